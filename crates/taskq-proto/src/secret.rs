//! [`Secret`]: a password, token or key that no message may show.

use std::fmt;

/// A secret string (a password, a token): its `Debug` and `Display` show
/// `***`, so it cannot reach a log line, an error or a panic message by
/// being formatted. Read it with [`expose`](Secret::expose) where it must go
/// on the wire.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Secret(String);

impl Secret {
    /// Wraps `s`.
    pub fn new(s: impl Into<String>) -> Secret {
        Secret(s.into())
    }

    /// The secret itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Secret {
        Secret(s)
    }
}

impl From<&str> for Secret {
    fn from(s: &str) -> Secret {
        Secret(s.to_owned())
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl Drop for Secret {
    /// Overwrites the bytes before the memory is freed.
    fn drop(&mut self) {
        let mut v = std::mem::take(&mut self.0).into_bytes();
        v.fill(0);
        // Keeps the stores from being dropped as dead (best effort, no `unsafe`).
        std::hint::black_box(&v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formatting_never_shows_the_secret() {
        let s = Secret::new("s3cret");
        assert_eq!(format!("{s} {s:?} {:?}", Some(&s)), "*** *** Some(***)");
        assert_eq!(s.expose(), "s3cret");
    }
}
