//! What the server says of a job it handed out.

/// Numbers from `stats-job`, copied out of the reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct JobInfo {
    /// Priority.
    pub pri: u32,
    /// Time to run, seconds.
    pub ttr: u64,
    /// Seconds left of the lease.
    pub time_left: u64,
    /// Times reserved, this time included.
    pub reserves: u64,
    /// Times its lease ran out.
    pub timeouts: u64,
    /// Times released.
    pub releases: u64,
    /// Times buried.
    pub buries: u64,
}
