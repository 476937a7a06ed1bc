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
//! - On a stream that allows message schedules (nats-server 2.12+), a job put
//!   with a delay waits on `taskq.T.delayed.<S>.<ID>`, a subject of its own
//!   (`S` the Unix second it becomes ready, `ID` its message id), until the
//!   server publishes it to `taskq.T` at second `S`. No consumer filters on
//!   these subjects either.

use taskq_proto::TubeNameError;
use taskq_proto::MAX_TUBE_NAME;

/// The header that carries a delayed job's ready time, in Unix milliseconds.
/// Before nats-server 2.12 JetStream has no scheduled publish, so the worker
/// that is handed the job early gives it back (`-NAK` with the time left);
/// a job the server held until its time carries it too, and the worker
/// checks it all the same.
pub const READY_AT_HEADER: &[u8] = b"Taskq-Ready-At";

/// The stream taskq uses unless told otherwise.
pub const DEFAULT_STREAM: &str = "TASKQ";

/// The last subject token of a tube's buried jobs.
const BURIED: &str = "buried";
/// The subject token after the tube's of its jobs held by the server until their time.
const DELAYED: &str = "delayed";

/// What a subject of the layout holds for its tube.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubjectKind {
    /// `taskq.T`: the tube's jobs, which its consumer hands out.
    Tube,
    /// `taskq.T.buried`: buried jobs.
    Buried,
    /// `taskq.T.delayed.<S>.<ID>`: a delayed job the server holds until
    /// Unix second `at`.
    Delayed {
        /// The Unix second it becomes ready.
        at: u64,
    },
}

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

    /// The start of the subjects where the server holds tube `tube`'s
    /// delayed jobs: `taskq.T.delayed.`; a job's own subject adds the Unix
    /// second it becomes ready and its message id
    /// ([`delayed_subject`](Self::delayed_subject)).
    pub fn delayed_prefix(&self, tube: &str) -> String {
        format!("{}.{tube}.{DELAYED}.", self.prefix)
    }

    /// Writes the subject of a delayed job into `out` (cleared first):
    /// `prefix` from [`delayed_prefix`](Self::delayed_prefix), then `at`
    /// (the Unix second it becomes ready), a dot and its message id.
    pub fn delayed_subject(prefix: &str, at: u64, msg_id: &str, out: &mut String) {
        out.clear();
        out.push_str(prefix);
        out.push_str(itoa::Buffer::new().format(at));
        out.push('.');
        out.push_str(msg_id);
    }

    /// The filter of every delayed job of tube `tube`: `taskq.T.delayed.>`.
    pub fn delayed_filter(&self, tube: &str) -> String {
        format!("{}.{tube}.{DELAYED}.>", self.prefix)
    }

    /// The durable consumer every worker of `tube` shares: `taskq-T`.
    pub fn consumer(tube: &str) -> String {
        format!("taskq-{tube}")
    }

    /// The tube a job's subject belongs to, and what the subject holds;
    /// `None` for a subject outside this layout.
    pub fn tube_of<'a>(&self, subject: &'a str) -> Option<(&'a str, SubjectKind)> {
        let rest = subject
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix('.')?;
        let mut tokens = rest.split('.');
        let tube = tokens.next().filter(|t| !t.is_empty())?;
        let kind = match (tokens.next(), tokens.next(), tokens.next()) {
            (None, _, _) => SubjectKind::Tube,
            (Some(BURIED), None, _) => SubjectKind::Buried,
            (Some(DELAYED), Some(at), Some(id))
                if !id.is_empty() && !at.is_empty() && at.bytes().all(|b| b.is_ascii_digit()) =>
            {
                SubjectKind::Delayed {
                    at: at.parse().ok()?,
                }
            }
            _ => return None,
        };
        match kind {
            SubjectKind::Delayed { .. } if tokens.next().is_some() => None,
            kind => Some((tube, kind)),
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
        assert_eq!(l.delayed_prefix("emails"), "taskq.emails.delayed.");
        assert_eq!(l.delayed_filter("emails"), "taskq.emails.delayed.>");
        let mut s = String::from("left over");
        Layout::delayed_subject(&l.delayed_prefix("emails"), 1_796_171_537, "k3x-7", &mut s);
        assert_eq!(s, "taskq.emails.delayed.1796171537.k3x-7");
        assert_eq!(
            l.tube_of(&s),
            Some(("emails", SubjectKind::Delayed { at: 1_796_171_537 }))
        );
    }

    #[test]
    fn delayed_subjects_are_covered_by_the_stream_and_by_no_tube_consumer() {
        let l = Layout::default();
        let s = format!("{}1796171537.abc-1", l.delayed_prefix("t"));
        let covers = taskq_proto::nats::subject_covers;
        assert!(covers(&l.capture(), &s), "the stream captures it");
        assert!(covers(&l.delayed_filter("t"), &s));
        assert!(!covers(&l.subject("t"), &s), "the tube's consumer does not");
        assert!(!covers(&l.subject("delayed"), &s));
        assert!(!covers(&l.buried_subject("t"), &s));
        assert!(!covers(&l.delayed_filter("u"), &s));
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
        let (tube, buried) = (SubjectKind::Tube, SubjectKind::Buried);
        let delayed = |at| SubjectKind::Delayed { at };
        let table: &[(&str, Option<(&str, SubjectKind)>)] = &[
            ("taskq.a", Some(("a", tube))),
            ("taskq.a-b_c", Some(("a-b_c", tube))),
            ("taskq.a.buried", Some(("a", buried))),
            ("taskq.buried", Some(("buried", tube))),
            ("taskq.delayed", Some(("delayed", tube))),
            (
                "taskq.a.delayed.1796171537.k3x-7",
                Some(("a", delayed(1_796_171_537))),
            ),
            ("taskq.delayed.delayed.0.x", Some(("delayed", delayed(0)))),
            ("taskq.a.delayed", None),
            ("taskq.a.delayed.17", None),
            ("taskq.a.delayed.17.", None),
            ("taskq.a.delayed..x", None),
            ("taskq.a.delayed.1x.y", None),
            ("taskq.a.delayed.1.x.y", None),
            ("taskq.a.delayed.99999999999999999999999.x", None),
            ("taskq.a.buried.x", None),
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
