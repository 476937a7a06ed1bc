//! The worker's rules for one JetStream connection, with no socket and no
//! clock: the JetStream counterpart of [`Machine`](super::Machine), fed by
//! a driver with what happened (a connection opened or broke, a delivery or
//! a confirmation came, a handler finished or asked to touch its job) and
//! the time, saying what to queue on the session next
//! ([`JsMachine::transmit`]) and when it next wants to be woken
//! ([`JsMachine::poll_timeout`], [`JsMachine::handle_timeout`]).
//!
//! It keeps:
//! - the window: up to `concurrency` jobs in flight, each in a slot, filled
//!   by one pull at a time from a tube's durable consumer, asking for the
//!   free room not yet asked for (a weighted turn at most its jobs left,
//!   without waiting; on one tube, up to `MAX_PULLS` waiting pulls in a
//!   row, which the consumer serves in order);
//!   every tube is tried without waiting before the last one waits for the
//!   reserve slice, as the thread worker's pulls do. A pull that ends
//!   empty answers nothing; one the cluster cannot serve (409, 503) is
//!   tried again after a pause;
//! - settling: the same settle rule as the thread worker
//!   (`worker::settle`), from what the deliveries say of the job (its
//!   delivery count, its early deliveries: `parts::delivered_info`). A job
//!   done is acked `+ACK`, a retry `-NAK` with the backoff's delay, a bury
//!   copies the job to the tube's buried subject first (on the driver's
//!   second connection: [`JsMachine::next_copy`]) and then acks it, a job
//!   over `max_job_size` is `+TERM`ed unrun. Every ack asks for the
//!   server's confirmation, and is counted only on it (done only on a
//!   confirmed `+ACK`);
//! - leases: a handler's touch is `+WPI`, confirmed, and the job's lease
//!   restarts from when it was sent;
//! - the ack re-send: an ack subject names the delivery, not the
//!   connection, so jobs keep running across a break, their acks go out on
//!   the next connection, and the acks a broken connection sent without a
//!   confirmation are sent again there (`engine::Carry`, the thread
//!   worker's own), until confirmed or the job's lease may have ended;
//! - delayed jobs the client holds: one delivered before its
//!   `Taskq-Ready-At` goes back with `-NAK` for the time left, unrun
//!   (`parts::not_ready`, `parts::GivenBack`);
//! - what the connection's silence means is the session's alone
//!   (`NatsSession::poll_timeout`: a pull due its expiry plus the I/O
//!   timeout, a confirmation the I/O timeout, a pull past its expiry plus
//!   the grace probed with a `PING`): the driver wakes at the session's
//!   deadlines as at the machine's, and tells the machine of a reply
//!   overdue ([`JsMachine::reply_overdue`]);
//! - the reconnect rule, the idle exit (an empty waiting pull with nothing
//!   running asks the driver whether the consumers still have jobs out),
//!   `max_jobs` tickets and the stop, as the beanstalkd machine keeps them.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use taskq_proto::nats::{AckKind, Delivery, HeaderBlock, NatsError, NatsSession};
use taskq_proto::{earliest, ConnectionError};

use super::{Answered, Asked, Begin, Lifecycle, TICKET_RETRY};
use crate::counters::Counters;
use crate::engine::nats::parts::{
    ack_kind, conn_error, delivered_info, not_ready, pull_expiry, ready_at, GivenBack, Strays, Tube,
};
use crate::engine::{Carry, Pool, Settle, Unconfirmed};
use crate::failure::Failure;
use crate::fair::{Schedule, Want};
use crate::handler::Outcome;
use crate::job::JobError;
use crate::machine::lease::{Lease, LeaseRule};
use crate::shared::Shared;
use crate::worker::account::{
    count_resolved, delivered_again_while_running, failed, tally, UNAVAILABLE_PAUSE,
};
use crate::worker::settle::{settle_with_info, settle_without_info, Settled};

/// Room kept in each pooled ack subject: `$JS.ACK.`, an optional domain
/// and account hash, the stream, the consumer and five numbers.
const ACK_ROOM: usize = 256;

/// Acks owed beyond a window's worth before pulls wait for confirmations.
const ACKS_OVER: usize = 8;

/// A slot of the window.
#[derive(Debug)]
enum Slot {
    Free,
    /// Its handler runs job `seq` of tube `tube`.
    Running(Held),
}

/// A job held: what settling it needs.
#[derive(Debug)]
struct Held {
    seq: u64,
    tube: usize,
    /// Its ack subject.
    ack: Vec<u8>,
    delivered: u64,
    /// Its deliveries before its ready time (not attempts).
    early: u64,
    /// When its lease started, at the earliest (its pull was sent, or the
    /// last confirmed touch was).
    leased: Instant,
    /// When its pull was sent.
    asked: Instant,
    /// Its attempt, as its delivery tells it.
    attempt: u32,
    /// Its handler runs; else it waits for one (`prefetch`), held.
    started: bool,
    /// Held: a touch of it is owed.
    touching: bool,
    /// Started, but handed to the blocking worker's handler threads and
    /// waiting in their queue ([`Shared::hand_ahead`]): its lease is kept
    /// here (it is in `waiting`) until its thread runs it, and it is never
    /// given back from here (the thread gives it back unrun at a stop).
    handed: bool,
}

/// An ack decided and not yet queued.
#[derive(Debug)]
enum Out {
    /// A settle, confirmed and counted; `resent`: carried from a broken
    /// connection.
    Settle(Pending),
    /// A touch of the job in `slot`.
    Touch { slot: usize, seq: u64 },
    /// A delivery given back unrun and uncounted (a delayed job early).
    Back { ack: Vec<u8>, delay: Duration },
    /// A touch of the job held in `slot`, waiting for a handler.
    Keep { slot: usize, seq: u64 },
}

/// A settle on its way: the job, the command, the ack that carries it out
/// and where to, and when the job's lease may end.
#[derive(Debug)]
struct Pending {
    seq: u64,
    /// Its tube (a bury's copy goes to the tube's buried subject).
    tube: usize,
    settle: Settle,
    kind: AckKind,
    ack: Vec<u8>,
    due: Instant,
    resent: bool,
}

/// A confirmation owed.
#[derive(Debug)]
enum Owed {
    Settle(Pending),
    Touch { slot: usize, seq: u64 },
    Keep { slot: usize, seq: u64 },
}

/// Pulls under way at once at most (one tube, unweighted).
const MAX_PULLS: usize = 4;

/// A pull under way.
#[derive(Debug, Clone, Copy)]
struct Pull {
    /// The session's token for it.
    token: u64,
    tube: usize,
    /// Jobs it may still deliver.
    left: u32,
    /// It waits on the server (else `no_wait`).
    waits: bool,
    /// More tubes to try after this one when it ends empty.
    scan: usize,
    /// A weighted turn's pull.
    turn: bool,
    sent: Instant,
}

/// What a delivery told the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JsStep {
    /// Nothing for the driver.
    Nothing,
    /// Run job `id` in `slot` (its body and headers are the delivery's),
    /// of tube `tube` (an index in the configuration's tubes), on its
    /// `attempt`.
    Run {
        /// The slot.
        slot: usize,
        /// The job's stream sequence.
        id: u64,
        /// Its tube.
        tube: usize,
        /// This run's attempt number.
        attempt: u32,
    },
    /// Keep the delivery's body and headers in `slot`: the job waits there
    /// for a handler (`prefetch`), and starts by a [`Begin`].
    Hold {
        /// The slot.
        slot: usize,
    },
}

/// One JetStream connection's worker rules (see the module docs).
#[derive(Debug)]
pub(crate) struct JsMachine {
    server: usize,
    stream: String,
    tubes: Vec<Tube>,
    slots: Vec<Slot>,
    free: Vec<usize>,
    life: Lifecycle,
    /// Pulls under way, oldest first.
    pulls: VecDeque<Pull>,
    /// No pull before this (the cluster could not serve one, or no
    /// `max_jobs` ticket was free).
    pull_at: Option<Instant>,
    /// The next pull goes on scanning the tubes: (tube, tubes left).
    scan_next: Option<(usize, usize)>,
    rotate: usize,
    out: VecDeque<Out>,
    /// Buries waiting for their copy (the driver's).
    copies: VecDeque<Pending>,
    /// Confirmations owed: token, when sent, what for.
    confirms: VecDeque<(u64, Instant, Owed)>,
    /// Acks a broken connection sent without a confirmation.
    carry: Carry,
    given_back: GivenBack,
    acks: Pool,
    sched: Option<Schedule>,
    /// Answers to what handlers asked: (slot, job, answer).
    answers: VecDeque<(usize, u64, Answered)>,
    /// How early a delivery's lease may have started, while a pull its
    /// probe ended may still deliver.
    strays: Strays,
    /// Handlers that may run at once (`concurrency`); the window may be
    /// larger (`prefetch`).
    handlers: usize,
    /// Slots whose handler runs.
    busy: usize,
    /// Slots of jobs waiting for a handler, oldest first, and of (handed)
    /// jobs waiting in the handler threads' queue.
    waiting: VecDeque<usize>,
    /// Every job delivered is handed on at once ([`Shared::hand_ahead`]).
    hand_ahead: bool,
    /// Handed jobs whose ack wait ran out before their thread ran them
    /// (slot, stream sequence): their threads are told not to run them
    /// ([`revoked`](Self::revoked)); each is counted lost once its thread
    /// gives it back, and never acked (an ack of an old delivery would
    /// settle the server's newer one).
    lost: Vec<(usize, u64)>,
    /// Of those, the ones the driver has not told the threads about yet.
    revoke: VecDeque<(usize, u64)>,
    /// Held jobs handed to handlers, for the driver to start.
    begins: VecDeque<Begin>,
    /// The consumers were found with nothing out after an empty wait.
    quiet: bool,
    /// An empty wait asks the driver whether jobs are still out.
    check_idle: bool,
    /// A connection came up and nothing was written on it yet.
    resume: bool,
}

impl JsMachine {
    /// A machine for server `server` of `sh`'s configuration, at `now`.
    pub(crate) fn new(sh: &Shared, server: usize, now: Instant) -> JsMachine {
        let n = super::window(&sh.cfg);
        JsMachine {
            server,
            stream: String::new(),
            tubes: Vec::new(),
            slots: (0..n).map(|_| Slot::Free).collect(),
            free: (0..n).rev().collect(),
            life: Lifecycle::new(now),
            pulls: VecDeque::with_capacity(MAX_PULLS),
            pull_at: None,
            scan_next: None,
            rotate: server,
            out: VecDeque::with_capacity(2 * n + 8),
            copies: VecDeque::new(),
            confirms: VecDeque::with_capacity(2 * n + 8),
            carry: Carry::default(),
            strays: Strays::default(),
            given_back: GivenBack::default(),
            // A slot's and an ack owed's for each job of the window, and
            // `ACKS_OVER` more (see `pull_more`).
            acks: Pool::made(2 * n + ACKS_OVER, ACK_ROOM),
            sched: sh
                .cfg
                .is_weighted()
                .then(|| Schedule::new(&sh.cfg.weights, sh.cfg.run_scale, server)),
            answers: VecDeque::new(),
            // Handed ahead, every job of the window starts when it comes:
            // the handler threads run `concurrency` of them at once.
            handlers: if sh.hand_ahead { n } else { sh.cfg.concurrency },
            busy: 0,
            waiting: VecDeque::with_capacity(n),
            hand_ahead: sh.hand_ahead,
            lost: Vec::new(),
            revoke: VecDeque::new(),
            begins: VecDeque::with_capacity(n),
            quiet: false,
            check_idle: false,
            resume: false,
        }
    }

    fn name<'s>(&self, sh: &'s Shared) -> &'s str {
        sh.cfg.servers[self.server].as_str()
    }

    /// Handlers running.
    pub(crate) fn running(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// The stream's name and the tubes as set up (for the driver's copies
    /// and checks).
    pub(crate) fn layout(&self) -> (&str, &[Tube]) {
        (&self.stream, &self.tubes)
    }

    /// True when a connect may go now.
    pub(crate) fn wants_connect(&self, sh: &Shared, now: Instant) -> bool {
        self.life.may_connect(now) && !self.is_done(sh)
    }

    /// A connection was opened and set up at `now`, on `stream` with
    /// `tubes` (in the configuration's order). The acks carried from a
    /// broken connection go out first, with its first write
    /// ([`transmit`](Self::transmit)), but those whose job's lease may end
    /// by then, which are given up.
    pub(crate) fn connected(&mut self, sh: &Shared, now: Instant, stream: &str, tubes: Vec<Tube>) {
        self.life.connected(sh, self.server, now);
        self.stream.clear();
        self.stream.push_str(stream);
        self.tubes = tubes;
        self.pulls.clear();
        self.pull_at = None;
        self.scan_next = None;
        self.quiet = false;
        // The acks waiting for a connection go with its first write, when
        // their leases are checked (not here: what the driver does first,
        // an idle check say, may take a while).
        self.resume = true;
    }

    /// The first write on a new connection at `now`: acks carried from the
    /// broken one, and those decided while none was up, go first, but those
    /// whose job's lease may end before they reach the server
    /// ([`Carry::MARGIN`]), which are given up (the server gives the job
    /// back); sent late, an ack might land on a job the server gave out
    /// again, and both runs would count as done.
    fn resume_settles(&mut self, sh: &Shared, now: Instant) {
        self.carry.expire(now);
        self.count_carried(sh);
        let mut k = 0;
        while k < self.out.len() {
            match &self.out[k] {
                Out::Settle(p) if p.due.saturating_duration_since(now) <= Carry::MARGIN => {
                    let Some(Out::Settle(p)) = self.out.remove(k) else {
                        unreachable!("matched above")
                    };
                    Counters::add(&sh.counters.lease_dropped);
                    sh.give_ticket();
                    tracing::warn!(
                        job = p.seq,
                        server = self.name(sh),
                        command = p.settle.name(),
                        "not sent before the job's lease ended: the job comes back"
                    );
                    self.acks.give(p.ack);
                }
                _ => k += 1,
            }
        }
        for u in self.carry.open.drain(..).rev() {
            self.out.push_front(Out::Settle(Pending {
                seq: u.id,
                tube: 0,
                settle: u.settle,
                kind: ack_kind(u.settle),
                ack: u.to,
                due: u.due,
                resent: true,
            }));
        }
    }

    /// Counts the carried acks resolved (given up: their leases ended).
    fn count_carried(&mut self, sh: &Shared) {
        for (id, settle, confirmed) in self.carry.resolved.drain(..) {
            count_resolved(
                sh,
                sh.cfg.servers[self.server].as_str(),
                id,
                settle,
                confirmed,
            );
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
        // The acks carried whose jobs' leases may have ended are given up
        // now, not only at the next connection that opens: counted no later
        // than the connect attempt after their lease.
        self.carry.expire(now);
        self.count_carried(sh);
    }

    /// The connection broke at `now`. The pull is over (its tickets go
    /// back); the acks sent without a confirmation are carried to the next
    /// connection; touches owed fail. Jobs held keep running: their acks
    /// go out on the next connection.
    pub(crate) fn broke(&mut self, sh: &Shared, now: Instant, random: u64) {
        if !self.life.broke(sh, now, random) {
            return;
        }
        self.end_pulls(sh);
        self.check_idle = false;
        while let Some((_, _, owed)) = self.confirms.pop_front() {
            match owed {
                Owed::Settle(p) => self.carry.open.push(Unconfirmed {
                    id: p.seq,
                    settle: p.settle,
                    to: p.ack,
                    due: p.due,
                }),
                Owed::Touch { slot, seq } => self.cannot_answer(slot, seq, Asked::Touch),
                // Touched again on the next connection, if it still waits.
                Owed::Keep { slot, seq } => self.untouched(slot, seq),
            }
        }
        // Touches not written yet are answered now, as those owed above
        // (the handler may ask again on the next connection); a held job's
        // is asked again by the lease rule.
        let mut unwritten = Vec::new();
        self.out.retain(|o| match *o {
            Out::Keep { .. } => false,
            Out::Touch { slot, seq } => {
                unwritten.push((slot, seq));
                false
            }
            _ => true,
        });
        for (slot, seq) in unwritten {
            self.cannot_answer(slot, seq, Asked::Touch);
        }
        for &slot in &self.waiting {
            if let Slot::Running(h) = &mut self.slots[slot] {
                h.touching = false;
            }
        }
    }

    /// The touch of held job `seq` in `slot` came to nothing: it may be
    /// touched again.
    fn untouched(&mut self, slot: usize, seq: u64) {
        if let Some(Slot::Running(h)) = self.slots.get_mut(slot) {
            if h.seq == seq {
                h.touching = false;
            }
        }
    }

    /// Every pull is over (the connection is): their tickets go back.
    fn end_pulls(&mut self, sh: &Shared) {
        while let Some(p) = self.pulls.pop_front() {
            self.give_tickets(sh, p.left);
        }
    }

    fn give_tickets(&self, sh: &Shared, n: u32) {
        for _ in 0..n {
            sh.give_ticket();
        }
    }

    /// The handler in `slot` ended with `outcome` (`failure`: how it
    /// failed, for the warning of a last attempt's bury). The slot is free
    /// again; the job's ack is decided by the settle rule and goes out with
    /// the next write (a bury's after its copy).
    pub(crate) fn finished(
        &mut self,
        sh: &Shared,
        slot: usize,
        outcome: Outcome,
        failure: Option<Failure>,
    ) {
        let Some(Slot::Running(h)) = self
            .slots
            .get_mut(slot)
            .map(|s| std::mem::replace(s, Slot::Free))
        else {
            return;
        };
        self.free.push(slot);
        if h.started {
            self.busy -= 1;
            if h.handed {
                // Given back unrun (a stop): its lease kept no more.
                self.waiting.retain(|&s| s != slot);
            }
            self.begin_held(sh);
        }
        if let Some(k) = self.lost.iter().position(|&l| l == (slot, h.seq)) {
            // Handed, and its ack wait over before its thread ran it:
            // lost, with nothing to ack.
            self.lost.swap_remove(k);
            self.acks.give(h.ack);
            Counters::add(&sh.counters.lost_lease_on_release);
            sh.give_ticket();
            tracing::warn!(
                job = h.seq,
                server = self.name(sh),
                "lease lost: the job's ack wait ran out before it ran"
            );
            return;
        }
        let ack_wait = self
            .tubes
            .get(h.tube)
            .map_or(Duration::ZERO, |t| t.ack_wait);
        let settle = settle_without_info(sh, self.server, h.seq, outcome).unwrap_or_else(|| {
            let info = delivered_info(ack_wait, h.leased, h.delivered, h.early);
            settle_with_info(sh, self.server, h.seq, outcome, &info, failure)
        });
        let p = Pending {
            seq: h.seq,
            tube: h.tube,
            settle,
            kind: ack_kind(settle),
            ack: h.ack,
            due: h.leased + ack_wait,
            resent: false,
        };
        if let Settle::Bury { .. } = settle {
            self.copies.push_back(p);
        } else {
            self.out.push_back(Out::Settle(p));
        }
    }

    /// Hands the oldest held jobs to the handlers free (none after a stop;
    /// none handed ahead, where each job started when it came).
    fn begin_held(&mut self, sh: &Shared) {
        if self.hand_ahead || sh.stop.load(Ordering::SeqCst) {
            return;
        }
        while self.busy < self.handlers {
            let Some(slot) = self.waiting.pop_front() else {
                return;
            };
            if let Slot::Running(h) = &mut self.slots[slot] {
                h.started = true;
                self.busy += 1;
                self.begins.push_back(Begin {
                    slot,
                    id: h.seq,
                    attempt: h.attempt,
                    tube: Some(h.tube),
                    looked_up: false,
                });
            }
        }
    }

    /// The next held job handed to a handler, for the driver to start.
    pub(crate) fn begun(&mut self) -> Option<Begin> {
        self.begins.pop_front()
    }

    /// The next handed job whose thread must not run it (its ack wait is
    /// over), for the driver to tell that thread: (slot, stream sequence).
    pub(crate) fn revoked(&mut self) -> Option<(usize, u64)> {
        self.revoke.pop_front()
    }

    /// The handler thread given job `seq` in `slot` runs it now: its lease
    /// is its handler's from now on ([`Shared::hand_ahead`]).
    pub(crate) fn runs_now(&mut self, slot: usize, seq: u64) {
        if let Some(Slot::Running(h)) = self.slots.get_mut(slot) {
            if h.seq == seq && h.handed {
                h.handed = false;
                h.touching = false;
                self.waiting.retain(|&s| s != slot);
            }
        }
    }

    /// The lease rule at `now` for every held job (the beanstalkd
    /// machine's, `machine::Held`): given back unstarted after `HOLD_MAX`
    /// and at a stop, touched (`+WPI`) once its lease is `TOUCH_AFTER` old;
    /// one whose ack wait ran out while it waited (no connection to touch
    /// it on) is lost: the server may have given it to another worker.
    fn keep_held(&mut self, sh: &Shared, now: Instant) {
        if self.waiting.is_empty() {
            return;
        }
        let held = LeaseRule::held(now, false, sh.stop.load(Ordering::SeqCst));
        let handed = LeaseRule::handed(now, false);
        let mut k = 0;
        while k < self.waiting.len() {
            let slot = self.waiting[k];
            let Slot::Running(h) = &mut self.slots[slot] else {
                self.waiting.remove(k);
                continue;
            };
            let ack_wait = self
                .tubes
                .get(h.tube)
                .map_or(Duration::ZERO, |t| t.ack_wait);
            let rule = if h.handed { handed } else { held };
            if h.handed && now >= h.leased + ack_wait {
                // Its thread has it: told not to run it, counted lost
                // when it comes back.
                h.handed = false;
                let seq = h.seq;
                self.waiting.remove(k);
                self.lost.push((slot, seq));
                self.revoke.push_back((slot, seq));
                continue;
            }
            if now >= h.leased + ack_wait {
                let seq = h.seq;
                self.waiting.remove(k);
                if let Slot::Running(h) = std::mem::replace(&mut self.slots[slot], Slot::Free) {
                    self.acks.give(h.ack);
                }
                self.free.push(slot);
                Counters::add(&sh.counters.lost_lease_on_release);
                sh.give_ticket();
                tracing::warn!(
                    job = seq,
                    server = self.name(sh),
                    "lease lost: the job's ack wait ran out while it waited"
                );
                continue;
            }
            match rule.of(h.asked, h.leased) {
                Lease::Release => {
                    self.waiting.remove(k);
                    self.finished(sh, slot, super::UNSTARTED, None);
                    continue;
                }
                Lease::Touch if !h.touching => {
                    h.touching = true;
                    let seq = h.seq;
                    self.out.push_back(Out::Keep { slot, seq });
                }
                _ => {}
            }
            k += 1;
        }
    }

    /// The held jobs' next lease deadline.
    fn held_due(&self) -> Option<Instant> {
        self.waiting
            .iter()
            .filter_map(|&slot| match &self.slots[slot] {
                Slot::Running(h) if !h.touching => {
                    let ack_wait = self
                        .tubes
                        .get(h.tube)
                        .map_or(Duration::ZERO, |t| t.ack_wait);
                    let touch = match h.handed {
                        true => LeaseRule::touch_due(h.leased),
                        false => LeaseRule::first_due(h.asked, h.leased),
                    };
                    earliest(touch, h.leased.checked_add(ack_wait))
                }
                _ => None,
            })
            .min()
    }

    /// The next bury whose copy the driver makes: the job's stream
    /// sequence and its tube's index.
    pub(crate) fn next_copy(&self) -> Option<(u64, usize)> {
        if !self.life.up {
            return None;
        }
        self.copies.front().map(|p| (p.seq, p.tube))
    }

    /// The copy of the bury at the front was stored (its ack goes out
    /// next) or could not be (`false`: the job comes back after its lease).
    pub(crate) fn copied(&mut self, sh: &Shared, ok: bool) {
        let Some(p) = self.copies.pop_front() else {
            return;
        };
        if ok {
            self.out.push_back(Out::Settle(p));
        } else {
            Counters::add(&sh.counters.lease_dropped);
            sh.give_ticket();
            tracing::warn!(
                job = p.seq,
                server = self.name(sh),
                "bury not copied: the job comes back"
            );
            self.acks.give(p.ack);
        }
    }

    /// The handler in `slot` asks `what` of its job `seq`: a touch goes
    /// out as `+WPI` and is answered on its confirmation; the job's numbers
    /// are the delivery's (`parts::delivered_info`), answered at once. What
    /// the handler of a job no longer held, or on a broken connection,
    /// asks is refused.
    pub(crate) fn handler_asks(&mut self, slot: usize, seq: u64, what: Asked) {
        match (self.slots.get(slot), what) {
            (Some(Slot::Running(h)), Asked::Touch) if h.seq == seq && self.life.up => {
                self.out.push_back(Out::Touch { slot, seq });
            }
            (Some(Slot::Running(h)), Asked::Stats) if h.seq == seq => {
                let ack_wait = self
                    .tubes
                    .get(h.tube)
                    .map_or(Duration::ZERO, |t| t.ack_wait);
                let info = delivered_info(ack_wait, h.leased, h.delivered, h.early);
                self.answers
                    .push_back((slot, seq, Answered::Stats(Ok(info))));
            }
            _ => self.cannot_answer(slot, seq, what),
        }
    }

    fn cannot_answer(&mut self, slot: usize, seq: u64, what: Asked) {
        self.answers.push_back((slot, seq, what.broken()));
    }

    /// The next answer to what a handler asked.
    pub(crate) fn answered(&mut self) -> Option<(usize, u64, Answered)> {
        self.answers.pop_front()
    }

    /// Queues on `session` every ack decided, then the pull the window has
    /// room for. `Err`: the session refused (the connection is given up).
    pub(crate) fn transmit(
        &mut self,
        sh: &Shared,
        now: Instant,
        session: &mut NatsSession,
    ) -> Result<(), NatsError> {
        if !self.life.up {
            return Ok(());
        }
        if std::mem::take(&mut self.resume) {
            self.resume_settles(sh, now);
        }
        self.keep_held(sh, now);
        while let Some(o) = self.out.pop_front() {
            let r = match &o {
                Out::Settle(p) => session.queue_ack(&p.ack, p.kind, true),
                Out::Touch { slot, seq } => match &self.slots[*slot] {
                    Slot::Running(h) if h.seq == *seq => {
                        session.queue_ack(&h.ack, AckKind::InProgress, true)
                    }
                    // Ended meanwhile: its settle says what the lease is.
                    _ => {
                        let lost = Answered::Touch(Err(JobError::LeaseLost));
                        self.answers.push_back((*slot, *seq, lost));
                        continue;
                    }
                },
                Out::Back { ack, delay } => {
                    let kind = AckKind::Nak {
                        delay: Some(*delay),
                    };
                    session.queue_ack(ack, kind, false)
                }
                Out::Keep { slot, seq } => match &self.slots[*slot] {
                    Slot::Running(h) if h.seq == *seq && (!h.started || h.handed) => {
                        session.queue_ack(&h.ack, AckKind::InProgress, true)
                    }
                    // Started or gone meanwhile.
                    _ => {
                        let (slot, seq) = (*slot, *seq);
                        self.untouched(slot, seq);
                        continue;
                    }
                },
            };
            let token = match r {
                Ok(t) => t,
                Err(e) => {
                    self.out.push_front(o);
                    return Err(e);
                }
            };
            match (o, token) {
                (Out::Settle(p), Some(t)) => self.confirms.push_back((t, now, Owed::Settle(p))),
                (Out::Touch { slot, seq }, Some(t)) => {
                    self.confirms.push_back((t, now, Owed::Touch { slot, seq }))
                }
                (Out::Keep { slot, seq }, Some(t)) => {
                    self.confirms.push_back((t, now, Owed::Keep { slot, seq }))
                }
                (Out::Back { ack, .. }, _) => self.acks.give(ack),
                _ => {}
            }
        }
        self.pull_more(sh, now, session)
    }

    /// Queues a pull for the free room not yet asked for, when one may go:
    /// with none under way, or, on one tube and unweighted, behind the
    /// waiting pulls under way (up to [`MAX_PULLS`]; the consumer serves
    /// them in order), so that room freed while a pull is answered is asked
    /// for at once.
    fn pull_more(
        &mut self,
        sh: &Shared,
        now: Instant,
        session: &mut NatsSession,
    ) -> Result<(), NatsError> {
        let asked: usize = self.pulls.iter().map(|p| p.left as usize).sum();
        // Acks decided and not yet confirmed hold their ack subjects too:
        // past a window of them (and `ACKS_OVER`), the room waits for
        // confirmations, so the jobs held and the acks owed stay within the
        // ack buffers made for them however slowly a server confirms.
        let unsettled = self.out.len() + self.confirms.len() + self.copies.len();
        let unsettled = unsettled + self.carry.open.len();
        let over = unsettled.saturating_sub(self.slots.len() + ACKS_OVER);
        let room = self.free.len().saturating_sub(asked).saturating_sub(over);
        let behind = !self.pulls.is_empty();
        if behind
            && (self.pulls.len() >= MAX_PULLS
                || self.tubes.len() != 1
                || self.sched.is_some()
                || self.pulls.iter().any(|p| !p.waits))
        {
            return Ok(());
        }
        if room == 0
            || self.tubes.is_empty()
            || sh.stop.load(Ordering::SeqCst)
            || self.check_idle
            || self.pull_at.is_some_and(|t| t > now)
        {
            return Ok(());
        }
        self.pull_at = None;
        let n = self.tubes.len();
        let (tube, waits, scan, turn, most) = match self.scan_next.take() {
            Some((tube, scan)) => (tube, scan == 0, scan, false, room),
            None => {
                let want = self.sched.as_ref().map(|s| (s.want(), s.left()));
                match want {
                    Some((Want::Try(k), left)) => (k, false, 0, true, (left as usize).min(room)),
                    _ => {
                        self.rotate = (self.rotate + 1) % n;
                        (self.rotate, n == 1, n - 1, false, room)
                    }
                }
            }
        };
        let mut batch = 0u32;
        while (batch as usize) < most.max(1) && sh.take_ticket() {
            batch += 1;
        }
        if batch == 0 {
            self.pull_at = Some(now + TICKET_RETRY);
            return Ok(());
        }
        let t = &self.tubes[tube];
        let expires = waits.then(|| pull_expiry(&sh.cfg));
        let token = match session.queue_pull_behind(&self.stream, &t.consumer, batch, expires, None)
        {
            Ok(token) => token,
            Err(e) => {
                self.give_tickets(sh, batch);
                return Err(e);
            }
        };
        self.pulls.push_back(Pull {
            token,
            tube,
            left: batch,
            waits,
            scan,
            turn,
            sent: now,
        });
        Ok(())
    }

    fn tube_of(&self, subject: &[u8]) -> Option<usize> {
        self.tubes
            .iter()
            .position(|t| t.subject.as_bytes() == subject)
    }

    /// Takes what the session read at `now`: a delivery, a pull's end or a
    /// confirmation. `Err(())`: the connection is given up
    /// ([`broke`](Self::broke) was called).
    #[allow(clippy::result_unit_err)]
    ///
    /// `pull` is the token of the pull it answers (the session's
    /// `DeliveryFrame::pull`); `strays`: the session's `strays_possible`
    /// when it was read.
    pub(crate) fn on_delivery(
        &mut self,
        sh: &Shared,
        now: Instant,
        d: Delivery<'_>,
        pull: Option<u64>,
        strays: bool,
        random: u64,
    ) -> Result<JsStep, ()> {
        self.strays.heard(strays);
        let at = pull.and_then(|t| self.pulls.iter().position(|p| p.token == t));
        match d {
            Delivery::Msg {
                subject,
                reply,
                headers,
                body,
                info,
            } => {
                let Some(tube) = self.tube_of(subject) else {
                    // A consumer filters on its tube's subject.
                    return self.fault(sh, now, "MSG", random);
                };
                let pulled = at.map(|i| {
                    let p = &mut self.pulls[i];
                    p.left = p.left.saturating_sub(1);
                    let sent = p.sent;
                    if p.left == 0 {
                        self.pulls.remove(i);
                    }
                    sent
                });
                // With no pull under way, it is for a pull this machine ended
                // first (its probe came back before the server's answer):
                // run in a free slot no pull under way asked for, else given
                // back at once. Its lease (as any read while such a pull may
                // still deliver) is counted from the oldest of those pulls.
                let leased = self.strays.lease_start(pulled);
                let room = pulled.is_some() || {
                    let asked: usize = self.pulls.iter().map(|p| p.left as usize).sum();
                    self.free.len() > asked && leased.is_some() && sh.take_ticket()
                };
                let (true, Some(sent)) = (room, leased) else {
                    let ack = self.acks.copy(reply);
                    self.out.push_back(Out::Back {
                        ack,
                        delay: Duration::ZERO,
                    });
                    return Ok(JsStep::Nothing);
                };
                self.life.reconnect.progress();
                Ok(self.take(
                    sh,
                    now,
                    sent,
                    tube,
                    reply,
                    headers,
                    body.len(),
                    info.delivered,
                    info.stream_seq,
                ))
            }
            Delivery::Confirmed(token) => {
                self.life.reconnect.progress();
                self.confirmed(sh, token);
                Ok(JsStep::Nothing)
            }
            Delivery::Heartbeat => Ok(JsStep::Nothing),
            Delivery::Unanswered => {
                // Over: the server never took it (or took it and answers
                // late: see `strays`); asked again after a pause, as when
                // the cluster cannot serve a pull.
                tracing::debug!(pull, "a pull never answered; its probe came back");
                if let Some(i) = at {
                    self.strays.ended(self.pulls[i].sent);
                }
                self.pull_unavailable(sh, now, pull);
                Ok(JsStep::Nothing)
            }
            Delivery::NoMessages | Delivery::Timeout => {
                self.life.reconnect.progress();
                if let Some(p) = at.and_then(|i| self.pulls.remove(i)) {
                    self.pull_empty(sh, p);
                }
                Ok(JsStep::Nothing)
            }
            other => {
                tracing::debug!(status = ?other, "pull ended: the cluster cannot serve it now");
                self.pull_unavailable(sh, now, pull);
                Ok(JsStep::Nothing)
            }
        }
    }

    /// A pull answered `503` (no responders: an election): tried again
    /// after a pause.
    /// `pull`: the token of the pull it ended.
    pub(crate) fn pull_unavailable(&mut self, sh: &Shared, now: Instant, pull: Option<u64>) {
        let at = pull.and_then(|t| self.pulls.iter().position(|p| p.token == t));
        if let Some(p) = at.and_then(|i| self.pulls.remove(i)) {
            self.give_tickets(sh, p.left);
        }
        self.life.last_busy = now;
        self.pull_at = Some(now + UNAVAILABLE_PAUSE);
    }

    fn pull_empty(&mut self, sh: &Shared, p: Pull) {
        self.give_tickets(sh, p.left);
        if p.turn {
            if let Some(s) = self.sched.as_mut() {
                s.empty();
            }
            return;
        }
        if p.scan > 0 && !p.waits {
            // Nothing on this tube now: the next one, the last one waiting.
            let n = self.tubes.len();
            self.scan_next = Some(((p.tube + 1) % n, p.scan - 1));
            return;
        }
        if p.waits {
            Counters::add(&sh.counters.reserve_timeouts);
            if self.running() == 0 && sh.cfg.exit_when_idle.is_some() {
                self.check_idle = true;
            }
        }
    }

    /// The driver's answer to [`wants_idle_check`](Self::wants_idle_check)
    /// at `now`: whether the consumers still have jobs out (`None`: it
    /// could not tell).
    pub(crate) fn idle_checked(&mut self, now: Instant, jobs_out: Option<bool>) {
        self.check_idle = false;
        if jobs_out == Some(false) {
            self.quiet = true;
        } else {
            self.quiet = false;
            self.life.last_busy = now;
        }
    }

    /// An empty wait with nothing running: the driver asks the consumers
    /// whether jobs are still out (no pull goes until it answers).
    pub(crate) fn wants_idle_check(&self) -> bool {
        self.life.up && self.check_idle
    }

    #[allow(clippy::too_many_arguments)]
    fn take(
        &mut self,
        sh: &Shared,
        now: Instant,
        pulled: Instant,
        tube: usize,
        reply: &[u8],
        headers: Option<HeaderBlock<'_>>,
        len: usize,
        delivered: u64,
        seq: u64,
    ) -> JsStep {
        let ready = ready_at(headers.as_ref());
        let scheduled = headers.as_ref().is_some_and(|h| {
            h.get(taskq_proto::nats::schedule::SCHEDULER_HEADER)
                .is_some()
        });
        if let Some(delay) = not_ready(ready) {
            // Early: back for the time left, not an attempt, not a job.
            sh.give_ticket();
            self.given_back.note(seq);
            let ack = self.acks.copy(reply);
            self.out.push_back(Out::Back { ack, delay });
            return JsStep::Nothing;
        }
        // Only a delivery after the first can be of a job a slot holds: a
        // first delivery costs no walk of the window.
        let again = (delivered > 1)
            .then(|| {
                self.slots.iter_mut().find_map(|s| match s {
                    Slot::Running(h) if h.seq == seq => Some(h),
                    _ => None,
                })
            })
            .flatten();
        if let Some(h) = again {
            // Its lease ran out while its handler ran, and the server gave
            // it to this worker again: one job, run once, its settle on
            // the newer delivery (the older one's ack subject no longer
            // settles it).
            self.acks.copy_into(&mut h.ack, reply);
            h.delivered = delivered;
            h.leased = pulled;
            delivered_again_while_running(sh, self.name(sh), seq);
            return JsStep::Nothing;
        }
        Counters::add(&sh.counters.reserved);
        self.life.last_busy = now;
        self.quiet = false;
        // Each job taken counts down the schedule's run, a turn's or the
        // fallback's after an empty turn (which ends with it), as the thread
        // worker counts them.
        if let Some(s) = self.sched.as_mut() {
            s.taken();
        }
        let early = self
            .given_back
            .early_deliveries(seq, delivered, ready, scheduled);
        let ack_wait = self.tubes[tube].ack_wait;
        let ack = self.acks.copy(reply);
        let pending = |settle: Settle, kind: AckKind, ack: Vec<u8>| Pending {
            seq,
            tube,
            settle,
            kind,
            ack,
            due: pulled + ack_wait,
            resent: false,
        };
        if sh.stop.load(Ordering::SeqCst) {
            // Taken after the stop: given back untouched.
            let back = Settle::Release { pri: 0, delay: 0 };
            self.out
                .push_back(Out::Settle(pending(back, ack_kind(back), ack)));
            return JsStep::Nothing;
        }
        if len > sh.cfg.limits.max_job_size {
            // Never run, never delivered again.
            Counters::add(&sh.counters.too_big);
            tracing::warn!(
                job = seq,
                server = self.name(sh),
                size = len,
                limit = sh.cfg.limits.max_job_size,
                "job larger than max_job_size: terminated without running"
            );
            let bury = Settle::Bury { pri: 0 };
            self.out
                .push_back(Out::Settle(pending(bury, AckKind::Term, ack)));
            return JsStep::Nothing;
        }
        let Some(slot) = self.free.pop() else {
            // A pull never asks for more than the room.
            let back = Settle::Release { pri: 0, delay: 0 };
            self.out
                .push_back(Out::Settle(pending(back, ack_kind(back), ack)));
            return JsStep::Nothing;
        };
        let releases = delivered.saturating_sub(1).saturating_sub(early);
        let n = crate::worker::settle::attempt(sh, self.server, seq, releases);
        let attempt = u32::try_from(n).unwrap_or(u32::MAX);
        // A handler free runs it now; else it waits, held, for one.
        let started = self.busy < self.handlers;
        self.slots[slot] = Slot::Running(Held {
            seq,
            tube,
            ack,
            delivered,
            early,
            leased: pulled,
            asked: pulled,
            attempt,
            started,
            touching: false,
            handed: started && self.hand_ahead,
        });
        if !started {
            self.waiting.push_back(slot);
            return JsStep::Hold { slot };
        }
        if self.hand_ahead {
            // Handed to the threads' queue: its lease kept until it runs.
            self.waiting.push_back(slot);
        }
        self.busy += 1;
        JsStep::Run {
            slot,
            id: seq,
            tube,
            attempt,
        }
    }

    /// The confirmation `token` came.
    fn confirmed(&mut self, sh: &Shared, token: u64) {
        let Some(i) = self.confirms.iter().position(|(t, _, _)| *t == token) else {
            return;
        };
        let (_, sent, owed) = self.confirms.remove(i).expect("found above");
        match owed {
            Owed::Settle(p) => {
                let server = sh.cfg.servers[self.server].as_str();
                if p.resent {
                    count_resolved(sh, server, p.seq, p.settle, true);
                } else {
                    let settled = Settled::of(p.settle == Settle::Delete, &Ok(p.settle.reply()));
                    tally(sh, server, p.seq, p.settle, settled);
                }
                self.acks.give(p.ack);
            }
            Owed::Touch { slot, seq } => {
                Counters::add(&sh.counters.touched);
                if let Some(Slot::Running(h)) = self.slots.get_mut(slot) {
                    if h.seq == seq {
                        h.leased = sent;
                    }
                }
                self.answers.push_back((slot, seq, Answered::Touch(Ok(()))));
            }
            Owed::Keep { slot, seq } => {
                Counters::add(&sh.counters.touched);
                if let Some(Slot::Running(h)) = self.slots.get_mut(slot) {
                    if h.seq == seq {
                        h.leased = sent;
                        h.touching = false;
                    }
                }
            }
        }
    }

    /// A failure of the connection (its read or write) at `now`.
    pub(crate) fn failed(&mut self, sh: &Shared, now: Instant, e: &ConnectionError, random: u64) {
        failed(sh, self.name(sh), None, e);
        self.broke(sh, now, random);
    }

    fn fault(
        &mut self,
        sh: &Shared,
        now: Instant,
        word: &'static str,
        random: u64,
    ) -> Result<JsStep, ()> {
        Counters::add(&sh.counters.unexpected_replies);
        tracing::warn!(server = self.name(sh), reply = word, "unexpected delivery");
        self.broke(sh, now, random);
        Err(())
    }

    /// The machine's deadlines: the next pull after a pause, the next
    /// connect, the idle exit (while ahead). The connection's reply
    /// deadlines are its session's.
    pub(crate) fn poll_timeout(&self, sh: &Shared, now: Instant) -> Option<Instant> {
        let mut t: Option<Instant> = None;
        let mut at = |x: Instant| t = Some(t.map_or(x, |t| t.min(x)));
        if self.life.up && self.pulls.is_empty() {
            // Only while ahead: once passed, the next pull waits on an
            // event (room, a tick of the idle rule), not on the clock, and
            // a deadline in the past would wake the driver in a loop.
            if let Some(p) = self.pull_at.filter(|&p| p > now) {
                at(p);
            }
        }
        if self.life.up {
            if let Some(h) = self.held_due() {
                at(h);
            }
        }
        self.life.due(sh, now, &mut at);
        t
    }

    /// The session found a reply overdue at `now`: the connection is
    /// silent, and given up as after a failed read.
    pub(crate) fn reply_overdue(&mut self, sh: &Shared, now: Instant, e: NatsError, random: u64) {
        if self.life.up {
            self.failed(sh, now, &conn_error(e), random);
        }
    }

    /// The idle-exit rule at `now` (see the beanstalkd machine's).
    pub(crate) fn is_idle(&self, sh: &Shared, now: Instant) -> bool {
        let working = self.running() > 0
            || !self.quiet
            || !self.confirms.is_empty()
            || !self.out.is_empty()
            || !self.copies.is_empty()
            || !self.carry.open.is_empty();
        self.life.is_idle(sh, now, working)
    }

    /// True once the worker stops and this connection has nothing left to
    /// do: no handler runs, no ack waits to go or for its confirmation
    /// (while the server cannot be reached, what waits is given up; a
    /// connection that broke is opened again once for it).
    pub(crate) fn is_done(&self, sh: &Shared) -> bool {
        let settled = self.out.is_empty()
            && self.copies.is_empty()
            && self.confirms.is_empty()
            && self.carry.open.is_empty();
        // Held jobs go back at the next write; while the server cannot be
        // reached they are given up (the server gives them out again).
        sh.stop.load(Ordering::SeqCst)
            && self.busy == 0
            && ((settled && self.waiting.is_empty()) || (!self.life.up && self.life.unreachable))
    }

    /// The end: what is still owed is given up and counted (the server
    /// gives the jobs back when their leases end).
    pub(crate) fn close(&mut self, sh: &Shared) {
        self.end_pulls(sh);
        for (_, _, owed) in self.confirms.drain(..) {
            if let Owed::Settle(p) = owed {
                self.carry.open.push(Unconfirmed {
                    id: p.seq,
                    settle: p.settle,
                    to: p.ack,
                    due: p.due,
                });
            }
        }
        for o in self
            .out
            .drain(..)
            .chain(self.copies.drain(..).map(Out::Settle))
        {
            if let Out::Settle(p) = o {
                if p.resent {
                    self.carry.open.push(Unconfirmed {
                        id: p.seq,
                        settle: p.settle,
                        to: p.ack,
                        due: p.due,
                    });
                } else {
                    Counters::add(&sh.counters.lease_dropped);
                    sh.give_ticket();
                }
            }
        }
        self.carry.give_up();
        self.count_carried(sh);
        while let Some(slot) = self.waiting.pop_front() {
            if let Slot::Running(h) = std::mem::replace(&mut self.slots[slot], Slot::Free) {
                self.acks.give(h.ack);
                self.free.push(slot);
                Counters::add(&sh.counters.lease_dropped);
                sh.give_ticket();
            }
        }
        self.life.up = false;
    }
}

#[cfg(test)]
mod tests;
