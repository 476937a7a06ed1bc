//! How taskq lays its queues out on NATS JetStream, in one place so that the
//! producer, the worker and the operators' commands agree with each other and
//! with other clients.
//!
//! - One stream, `TASKQ` by default, WorkQueue retention, capturing `taskq.>`.
//!   Another stream name `NAME` captures `name.>` (the name in lower case), so
//!   two deployments can share a cluster: streams may not overlap.
//! - Tube `T` is subject `taskq.T`: a plain message published there by any
//!   client is a job.
//! - Every worker of tube `T` shares one durable pull consumer, `taskq-T`,
//!   filtered on `taskq.T` (a WorkQueue stream allows one consumer per subject).
//! - Buried jobs of tube `T` are kept on `taskq.T.buried`, in the same stream:
//!   no consumer filters on it, so they stay until `taskq kick` moves them back.

use crate::error::TubeNameError;
use crate::MAX_TUBE_NAME;

/// The header that carries a delayed job's ready time, in Unix milliseconds:
/// JetStream 2.9 has no scheduled publish, so the worker that is handed the
/// job early gives it back (`-NAK` with the time left).
pub const READY_AT_HEADER: &[u8] = b"Taskq-Ready-At";

/// The stream taskq uses unless told otherwise.
pub const DEFAULT_STREAM: &str = "TASKQ";

/// The last subject token of a tube's buried jobs.
const BURIED: &str = "buried";

/// Names of the stream, subjects and consumers of one taskq deployment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    stream: String,
    prefix: String,
}

impl Default for Layout {
    fn default() -> Layout {
        Layout::new(DEFAULT_STREAM).expect("the default stream name is valid")
    }
}

impl Layout {
    /// The layout of stream `stream`; its subjects start with the name in lower case.
    /// The name follows the tube rule (`A-Z a-z 0-9 - _`), which keeps it a
    /// single subject token and a valid stream name.
    pub fn new(stream: &str) -> Result<Layout, TubeNameError> {
        validate_subject_tube(stream)?;
        Ok(Layout {
            stream: stream.to_owned(),
            prefix: stream.to_ascii_lowercase(),
        })
    }

    /// The stream's name.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// The subject filter the stream captures: `taskq.>`.
    pub fn capture(&self) -> String {
        format!("{}.>", self.prefix)
    }

    /// Tube `tube`'s subject: `taskq.T`.
    pub fn subject(&self, tube: &str) -> String {
        format!("{}.{tube}", self.prefix)
    }

    /// The subject where tube `tube`'s buried jobs are kept: `taskq.T.buried`.
    pub fn buried_subject(&self, tube: &str) -> String {
        format!("{}.{tube}.{BURIED}", self.prefix)
    }

    /// The durable consumer every worker of `tube` shares: `taskq-T`.
    pub fn consumer(tube: &str) -> String {
        format!("taskq-{tube}")
    }

    /// The tube a job's subject belongs to, and whether it is the buried
    /// subject; `None` for a subject outside this layout.
    pub fn tube_of<'a>(&self, subject: &'a str) -> Option<(&'a str, bool)> {
        let rest = subject
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix('.')?;
        match rest.split_once('.') {
            None if !rest.is_empty() => Some((rest, false)),
            Some((tube, BURIED)) if !tube.is_empty() => Some((tube, true)),
            _ => None,
        }
    }

    /// The tube whose consumer this is, for a name `taskq-T`.
    pub fn tube_of_consumer(name: &str) -> Option<&str> {
        name.strip_prefix("taskq-").filter(|t| !t.is_empty())
    }
}

/// Checks a tube name for JetStream: 1 to 200 bytes of `A-Z a-z 0-9 - _`, so
/// that it is one subject token and part of a consumer's name.
pub fn validate_subject_tube(name: &str) -> Result<(), TubeNameError> {
    let bytes = name.as_bytes();
    if bytes.is_empty() {
        return Err(TubeNameError::Empty);
    }
    if bytes.len() > MAX_TUBE_NAME {
        return Err(TubeNameError::TooLong { len: bytes.len() });
    }
    match bytes
        .iter()
        .position(|&b| !(b.is_ascii_alphanumeric() || b == b'-' || b == b'_'))
    {
        Some(at) => Err(TubeNameError::BadSubjectByte {
            byte: bytes[at],
            at,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_the_default_layout() {
        let l = Layout::default();
        assert_eq!(l.stream(), "TASKQ");
        assert_eq!(l.capture(), "taskq.>");
        assert_eq!(l.subject("emails"), "taskq.emails");
        assert_eq!(l.buried_subject("emails"), "taskq.emails.buried");
        assert_eq!(Layout::consumer("emails"), "taskq-emails");
        assert_eq!(Layout::tube_of_consumer("taskq-emails"), Some("emails"));
        assert_eq!(Layout::tube_of_consumer("other"), None);
    }

    #[test]
    fn another_stream_captures_its_own_lower_case_prefix() {
        let l = Layout::new("Staging_2").unwrap();
        assert_eq!(l.stream(), "Staging_2");
        assert_eq!(l.capture(), "staging_2.>");
        assert_eq!(l.subject("t"), "staging_2.t");
        assert_eq!(l.tube_of("taskq.t"), None);
    }

    #[test]
    fn subjects_map_back_to_tubes() {
        let l = Layout::default();
        let table: &[(&str, Option<(&str, bool)>)] = &[
            ("taskq.a", Some(("a", false))),
            ("taskq.a-b_c", Some(("a-b_c", false))),
            ("taskq.a.buried", Some(("a", true))),
            ("taskq.buried", Some(("buried", false))),
            ("taskq.a.other", None),
            ("taskq.", None),
            ("taskq..buried", None),
            ("taskqx.a", None),
            ("other.a", None),
            ("taskq", None),
        ];
        for (subject, want) in table {
            assert_eq!(l.tube_of(subject), *want, "{subject}");
        }
    }

    #[test]
    fn tube_names_on_jetstream() {
        assert_eq!(validate_subject_tube("jobs-1_x"), Ok(()));
        assert_eq!(validate_subject_tube("-x"), Ok(()));
        assert_eq!(validate_subject_tube(""), Err(TubeNameError::Empty));
        assert_eq!(
            validate_subject_tube(&"a".repeat(201)),
            Err(TubeNameError::TooLong { len: 201 })
        );
        for (name, at) in [
            ("a.b", 1),
            ("a*", 1),
            (">", 0),
            ("a b", 1),
            ("a/b", 1),
            ("é", 0),
        ] {
            let e = validate_subject_tube(name).unwrap_err();
            assert_eq!(
                e,
                TubeNameError::BadSubjectByte {
                    byte: name.as_bytes()[at],
                    at
                },
                "{name}"
            );
        }
        assert!(Layout::new("A.B").is_err());
    }
}
