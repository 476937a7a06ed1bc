//! A blocking worker for beanstalkd-protocol work queues that never loses a job.
//!
//! A [`Worker`] runs a [`Handler`] on each job it reserves and settles the job by
//! the [`Outcome`] the handler returns: delete, release, or bury. It counts a job
//! done only when the server answers `DELETED`, survives cut, silent and dead
//! connections by reconnecting with capped, jittered backoff, and stops cleanly:
//! first it stops taking jobs and lets the running ones finish, and on a second
//! request it gives them back at once.
//!
//! Each thread holds its own connection to each server. After a job it sends
//! the job's `delete` and the next `reserve-with-timeout` in one write, so one
//! round trip serves both.
//!
//! ```no_run
//! use taskq_worker::{Config, Outcome, Worker};
//!
//! let cfg = Config {
//!     servers: vec!["127.0.0.1:11300".into()],
//!     concurrency: 4,
//!     ..Config::default()
//! };
//! let worker = Worker::new(cfg, |job: &mut taskq_worker::Job<'_>| {
//!     println!("job {}: {} bytes", job.id(), job.body().len());
//!     Outcome::Done
//! })
//! .unwrap();
//! let counts = worker.run();
//! println!("{counts}");
//! ```

mod backoff;
pub mod command;
mod config;
mod counters;
mod job;
mod worker;

pub use backoff::Backoff;
pub use config::{Config, ConfigError};
pub use counters::{Counters, Snapshot};
pub use job::{Job, JobError, JobInfo};
pub use worker::{Control, Running, Worker};

use std::time::Duration;

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
    /// it has failed [`Config::max_attempts`] times.
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
