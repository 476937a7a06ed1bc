//! The worker: the handles that make, start, stop and join it (the state its
//! threads share is in `crate::shared`). Each thread's loop over its servers
//! is in [`lane`], one turn on a lane (reserve, run the handler, settle) in
//! [`turn`], what each step counts as in [`account`], the choice of the
//! command that settles a job in [`settle`], and the window of `prefetch` in
//! [`prefetch`].

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::config::{Config, ConfigError};
use crate::counters::Snapshot;
use crate::handler::Handler;
use crate::shared::Shared;

pub(crate) mod account;
mod lane;
pub(crate) mod prefetch;
pub(crate) mod settle;
mod turn;

use crate::engine::{Beanstalkd, Nats};
use lane::Lanes;

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
    #[cfg(feature = "tokio")]
    pub(crate) fn of(shared: Arc<Shared>) -> Control {
        Control { shared }
    }

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
        cfg.lift_credentials();
        let lanes = cfg.concurrency * cfg.servers.len();
        Ok(Worker {
            shared: Arc::new(Shared::new(cfg, lanes)),
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
        let threads = (0..self.shared.cfg.concurrency)
            .map(|t| {
                let shared = self.shared.clone();
                let handler = self.handler.clone();
                std::thread::Builder::new()
                    .name(format!("taskq-worker-{t}"))
                    .spawn(move || {
                        let sh = shared.clone();
                        match shared.cfg.engine() {
                            Ok(taskq_connect::Engine::Nats) => {
                                Lanes::<Nats>::new(shared, handler, t).run()
                            }
                            _ => Lanes::<Beanstalkd>::new(shared, handler, t).run(),
                        }
                        sh.thread_ended();
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

    /// Waits for every thread to end, stopping the worker when it has been idle
    /// for `exit_when_idle`, and returns the final counters. With prefetch it
    /// also keeps the leases of jobs waiting behind a long job.
    pub fn join(self) -> Snapshot {
        let shared = &self.control.shared;
        *shared.joiner.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::thread::current());
        // A thread that panicked never says it ended: it is finished.
        while shared.ended.load(Ordering::SeqCst) < self.threads.len()
            && !self.threads.iter().all(|t| t.is_finished())
        {
            if let Some(idle) = shared.cfg.exit_when_idle {
                let quiet = shared
                    .now_ms()
                    .saturating_sub(shared.last_busy_ms.load(Ordering::Relaxed));
                if !shared.stop.load(Ordering::Relaxed)
                    && crate::shared::idle_over(
                        Duration::from_millis(quiet),
                        idle,
                        shared.working_any(),
                    )
                {
                    tracing::debug!(idle_ms = quiet, "idle: stopping");
                    shared.shutdown();
                }
            }
            if shared.cfg.prefetch > 1 {
                shared.keep_waiting_leases();
            }
            // A thread that ends wakes this one: the join returns at once.
            std::thread::park_timeout(Duration::from_millis(10));
        }
        for t in self.threads {
            if t.join().is_err() {
                tracing::error!("a worker thread panicked");
            }
        }
        shared.counters.snapshot()
    }
}
