//! The blocking worker: the handles that make, start, stop and join it.
//! It runs the same machines as the async worker (`crate::machine`, one per
//! server, each with its driver), on a small tokio runtime of its own on
//! one thread, and calls the handler on `concurrency` handler threads per
//! server. Jobs taken beyond those (up to `max(concurrency, prefetch)` in
//! flight per server) wait in the handler threads' queue, handed over as
//! soon as they are taken, their leases kept by the driver until a thread
//! runs them (`Shared::hand_ahead`). What each step
//! counts as is in [`account`], the choice of the command that settles a
//! job in [`settle`].

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::config::{Config, ConfigError};
use crate::counters::Snapshot;
use crate::handler::Handler;
use crate::shared::Shared;

pub(crate) mod account;
pub(crate) mod settle;

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
    /// A handle on `shared` (the async worker's).
    pub(crate) fn of(shared: Arc<Shared>) -> Control {
        Control { shared }
    }

    /// Stop taking jobs; running jobs finish and are settled, then the threads
    /// end. Prefetched jobs that have not started are given back at once.
    pub fn shutdown(&self) {
        self.shared.shutdown();
    }

    /// Stop at once: handlers see [`Job::aborting`](crate::Job::aborting), and every running job that
    /// is not done is released without delay.
    pub fn abort(&self) {
        self.shared.abort.store(true, Ordering::SeqCst);
        self.shared.shutdown();
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
    /// The thread of the machines' runtime: their counters at its end.
    thread: JoinHandle<Snapshot>,
}

impl Worker {
    /// Checks the settings and prepares a worker running `handler` on each job.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use taskq_worker::{Config, Job, Outcome, Worker};
    ///
    /// let cfg = Config {
    ///     servers: vec!["nats://127.0.0.1:4222".into()],
    ///     tubes: vec!["emails".into()],
    ///     concurrency: 8,
    ///     exit_when_idle: Some(Duration::from_secs(5)),
    ///     ..Config::default()
    /// };
    /// let worker = Worker::new(cfg, |job: &mut Job<'_>| {
    ///     if job.body().is_empty() { Outcome::Bury } else { Outcome::Done }
    /// })?;
    /// # Ok::<(), taskq_worker::ConfigError>(())
    /// ```
    pub fn new<H: Handler>(mut cfg: Config, handler: H) -> Result<Worker, ConfigError> {
        cfg.validate()?;
        cfg.engine()?;
        cfg.lift_credentials();
        // A handler asks for a beanstalkd job's numbers when it wants them
        // (`Job::attempt`, `Job::tube`, `Job::stats`): none is looked up
        // before it runs, not even when several tubes were watched at once
        // (the shared state's `lazy_lookup`).
        cfg.job_lookup = false;
        Ok(Worker {
            shared: Arc::new(Shared::new(cfg, true)),
            handler: Arc::new(handler),
        })
    }

    /// A handle to stop the worker, usable before and after [`start`](Self::start).
    pub fn control(&self) -> Control {
        Control {
            shared: self.shared.clone(),
        }
    }

    /// Starts the threads: one for the machines (one per server, each
    /// driving its connection) and, for each server, `concurrency` that run
    /// the handler (`taskq-worker-SERVER-K`).
    ///
    /// ```no_run
    /// use taskq_worker::{Config, Job, Outcome, Worker};
    ///
    /// let worker = Worker::new(Config::default(), |_: &mut Job<'_>| Outcome::Done)?;
    /// let running = worker.start();
    /// let control = running.control();
    /// // ... later, from any thread (a signal handler, a shutdown hook):
    /// control.shutdown();
    /// println!("{}", running.join());
    /// # Ok::<(), taskq_worker::ConfigError>(())
    /// ```
    pub fn start(self) -> Running {
        let control = self.control();
        let shared = self.shared;
        let handler = self.handler;
        let thread = std::thread::Builder::new()
            .name("taskq-worker".to_owned())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("the worker's runtime");
                let spawner = crate::async_worker::Blocking::new(handler);
                let counts = rt.block_on(crate::async_worker::run_machines(
                    shared,
                    &spawner,
                    std::future::pending(),
                ));
                spawner.join();
                counts
            })
            .expect("spawning the worker's thread");
        Running { control, thread }
    }

    /// Runs until stopped (by a [`Control`], `max_jobs` or `exit_when_idle`) and
    /// returns the final counters.
    ///
    /// ```no_run
    /// use taskq_worker::{Config, Job, Outcome, Worker};
    ///
    /// let cfg = Config { max_jobs: Some(100), ..Config::default() };
    /// let counts = Worker::new(cfg, |_: &mut Job<'_>| Outcome::Done)?.run();
    /// println!("done {}", counts.deleted);
    /// # Ok::<(), taskq_worker::ConfigError>(())
    /// ```
    pub fn run(self) -> Snapshot {
        self.start().join()
    }
}

impl Running {
    /// A handle to stop the worker.
    pub fn control(&self) -> Control {
        self.control.clone()
    }

    /// Waits for the worker to end (a [`Control`], `max_jobs`, or
    /// `exit_when_idle`: the machines keep the idle rule and the leases of
    /// jobs waiting behind a long one), and returns the final counters.
    pub fn join(self) -> Snapshot {
        match self.thread.join() {
            Ok(counts) => counts,
            Err(_) => {
                tracing::error!("the worker's thread panicked");
                self.control.shared.counters.snapshot()
            }
        }
    }
}
