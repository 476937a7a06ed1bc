//! The state one worker's parts and its `Control` handles share: the
//! settings, the counters, the stop flags and their wake-up, the
//! `max_jobs` tickets, and the releases made for `TempFail`/`Retry`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::config::Config;
use crate::counters::Counters;

/// State shared by the threads of one worker and its [`Control`](crate::Control) handles.
pub(crate) struct Shared {
    pub(crate) cfg: Config,
    pub(crate) counters: Counters,
    pub(crate) stop: AtomicBool,
    pub(crate) abort: AtomicBool,
    /// The blocking worker's: a beanstalkd job reserved while several tubes
    /// were watched starts without a lookup, its handler asking for its tube
    /// when it wants it (`Job::tube`); the async worker's handler is told.
    pub(crate) lazy_lookup: bool,
    /// The blocking worker's: every job taken is handed to the handler
    /// threads' queue at once (the window's jobs wait there, not in the
    /// machine), so that a thread goes from one job to the next without a
    /// round trip through the driver. The machine keeps such a job's lease
    /// until its thread says it runs it ([`Machine::runs_now`](crate::machine::Machine::runs_now)).
    pub(crate) hand_ahead: bool,
    /// Reservations still allowed under `max_jobs`.
    pub(crate) tickets: AtomicU64,
    /// Releases this process made for `TempFail`/`Retry`, by (server, job id):
    /// they are subtracted from the job's `releases` count when counting
    /// failed attempts. Touched only on those rare paths.
    pub(crate) tempfails: Mutex<HashMap<(usize, u64), u32>>,
    pub(crate) tempfails_any: AtomicBool,
    /// Wakes the machines' drivers at a stop.
    pub(crate) stop_wake: tokio::sync::Notify,
}

/// The idle-exit rule: a worker stops once it has been quiet (no job
/// taken, no connect) for `idle`, unless it is still working (a job held, a
/// connect under way, a settle unconfirmed, jobs possibly still out).
pub(crate) fn idle_over(
    quiet: std::time::Duration,
    idle: std::time::Duration,
    working: bool,
) -> bool {
    quiet >= idle && !working
}

impl Shared {
    /// The shared state of a worker (`blocking`: the blocking worker's, see
    /// [`lazy_lookup`](Self::lazy_lookup)).
    pub(crate) fn new(cfg: Config, blocking: bool) -> Shared {
        let tickets = AtomicU64::new(cfg.max_jobs.unwrap_or(0));
        Shared {
            cfg,
            counters: Counters::default(),
            stop: AtomicBool::new(false),
            abort: AtomicBool::new(false),
            lazy_lookup: blocking,
            hand_ahead: blocking,
            tickets,
            tempfails: Mutex::new(HashMap::new()),
            tempfails_any: AtomicBool::new(false),
            stop_wake: tokio::sync::Notify::new(),
        }
    }

    /// Stops taking jobs, and wakes the drivers to see it.
    pub(crate) fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.stop_wake.notify_waiters();
    }

    pub(crate) fn take_ticket(&self) -> bool {
        if self.cfg.max_jobs.is_none() {
            return true;
        }
        self.tickets
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| t.checked_sub(1))
            .is_ok()
    }

    pub(crate) fn give_ticket(&self) {
        if self.cfg.max_jobs.is_some() {
            self.tickets.fetch_add(1, Ordering::AcqRel);
        }
    }
}
