//! The worker's rules for one connection to one server, with no socket and
//! no clock: a state machine that a driver feeds with what happened (a
//! connection opened or broke, a reply came, a handler finished, a handler
//! asked to touch its job) and the time it happened, and that says what to
//! send next ([`Machine::transmit`]) and when it next wants to be woken
//! ([`Machine::poll_timeout`], [`Machine::handle_timeout`]).
//!
//! It keeps:
//! - the window: up to `concurrency` jobs in flight, each in a slot; no-wait
//!   reserves (`reserve-with-timeout 0`) ask for the free room, pipelined
//!   with the settles; when the server had nothing ready it is probed again
//!   after a short wait that doubles (up to the reserve slice) while jobs
//!   run, and, once nothing runs and nothing is owed, one blocking reserve
//!   waits for a slice, so an empty queue costs one request per slice and a
//!   blocking reserve never holds a settle or a touch behind it;
//! - the lookup: each job taken is looked up (`stats-job`, in the next
//!   write) before its handler starts, so that the handler is told its tube
//!   and attempt without a wait, and the settle has the job's numbers
//!   (unless `Config::job_lookup` is off: then a job whose reserve watched
//!   one tube starts at once, and only a settle that needs the numbers asks
//!   for them; with several tubes watched at once, the lookup still tells
//!   the tube);
//! - settling: the settle rule of `worker::settle` (a job done is deleted;
//!   any other outcome releases with the backoff or buries after
//!   `max_attempts`, by the job's numbers, asked for first where the job was
//!   not looked up: one over the limit, or taken after a stop), and what
//!   each reply counts as ([`Settled`] and the tally of `worker::account`):
//!   done only on `DELETED`;
//! - `max_jobs`: each reserve takes one of the worker's shared tickets;
//! - leases: a handler's touch (and a lookup it asks for, `stats`) goes
//!   out in the next write and its answer comes back to that handler
//!   ([`Machine::answered`]);
//! - weighted tubes: the reserves follow `fair::Schedule`;
//! - the reply deadline is the session's (`Session::poll_timeout`: the I/O
//!   timeout, plus a blocking reserve's slice, after the reply was first
//!   waited for); the driver wakes at the earlier of it and the machine's
//!   own deadlines, and a reply overdue ([`Machine::reply_overdue`]) breaks
//!   the connection;
//! - the reconnect rule (`taskq_proto::Reconnect`): at once after progress,
//!   else with the capped, jittered backoff;
//! - the idle exit and the stop: whether this connection is idle
//!   ([`Machine::is_idle`], by `shared::idle_over`); no reserve after a
//!   stop, and a job taken and not started goes back untouched; the jobs
//!   running finish and are settled; then the machine is done.
//!
//! Jobs running when their connection breaks go back to the server by
//! themselves (beanstalkd puts back a closed connection's jobs): they are
//! counted `lease_dropped` at the break, and their handlers' outcomes are
//! dropped when they end. Their slots stay taken until then, so the jobs in
//! flight never exceed the window. A job taken and not yet started frees
//! its slot at the break.
//!
//! The request and reply words are beanstalkd's; JetStream's pulls and
//! confirmed acks are [`js::JsMachine`]'s, which keeps the same rules.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use taskq_proto::{ConnectionError, Reconnect};

use crate::counters::Counters;
use crate::engine::{Fault, Req, Settle, SettleReply, Took};
use crate::failure::Failure;
use crate::fair::Schedule;
use crate::handler::Outcome;
use crate::job::JobError;
use crate::job_info::JobInfo;
use crate::machine::lease::{Lease, LeaseRule};
use crate::shared::Shared;
use crate::worker::settle::{settle_with_info, settle_without_info, Settled};

/// The first wait before probing again a server that had nothing ready
/// while jobs run; it doubles up to the reserve slice.
pub(crate) const PROBE_MIN: Duration = Duration::from_millis(10);

/// With `max_jobs`: how soon a machine that found no ticket free looks
/// again (another server's machine may give one back).
pub(crate) const TICKET_RETRY: Duration = Duration::from_millis(10);

/// With `max_jobs`: how long a machine whose blocking reserve came back
/// empty leaves its ticket free before taking it again, so that another
/// server's machine, which may have jobs to reserve, can take it.
pub(crate) const TICKET_YIELD: Duration = Duration::from_millis(50);

/// The jobs one connection of the async worker holds at once (both
/// machines): `concurrency` running, and with a larger `prefetch`, that
/// many in all, the rest waiting for a handler (see `Held`).
pub(crate) fn window(cfg: &crate::Config) -> usize {
    cfg.concurrency.max(cfg.prefetch)
}

/// What both machines keep alike of a connection's life: whether it is
/// up, the reconnect rule (`taskq_proto::Reconnect`: at once after
/// progress, else the capped, jittered backoff), and the idle clock.
#[derive(Debug)]
pub(crate) struct Lifecycle {
    pub(crate) up: bool,
    ever_up: bool,
    /// The last connect failed: the server cannot be reached now.
    pub(crate) unreachable: bool,
    pub(crate) reconnect: Reconnect,
    /// The last moment the worker was busy (a job taken, a connect, jobs
    /// found still out).
    pub(crate) last_busy: Instant,
}

impl Lifecycle {
    pub(crate) fn new(now: Instant) -> Lifecycle {
        Lifecycle {
            up: false,
            ever_up: false,
            unreachable: false,
            reconnect: Reconnect::new(),
            last_busy: now,
        }
    }

    /// Down, and the reconnect rule lets a connect go at `now`.
    pub(crate) fn may_connect(&self, now: Instant) -> bool {
        !self.up && self.reconnect.wait_left(now).is_none()
    }

    /// A connection to server `server` opened at `now`.
    pub(crate) fn connected(&mut self, sh: &Shared, server: usize, now: Instant) {
        if self.ever_up {
            Counters::add(&sh.counters.reconnects);
            tracing::warn!(server = sh.cfg.servers[server].as_str(), "reconnected");
        }
        self.ever_up = true;
        self.up = true;
        self.unreachable = false;
        self.reconnect.opened();
        self.last_busy = now;
    }

    /// A connect to server `server` failed at `now`; `random` spreads the
    /// backoff.
    pub(crate) fn connect_failed(
        &mut self,
        sh: &Shared,
        server: usize,
        now: Instant,
        e: &ConnectionError,
        random: u64,
    ) {
        Counters::add(&sh.counters.connect_failures);
        if e.is_timeout() {
            Counters::add(&sh.counters.io_timeouts);
        }
        // The server's time, not idle time.
        self.last_busy = now;
        self.unreachable = true;
        let first = self.reconnect.failures() == 0;
        self.reconnect
            .connect_failed(&sh.cfg.reconnect_backoff, now, random);
        let name = sh.cfg.servers[server].as_str();
        if first {
            tracing::warn!(server = name, error = %e, "cannot connect; backing off");
        } else {
            tracing::debug!(server = name, error = %e, "cannot connect");
        }
    }

    /// The connection broke at `now`: false when it was down already.
    pub(crate) fn broke(&mut self, sh: &Shared, now: Instant, random: u64) -> bool {
        if !self.up {
            return false;
        }
        self.up = false;
        self.reconnect.broke(&sh.cfg.reconnect_backoff, now, random);
        true
    }

    /// The deadlines of the connection's life at `now`: the next connect
    /// while down, and the idle exit while still ahead (once passed, the
    /// driver asks `is_idle` after each event).
    pub(crate) fn due(&self, sh: &Shared, now: Instant, mut at: impl FnMut(Instant)) {
        if !self.up {
            if let Some(r) = self.reconnect.retry_at() {
                at(r);
            }
        }
        if let Some(idle) = sh.cfg.exit_when_idle {
            let due = self.last_busy + idle;
            if due > now {
                at(due);
            }
        }
    }

    /// The idle-exit rule (`shared::idle_over`) at `now`, for a connection
    /// still `working` or not.
    pub(crate) fn is_idle(&self, sh: &Shared, now: Instant, working: bool) -> bool {
        let Some(idle) = sh.cfg.exit_when_idle else {
            return false;
        };
        crate::shared::idle_over(now.saturating_duration_since(self.last_busy), idle, working)
    }
}

/// Where the requests [`Machine::transmit`] decides go: a driver's
/// encoder for its engine, queued for one write.
pub(crate) trait Sink {
    /// Queues one of the loop's requests.
    fn req(&mut self, req: Req<'_>) -> Result<(), ConnectionError>;
    /// Queues a lookup of job `id` (`stats-job`).
    fn info(&mut self, id: u64) -> Result<(), ConnectionError>;
}

/// A reply the driver read and decoded, for the request at the front of
/// the pipeline ([`Machine::expect`] says which kind that is).
#[derive(Debug)]
pub(crate) enum Answer<'a> {
    /// To a reserve.
    Took(Result<Took<'a>, Fault>),
    /// To a settle.
    Settled(Result<SettleReply, Fault>),
    /// To a touch: `Ok(false)` when the job was no longer ours.
    Touched(Result<bool, Fault>),
    /// To a lookup: `Ok(None)` when the job was no longer ours.
    Info(Result<Option<JobInfo>, Fault>),
}

/// The kind of reply owed next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expect {
    /// A reserve's.
    Took,
    /// A settle's.
    Settled,
    /// A touch's.
    Touched,
    /// A lookup's.
    Info,
}

/// A job taken into a slot: the driver keeps the body of the reply just
/// given to [`Machine::on_reply`] (still borrowed by the driver) for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Start {
    /// The slot it runs in (`0..concurrency`).
    pub(crate) slot: usize,
    /// The job's id.
    pub(crate) id: u64,
    /// Its tube (an index into the configured tubes) when it starts
    /// without a lookup and its reserve watched one tube.
    pub(crate) tube: Option<usize>,
    /// It starts now, not looked up; else it is looked up first, or waits
    /// held for a handler.
    pub(crate) run: bool,
}

/// What a reply told the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Nothing for the driver.
    Nothing,
    /// A job was taken into a slot: keep its body (its lookup follows).
    Hold(Start),
    /// A job was taken into a slot and starts now, not looked up
    /// ([`Config::job_lookup`](crate::Config::job_lookup) off, and its
    /// reserve watched one tube, `start.tube`, or the blocking worker's
    /// handler asks for its tube when it wants it, `None`): keep its body
    /// and run it, its attempt not known (0).
    Take(Start),
    /// A lookup a handler asked for (`Asked::Stats`) was answered for the
    /// job in `slot`: keep the tube's name its reply carried, for the
    /// handler that asked.
    Told {
        /// The slot.
        slot: usize,
    },
    /// The job in `slot` was looked up and waits for a handler: keep the
    /// tube's name the lookup's reply carried; it starts by a [`Begin`].
    Wait {
        /// The slot.
        slot: usize,
    },
    /// The job in `slot` was looked up: run it. Its tube's name is the one
    /// the lookup's reply carried; `attempt` counts as `max_attempts` does.
    Run {
        /// The slot.
        slot: usize,
        /// The job.
        id: u64,
        /// This run's attempt number.
        attempt: u32,
    },
}

/// What a handler asks of its job's server while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Asked {
    /// Restart the job's lease.
    Touch,
    /// The job's numbers (`stats-job` on beanstalkd; the delivery's on
    /// JetStream, known without a request).
    Stats,
}

/// The answer to what a handler asked.
#[derive(Debug)]
pub(crate) enum Answered {
    Touch(Result<(), JobError>),
    Stats(Result<JobInfo, JobError>),
}

impl Asked {
    /// The answer when the job's connection broke (or the job is no longer
    /// the slot's).
    pub(crate) fn broken(self) -> Answered {
        let e = JobError::Connection(ConnectionError::Broken);
        match self {
            Asked::Touch => Answered::Touch(Err(e)),
            Asked::Stats => Answered::Stats(Err(e)),
        }
    }
}

/// A reply owed, in the order sent.
#[derive(Debug, Clone, Copy)]
enum Owed {
    /// A reserve; `wait` is what the server may take by design (seconds);
    /// `tube`: the one tube it watched, when it watched one.
    Ask {
        wait: u32,
        tube: Option<usize>,
        sent: Instant,
    },
    Settle {
        id: u64,
        settle: Settle,
    },
    /// A lookup for the settle of a job that ended with `outcome`
    /// (`failure`: how its handler failed, for the bury warning).
    Info {
        id: u64,
        outcome: Outcome,
        failure: Option<Failure>,
    },
    /// A handler's touch of the job in `slot`.
    Touch {
        slot: usize,
        id: u64,
    },
    /// The lookup of the job just taken into `slot`, before it runs.
    Lookup {
        slot: usize,
        id: u64,
    },
    /// A lookup its handler asked for.
    Stats {
        slot: usize,
        id: u64,
    },
    /// A touch of the job held in `slot`, waiting for a handler, sent at
    /// `sent`.
    Keep {
        slot: usize,
        id: u64,
        sent: Instant,
    },
}

/// A request decided and not yet given to the sink.
#[derive(Debug, Clone, Copy)]
enum Out {
    Settle(u64, Settle),
    Info(u64, Outcome, Option<Failure>),
    Ask(usize, u64, Asked),
    Lookup(usize, u64),
    /// A touch of the job held in the slot.
    Keep(usize, u64),
}

/// A job taken and ready, waiting for a handler: the window
/// (`max(concurrency, prefetch)` jobs) holds more jobs than handlers run.
/// It keeps its slot (and its body there) and its lease, by the thread
/// worker's lease rule (`lease::LeaseRule`): touched while it
/// waits, given back unstarted after `HOLD_MAX`, at a stop, or when the
/// server says a lease is about to run out and it cannot be touched.
#[derive(Debug, Clone, Copy)]
struct Held {
    slot: usize,
    id: u64,
    /// When the reserve that brought it was sent.
    asked: Instant,
    /// When its lease last started, at the latest (the reserve's or the
    /// last confirmed touch's send).
    leased: Instant,
    /// How it starts: its attempt once looked up, or its tube when taken
    /// without a lookup (and its reserve watched one).
    attempt: u32,
    tube: Option<usize>,
    looked_up: bool,
    /// A touch of it is owed.
    touching: bool,
    /// Handed to the blocking worker's handler threads already
    /// ([`Shared::hand_ahead`]), waiting in their queue: its lease is kept
    /// here until its thread runs it, but it is never given back from here
    /// (the thread gives it back unrun at a stop).
    handed: bool,
}

/// How a held job goes back unstarted (after `HOLD_MAX`, at a stop): not an
/// attempt of the job's.
pub(crate) const UNSTARTED: Outcome = Outcome::Retry {
    delay: Duration::ZERO,
};

/// A held job handed to a handler that came free: the driver starts it in
/// its slot, where its body is already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Begin {
    pub(crate) slot: usize,
    pub(crate) id: u64,
    /// Its attempt (0 when not known: taken without a lookup).
    pub(crate) attempt: u32,
    /// Its tube, when its reserve watched one (taken without a lookup).
    pub(crate) tube: Option<usize>,
    /// It was looked up: its tube is the one the lookup named, which the
    /// driver kept ([`Step::Wait`]).
    pub(crate) looked_up: bool,
}

/// A slot of the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Free,
    /// Job `id`, reserved on connection `epoch`: its handler runs
    /// (`started`), or it is looked up first. `info`: its numbers, once
    /// looked up (`None` for a job started without its lookup).
    Running {
        id: u64,
        epoch: u64,
        info: Option<JobInfo>,
        started: bool,
        /// When the reserve that brought it was sent.
        asked: Instant,
    },
}

/// One connection's worker rules (see the module docs).
#[derive(Debug)]
pub(crate) struct Machine {
    /// The server's index in the configuration.
    server: usize,
    slots: Vec<Slot>,
    /// Free slots, taken from the end.
    free: Vec<usize>,
    /// Connections opened so far; a job belongs to the one it came on.
    epoch: u64,
    life: Lifecycle,
    owed: VecDeque<Owed>,
    out: VecDeque<Out>,
    /// No-wait reserves owed.
    asks: usize,
    /// A blocking reserve is owed.
    blocking: bool,
    /// The last reserve found nothing ready.
    dry: bool,
    probe_wait: Duration,
    probe_at: Option<Instant>,
    /// With `max_jobs`: no reserve before this (see [`TICKET_RETRY`] and
    /// [`TICKET_YIELD`]).
    ticket_at: Option<Instant>,
    /// No job may be out: the last blocking reserve found none.
    quiet: bool,
    sched: Option<Schedule>,
    /// Answers to what handlers asked: (slot, job, answer).
    answers: VecDeque<(usize, u64, Answered)>,
    /// Handlers that may run at once (`concurrency`); the window, the
    /// slots, may be larger (`prefetch`).
    handlers: usize,
    /// Slots whose handler runs (started, not yet finished).
    busy: usize,
    /// Jobs ready and waiting for a handler, oldest first, and (handed)
    /// jobs waiting in the handler threads' queue.
    held: VecDeque<Held>,
    /// Every job ready is handed on at once ([`Shared::hand_ahead`]).
    hand_ahead: bool,
    /// Handed jobs the server no longer counts as ours (a touch answered
    /// `NOT_FOUND`): (slot, job). Their threads are told not to run them
    /// ([`revoked`](Self::revoked)); each is counted lost once its thread
    /// gives it back, and never settled.
    lost: Vec<(usize, u64)>,
    /// Of those, the ones the driver has not told the threads about yet.
    revoke: VecDeque<(usize, u64)>,
    /// Held jobs handed to handlers, for the driver to start.
    begins: VecDeque<Begin>,
    /// The server answered a reserve `DEADLINE_SOON`: touch the held jobs.
    soon: bool,
}

impl Machine {
    /// A machine for server `server` of `sh`'s configuration, at `now`.
    pub(crate) fn new(sh: &Shared, server: usize, now: Instant) -> Machine {
        let n = window(&sh.cfg);
        Machine {
            server,
            slots: vec![Slot::Free; n],
            free: (0..n).rev().collect(),
            epoch: 0,
            life: Lifecycle::new(now),
            owed: VecDeque::with_capacity(4 * n + 8),
            out: VecDeque::with_capacity(2 * n + 8),
            asks: 0,
            blocking: false,
            dry: false,
            probe_wait: PROBE_MIN,
            probe_at: None,
            ticket_at: None,
            quiet: false,
            sched: sh
                .cfg
                .is_weighted()
                .then(|| Schedule::new(&sh.cfg.weights, sh.cfg.run_scale, server)),
            answers: VecDeque::new(),
            // Handed ahead, every job of the window starts when ready: the
            // handler threads run `concurrency` of them at once.
            handlers: if sh.hand_ahead { n } else { sh.cfg.concurrency },
            busy: 0,
            held: VecDeque::with_capacity(n),
            hand_ahead: sh.hand_ahead,
            lost: Vec::new(),
            revoke: VecDeque::new(),
            begins: VecDeque::with_capacity(n),
            soon: false,
        }
    }

    fn name<'s>(&self, sh: &'s Shared) -> &'s str {
        sh.cfg.servers[self.server].as_str()
    }

    /// Handlers running (jobs of a broken connection included).
    pub(crate) fn running(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// True while a connection is open.
    #[cfg(test)]
    pub(crate) fn is_up(&self) -> bool {
        self.life.up
    }

    /// True when a connect may go now.
    pub(crate) fn wants_connect(&self, sh: &Shared, now: Instant) -> bool {
        self.life.may_connect(now) && !self.is_done(sh)
    }

    /// A connection was opened and set up at `now`.
    pub(crate) fn connected(&mut self, sh: &Shared, now: Instant) {
        self.life.connected(sh, self.server, now);
        self.epoch += 1;
        self.dry = false;
        self.probe_at = None;
        self.probe_wait = PROBE_MIN;
        if let Some(s) = self.sched.as_mut() {
            s.watching_all();
        }
    }

    /// A connect attempt failed at `now`; `random` spreads the backoff.
    pub(crate) fn connect_failed(
        &mut self,
        sh: &Shared,
        now: Instant,
        e: &ConnectionError,
        random: u64,
    ) {
        self.life.connect_failed(sh, self.server, now, e, random);
    }

    /// The connection broke (or was given up) at `now`: every owed reply
    /// and every job held is counted as what it comes to, and the next
    /// connect waits by the reconnect rule. The driver closes the socket.
    pub(crate) fn broke(&mut self, sh: &Shared, now: Instant, random: u64) {
        if !self.life.broke(sh, now, random) {
            return;
        }
        while let Some(o) = self.owed.pop_front() {
            match o {
                Owed::Ask { .. } => sh.give_ticket(),
                Owed::Settle { settle, .. } => {
                    // Written, not answered: a delete may have been carried out.
                    let settled = Settled::unanswered(settle == Settle::Delete);
                    Counters::add(settled.counter(&sh.counters));
                    sh.give_ticket();
                }
                // The job's slot counts it below.
                Owed::Lookup { .. } => {}
                Owed::Info { .. } => {
                    Counters::add(&sh.counters.lease_dropped);
                    sh.give_ticket();
                }
                Owed::Touch { slot, id } => self.cannot_answer(slot, id, Asked::Touch),
                Owed::Stats { slot, id } => self.cannot_answer(slot, id, Asked::Stats),
                // The held job's slot counts it below.
                Owed::Keep { .. } => {}
            }
        }
        while let Some(o) = self.out.pop_front() {
            match o {
                // Never written: the server puts the job back.
                Out::Settle(..) | Out::Info(..) => {
                    Counters::add(&sh.counters.lease_dropped);
                    sh.give_ticket();
                }
                Out::Lookup(..) | Out::Keep(..) => {}
                Out::Ask(slot, id, what) => self.cannot_answer(slot, id, what),
            }
        }
        // Held jobs, and those handed to a handler the driver has not
        // started yet, never ran: their slots are freed below. Jobs handed
        // ahead to the threads' queue and not run yet are the server's
        // again too: their threads are told not to run them (counted
        // `lease_dropped` below, as started jobs; their outcome dropped).
        for h in self.held.iter().filter(|h| h.handed) {
            self.revoke.push_back((h.slot, h.id));
        }
        self.held.clear();
        // A handed job already known lost is counted below with the rest
        // (`lease_dropped`), once.
        self.lost.clear();
        while let Some(b) = self.begins.pop_front() {
            if let Some(Slot::Running { started, .. }) = self.slots.get_mut(b.slot) {
                *started = false;
                self.busy -= 1;
            }
        }
        for k in 0..self.slots.len() {
            let Slot::Running {
                id, epoch, started, ..
            } = self.slots[k]
            else {
                continue;
            };
            if epoch != self.epoch {
                continue;
            }
            Counters::add(&sh.counters.lease_dropped);
            sh.give_ticket();
            if !started {
                // Taken, never started (its lookup was not answered): no
                // handler will end it, so its slot is free now. A job
                // started keeps its slot until its handler ends, whether
                // or not it was looked up.
                self.slots[k] = Slot::Free;
                self.free.push(k);
                tracing::warn!(
                    job = id,
                    server = self.name(sh),
                    "connection broke before the job ran"
                );
            } else {
                tracing::warn!(
                    job = id,
                    server = self.name(sh),
                    "connection broke while the job ran"
                );
            }
        }
        self.asks = 0;
        self.blocking = false;
    }

    /// The handler in `slot` ended with `outcome` (`failure`: how it
    /// failed, a panic or how the command it ran ended, for the warning of a
    /// last attempt's bury). The slot is free again; the job's settle goes
    /// out with the next write, unless its connection broke meanwhile (the
    /// server has the job back).
    pub(crate) fn finished(
        &mut self,
        sh: &Shared,
        slot: usize,
        outcome: Outcome,
        failure: Option<Failure>,
    ) {
        let Some(Slot::Running {
            id,
            epoch,
            info,
            started,
            ..
        }) = self.slots.get(slot).copied()
        else {
            return;
        };
        self.slots[slot] = Slot::Free;
        self.free.push(slot);
        if started {
            self.busy -= 1;
            // Handed and given back unrun (a stop), its lease kept no more.
            self.held.retain(|h| h.slot != slot);
            self.begin_held(sh);
        }
        if let Some(k) = self.lost.iter().position(|&l| l == (slot, id)) {
            // Handed, and its lease gone before its thread ran it: lost,
            // with nothing to settle.
            self.lost.swap_remove(k);
            self.lease_lost(sh, id);
            return;
        }
        if !self.life.up || epoch != self.epoch {
            return;
        }
        match (settle_without_info(sh, self.server, id, outcome), info) {
            (Some(settle), _) => self.out.push_back(Out::Settle(id, settle)),
            (None, Some(info)) => {
                let settle = settle_with_info(sh, self.server, id, outcome, &info, failure);
                self.out.push_back(Out::Settle(id, settle));
            }
            (None, None) => self.out.push_back(Out::Info(id, outcome, failure)),
        }
    }

    /// Hands the oldest held jobs to the handlers free (none after a stop;
    /// none handed ahead, where each job started when it was ready).
    fn begin_held(&mut self, sh: &Shared) {
        if self.hand_ahead || sh.stop.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        while self.busy < self.handlers {
            let Some(h) = self.held.pop_front() else {
                return;
            };
            if let Some(Slot::Running { started, .. }) = self.slots.get_mut(h.slot) {
                *started = true;
            }
            self.busy += 1;
            self.begins.push_back(Begin {
                slot: h.slot,
                id: h.id,
                attempt: h.attempt,
                tube: h.tube,
                looked_up: h.looked_up,
            });
        }
    }

    /// A job ready in `slot` starts now when a handler is free (true), or
    /// waits, held, for one. `looked_up`: it was (its attempt is known).
    fn ready(
        &mut self,
        slot: usize,
        id: u64,
        (attempt, looked_up): (u32, bool),
        tube: Option<usize>,
    ) -> bool {
        let Some(Slot::Running { started, asked, .. }) = self.slots.get_mut(slot) else {
            return false;
        };
        let asked = *asked;
        let run = self.busy < self.handlers;
        *started = run;
        if run {
            self.busy += 1;
        }
        if run && !self.hand_ahead {
            return true;
        }
        // Held for a handler, or handed to the threads' queue and held
        // here for its lease until its thread runs it.
        self.held.push_back(Held {
            slot,
            id,
            asked,
            leased: asked,
            attempt,
            tube,
            looked_up,
            touching: false,
            handed: run,
        });
        run
    }

    /// The next handed job whose thread must not run it (its lease is
    /// gone), for the driver to tell that thread: (slot, job).
    pub(crate) fn revoked(&mut self) -> Option<(usize, u64)> {
        self.revoke.pop_front()
    }

    /// The handler thread given the job in `slot` runs it now: its lease
    /// is its handler's from now on ([`Shared::hand_ahead`]).
    pub(crate) fn runs_now(&mut self, slot: usize, id: u64) {
        self.held.retain(|h| !(h.slot == slot && h.id == id));
    }

    /// The lease rule at `now` for every held job: given back after
    /// `HOLD_MAX` (and all of them after a stop), touched once its lease is
    /// `TOUCH_AFTER` old (or the server said one is about to run out).
    fn keep_held(&mut self, sh: &Shared, now: Instant) {
        let soon = std::mem::take(&mut self.soon);
        if self.held.is_empty() {
            return;
        }
        let stopping = sh.stop.load(std::sync::atomic::Ordering::SeqCst);
        let rule = LeaseRule::held(now, soon, stopping);
        let handed = LeaseRule::handed(now, soon);
        let mut k = 0;
        while k < self.held.len() {
            let h = self.held[k];
            let rule = if h.handed { handed } else { rule };
            match rule.of(h.asked, h.leased) {
                Lease::Release => {
                    self.held.remove(k);
                    self.finished(sh, h.slot, UNSTARTED, None);
                    continue;
                }
                Lease::Touch if !h.touching => {
                    self.held[k].touching = true;
                    self.out.push_back(Out::Keep(h.slot, h.id));
                }
                _ => {}
            }
            k += 1;
        }
    }

    /// The held jobs' next lease deadline.
    fn held_due(&self, now: Instant) -> Option<Instant> {
        if self.soon && self.held.iter().any(|h| !h.handed) {
            return Some(now);
        }
        self.held
            .iter()
            .filter(|h| !h.touching)
            .filter_map(|h| match h.handed {
                true => LeaseRule::touch_due(h.leased),
                false => LeaseRule::first_due(h.asked, h.leased),
            })
            .min()
    }

    /// The next held job handed to a handler, for the driver to start.
    pub(crate) fn begun(&mut self) -> Option<Begin> {
        self.begins.pop_front()
    }

    /// Queues the settle of job `id` by the settle rule: a delete at once,
    /// anything else after a lookup.
    fn settle(&mut self, sh: &Shared, id: u64, outcome: Outcome, failure: Option<Failure>) {
        match settle_without_info(sh, self.server, id, outcome) {
            Some(settle) => self.out.push_back(Out::Settle(id, settle)),
            None => self.out.push_back(Out::Info(id, outcome, failure)),
        }
    }

    /// The handler in `slot` asks `what` of its job `job` (a touch, to
    /// restart its lease; its numbers, `stats-job`): the request goes out
    /// with the next write, and its answer comes back through
    /// [`answered`](Self::answered). Refused at once when the job's
    /// connection broke.
    pub(crate) fn handler_asks(&mut self, slot: usize, job: u64, what: Asked) {
        match self.slots.get(slot).copied() {
            Some(Slot::Running { id, epoch, .. })
                if id == job && self.life.up && epoch == self.epoch =>
            {
                self.out.push_back(Out::Ask(slot, id, what));
            }
            _ => self.cannot_answer(slot, job, what),
        }
    }

    /// What job `id`'s handler in `slot` asked cannot be answered: its
    /// connection broke (or the job is no longer the slot's).
    fn cannot_answer(&mut self, slot: usize, id: u64, what: Asked) {
        self.answers.push_back((slot, id, what.broken()));
    }

    /// The next answer to what a handler asked: its slot, its job, and the
    /// answer.
    pub(crate) fn answered(&mut self) -> Option<(usize, u64, Answered)> {
        self.answers.pop_front()
    }

    /// The idle-exit rule for this connection at `now`: quiet (no job taken,
    /// no connect) for `exit_when_idle`, holding no job, owing no settle,
    /// and its last blocking reserve found nothing. The worker stops once
    /// every server's machine says so (the driver keeps their answers).
    pub(crate) fn is_idle(&self, sh: &Shared, now: Instant) -> bool {
        let working = self.running() > 0
            || !self.quiet
            || self.owed.iter().any(|o| !matches!(o, Owed::Ask { .. }));
        self.life.is_idle(sh, now, working)
    }

    /// True once the worker stops and this connection has nothing left to
    /// do: no handler runs, nothing waits to be sent, and no reply but a
    /// reserve's is owed (closing the connection gives back any job the
    /// server hands out meanwhile).
    pub(crate) fn is_done(&self, sh: &Shared) -> bool {
        sh.stop.load(std::sync::atomic::Ordering::SeqCst)
            && self.running() == 0
            && self.out.is_empty()
            && self.owed.iter().all(|o| matches!(o, Owed::Ask { .. }))
    }

    /// The connection is closed at the end: the reserves still owed give
    /// their tickets back.
    pub(crate) fn close(&mut self, sh: &Shared) {
        while let Some(o) = self.owed.pop_front() {
            if let Owed::Ask { .. } = o {
                sh.give_ticket();
            }
        }
        self.asks = 0;
        self.blocking = false;
        self.life.up = false;
    }
}

pub(crate) mod js;
pub(crate) mod lease;
mod replies;
#[cfg(test)]
mod tests;
mod transmit;
