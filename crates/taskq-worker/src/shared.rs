//! The state the threads of one worker and its `Control` handles share:
//! the settings, the counters, the stop flags, the `max_jobs` tickets, the
//! idle clock, and what each lane (one thread's connection to one server)
//! shows the others: its state, whether jobs of its tubes may still be out,
//! the handle that cuts its connection, and its window of prefetched jobs.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use taskq_proto::Interrupter;

use crate::config::Config;
use crate::counters::Counters;

/// A lane's connection waits for nothing, or the thread is between requests.
pub(crate) const IDLE: u8 = 0;
/// A reserve is in flight on the lane and it holds no job: safe to cut.
pub(crate) const RESERVING: u8 = 1;
/// The lane holds a job.
pub(crate) const HOLDING: u8 = 2;
/// The lane is connecting (and setting the connection up): time the server
/// has not answered yet, not idle time.
pub(crate) const CONNECTING: u8 = 3;

/// State shared by the threads of one worker and its [`Control`](crate::Control) handles.
pub(crate) struct Shared {
    pub(crate) cfg: Config,
    pub(crate) counters: Counters,
    pub(crate) stop: AtomicBool,
    pub(crate) abort: AtomicBool,
    /// One per (thread, server), thread-major.
    pub(crate) lanes: Vec<LaneShared>,
    pub(crate) started: Instant,
    /// Milliseconds after `started` of the last moment the worker was busy: a
    /// job reserved, or a reserve or a connect the server did not answer. A
    /// server that cannot be asked (down, or electing a leader) is not an empty
    /// queue, so that time is not idle time for `exit_when_idle`.
    pub(crate) last_busy_ms: AtomicU64,
    /// Reservations still allowed under `max_jobs`.
    pub(crate) tickets: AtomicU64,
    /// Releases this process made for `TempFail`/`Retry`, by (server, job id):
    /// they are subtracted from the job's `releases` count when counting
    /// failed attempts. Touched only on those rare paths.
    pub(crate) tempfails: Mutex<HashMap<(usize, u64), u32>>,
    pub(crate) tempfails_any: AtomicBool,
    /// Threads whose loop has ended.
    pub(crate) ended: AtomicUsize,
    /// The thread waiting in `Running::join`, woken when one ends.
    pub(crate) joiner: Mutex<Option<std::thread::Thread>>,
    /// Wakes the async worker's drivers at a stop.
    #[cfg(feature = "tokio")]
    pub(crate) stop_wake: tokio::sync::Notify,
}

pub(crate) struct LaneShared {
    pub(crate) state: AtomicU8,
    /// The lane may still have jobs out on the server (JetStream: not
    /// delivered yet, or not acknowledged, such as one released with a
    /// delay): set when it takes a job, and from then on by what each of its
    /// empty reserves finds (beanstalkd: nothing; JetStream: the consumers'
    /// info).
    pub(crate) outstanding: AtomicBool,
    /// The lane keeps settles a failed connection sent without an answer,
    /// to send again.
    pub(crate) carrying: AtomicBool,
    pub(crate) cut: Mutex<Option<Interrupter>>,
    /// With prefetch: the lane's window, for a stop to give its jobs that have
    /// not started back at once, while the thread runs a job.
    pub(crate) keeper: Mutex<Option<Arc<dyn Keep>>>,
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
    /// The shared state of a worker with `lanes` lanes (threads times
    /// servers; none for the async worker, which keeps its own).
    pub(crate) fn new(cfg: Config, lanes: usize) -> Shared {
        let lanes = (0..lanes)
            .map(|_| LaneShared {
                state: AtomicU8::new(IDLE),
                outstanding: AtomicBool::new(false),
                carrying: AtomicBool::new(false),
                cut: Mutex::new(None),
                keeper: Mutex::new(None),
            })
            .collect();
        let tickets = AtomicU64::new(cfg.max_jobs.unwrap_or(0));
        Shared {
            cfg,
            counters: Counters::default(),
            stop: AtomicBool::new(false),
            abort: AtomicBool::new(false),
            lanes,
            started: Instant::now(),
            last_busy_ms: AtomicU64::new(0),
            tickets,
            tempfails: Mutex::new(HashMap::new()),
            tempfails_any: AtomicBool::new(false),
            ended: AtomicUsize::new(0),
            joiner: Mutex::new(None),
            #[cfg(feature = "tokio")]
            stop_wake: tokio::sync::Notify::new(),
        }
    }

    pub(crate) fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
        #[cfg(feature = "tokio")]
        self.stop_wake.notify_waiters();
        // A thread waiting in a reserve holds no job: cut its connection so it
        // stops at once instead of at the end of its slice. The server returns
        // a job it may have handed out in the meantime.
        for lane in &self.lanes {
            if lane.state.load(Ordering::SeqCst) == RESERVING {
                if let Some(cut) = lane.cut.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                    cut.interrupt();
                }
            }
        }
    }

    /// Gives every prefetched job that has not started back to its server
    /// (a stop asked from outside the lanes: a lane's own thread does it for
    /// its window when it sees the stop).
    pub(crate) fn release_unstarted(&self) {
        self.each_window(|k| k.release_unstarted(self));
    }

    /// Keeps the leases of prefetched jobs waiting behind a running job (the
    /// lanes' threads do it between jobs; this covers a long job).
    pub(crate) fn keep_waiting_leases(&self) {
        self.each_window(|k| k.keep_leases(self));
    }

    pub(crate) fn each_window(&self, f: impl Fn(&dyn Keep)) {
        for lane in &self.lanes {
            let keeper = lane
                .keeper
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            if let Some(k) = keeper {
                f(&*k);
            }
        }
    }

    pub(crate) fn take_ticket(&self) -> bool {
        if self.cfg.max_jobs.is_none() {
            return true;
        }
        self.tickets
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| t.checked_sub(1))
            .is_ok()
    }

    /// True when a reservation is allowed under `max_jobs` now.
    pub(crate) fn has_ticket(&self) -> bool {
        self.cfg.max_jobs.is_none() || self.tickets.load(Ordering::Acquire) > 0
    }

    pub(crate) fn give_ticket(&self) {
        if self.cfg.max_jobs.is_some() {
            self.tickets.fetch_add(1, Ordering::AcqRel);
        }
    }

    pub(crate) fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Marks now as busy: `exit_when_idle` counts from here.
    pub(crate) fn busy(&self) {
        self.last_busy_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// Lane `ls` took a job: busy now, and not idle until an empty reserve
    /// of that lane, after the job, finds nothing out. Idle time counts
    /// from the last job taken, so a job that runs longer than
    /// `exit_when_idle` would otherwise let the worker stop as soon as it
    /// ends, before the lane has looked again: a job the server still owes
    /// (released with a delay, due back later) would be left behind.
    pub(crate) fn took_job(&self, ls: &LaneShared) {
        ls.outstanding.store(true, Ordering::SeqCst);
        self.busy();
    }

    /// A worker thread's loop ended: counted, and the joining thread woken.
    pub(crate) fn thread_ended(&self) {
        self.ended.fetch_add(1, Ordering::SeqCst);
        if let Some(t) = self
            .joiner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            t.unpark();
        }
    }

    /// True while some lane holds a job or connects, keeps settles not
    /// confirmed yet, or last saw jobs of its tubes still out on the
    /// server: the worker is not idle then, however long it has been quiet.
    pub(crate) fn working_any(&self) -> bool {
        self.lanes.iter().any(|l| {
            matches!(l.state.load(Ordering::SeqCst), HOLDING | CONNECTING)
                || l.outstanding.load(Ordering::SeqCst)
                || l.carrying.load(Ordering::SeqCst)
        })
    }
}

/// A window of prefetched jobs that another thread may tend while the lane's
/// thread runs a job (implemented by the window in `worker::prefetch`).
pub(crate) trait Keep: Send + Sync {
    /// Releases every prefetched job that has not started.
    fn release_unstarted(&self, sh: &Shared);
    /// Applies the lease rule to the waiting jobs, unless the lane's thread
    /// is between jobs (it does so itself then).
    fn keep_leases(&self, sh: &Shared);
}
