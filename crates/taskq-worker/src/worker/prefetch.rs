//! Prefetch: a window of up to `prefetch` jobs per connection, the running one
//! included, the rest reserved ahead of the handler.
//!
//! After each job, the settle, the touches that keep the waiting jobs' leases
//! and the no-wait reserves that refill the window go out in one write. Their
//! replies are read later, oldest first, when the window is down to half (or
//! before the handler uses the link, or when too many are owed): so a short
//! job costs one write and a fraction of a read. When the window is empty and the server
//! had nothing ready, one blocking reserve waits, as without prefetch.
//!
//! An engine that asks for a window's jobs in one request ([`Link::GATHER`]:
//! JetStream, whose refill is one pull of a batch) gathers instead: while the
//! next job is already in hand, a job's settle is queued and not written.
//! The settles go out with the pull that refills the window, in one write,
//! once the window is empty, or once the oldest of them has waited
//! [`GATHER_MAX`] (the pull then asks for the room there is). A replicated
//! stream answers a write after about the same round trip however many
//! acks and jobs it carries (about 3 ms for 50 or for 64 on a 3-node
//! cluster on 2 cores), so quick jobs are best served a whole window a
//! round trip (refilling at half a window ran at 0.6 of a loop that
//! refills an empty window of 64, at an eighth 0.75), while slow ones
//! still find the window refilled before it runs dry. A settle is
//! still counted only on the server's answer. Settles are never held back
//! long: a touch, a stop, a read or an empty window writes them, and so
//! does the next job's end or the thread that keeps the leases
//! ([`Keep::keep_leases`]) once they have waited [`GATHER_MAX`].
//!
//! The window lives behind a mutex that the lane's thread holds only between
//! jobs, so that a stop from another thread can give the jobs that have not
//! started back at once while a job runs. Whenever the mutex is free, every
//! queued request has been sent, but for the settles a window gathers.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use taskq_proto::{earliest, ConnectionError};

use super::account::{
    count_settled, delivered_again_while_running, failed, unexpected, After, UNAVAILABLE_PAUSE,
};
use super::settle::Settled;
use crate::counters::Counters;
use crate::engine::{Fault, Link, Pool, Req, Settle, Taken, Took, BODY_ROOM};
use crate::job::{job_info, JobError};
use crate::job_info::JobInfo;
use crate::shared::{Keep, Shared};

mod window;

/// A waiting job whose lease was restarted this long ago (or which was asked
/// for this long ago) is touched before it starts, or between jobs. beanstalkd
/// gives every job a TTR of at least one second, so a job younger than this
/// still has at least half a second of its lease.
pub(crate) const TOUCH_AFTER: Duration = Duration::from_millis(500);

/// A job that waited this long in the window since it was reserved is given
/// back: the jobs ahead of it are too long for it to start in time, and
/// another worker may be free.
pub(crate) const HOLD_MAX: Duration = Duration::from_secs(30);

/// Settles a gathering window holds back are written once the first of them
/// has waited this long, with a refill of the room there is: a long job
/// does not hold the acks of the jobs before it, and jobs slower than a
/// window a round trip keep the window filled ahead of them.
pub(crate) const GATHER_MAX: Duration = Duration::from_millis(2);

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

    /// The rule at `now` for jobs held by the async worker's machines,
    /// where a stop (`stopping`) gives every one back.
    pub(crate) fn held(now: Instant, soon: bool, stopping: bool) -> LeaseRule {
        let mut rule = LeaseRule::at(now, soon);
        if stopping {
            rule.release = Some(now);
        }
        rule
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

/// A job in the window that has not started.
struct Held {
    id: u64,
    body: Vec<u8>,
    /// Its header block (JetStream).
    headers: Vec<u8>,
    /// When the reserve that brought it was sent.
    asked: Instant,
    /// When its lease last started, at the latest: the reserve or the last
    /// touch confirmed, taken when the request was sent.
    leased: Instant,
    /// Larger than the limit (its size): settled without running.
    too_big: Option<u64>,
}

/// A reply owed on the link, in the order sent.
#[derive(Debug, Clone, Copy)]
enum Owed {
    Settle { id: u64, settle: Settle },
    Ask { sent: Instant },
    Touch { id: u64, sent: Instant },
}

/// One lane's connection with its window.
pub(super) struct Pipe<L> {
    pub(super) link: Option<L>,
    /// The server's index in the configuration.
    server: usize,
    /// The lane's index in the worker's shared state.
    lane: usize,
    held: VecDeque<Held>,
    /// Body buffers of jobs gone, reused by the next ones.
    bodies: Pool,
    /// Header-block buffers, likewise (made as headers come: beanstalkd's
    /// jobs have none, and an empty copy allocates nothing).
    headers: Pool,
    owed: VecDeque<Owed>,
    /// Of `owed`, the newest requests queued and not written yet (settles a
    /// gathering window holds back): no reply can come for them.
    unsent: usize,
    /// When the oldest of those was queued.
    gathered: Option<Instant>,
    /// How long they may wait: [`GATHER_MAX`] (a test that counts writes
    /// makes it long, so that no pause of the machine adds one).
    pub(super) gather_max: Duration,
    /// Reserves in flight.
    asks: usize,
    /// `DEADLINE_SOON` came since the lease rule last ran.
    soon: bool,
    /// No waiting job needs the lease rule before this (it may be earlier
    /// than need be: a lease restarted or a job gone only moves the true
    /// instant later); `None` with none waiting. The rule then skips its
    /// walk of the window after each job.
    lease_due: Option<Instant>,
    /// The last no-wait reserve found nothing ready.
    dry: bool,
    /// Weighted: the tube whose turn it was had nothing ready.
    turn_empty: bool,
    /// A reply came since the loop last looked.
    progress: bool,
    /// The job the lane's handler runs now: a delivery of it again (its
    /// lease ran out while it ran, and the server gave it back to this
    /// link) is not held to run a second time.
    pub(super) running: Option<u64>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<L: Link> Pipe<L> {
    pub(super) fn new(server: usize, lane: usize, k: usize) -> Pipe<L> {
        Pipe {
            link: None,
            server,
            lane,
            held: VecDeque::with_capacity(k),
            bodies: Pool::made(k + 1, BODY_ROOM),
            headers: Pool::default(),
            // Per job at most a settle, a touch per waiting job and a
            // refill; read once more than 2k are owed.
            owed: VecDeque::with_capacity(5 * k + 8),
            unsent: 0,
            gathered: None,
            gather_max: GATHER_MAX,
            asks: 0,
            soon: false,
            lease_due: None,
            dry: false,
            turn_empty: false,
            progress: false,
            running: None,
        }
    }

    fn link(&mut self) -> Result<&mut L, ConnectionError> {
        self.link.as_mut().ok_or(ConnectionError::Broken)
    }

    /// Queues a request and the reply it is owed.
    fn queue(&mut self, req: Req<'_>, owed: Owed) -> Result<(), ConnectionError> {
        self.link()?.queue(req)?;
        self.owed.push_back(owed);
        self.unsent += 1;
        Ok(())
    }

    /// Sends what was queued; on failure the window is forgotten.
    fn flush(&mut self, sh: &Shared) -> Result<(), After> {
        let r = self
            .link
            .as_mut()
            .map_or(Err(ConnectionError::Broken), L::flush);
        self.unsent = 0;
        self.gathered = None;
        r.map_err(|e| {
            let server = sh.cfg.servers[self.server].as_str();
            self.forget(sh);
            failed(sh, server, None, &e)
        })
    }

    /// Writes the settles held back, if any.
    fn send_gathered(&mut self, sh: &Shared) -> Result<(), After> {
        if self.unsent > 0 {
            self.flush(sh)?;
        }
        Ok(())
    }

    /// Reads every owed reply and counts it: settles as without prefetch,
    /// reserves into the window, touches into the leases. What was held back
    /// is written first.
    fn absorb(&mut self, sh: &Shared) -> Result<(), After> {
        self.send_gathered(sh)?;
        self.absorb_until(sh, usize::MAX)
    }

    /// [`absorb`](Self::absorb) of the replies to what was written, oldest
    /// first, stopping once `held` jobs wait in the window: the newest
    /// replies may not have come yet.
    fn absorb_until(&mut self, sh: &Shared, held: usize) -> Result<(), After> {
        let server = sh.cfg.servers[self.server].as_str();
        // Reserves the server could not serve: one pause after them all
        // (a pull of the whole window ends unserved at once, and each of its
        // asks is told so).
        let mut unavailable = false;
        while self.held.len() < held && self.owed.len() > self.unsent {
            let Some(owed) = self.owed.pop_front() else {
                break;
            };
            let Some(link) = self.link.as_mut() else {
                self.forget(sh);
                return Err(After::Broken);
            };
            let fault = match owed {
                Owed::Settle { id, settle } => {
                    let reply = link.settled();
                    self.progress |= reply.is_ok();
                    match count_settled(sh, link, server, id, settle, reply) {
                        Ok(()) => continue,
                        Err(after) => {
                            self.forget(sh);
                            return Err(after);
                        }
                    }
                }
                Owed::Ask { sent } => {
                    self.asks -= 1;
                    match link.reserved() {
                        Ok(ref took) if took.job().is_some() => {
                            let Taken {
                                id,
                                body,
                                headers,
                                too_big,
                            } = took.job().expect("a job");
                            Counters::add(&sh.counters.reserved);
                            sh.took_job(&sh.lanes[self.lane]);
                            self.progress = true;
                            self.dry = false;
                            if self.running == Some(id) {
                                // Its lease ran out while its handler runs,
                                // and it came back to this link: one job, run
                                // once, settled on the newer lease.
                                delivered_again_while_running(sh, server, id);
                                continue;
                            }
                            if let Some(h) = self.held.iter_mut().find(|h| h.id == id) {
                                // Its lease ran out while it waited, and the
                                // server handed it to this link again: one job,
                                // held once, on the newer lease.
                                Counters::add(&sh.counters.lost_lease_on_release);
                                sh.give_ticket();
                                self.bodies.copy_into(&mut h.body, body);
                                self.headers.copy_into(&mut h.headers, headers);
                                (h.asked, h.leased, h.too_big) = (sent, sent, too_big);
                                self.lease_due_by(sent, sent);
                            } else {
                                let b = self.bodies.copy(body);
                                let headers = self.headers.copy(headers);
                                self.held.push_back(Held {
                                    id,
                                    body: b,
                                    headers,
                                    asked: sent,
                                    leased: sent,
                                    too_big,
                                });
                                self.lease_due_by(sent, sent);
                            }
                            continue;
                        }
                        Ok(took) => {
                            self.progress = true;
                            sh.give_ticket();
                            match took {
                                Took::DeadlineSoon => {
                                    // A waiting job's lease ends within a
                                    // second: the lease rule touches them all.
                                    Counters::add(&sh.counters.deadline_soon);
                                    self.soon = true;
                                }
                                Took::TurnEmpty => {
                                    self.dry = true;
                                    self.turn_empty = true;
                                }
                                Took::Unavailable => {
                                    // An election: not idle, and no spinning
                                    // on the server's instant answers.
                                    sh.busy();
                                    self.dry = true;
                                    unavailable = true;
                                }
                                _ => self.dry = true,
                            }
                            continue;
                        }
                        Err(f) => {
                            sh.give_ticket();
                            f
                        }
                    }
                }
                Owed::Touch { id, sent } => match link.touched() {
                    Ok(true) => {
                        self.progress = true;
                        Counters::add(&sh.counters.touched);
                        if let Some(h) = self.held.iter_mut().find(|h| h.id == id) {
                            h.leased = sent;
                        }
                        continue;
                    }
                    Ok(false) => {
                        // It waited past its lease: the server has it back.
                        self.progress = true;
                        if let Some(k) = self.held.iter().position(|h| h.id == id) {
                            self.drop_held(k);
                            Counters::add(&sh.counters.lost_lease_on_release);
                            sh.give_ticket();
                            tracing::warn!(job = id, server, "prefetched job's lease ran out");
                        }
                        continue;
                    }
                    Err(f) => f,
                },
            };
            let after = match fault {
                Fault::Unexpected(word) => unexpected(sh, link, server, None, word),
                Fault::Conn(e) => failed(sh, server, None, &e),
            };
            self.forget(sh);
            return Err(after);
        }
        if unavailable {
            std::thread::sleep(UNAVAILABLE_PAUSE);
        }
        Ok(())
    }

    /// A gathering window holds the settle just queued back: the next job is
    /// in hand or on its way (its read needs nothing more written), no touch
    /// waits to go out, the settles held are young, and
    /// the refill is not due (it is once the last pull was read and the
    /// window is empty, or at once when the server had nothing ready last
    /// time; never when `max_jobs` leaves nothing to ask for).
    fn gathers(&self, sh: &Shared, touched: bool, now: Instant) -> bool {
        let refill = self.asks == 0 && (self.dry || self.held.is_empty()) && sh.has_ticket();
        L::GATHER
            && !touched
            && (!self.held.is_empty() || self.asks > 0)
            && !refill
            && self
                .gathered
                .is_none_or(|t| now.duration_since(t) < self.gather_max)
    }

    fn drop_held(&mut self, k: usize) {
        if let Some(h) = self.held.remove(k) {
            self.bodies.give(h.body);
            self.headers.give(h.headers);
        }
    }

    /// The link broke (or was given up): the server gives back every job it
    /// held. Counts what each owed reply and waiting job comes to.
    pub(super) fn forget(&mut self, sh: &Shared) {
        if let Some(l) = self.link.as_mut() {
            l.mark_broken();
        }
        while let Some(o) = self.owed.pop_front() {
            match o {
                Owed::Settle { id, settle } => {
                    if self.link.as_mut().is_some_and(|l| l.carry_settle(id)) {
                        // Sent again on the next connection; counted then.
                        continue;
                    }
                    // A delete may have been carried out: it counts as
                    // unknown, which keeps the bracket of the server's record.
                    let settled = Settled::unanswered(settle == Settle::Delete);
                    Counters::add(settled.counter(&sh.counters));
                    sh.give_ticket();
                }
                Owed::Ask { .. } => sh.give_ticket(),
                Owed::Touch { .. } => {}
            }
        }
        self.asks = 0;
        self.unsent = 0;
        self.gathered = None;
        while !self.held.is_empty() {
            self.drop_held(0);
            Counters::add(&sh.counters.lease_dropped);
            sh.give_ticket();
        }
    }

    /// Applies the lease rule to every waiting job: the releases at once (each
    /// asks the job's priority first: a rare path), the touches queued for the
    /// next write. True when touches were queued.
    fn queue_leases(&mut self, sh: &Shared, now: Instant) -> Result<bool, After> {
        if !self.soon && self.lease_due.is_none_or(|t| now < t) {
            return Ok(false);
        }
        let at = LeaseRule::at(now, std::mem::take(&mut self.soon));
        let rule = |h: &Held| at.of(h.asked, h.leased);
        if self.held.iter().any(|h| rule(h) == Lease::Release) {
            self.release(sh, |h| rule(h) == Lease::Release)?;
        }
        let mut touched = false;
        for k in 0..self.held.len() {
            if rule(&self.held[k]) != Lease::Touch {
                continue;
            }
            let id = self.held[k].id;
            if let Err(e) = self.queue(Req::Touch(id), Owed::Touch { id, sent: now }) {
                self.forget(sh);
                return Err(failed(
                    sh,
                    sh.cfg.servers[self.server].as_str(),
                    Some(id),
                    &e,
                ));
            }
            touched = true;
        }
        self.lease_due = None;
        for k in 0..self.held.len() {
            let (asked, leased) = (self.held[k].asked, self.held[k].leased);
            self.lease_due_by(asked, leased);
        }
        Ok(touched)
    }

    /// A waiting job asked for at `asked`, its lease started at `leased`,
    /// may need the lease rule from its first due instant on.
    fn lease_due_by(&mut self, asked: Instant, leased: Instant) {
        if let Some(t) = LeaseRule::first_due(asked, leased) {
            self.lease_due = Some(self.lease_due.map_or(t, |d| d.min(t)));
        }
    }

    /// Gives back, at once, every waiting job that `pick` chooses (all of
    /// them at a stop): the replies owed first, then each job's priority, then
    /// the releases in one write.
    fn release(&mut self, sh: &Shared, pick: impl Fn(&Held) -> bool) -> Result<(), After> {
        self.absorb(sh)?;
        let server = sh.cfg.servers[self.server].as_str();
        let mut k = 0;
        let mut any = false;
        while k < self.held.len() {
            if !pick(&self.held[k]) {
                k += 1;
                continue;
            }
            let id = self.held[k].id;
            self.drop_held(k);
            let Some(link) = self.link.as_mut() else {
                break;
            };
            match job_info(link, sh, id, server, None) {
                Ok(JobInfo { pri, .. }) => {
                    // Given back unstarted: not an attempt of the job's.
                    crate::worker::settle::note_tempfail(sh, self.server, id);
                    let settle = Settle::Release { pri, delay: 0 };
                    if let Err(e) = self.queue(Req::Settle(id, settle), Owed::Settle { id, settle })
                    {
                        Counters::add(&sh.counters.lease_dropped);
                        sh.give_ticket();
                        self.forget(sh);
                        return Err(failed(sh, server, Some(id), &e));
                    }
                    any = true;
                }
                Err(JobError::LeaseLost) => {
                    Counters::add(&sh.counters.lost_lease_on_release);
                    sh.give_ticket();
                }
                Err(_) => {
                    Counters::add(&sh.counters.lease_dropped);
                    sh.give_ticket();
                    self.forget(sh);
                    return Err(After::Broken);
                }
            }
        }
        if any {
            self.flush(sh)?;
            self.absorb(sh)?;
        }
        Ok(())
    }
}

impl<L: Link + Send> Keep for Mutex<Pipe<L>> {
    fn release_unstarted(&self, sh: &Shared) {
        let mut p = lock(self);
        let live = p.link.as_ref().is_some_and(|l| !l.is_broken());
        if live && (!p.held.is_empty() || !p.owed.is_empty()) {
            // A failure gives the link up; the lane's thread sees it broken.
            let _ = p.release(sh, |_| true);
        }
    }

    fn keep_leases(&self, sh: &Shared) {
        let Ok(mut p) = self.try_lock() else {
            return;
        };
        let live = p.link.as_ref().is_some_and(|l| !l.is_broken());
        if !live {
            return;
        }
        let now = Instant::now();
        // A failure gives the link up; the lane's thread sees it broken.
        if !p.held.is_empty() {
            if let Ok(true) = p.queue_leases(sh, now) {
                let _ = p.flush(sh).and_then(|()| p.absorb(sh));
                return;
            }
        }
        // The settles of the jobs before the running one wait for nothing.
        if p.gathered
            .is_some_and(|t| now.duration_since(t) >= p.gather_max)
        {
            let _ = p.flush(sh);
        }
    }
}

#[cfg(test)]
mod scripted;

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    use super::scripted::{Say, Scripted};
    use super::*;
    use crate::config::Config;
    use crate::engine::SettleReply;
    use crate::worker::Worker;

    const MS: Duration = Duration::from_millis(1);

    /// A worker's shared state with ten `max_jobs` tickets.
    fn shared() -> Arc<Shared> {
        let cfg = Config {
            max_jobs: Some(10),
            prefetch: 4,
            ..Config::default()
        };
        Worker::new(cfg, |_: &mut crate::Job<'_>| crate::Outcome::Done)
            .unwrap()
            .shared
    }

    fn tickets(sh: &Shared) -> u64 {
        sh.tickets.load(Ordering::SeqCst)
    }

    /// A window on a scripted link, with `asks` reserves owed (tickets taken).
    fn pipe(sh: &Shared, asks: usize, script: Vec<Say>) -> Pipe<Scripted> {
        let mut p = Pipe::new(0, 0, 4);
        p.link = Some(Scripted {
            script: script.into(),
            ..Scripted::default()
        });
        let t0 = Instant::now();
        for _ in 0..asks {
            assert!(sh.take_ticket());
            p.owed.push_back(Owed::Ask { sent: t0 });
            p.asks += 1;
        }
        p
    }

    #[test]
    fn a_refill_fills_the_window_and_deadline_soon_is_a_signal_not_an_error() {
        let sh = shared();
        let mut p = pipe(&sh, 3, vec![Say::Job(7), Say::Soon, Say::Empty]);
        p.absorb(&sh).unwrap();
        assert_eq!(p.held.iter().map(|h| h.id).collect::<Vec<_>>(), [7]);
        assert_eq!(p.held[0].body, b"body");
        assert!(p.soon && p.dry && p.turn_empty);
        assert_eq!(p.asks, 0);
        // The job keeps its ticket; the two empty answers gave theirs back.
        assert_eq!(tickets(&sh), 9);
        let c = sh.counters.snapshot();
        assert_eq!(
            (c.reserved, c.deadline_soon, c.unexpected_replies),
            (1, 1, 0)
        );
        assert!(!p.link.as_ref().unwrap().broken);
        // The next lease rule touches every waiting job, however young.
        assert!(p.queue_leases(&sh, Instant::now()).unwrap());
        assert_eq!(p.link.as_ref().unwrap().queued, ["touch 7"]);
        assert!(!p.soon);
    }

    /// The rule walks the window only once some waiting job may need it:
    /// before the youngest lease's touch age nothing is queued, at it every
    /// job due is touched, and until a touch is confirmed it stays due.
    #[test]
    fn the_lease_rule_acts_from_the_first_jobs_touch_age_and_not_before() {
        let sh = shared();
        let mut p = pipe(&sh, 2, vec![Say::Job(1), Say::Job(2)]);
        p.absorb(&sh).unwrap();
        let asked = p.held[0].asked;
        p.held[1].leased = asked + 100 * MS;
        assert!(!p.queue_leases(&sh, asked + TOUCH_AFTER - MS).unwrap());
        assert!(p.link.as_ref().unwrap().queued.is_empty());
        assert!(p.queue_leases(&sh, asked + TOUCH_AFTER).unwrap());
        assert!(p.queue_leases(&sh, asked + TOUCH_AFTER + 100 * MS).unwrap());
        assert_eq!(
            p.link.as_ref().unwrap().queued,
            ["touch 1", "touch 1", "touch 2"]
        );
    }

    #[test]
    fn a_waiting_job_whose_touch_is_not_found_is_dropped_never_run() {
        let sh = shared();
        let mut p = pipe(&sh, 2, vec![Say::Job(1), Say::Job(2)]);
        p.absorb(&sh).unwrap();
        let now = Instant::now();
        for id in [1, 2] {
            p.queue(Req::Touch(id), Owed::Touch { id, sent: now })
                .unwrap();
        }
        p.link.as_mut().unwrap().script = vec![Say::Touched(true), Say::Touched(false)].into();
        let spare = p.bodies.spare();
        p.absorb(&sh).unwrap();
        assert_eq!(p.held.iter().map(|h| h.id).collect::<Vec<_>>(), [1]);
        assert_eq!(p.held[0].leased, now);
        let c = sh.counters.snapshot();
        assert_eq!((c.touched, c.lost_lease_on_release), (1, 1));
        assert_eq!(tickets(&sh), 9);
        assert_eq!(
            p.bodies.spare(),
            spare + 1,
            "the body buffer is kept for reuse"
        );
    }

    /// A pull of the whole window the server could not serve (an election,
    /// or a pull it never took) answers each of its asks so: the window
    /// pauses once after them, not once per ask (eight pauses of 250 ms
    /// stalled a 3-node drain for 8 s after its first pull went unanswered).
    #[test]
    fn a_window_the_server_cannot_serve_pauses_once() {
        let sh = shared();
        let mut p = pipe(&sh, 4, (0..4).map(|_| Say::Unavailable).collect());
        let t = Instant::now();
        p.absorb(&sh).unwrap();
        let took = t.elapsed();
        assert!(took >= UNAVAILABLE_PAUSE, "{took:?}");
        assert!(
            took < 3 * UNAVAILABLE_PAUSE,
            "one pause, not four: {took:?}"
        );
        assert!(p.dry && p.held.is_empty());
        assert_eq!((p.asks, tickets(&sh)), (0, 10), "every ticket back");
        assert!(!p.link.as_ref().unwrap().broken);
    }

    #[test]
    fn a_job_handed_out_again_is_held_once() {
        let sh = shared();
        let mut p = pipe(&sh, 2, vec![Say::Job(5), Say::Job(5)]);
        p.absorb(&sh).unwrap();
        assert_eq!(p.held.len(), 1);
        assert_eq!(tickets(&sh), 9);
        assert_eq!(sh.counters.snapshot().lost_lease_on_release, 1);
    }

    #[test]
    fn only_the_older_replies_are_read_while_the_window_has_jobs() {
        let sh = shared();
        let mut p = pipe(&sh, 3, vec![Say::Job(1), Say::Job(2)]);
        p.absorb_until(&sh, 2).unwrap();
        // The third reply may not have come: it is not waited for.
        assert_eq!((p.held.len(), p.owed.len(), p.asks), (2, 1, 1));
        assert!(!p.link.as_ref().unwrap().broken);
    }

    #[test]
    fn a_broken_link_forgets_the_window_and_counts_every_owed_reply() {
        let sh = shared();
        // Two jobs come, then the link fails before the third reply.
        let mut p = pipe(&sh, 3, vec![Say::Job(1), Say::Job(2)]);
        p.owed.push_back(Owed::Settle {
            id: 9,
            settle: Settle::Delete,
        });
        assert!(sh.take_ticket(), "the ticket of job 9");
        assert!(matches!(p.absorb(&sh), Err(After::Broken)));
        assert!(p.held.is_empty() && p.owed.is_empty());
        assert_eq!(p.asks, 0);
        assert!(p.link.as_ref().unwrap().broken);
        let c = sh.counters.snapshot();
        // The delete may have been carried out; the waiting jobs go back.
        assert_eq!((c.reserved, c.ack_unknown, c.lease_dropped), (2, 1, 2));
        assert_eq!(tickets(&sh), 10, "every ticket back");
    }

    #[test]
    fn a_job_waiting_too_long_is_released_with_its_priority() {
        let sh = shared();
        let mut p = pipe(&sh, 2, vec![Say::Job(1), Say::Job(2)]);
        p.absorb(&sh).unwrap();
        let now = p.held[0].asked + HOLD_MAX;
        // Job 1 was touched lately, job 2 is young: only the wait counts.
        p.held[0].leased = now;
        p.held[1].asked = now - MS;
        p.held[1].leased = now - MS;
        p.link.as_mut().unwrap().script =
            vec![Say::Info(42), Say::Settled(SettleReply::Released)].into();
        assert!(!p.queue_leases(&sh, now).unwrap(), "nothing to touch");
        assert_eq!(p.held.iter().map(|h| h.id).collect::<Vec<_>>(), [2]);
        let link = p.link.as_ref().unwrap();
        assert_eq!(link.queued, ["Release { pri: 42, delay: 0 } 1"]);
        assert_eq!(link.writes, 1);
        let c = sh.counters.snapshot();
        assert_eq!(c.released, 1);
        assert_eq!(tickets(&sh), 9);
        // Given back unstarted: when it comes again, its release is not
        // counted as a failed attempt.
        assert_eq!(crate::worker::settle::attempt(&sh, 0, 1, 1), 1);
    }

    #[test]
    fn a_job_delivered_again_while_its_handler_runs_is_not_held_to_run_twice() {
        let sh = shared();
        let mut p = pipe(&sh, 1, vec![Say::Job(5)]);
        p.absorb(&sh).unwrap();
        // Job 5 starts: its lease then runs out while it runs, and a refill
        // brings it to this link again.
        p.held.pop_front();
        p.running = Some(5);
        assert!(sh.take_ticket());
        p.owed.push_back(Owed::Ask {
            sent: Instant::now(),
        });
        p.asks += 1;
        p.link.as_mut().unwrap().script = vec![Say::Job(5)].into();
        p.absorb(&sh).unwrap();
        assert!(p.held.is_empty(), "not held a second time");
        let c = sh.counters.snapshot();
        assert_eq!((c.reserved, c.lost_lease_on_release), (2, 1));
        // The running job keeps its ticket; the second delivery's came back.
        assert_eq!(tickets(&sh), 9);
    }

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
