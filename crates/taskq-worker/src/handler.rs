//! What a worker runs on each job, and how the job is settled after.

use std::time::Duration;

use crate::job::Job;

/// How a handler settles a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The work succeeded: delete the job. Counted done on `DELETED` only.
    Done,
    /// Give the job back to run later, after `delay`; not a failed attempt.
    Retry {
        /// Wait before the job is ready again (rounded up to whole seconds).
        delay: Duration,
    },
    /// Give the job back with the retry backoff for its release count; not a
    /// failed attempt (what exit status 75, `EX_TEMPFAIL`, means to `taskq-worker`).
    TempFail,
    /// Bury the job now: it stays aside until someone kicks it.
    Bury,
    /// The work failed: release the job with a growing delay, or bury it once
    /// it has failed [`Config::max_attempts`](crate::Config::max_attempts) times.
    Fail,
}

/// The work done for each job. Implemented for every suitable closure.
pub trait Handler: Send + Sync + 'static {
    /// Runs one job and says how to settle it.
    fn handle(&self, job: &mut Job<'_>) -> Outcome;
}

impl<F> Handler for F
where
    F: Fn(&mut Job<'_>) -> Outcome + Send + Sync + 'static,
{
    fn handle(&self, job: &mut Job<'_>) -> Outcome {
        self(job)
    }
}
