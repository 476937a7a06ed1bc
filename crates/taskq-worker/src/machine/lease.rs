//! The lease rule for jobs held and not started (a window larger than its
//! handlers, `Config::prefetch`), one for both machines: a job waiting too
//! long goes back to the server, one whose lease may run out is touched.

use std::time::{Duration, Instant};

use taskq_proto::earliest;

/// A waiting job whose lease was restarted this long ago (or which was asked
/// for this long ago) is touched by its machine, in the driver's next write,
/// while it waits to start (a running job's lease is its handler's to keep,
/// with `Job::touch` or `AsyncJob::touch`). beanstalkd gives every job a TTR
/// of at least one second, so a job younger than this still has at least
/// half a second of its lease.
pub(crate) const TOUCH_AFTER: Duration = Duration::from_millis(500);

/// A job that waited this long in the window since it was reserved is given
/// back: the jobs ahead of it are too long for it to start in time, and
/// another worker may be free.
pub(crate) const HOLD_MAX: Duration = Duration::from_secs(30);

/// What to do for a job waiting in the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lease {
    /// Nothing: its lease is young.
    Keep,
    /// Restart its lease.
    Touch,
    /// Give it back to the server.
    Release,
}

/// The lease rule at one instant `now`, for every job waiting in the
/// window: a job asked for [`HOLD_MAX`] ago or more goes back to the
/// server; one whose lease was last (re)started [`TOUCH_AFTER`] ago or more,
/// or any while `soon` (the server answered a reserve `DEADLINE_SOON` since
/// the rule last ran: some lease of this connection is within a second of
/// its end), is touched; the rest are kept. The ages are turned into
/// instants once, so that a window of jobs costs a comparison each, not a
/// clock subtraction (which, per job and per waiting job, was a third of a
/// JetStream drain's instructions at a window of 64).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseRule {
    /// Asked for at or before this: released.
    release: Option<Instant>,
    /// Leased at or before this: touched.
    touch: Option<Instant>,
    soon: bool,
}

impl LeaseRule {
    pub(crate) fn at(now: Instant, soon: bool) -> LeaseRule {
        LeaseRule {
            release: now.checked_sub(HOLD_MAX),
            touch: now.checked_sub(TOUCH_AFTER),
            soon,
        }
    }

    /// The rule at `now` for jobs held by either worker's machines (up to
    /// `max(concurrency, prefetch)` jobs in flight per server, `concurrency`
    /// of them running), where a stop (`stopping`) gives every one back.
    pub(crate) fn held(now: Instant, soon: bool, stopping: bool) -> LeaseRule {
        let mut rule = LeaseRule::at(now, soon);
        if stopping {
            rule.release = Some(now);
        }
        rule
    }

    /// The rule at `now` for a job handed to the blocking worker's handler
    /// threads and not yet run: touched once its lease is `TOUCH_AFTER` old,
    /// as a held job, and never given back (its thread gives it back unrun
    /// at a stop). A `DEADLINE_SOON` (`soon`) touches it once its lease is
    /// half that old: a job handed a moment ago is about to start on a free
    /// thread, and touching it would be for nothing.
    pub(crate) fn handed(now: Instant, soon: bool) -> LeaseRule {
        let age = if soon { TOUCH_AFTER / 2 } else { TOUCH_AFTER };
        LeaseRule {
            release: None,
            touch: now.checked_sub(age),
            soon: false,
        }
    }

    /// When a handed job whose lease last started at `leased` is next
    /// touched (the [`handed`](Self::handed) rule, without `soon`).
    pub(crate) fn touch_due(leased: Instant) -> Option<Instant> {
        leased.checked_add(TOUCH_AFTER)
    }

    /// The first instant at which the rule (without `soon`) does anything
    /// for a job asked for at `asked` whose lease last started at `leased`:
    /// before it, [`of`](Self::of) keeps the job.
    pub(crate) fn first_due(asked: Instant, leased: Instant) -> Option<Instant> {
        earliest(asked.checked_add(HOLD_MAX), leased.checked_add(TOUCH_AFTER))
    }

    /// What to do for a job asked for at `asked` whose lease last started
    /// at `leased`.
    pub(crate) fn of(&self, asked: Instant, leased: Instant) -> Lease {
        if self.release.is_some_and(|t| asked <= t) {
            Lease::Release
        } else if self.soon || self.touch.is_some_and(|t| leased <= t) {
            Lease::Touch
        } else {
            Lease::Keep
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_young_lease_is_kept_an_old_one_touched_a_long_wait_released() {
        let lease = lease_at(false);
        assert_eq!(lease(Duration::ZERO, Duration::ZERO), Lease::Keep);
        assert_eq!(lease(400 * MS, 499 * MS), Lease::Keep);
        assert_eq!(lease(600 * MS, 500 * MS), Lease::Touch);
        assert_eq!(lease(5_000 * MS, 2_000 * MS), Lease::Touch);
        // Touched lately, but waiting too long: back to the server.
        assert_eq!(lease(HOLD_MAX, Duration::ZERO), Lease::Release);
        assert_eq!(lease_at(true)(HOLD_MAX + MS, 10 * MS), Lease::Release);
    }

    /// The rule at an instant, for a job that has waited `waited` since it
    /// was asked for and whose lease started `since` ago.
    fn lease_at(soon: bool) -> impl Fn(Duration, Duration) -> Lease {
        let now = Instant::now() + HOLD_MAX;
        let rule = LeaseRule::at(now, soon);
        move |waited, since| rule.of(now - waited, now - since)
    }

    #[test]
    fn a_handed_job_is_touched_as_a_held_one_and_never_given_back() {
        let now = Instant::now() + 2 * HOLD_MAX;
        let rule = LeaseRule::handed(now, false);
        assert_eq!(rule.of(now - 2 * HOLD_MAX, now - 400 * MS), Lease::Keep);
        assert_eq!(rule.of(now - 2 * HOLD_MAX, now - 600 * MS), Lease::Touch);
        // DEADLINE_SOON: touched at half the age, a job handed just now not.
        let soon = LeaseRule::handed(now, true);
        assert_eq!(soon.of(now, now - 249 * MS), Lease::Keep);
        assert_eq!(soon.of(now, now - 250 * MS), Lease::Touch);
        assert_eq!(LeaseRule::touch_due(now), Some(now + TOUCH_AFTER));
    }

    #[test]
    fn deadline_soon_touches_every_waiting_job_whatever_its_age() {
        let lease = lease_at(true);
        assert_eq!(lease(Duration::ZERO, Duration::ZERO), Lease::Touch);
        assert_eq!(lease(10 * MS, MS), Lease::Touch);
        assert_eq!(lease(HOLD_MAX - MS, MS), Lease::Touch);
    }

    #[test]
    fn a_job_younger_than_the_touch_age_keeps_half_of_the_shortest_lease() {
        // beanstalkd's shortest TTR is one second.
        let shortest = Duration::from_secs(1);
        let lease = lease_at(false);
        let mut since = Duration::ZERO;
        while lease(since, since) == Lease::Keep {
            assert!(shortest - since >= shortest / 2, "{since:?}");
            since += MS;
        }
        assert_eq!(since, TOUCH_AFTER);
    }
}
