//! The id a server gave a job: one type for the producer that put it and the
//! worker that runs it.

/// A job's id on its server (beanstalkd's job id; the stream sequence on a
/// JetStream engine).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobId(u64);

impl JobId {
    /// Wraps an id the server gave.
    #[inline]
    pub const fn new(id: u64) -> JobId {
        JobId(id)
    }

    /// The number.
    #[inline]
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl std::fmt::Display for JobId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl From<JobId> for u64 {
    fn from(id: JobId) -> u64 {
        id.0
    }
}
