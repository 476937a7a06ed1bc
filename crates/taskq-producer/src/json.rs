//! Typed jobs (feature `serde`): a value put as its JSON, serialized into a
//! buffer the producer keeps, so a value whose serialization allocates
//! nothing is put without allocating.

use std::io;

use serde::Serialize;

use crate::error::{Error, Invalid};

/// Serializes `value` into `buf` (emptied first).
pub(crate) fn encode<T: Serialize + ?Sized>(buf: &mut Vec<u8>, value: &T) -> Result<(), Error> {
    buf.clear();
    serde_json::to_writer(&mut *buf, value).map_err(|_| Error::Invalid(Invalid::Unserializable))
}

/// The bytes `value` serializes to, counted without keeping them.
pub(crate) fn encoded_len<T: Serialize + ?Sized>(value: &T) -> Result<usize, Error> {
    struct Count(usize);
    impl io::Write for Count {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let mut n = Count(0);
    serde_json::to_writer(&mut n, value).map_err(|_| Error::Invalid(Invalid::Unserializable))?;
    Ok(n.0)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn a_value_is_its_json_and_a_map_with_non_string_keys_is_refused() {
        let mut buf = Vec::new();
        encode(&mut buf, &("a", 1, [true])).unwrap();
        assert_eq!(buf, br#"["a",1,[true]]"#);
        assert_eq!(encoded_len(&("a", 1, [true])).unwrap(), buf.len());
        let bad: HashMap<(u8, u8), u8> = [((1, 2), 3)].into();
        let e = encode(&mut buf, &bad).unwrap_err();
        assert!(
            matches!(e, Error::Invalid(Invalid::Unserializable)),
            "{e:?}"
        );
        assert!(e.not_sent());
        assert!(encoded_len(&bad).is_err());
    }
}
