//! The worker: its settings, the state its threads share, and the handles
//! that start, stop and join it. Each thread's loop over its servers is in
//! [`lane`], one turn on a lane (reserve, run the handler, settle) in
//! [`turn`], and the choice of the command that settles a job in [`settle`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use taskq_proto::Interrupter;

use crate::config::{Config, ConfigError};
use crate::counters::{Counters, Snapshot};
use crate::Handler;

mod lane;
mod prefetch;
pub(crate) mod settle;
mod turn;

use crate::engine::{Beanstalkd, Nats};
use lane::Lanes;

/// A lane's connection waits for nothing, or the thread is between requests.
const IDLE: u8 = 0;
/// A reserve is in flight on the lane and it holds no job: safe to cut.
const RESERVING: u8 = 1;
/// The lane holds a job.
const HOLDING: u8 = 2;
/// The lane is connecting (and setting the connection up): time the server
/// has not answered yet, not idle time.
const CONNECTING: u8 = 3;

/// State shared by the threads of one worker and its [`Control`] handles.
pub(crate) struct Shared {
    pub(crate) cfg: Config,
    pub(crate) counters: Counters,
    pub(crate) stop: AtomicBool,
    pub(crate) abort: AtomicBool,
    /// One per (thread, server), thread-major.
    lanes: Vec<LaneShared>,
    started: Instant,
    /// Milliseconds after `started` of the last moment the worker was busy: a
    /// job reserved, or a reserve or a connect the server did not answer. A
    /// server that cannot be asked (down, or electing a leader) is not an empty
    /// queue, so that time is not idle time for `exit_when_idle`.
    last_busy_ms: AtomicU64,
    /// Reservations still allowed under `max_jobs`.
    tickets: AtomicU64,
    /// Releases this process made for `TempFail`/`Retry`, by (server, job id):
    /// they are subtracted from the job's `releases` count when counting
    /// failed attempts. Touched only on those rare paths.
    tempfails: Mutex<HashMap<(usize, u64), u32>>,
    tempfails_any: AtomicBool,
}

struct LaneShared {
    state: AtomicU8,
    /// The lane may still have jobs out on the server (JetStream: not
    /// delivered yet, or not acknowledged, such as one released with a
    /// delay): set when it takes a job, and from then on by what each of its
    /// empty reserves finds (beanstalkd: nothing; JetStream: the consumers'
    /// info).
    outstanding: AtomicBool,
    /// The lane keeps settles a failed connection sent without an answer,
    /// to send again.
    carrying: AtomicBool,
    cut: Mutex<Option<Interrupter>>,
    /// With prefetch: the lane's window, for a stop to give its jobs that have
    /// not started back at once, while the thread runs a job.
    keeper: Mutex<Option<Arc<dyn prefetch::Keep>>>,
}

impl Shared {
    fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
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
    fn release_unstarted(&self) {
        self.each_window(|k| k.release_unstarted(self));
    }

    /// Keeps the leases of prefetched jobs waiting behind a running job (the
    /// lanes' threads do it between jobs; this covers a long job).
    fn keep_waiting_leases(&self) {
        self.each_window(|k| k.keep_leases(self));
    }

    fn each_window(&self, f: impl Fn(&dyn prefetch::Keep)) {
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

    fn take_ticket(&self) -> bool {
        if self.cfg.max_jobs.is_none() {
            return true;
        }
        self.tickets
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| t.checked_sub(1))
            .is_ok()
    }

    /// True when a reservation is allowed under `max_jobs` now.
    fn has_ticket(&self) -> bool {
        self.cfg.max_jobs.is_none() || self.tickets.load(Ordering::Acquire) > 0
    }

    fn give_ticket(&self) {
        if self.cfg.max_jobs.is_some() {
            self.tickets.fetch_add(1, Ordering::AcqRel);
        }
    }

    fn now_ms(&self) -> u64 {
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
    fn took_job(&self, ls: &LaneShared) {
        ls.outstanding.store(true, Ordering::SeqCst);
        self.busy();
    }

    /// True while some lane holds a job or connects, keeps settles not
    /// confirmed yet, or last saw jobs of its tubes still out on the
    /// server: the worker is not idle then, however long it has been quiet.
    fn working_any(&self) -> bool {
        self.lanes.iter().any(|l| {
            matches!(l.state.load(Ordering::SeqCst), HOLDING | CONNECTING)
                || l.outstanding.load(Ordering::SeqCst)
                || l.carrying.load(Ordering::SeqCst)
        })
    }
}

/// A configured worker, not yet running.
pub struct Worker {
    shared: Arc<Shared>,
    handler: Arc<dyn Handler>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("cfg", &self.shared.cfg)
            .finish()
    }
}

/// Stops a worker or reads its counters, from any thread (a signal handler's, say).
#[derive(Clone)]
pub struct Control {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control")
            .field("stopping", &self.is_stopping())
            .finish()
    }
}

impl Control {
    /// Stop taking jobs; running jobs finish and are settled, then the threads
    /// end. Prefetched jobs that have not started are given back at once.
    pub fn shutdown(&self) {
        self.shared.shutdown();
        self.shared.release_unstarted();
    }

    /// Stop at once: handlers see [`Job::aborting`](crate::Job::aborting), and every running job that
    /// is not done is released without delay.
    pub fn abort(&self) {
        self.shared.abort.store(true, Ordering::SeqCst);
        self.shared.shutdown();
        self.shared.release_unstarted();
    }

    /// True once a shutdown was asked for (or `max_jobs` / idle exit reached).
    pub fn is_stopping(&self) -> bool {
        self.shared.stop.load(Ordering::SeqCst)
    }

    /// The counters now.
    pub fn counters(&self) -> Snapshot {
        self.shared.counters.snapshot()
    }
}

/// A worker whose threads are running.
#[derive(Debug)]
pub struct Running {
    control: Control,
    threads: Vec<JoinHandle<()>>,
}

impl Worker {
    /// Checks the settings and prepares a worker running `handler` on each job.
    pub fn new<H: Handler>(mut cfg: Config, handler: H) -> Result<Worker, ConfigError> {
        cfg.validate()?;
        cfg.lift_credentials();
        let lanes = (0..cfg.concurrency * cfg.servers.len())
            .map(|_| LaneShared {
                state: AtomicU8::new(IDLE),
                outstanding: AtomicBool::new(false),
                carrying: AtomicBool::new(false),
                cut: Mutex::new(None),
                keeper: Mutex::new(None),
            })
            .collect();
        let tickets = AtomicU64::new(cfg.max_jobs.unwrap_or(0));
        Ok(Worker {
            shared: Arc::new(Shared {
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
            }),
            handler: Arc::new(handler),
        })
    }

    /// A handle to stop the worker, usable before and after [`start`](Self::start).
    pub fn control(&self) -> Control {
        Control {
            shared: self.shared.clone(),
        }
    }

    /// Starts the threads.
    pub fn start(self) -> Running {
        let threads = (0..self.shared.cfg.concurrency)
            .map(|t| {
                let shared = self.shared.clone();
                let handler = self.handler.clone();
                std::thread::Builder::new()
                    .name(format!("taskq-worker-{t}"))
                    .spawn(move || match shared.cfg.engine() {
                        Ok(taskq_proto::Engine::Nats) => {
                            Lanes::<Nats>::new(shared, handler, t).run()
                        }
                        _ => Lanes::<Beanstalkd>::new(shared, handler, t).run(),
                    })
                    .expect("spawning a worker thread")
            })
            .collect();
        Running {
            control: self.control(),
            threads,
        }
    }

    /// Runs until stopped (by a [`Control`], `max_jobs` or `exit_when_idle`) and
    /// returns the final counters.
    pub fn run(self) -> Snapshot {
        self.start().join()
    }
}

impl Running {
    /// A handle to stop the worker.
    pub fn control(&self) -> Control {
        self.control.clone()
    }

    /// Waits for every thread to end, stopping the worker when it has been idle
    /// for `exit_when_idle`, and returns the final counters. With prefetch it
    /// also keeps the leases of jobs waiting behind a long job.
    pub fn join(self) -> Snapshot {
        let shared = &self.control.shared;
        while !self.threads.iter().all(|t| t.is_finished()) {
            if let Some(idle) = shared.cfg.exit_when_idle {
                let quiet = shared
                    .now_ms()
                    .saturating_sub(shared.last_busy_ms.load(Ordering::Relaxed));
                if !shared.stop.load(Ordering::Relaxed)
                    && quiet >= idle.as_millis() as u64
                    && !shared.working_any()
                {
                    tracing::debug!(idle_ms = quiet, "idle: stopping");
                    shared.shutdown();
                }
            }
            if shared.cfg.prefetch > 1 {
                shared.keep_waiting_leases();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        for t in self.threads {
            if t.join().is_err() {
                tracing::error!("a worker thread panicked");
            }
        }
        shared.counters.snapshot()
    }
}
