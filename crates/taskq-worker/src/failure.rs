//! How the last failed attempt of a thread ended: the command handler notes
//! it (and the worker, for a handler that panicked), and the settle that
//! buries the job after its last attempt logs it.

use std::cell::Cell;

/// How the last failed command of this thread ended, for the bury warning
/// that the worker logs when the failure was the last attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// Exited with this status.
    Exit(i32),
    /// Killed by this signal.
    Signal(i32),
    /// Killed after `--job-timeout`.
    TimedOut,
    /// Could not be run or waited for.
    Lost,
    /// The handler panicked.
    Panicked,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Exit(c) => write!(f, "exit status {c}"),
            Failure::Signal(s) => write!(f, "signal {s}"),
            Failure::TimedOut => f.write_str("killed after --job-timeout"),
            Failure::Lost => f.write_str("could not be run or waited for"),
            Failure::Panicked => f.write_str("the handler panicked"),
        }
    }
}

thread_local! {
    static LAST_FAILURE: Cell<Option<Failure>> = const { Cell::new(None) };
}

/// Forgets this thread's last failure (a new attempt starts).
pub(crate) fn clear() {
    LAST_FAILURE.with(|c| c.set(None));
}

/// Notes how this thread's command failed, for [`take_failure`].
pub(crate) fn note(f: Failure) {
    LAST_FAILURE.with(|c| c.set(Some(f)));
}

/// Takes how this thread's last command failed: taken on the handler's
/// thread when the handler returns, and sent with its outcome
/// (`slot::Msg::Finished`) to the machine that settles the job.
pub(crate) fn take_failure() -> Option<Failure> {
    LAST_FAILURE.with(Cell::take)
}
