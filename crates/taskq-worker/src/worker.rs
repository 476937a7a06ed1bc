//! The worker loop: reserve in short slices, run the handler, settle the job,
//! and keep going through broken connections until told to stop.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use taskq_proto::{Command, CommandKind, Connection, Error, Interrupter, IoCounts, Reply};

use crate::config::{Config, ConfigError};
use crate::counters::{Counters, Snapshot};
use crate::fair::{Schedule, Want};
use crate::job::{job_info, Job, JobError};
use crate::{Handler, Outcome};

/// A lane's connection waits for nothing, or the thread is between requests.
const IDLE: u8 = 0;
/// A reserve is in flight on the lane and it holds no job: safe to cut.
const RESERVING: u8 = 1;
/// The lane holds a job.
const HOLDING: u8 = 2;

/// Longest nap of a thread that has nothing to do (all servers backing off, or no
/// `max_jobs` ticket free), so that it notices a stop soon.
const NAP: Duration = Duration::from_millis(50);

/// State shared by the threads of one worker and its [`Control`] handles.
pub(crate) struct Shared {
    pub(crate) cfg: Config,
    pub(crate) counters: Counters,
    pub(crate) stop: AtomicBool,
    pub(crate) abort: AtomicBool,
    /// One per (thread, server), thread-major.
    lanes: Vec<LaneShared>,
    started: Instant,
    /// Milliseconds after `started` of the last reserved job.
    last_reserved_ms: AtomicU64,
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
    cut: Mutex<Option<Interrupter>>,
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

    fn take_ticket(&self) -> bool {
        if self.cfg.max_jobs.is_none() {
            return true;
        }
        self.tickets
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| t.checked_sub(1))
            .is_ok()
    }

    fn give_ticket(&self) {
        if self.cfg.max_jobs.is_some() {
            self.tickets.fetch_add(1, Ordering::AcqRel);
        }
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn holding_any(&self) -> bool {
        self.lanes
            .iter()
            .any(|l| l.state.load(Ordering::SeqCst) == HOLDING)
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
    /// Stop taking jobs; running jobs finish and are settled, then the threads end.
    pub fn shutdown(&self) {
        self.shared.shutdown();
    }

    /// Stop at once: handlers see [`Job::aborting`], and every running job that
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
    threads: Vec<JoinHandle<()>>,
}

impl Worker {
    /// Checks the settings and prepares a worker running `handler` on each job.
    pub fn new<H: Handler>(cfg: Config, handler: H) -> Result<Worker, ConfigError> {
        cfg.validate()?;
        let lanes = (0..cfg.concurrency * cfg.servers.len())
            .map(|_| LaneShared {
                state: AtomicU8::new(IDLE),
                cut: Mutex::new(None),
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
                last_reserved_ms: AtomicU64::new(0),
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
                    .spawn(move || Lanes::new(shared, handler, t).run())
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
    /// for `exit_when_idle`, and returns the final counters.
    pub fn join(self) -> Snapshot {
        let shared = &self.control.shared;
        while !self.threads.iter().all(|t| t.is_finished()) {
            if let Some(idle) = shared.cfg.exit_when_idle {
                let quiet = shared
                    .now_ms()
                    .saturating_sub(shared.last_reserved_ms.load(Ordering::Relaxed));
                if !shared.stop.load(Ordering::Relaxed)
                    && quiet >= idle.as_millis() as u64
                    && !shared.holding_any()
                {
                    tracing::debug!(idle_ms = quiet, "idle: stopping");
                    shared.shutdown();
                }
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

/// One server as one thread sees it.
struct Lane {
    server: usize,
    conn: Option<Connection>,
    /// Consecutive failed connects (or connections that broke before any reply).
    failures: u32,
    retry_at: Instant,
    ever_connected: bool,
    /// The current connection got at least one reply after setup.
    progress: bool,
    /// Weighted tubes: this connection's place in the cycle.
    sched: Option<Schedule>,
    /// The connection's system calls already added to the counters.
    io_seen: IoCounts,
}

/// The reserve in flight, and the `watch`/`ignore` replies that come before its own.
#[derive(Debug, Clone, Copy)]
struct Pending {
    watch_replies: usize,
    timeout: u32,
}

/// How a lane's turn ended.
enum After {
    /// Reserve again on the same lane.
    Again,
    /// No job there within the slice: try the next server.
    Next,
    /// The connection broke; it was dropped.
    Broken,
    /// The worker is stopping.
    Stop,
}

/// The thread's side: its lanes, the handler, and the reused body buffer.
struct Lanes {
    shared: Arc<Shared>,
    handler: Arc<dyn Handler>,
    thread: usize,
    lanes: Vec<Lane>,
    body: Vec<u8>,
}

impl Lanes {
    fn new(shared: Arc<Shared>, handler: Arc<dyn Handler>, thread: usize) -> Lanes {
        let now = Instant::now();
        let lanes = (0..shared.cfg.servers.len())
            .map(|server| Lane {
                server,
                conn: None,
                failures: 0,
                retry_at: now,
                ever_connected: false,
                progress: false,
                sched: shared
                    .cfg
                    .is_weighted()
                    .then(|| Schedule::new(&shared.cfg.weights, shared.cfg.run_scale, thread)),
                io_seen: IoCounts::default(),
            })
            .collect();
        Lanes {
            shared,
            handler,
            thread,
            lanes,
            body: Vec::new(),
        }
    }

    fn lane_shared(&self, server: usize) -> &LaneShared {
        &self.shared.lanes[self.thread * self.lanes.len() + server]
    }

    fn run(mut self) {
        let m = self.lanes.len();
        // Threads start on different servers so that all are covered at once.
        let mut cur = self.thread % m;
        while !self.shared.stop.load(Ordering::SeqCst) {
            let now = Instant::now();
            let ready = (0..m)
                .map(|k| (cur + k) % m)
                .find(|&i| self.lanes[i].conn.is_some() || self.lanes[i].retry_at <= now);
            let Some(i) = ready else {
                // Every server is backing off: sleep, costing no CPU.
                let next = self.lanes.iter().map(|l| l.retry_at).min().unwrap_or(now);
                std::thread::sleep(next.saturating_duration_since(now).min(NAP));
                continue;
            };
            cur = i;
            if self.lanes[i].conn.is_none() && !self.connect(i) {
                cur = (i + 1) % m;
                continue;
            }
            if !self.shared.take_ticket() {
                std::thread::sleep(NAP / 5);
                continue;
            }
            match self.serve(i) {
                After::Again => {}
                After::Next => cur = (i + 1) % m,
                After::Broken => {
                    self.broke(i);
                    cur = (i + 1) % m;
                }
                After::Stop => break,
            }
        }
        for i in 0..m {
            self.lane_shared(i).state.store(IDLE, Ordering::SeqCst);
            if let Some(c) = self.lanes[i].conn.take() {
                account_io(&self.shared.counters, &c, &mut self.lanes[i].io_seen);
                c.quit();
            }
        }
    }

    /// Opens the lane's connection and restores its watch list; on failure, sets
    /// the next attempt with capped exponential backoff and full jitter.
    fn connect(&mut self, i: usize) -> bool {
        let sh = &*self.shared;
        let addr = sh.cfg.servers[self.lanes[i].server].as_str();
        let pcfg = taskq_proto::Config {
            connect_timeout: sh.cfg.connect_timeout,
            io_timeout: sh.cfg.io_timeout,
            limits: sh.cfg.limits,
            ..taskq_proto::Config::default()
        };
        let result = Connection::connect(addr, pcfg).and_then(|mut c| {
            restore_watch(&mut c, &sh.cfg.tubes)?;
            Ok(c)
        });
        let lane = &mut self.lanes[i];
        match result {
            Ok(conn) => {
                if let Ok(cut) = conn.interrupter() {
                    *self.shared.lanes[self.thread * self.shared.cfg.servers.len() + i]
                        .cut
                        .lock()
                        .unwrap_or_else(|e| e.into_inner()) = Some(cut);
                }
                if lane.ever_connected {
                    Counters::add(&sh.counters.reconnects);
                    tracing::warn!(server = addr, "reconnected");
                }
                lane.ever_connected = true;
                lane.progress = false;
                lane.io_seen = IoCounts::default();
                account_io(&sh.counters, &conn, &mut lane.io_seen);
                if let Some(s) = lane.sched.as_mut() {
                    s.watching_all();
                }
                lane.conn = Some(conn);
                true
            }
            Err(e) => {
                Counters::add(&sh.counters.connect_failures);
                if e.is_timeout() {
                    Counters::add(&sh.counters.io_timeouts);
                }
                let wait = sh.cfg.reconnect_backoff.jittered(lane.failures);
                if lane.failures == 0 {
                    tracing::warn!(server = addr, error = %e, "cannot connect; backing off");
                } else {
                    tracing::debug!(server = addr, error = %e, ?wait, "cannot connect");
                }
                lane.failures = lane.failures.saturating_add(1);
                lane.retry_at = Instant::now() + wait;
                false
            }
        }
    }

    /// Drops a broken connection. The first reconnect is immediate; a connection
    /// that broke before any reply counts as a failure, so a server that cuts
    /// every connection is retried with backoff, not in a tight loop.
    fn broke(&mut self, i: usize) {
        self.lane_shared(i).state.store(IDLE, Ordering::SeqCst);
        let lane = &mut self.lanes[i];
        if let Some(c) = lane.conn.take() {
            account_io(&self.shared.counters, &c, &mut lane.io_seen);
        }
        if lane.progress {
            lane.failures = 0;
            lane.retry_at = Instant::now();
        } else {
            let wait = self.shared.cfg.reconnect_backoff.jittered(lane.failures);
            lane.failures = lane.failures.saturating_add(1);
            lane.retry_at = Instant::now() + wait;
        }
    }

    /// Reserves and works jobs on lane `i` while it yields them. Holds one
    /// `max_jobs` ticket on entry, for the first reserve.
    fn serve(&mut self, i: usize) -> After {
        let sh = &*self.shared;
        let ls = &sh.lanes[self.thread * self.lanes.len() + i];
        let lane = &mut self.lanes[i];
        let server = sh.cfg.servers[lane.server].as_str();
        let Some(conn) = lane.conn.as_mut() else {
            sh.give_ticket();
            return After::Broken;
        };
        let slice = sh.cfg.reserve_secs();
        let tubes = &sh.cfg.tubes;
        let mut pending =
            match queue_reserve(conn, lane.sched.as_mut(), tubes, slice).and_then(|p| {
                conn.flush()?;
                Ok(p)
            }) {
                Ok(p) => p,
                Err(e) => {
                    sh.give_ticket();
                    return failed(sh, server, None, &e);
                }
            };
        loop {
            // A reserve is in flight, and a ticket is held for it.
            ls.state.store(RESERVING, Ordering::SeqCst);
            account_io(&sh.counters, conn, &mut lane.io_seen);
            if sh.stop.load(Ordering::SeqCst) {
                ls.state.store(IDLE, Ordering::SeqCst);
                sh.give_ticket();
                // Closing returns any job the server hands out meanwhile.
                lane.conn = None;
                return After::Stop;
            }
            if let Err(after) = recv_watching(sh, conn, server, pending.watch_replies) {
                ls.state.store(IDLE, Ordering::SeqCst);
                sh.give_ticket();
                if sh.stop.load(Ordering::SeqCst) {
                    lane.conn = None;
                    return After::Stop;
                }
                return after;
            }
            pending.watch_replies = 0;
            let reserve = CommandKind::ReserveWithTimeout {
                timeout: pending.timeout,
            };
            let id = match conn.recv(reserve) {
                Ok(Reply::Reserved { id, body }) => {
                    self.body.clear();
                    self.body.extend_from_slice(body);
                    id
                }
                Ok(Reply::TimedOut) if pending.timeout == 0 => {
                    // Weighted: the tube whose turn it is has no ready job. Fall
                    // back to all of them, waiting; the ticket stays held.
                    lane.progress = true;
                    if let Some(s) = lane.sched.as_mut() {
                        s.empty();
                    }
                    match queue_reserve(conn, lane.sched.as_mut(), tubes, slice).and_then(|p| {
                        conn.flush()?;
                        Ok(p)
                    }) {
                        Ok(p) => pending = p,
                        Err(e) => {
                            ls.state.store(IDLE, Ordering::SeqCst);
                            sh.give_ticket();
                            return failed(sh, server, None, &e);
                        }
                    }
                    continue;
                }
                Ok(Reply::TimedOut) => {
                    ls.state.store(IDLE, Ordering::SeqCst);
                    lane.progress = true;
                    Counters::add(&sh.counters.reserve_timeouts);
                    sh.give_ticket();
                    return if self.lanes.len() > 1 {
                        After::Next
                    } else {
                        After::Again
                    };
                }
                Ok(Reply::DeadlineSoon) => {
                    // Only a connection holding a job near its TTR gets this; ours
                    // holds none while it reserves. Not an error: ask again.
                    ls.state.store(IDLE, Ordering::SeqCst);
                    lane.progress = true;
                    Counters::add(&sh.counters.deadline_soon);
                    sh.give_ticket();
                    return After::Again;
                }
                Ok(r) => {
                    let word = r.word();
                    ls.state.store(IDLE, Ordering::SeqCst);
                    sh.give_ticket();
                    return unexpected(sh, conn, server, None, word);
                }
                Err(e) => {
                    ls.state.store(IDLE, Ordering::SeqCst);
                    sh.give_ticket();
                    if sh.stop.load(Ordering::SeqCst) {
                        lane.conn = None;
                        return After::Stop;
                    }
                    return failed(sh, server, None, &e);
                }
            };
            ls.state.store(HOLDING, Ordering::SeqCst);
            lane.progress = true;
            if let Some(s) = lane.sched.as_mut() {
                s.taken();
            }
            Counters::add(&sh.counters.reserved);
            sh.last_reserved_ms.store(sh.now_ms(), Ordering::Relaxed);

            let outcome = if sh.stop.load(Ordering::SeqCst) {
                // Reserved after the stop: give it back untouched.
                Outcome::Retry {
                    delay: Duration::ZERO,
                }
            } else {
                let mut job = Job {
                    id,
                    body: &self.body,
                    conn,
                    server,
                    shared: sh,
                };
                self.handler.handle(&mut job)
            };
            if conn.is_broken() {
                // A touch or stats lookup broke the connection: the server
                // puts the job back when it notices the close.
                ls.state.store(IDLE, Ordering::SeqCst);
                Counters::add(&sh.counters.lease_dropped);
                sh.give_ticket();
                tracing::warn!(job = id, server, "connection broke while the job ran");
                return After::Broken;
            }
            let settle = match decide(sh, conn, lane.server, id, outcome) {
                Ok(cmd) => cmd,
                Err(JobError::LeaseLost) => {
                    ls.state.store(IDLE, Ordering::SeqCst);
                    Counters::add(&sh.counters.lost_lease_on_release);
                    sh.give_ticket();
                    tracing::warn!(job = id, server, "lease lost: job no longer ours");
                    if sh.stop.load(Ordering::SeqCst) || !sh.take_ticket() {
                        return After::Again;
                    }
                    match queue_reserve(conn, lane.sched.as_mut(), tubes, slice).and_then(|p| {
                        conn.flush()?;
                        Ok(p)
                    }) {
                        Ok(p) => pending = p,
                        Err(e) => {
                            sh.give_ticket();
                            return failed(sh, server, None, &e);
                        }
                    }
                    continue;
                }
                Err(e) => {
                    ls.state.store(IDLE, Ordering::SeqCst);
                    Counters::add(&sh.counters.lease_dropped);
                    sh.give_ticket();
                    conn.mark_broken();
                    tracing::warn!(job = id, server, error = %e, "cannot settle job");
                    return After::Broken;
                }
            };
            // Pipelining: the job's outcome and the next reserve go out in one
            // write, unless the worker is stopping.
            let next = !sh.stop.load(Ordering::SeqCst) && sh.take_ticket();
            let sent = conn.queue(&settle).and_then(|()| {
                if next {
                    pending = queue_reserve(conn, lane.sched.as_mut(), tubes, slice)?;
                }
                conn.flush()
            });
            let is_delete = matches!(settle, Command::Delete { .. });
            if let Err(e) = sent {
                ls.state.store(IDLE, Ordering::SeqCst);
                conn.clear_queue();
                sh.give_ticket();
                if next {
                    sh.give_ticket();
                }
                if is_delete && !e.not_sent() {
                    Counters::add(&sh.counters.ack_unknown);
                } else {
                    Counters::add(&sh.counters.lease_dropped);
                }
                return failed(sh, server, Some(id), &e);
            }
            let reply = conn.recv(settle.kind());
            ls.state.store(IDLE, Ordering::SeqCst);
            match reply {
                Ok(Reply::Deleted) => {
                    let done = sh.counters.deleted.fetch_add(1, Ordering::Relaxed) + 1;
                    if sh.cfg.max_jobs.is_some_and(|max| done >= max) {
                        sh.shutdown();
                    }
                }
                Ok(Reply::Released) => {
                    Counters::add(&sh.counters.released);
                    sh.give_ticket();
                }
                Ok(Reply::Buried) => {
                    Counters::add(&sh.counters.buried);
                    sh.give_ticket();
                }
                Ok(Reply::NotFound) => {
                    // Only a delete's NOT_FOUND is a `lost_lease`: that is the
                    // count the server's `cmd-delete` is checked against.
                    Counters::add(if is_delete {
                        &sh.counters.lost_lease
                    } else {
                        &sh.counters.lost_lease_on_release
                    });
                    sh.give_ticket();
                    tracing::warn!(
                        job = id,
                        server,
                        command = settle.kind().name(),
                        "lease lost: NOT_FOUND"
                    );
                }
                other => {
                    sh.give_ticket();
                    if next {
                        sh.give_ticket();
                    }
                    if is_delete {
                        Counters::add(&sh.counters.ack_unknown);
                    } else {
                        Counters::add(&sh.counters.lease_dropped);
                    }
                    return match other {
                        Ok(r) => {
                            let word = r.word();
                            unexpected(sh, conn, server, Some(id), word)
                        }
                        Err(e) => failed(sh, server, Some(id), &e),
                    };
                }
            }
            if !next {
                return if sh.stop.load(Ordering::SeqCst) {
                    After::Stop
                } else {
                    After::Again
                };
            }
        }
    }
}

/// Queues the next reserve: in strict mode one `reserve-with-timeout` for a
/// slice; with weighted tubes, the `watch`/`ignore` commands the schedule needs
/// first (in the same write) and a reserve that waits only in a fallback run.
fn queue_reserve(
    conn: &mut Connection,
    sched: Option<&mut Schedule>,
    tubes: &[String],
    slice: u32,
) -> Result<Pending, Error> {
    let (watch_replies, timeout) = match sched {
        None => (0, slice),
        Some(s) => {
            let want = s.want();
            let n = s.switch(want, |watch, k| {
                let tube = tubes[k].as_str();
                conn.queue(&if watch {
                    Command::Watch { tube }
                } else {
                    Command::Ignore { tube }
                })
            })?;
            (n, if want == Want::All { slice } else { 0 })
        }
    };
    conn.queue(&Command::ReserveWithTimeout { timeout })?;
    Ok(Pending {
        watch_replies,
        timeout,
    })
}

/// Reads the replies to pipelined `watch`/`ignore` commands.
fn recv_watching(sh: &Shared, conn: &mut Connection, server: &str, n: usize) -> Result<(), After> {
    for _ in 0..n {
        match conn.recv(CommandKind::Watch) {
            Ok(Reply::Watching { .. }) => {}
            Ok(r) => {
                let word = r.word();
                return Err(unexpected(sh, conn, server, None, word));
            }
            Err(e) => return Err(failed(sh, server, None, &e)),
        }
    }
    Ok(())
}

/// Adds the system calls a connection made since the last call to the counters.
fn account_io(counters: &Counters, conn: &Connection, seen: &mut IoCounts) {
    let now = conn.io_counts();
    counters
        .writes
        .fetch_add(now.writes - seen.writes, Ordering::Relaxed);
    counters
        .reads
        .fetch_add(now.reads - seen.reads, Ordering::Relaxed);
    *seen = now;
}

/// Watches the configured tubes and ignores `default` unless listed, in one write.
fn restore_watch(conn: &mut Connection, tubes: &[String]) -> Result<(), Error> {
    for t in tubes {
        conn.queue(&Command::Watch { tube: t })?;
    }
    let ignore_default = !tubes.iter().any(|t| t == "default");
    if ignore_default {
        conn.queue(&Command::Ignore { tube: "default" })?;
    }
    conn.flush()?;
    let replies = tubes.len() + usize::from(ignore_default);
    for _ in 0..replies {
        match conn.recv(CommandKind::Watch)? {
            Reply::Watching { .. } => {}
            r => {
                let word = r.word();
                tracing::warn!(server = %conn.peer_addr(), reply = word, "unexpected reply to watch");
                conn.mark_broken();
                return Err(Error::Broken);
            }
        }
    }
    Ok(())
}

/// The command that settles a job. Anything but a delete needs the job's
/// priority (and for `Fail`, its release count): one `stats-job` on that rare path.
fn decide(
    sh: &Shared,
    conn: &mut Connection,
    server: usize,
    id: u64,
    outcome: Outcome,
) -> Result<Command<'static>, JobError> {
    let aborting = sh.abort.load(Ordering::SeqCst);
    let outcome = match outcome {
        Outcome::Done => {
            if sh.tempfails_any.load(Ordering::Relaxed) {
                forget_tempfails(sh, server, id);
            }
            return Ok(Command::Delete { id });
        }
        // Aborting: whatever is not done goes back now.
        _ if aborting => Outcome::Retry {
            delay: Duration::ZERO,
        },
        o => o,
    };
    let info = job_info(conn, id, sh).inspect_err(|e| {
        if matches!(e, JobError::Unexpected { .. }) {
            conn.mark_broken();
        }
    })?;
    let release = |delay: Duration| Command::Release {
        id,
        pri: info.pri,
        delay: taskq_proto::secs_ceil(delay),
    };
    Ok(match outcome {
        Outcome::Retry { delay } => {
            note_tempfail(sh, server, id);
            release(delay)
        }
        Outcome::TempFail => {
            note_tempfail(sh, server, id);
            let n = u32::try_from(info.releases).unwrap_or(u32::MAX);
            release(sh.cfg.retry_backoff.ceiling(n))
        }
        Outcome::Bury => {
            forget_tempfails(sh, server, id);
            Command::Bury { id, pri: info.pri }
        }
        _ => {
            let temp = if sh.tempfails_any.load(Ordering::Relaxed) {
                let map = sh.tempfails.lock().unwrap_or_else(|e| e.into_inner());
                u64::from(map.get(&(server, id)).copied().unwrap_or(0))
            } else {
                0
            };
            // This attempt plus the earlier failed ones: releases not made for a
            // temporary failure by this process.
            let attempts = info.releases.saturating_sub(temp) + 1;
            if attempts >= u64::from(sh.cfg.max_attempts) {
                forget_tempfails(sh, server, id);
                tracing::warn!(job = id, attempts, "burying after the last attempt");
                Command::Bury { id, pri: info.pri }
            } else {
                let n = u32::try_from(attempts - 1).unwrap_or(u32::MAX);
                release(sh.cfg.retry_backoff.ceiling(n))
            }
        }
    })
}

fn note_tempfail(sh: &Shared, server: usize, id: u64) {
    let mut map = sh.tempfails.lock().unwrap_or_else(|e| e.into_inner());
    // Bounded: a job forgotten here at worst counts a retry as an attempt.
    if map.len() >= 100_000 {
        map.clear();
    }
    *map.entry((server, id)).or_insert(0) += 1;
    sh.tempfails_any.store(true, Ordering::Relaxed);
}

fn forget_tempfails(sh: &Shared, server: usize, id: u64) {
    let mut map = sh.tempfails.lock().unwrap_or_else(|e| e.into_inner());
    map.remove(&(server, id));
    if map.is_empty() {
        sh.tempfails_any.store(false, Ordering::Relaxed);
    }
}

/// A request failed: count a timeout or an undecodable reply, log, and give up the connection.
fn failed(sh: &Shared, server: &str, job: Option<u64>, e: &Error) -> After {
    if e.is_timeout() {
        Counters::add(&sh.counters.io_timeouts);
    }
    if matches!(e, Error::Protocol(_)) {
        // A garbage line, or a reply word that cannot answer the command.
        Counters::add(&sh.counters.unexpected_replies);
    }
    match job {
        Some(id) => tracing::warn!(job = id, server, error = %e, "connection failed"),
        None => tracing::warn!(server, error = %e, "connection failed"),
    }
    After::Broken
}

/// A reply that cannot answer the request: the stream is out of step.
fn unexpected(
    sh: &Shared,
    conn: &mut Connection,
    server: &str,
    job: Option<u64>,
    word: &str,
) -> After {
    Counters::add(&sh.counters.unexpected_replies);
    conn.mark_broken();
    match job {
        Some(id) => tracing::warn!(job = id, server, reply = word, "unexpected reply"),
        None => tracing::warn!(server, reply = word, "unexpected reply"),
    }
    After::Broken
}
