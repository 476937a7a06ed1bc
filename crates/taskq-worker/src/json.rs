//! Typed job bodies: a body decoded from JSON, and what is told when it
//! does not decode. The error never carries the body's bytes: a body may
//! hold anything, secrets included, and the error goes to logs.

use std::fmt;

use serde::de::DeserializeOwned;

use crate::handler::Outcome;

/// Why a job's body did not decode as the type asked for.
///
/// Its `Display` names the job, the type, the kind of failure and where in
/// the body it was found, and nothing of the body itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    job: u64,
    ty: &'static str,
    kind: DecodeErrorKind,
    line: usize,
    column: usize,
}

/// What kind of failure a [`DecodeError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeErrorKind {
    /// The body is not JSON (or not UTF-8).
    Syntax,
    /// The body is JSON, but not of the type's shape: a field missing or of
    /// another type, a value out of range.
    Shape,
    /// The body ends in the middle of a JSON value (an empty body, say).
    Truncated,
}

impl DecodeError {
    /// The job whose body did not decode.
    pub fn job(&self) -> crate::JobId {
        crate::JobId::new(self.job)
    }

    /// What kind of failure it is.
    pub fn kind(&self) -> DecodeErrorKind {
        self.kind
    }

    /// Where in the body it was found: 1-based line and column (0, 0 when
    /// not known).
    pub fn position(&self) -> (usize, usize) {
        (self.line, self.column)
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            DecodeErrorKind::Syntax => "is not JSON",
            DecodeErrorKind::Shape => "does not have the shape of",
            DecodeErrorKind::Truncated => "ends before a whole",
        };
        write!(
            f,
            "job {}: body {what} {} (line {}, column {})",
            self.job, self.ty, self.line, self.column
        )
    }
}

impl std::error::Error for DecodeError {}

/// A body that does not decode is a job no attempt can run: returned from
/// the handler (`return e.into()`), the job is buried, and the error logged
/// with the job's id.
impl From<DecodeError> for Outcome {
    fn from(e: DecodeError) -> Outcome {
        tracing::warn!(job = e.job, error = %e, "job body does not decode: burying it");
        Outcome::Bury
    }
}

/// Decodes job `job`'s `body` as a `T`.
pub(crate) fn decode<T: DeserializeOwned>(job: u64, body: &[u8]) -> Result<T, DecodeError> {
    serde_json::from_slice(body).map_err(|e| {
        use serde_json::error::Category;
        DecodeError {
            job,
            ty: std::any::type_name::<T>(),
            kind: match e.classify() {
                Category::Eof => DecodeErrorKind::Truncated,
                Category::Data => DecodeErrorKind::Shape,
                // A slice is read without I/O: what is left is syntax.
                Category::Syntax | Category::Io => DecodeErrorKind::Syntax,
            },
            line: e.line(),
            column: e.column(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, serde::Deserialize)]
    struct Order {
        id: u32,
        item: String,
    }

    #[test]
    fn a_body_decodes_or_says_why_without_showing_itself() {
        use DecodeErrorKind::*;
        let ok: Order = decode(1, br#"{"id": 7, "item": "tea"}"#).unwrap();
        assert_eq!(
            ok,
            Order {
                id: 7,
                item: "tea".into()
            }
        );
        let cases: [(&[u8], DecodeErrorKind, (usize, usize)); 7] = [
            (b"", Truncated, (1, 0)),
            (br#"{"id": 7, "item": "tea""#, Truncated, (1, 23)),
            (b"hunter2", Syntax, (1, 1)),
            (b"\xff\xfe hunter2", Syntax, (1, 1)),
            (br#"{"id": "hunter2", "item": "tea"}"#, Shape, (1, 16)),
            (br#"{"item": "hunter2"}"#, Shape, (1, 19)),
            (br#"{"id": 99999999999, "item": "hunter2"}"#, Shape, (1, 18)),
        ];
        for (body, kind, at) in cases {
            let e = decode::<Order>(42, body).unwrap_err();
            assert_eq!((e.kind(), e.position()), (kind, at), "{body:?}: {e}");
            assert_eq!(e.job().get(), 42);
            let shown = format!("{e} {e:?}");
            assert!(
                !shown.contains("hunter2") && !shown.contains("tea"),
                "{shown}"
            );
            assert!(shown.starts_with("job 42: body "), "{shown}");
            assert!(shown.contains("json::tests::Order"), "{shown}");
            assert_eq!(Outcome::from(e), Outcome::Bury);
        }
    }
}
