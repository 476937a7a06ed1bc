//! What a worker runs on each job, and how the job is settled after, and
//! the guard that makes a handler's panic a failed attempt.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use crate::counters::Counters;
use crate::failure::{self, Failure};
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
///
/// A handler that panics does not take its worker thread with it: the panic
/// is caught, counted (`panicked`), logged once with the job's id and the
/// panic's message, and settled as [`Outcome::Fail`]: released with the
/// retry backoff, or buried once it was the last of
/// [`Config::max_attempts`](crate::Config::max_attempts). The thread then
/// takes the next job. The worker leaves the process's panic hook alone (it
/// belongs to the program): the hook still prints its own message, with the
/// place of the panic, as for any other panic. A program that wants the
/// worker's log line alone can install a quiet hook with
/// [`std::panic::set_hook`].
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

/// Runs `handler` on `job`. A panic in it is a failed attempt: counted,
/// logged once, noted for the bury warning of a last attempt, and answered
/// [`Outcome::Fail`], so that the settle treats it as any other failure.
pub(crate) fn handle_guarded(handler: &dyn Handler, job: &mut Job<'_>) -> Outcome {
    failure::clear();
    let payload = match catch_unwind(AssertUnwindSafe(|| handler.handle(job))) {
        Ok(outcome) => return outcome,
        Err(payload) => payload,
    };
    Counters::add(&job.shared.counters.panicked);
    tracing::error!(
        job = job.id,
        server = job.server,
        panic = panic_message(&*payload),
        "handler panicked: a failed attempt"
    );
    // A payload whose drop panics too must not end the thread either.
    let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
    failure::note(Failure::Panicked);
    Outcome::Fail
}

/// The message a panic was given (`panic!("...")` makes a `&str` or a
/// `String`); other payloads have none to show.
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "(not a string)"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panics_message_is_shown_whatever_its_payload() {
        let cases: [(Box<dyn Any + Send>, &str); 3] = [
            (Box::new("static"), "static"),
            (Box::new(String::from("formatted 7")), "formatted 7"),
            (Box::new(7_u32), "(not a string)"),
        ];
        for (payload, want) in cases {
            assert_eq!(panic_message(&*payload), want);
        }
    }
}
