//! The shared producer's core, with no socket and no clock of its own: the
//! puts callers handed in, which of them are written and owe a reply, and
//! what a reply, a broken connection or a failed connect makes of each.
//!
//! Every put lives in a [`Slot`] from the moment a caller hands it in until
//! the caller takes its outcome (or drops its future). Slots are made once,
//! up to the configured number, and reused: their tube and body buffers keep
//! their room, so a put in steady state allocates nothing.
//!
//! A slot moves `Queued` (handed in, not written) → `Written` (on the
//! connection, its reply owed) → `Done` (outcome waiting for the caller) →
//! free. A broken connection sends its written puts back to `Queued` when
//! the engine's rule says to send them again (at-least-once retries on
//! beanstalkd; the same message id within `resolve_for` on JetStream), else
//! to `Done` with their outcome unknown. Puts still `Queued` go out on the
//! next connection. The owed replies are kept in the order they were
//! written, each naming its slot and that slot's generation, so a reply can
//! only ever reach the put it answers.

use std::collections::VecDeque;
use std::task::Waker;
use std::time::Instant;

use crate::classify::Attempts;
pub(crate) use crate::classify::Rule;
use crate::error::{Error, NotSent};
use crate::{JobId, PutOptions};

/// Where a put is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Not in use.
    Free,
    /// Handed in, not yet written.
    Queued,
    /// Written; its reply is owed.
    Written,
    /// Its outcome waits for the caller.
    Done,
}

/// One put, from hand-in to outcome.
#[derive(Debug)]
pub(crate) struct Slot {
    /// Bumped each time the slot is taken, so nothing meant for an earlier
    /// put can reach a later one.
    pub(crate) gen: u32,
    pub(crate) phase: Phase,
    pub(crate) tube: String,
    pub(crate) body: Vec<u8>,
    pub(crate) opts: PutOptions,
    /// The room this put holds against the byte limit.
    pub(crate) weight: u32,
    /// JetStream: the message id's counter, fixed at the first write so
    /// every copy carries the same id (0: not written yet).
    pub(crate) msg: u64,
    /// Whether a failed attempt goes again: the rule every producer keeps.
    attempts: Attempts,
    /// The caller's future was dropped after the put was written: its reply
    /// is still read, and handed to nobody.
    abandoned: bool,
    outcome: Option<Result<JobId, Error>>,
    waker: Option<Waker>,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            gen: 0,
            phase: Phase::Free,
            tube: String::new(),
            body: Vec::new(),
            opts: PutOptions::default(),
            weight: 0,
            msg: 0,
            attempts: Attempts::new(Rule::Retries(0)),
            abandoned: false,
            outcome: None,
            waker: None,
        }
    }
}

/// A put handed in: its slot and the slot's generation then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ticket {
    pub(crate) slot: u32,
    pub(crate) gen: u32,
}

/// One reply owed on the connection, in the order written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owed {
    /// A `use` the driver inserted where the tube changed.
    Use,
    /// A put; `token` is its reply subject's token on JetStream.
    Put { ticket: Ticket, token: u64 },
}

/// The most buffer a free slot keeps for its next body (a put of a larger
/// body allocates its own, given back when its outcome is taken).
const KEEP_BODY: usize = 4 << 10;

/// The shared producer's state: every slot, the queue of puts to write,
/// the replies owed.
#[derive(Debug)]
pub(crate) struct Pipeline {
    slots: Vec<Slot>,
    free: Vec<u32>,
    queued: VecDeque<u32>,
    owed: VecDeque<Owed>,
    rule: Rule,
    /// Handles to the producer still alive; at 0 the driver ends once
    /// nothing is owed.
    pub(crate) handles: usize,
    /// The driver is gone (its runtime shut down): every put fails at once.
    pub(crate) dead: bool,
    /// The driver waits for work here.
    pub(crate) driver: Option<Waker>,
    /// Sends wait until then (the stream had no leader).
    pub(crate) pause_until: Option<Instant>,
    /// Slots and weight the driver freed (abandoned puts), not yet given
    /// back to the permits.
    freed: (usize, usize),
}

impl Pipeline {
    /// Room for `max_puts` puts at once, made now.
    pub(crate) fn new(max_puts: usize, rule: Rule) -> Pipeline {
        let max = max_puts.clamp(1, u32::MAX as usize);
        Pipeline {
            slots: (0..max).map(|_| Slot::new()).collect(),
            free: (0..max as u32).rev().collect(),
            queued: VecDeque::with_capacity(max),
            // A `use` may precede every put.
            owed: VecDeque::with_capacity(2 * max),
            rule,
            handles: 1,
            dead: false,
            driver: None,
            pause_until: None,
            freed: (0, 0),
        }
    }

    /// Hands a put in (the caller holds a permit, so a slot is free);
    /// `None` when the driver is gone.
    #[cfg(test)]
    pub(crate) fn hand_in(
        &mut self,
        tube: &str,
        body: &[u8],
        opts: PutOptions,
        weight: u32,
    ) -> Option<Ticket> {
        self.hand_in_with(tube, opts, weight, |b| {
            b.extend_from_slice(body);
            Ok(())
        })
        .map(|r| r.expect("a copy cannot fail"))
    }

    /// [`hand_in`](Self::hand_in) with the body written into the slot's
    /// buffer by `fill` (a failure hands nothing in).
    pub(crate) fn hand_in_with(
        &mut self,
        tube: &str,
        opts: PutOptions,
        weight: u32,
        fill: impl FnOnce(&mut Vec<u8>) -> Result<(), Error>,
    ) -> Option<Result<Ticket, Error>> {
        if self.dead {
            return None;
        }
        let &i = self.free.last().expect("a permit stands for a free slot");
        let s = &mut self.slots[i as usize];
        s.body.clear();
        if let Err(e) = fill(&mut s.body) {
            return Some(Err(e));
        }
        self.free.pop();
        s.gen = s.gen.wrapping_add(1);
        s.phase = Phase::Queued;
        s.tube.clear();
        s.tube.push_str(tube);
        s.opts = opts;
        s.weight = weight;
        s.msg = 0;
        s.attempts = Attempts::new(self.rule);
        s.abandoned = false;
        s.outcome = None;
        s.waker = None;
        self.queued.push_back(i);
        Some(Ok(Ticket {
            slot: i,
            gen: s.gen,
        }))
    }

    fn slot(&mut self, t: Ticket) -> Option<&mut Slot> {
        self.slots
            .get_mut(t.slot as usize)
            .filter(|s| s.gen == t.gen && s.phase != Phase::Free)
    }

    /// The caller polls its put: its outcome once there is one (the slot is
    /// then freed; the weight to give back comes with it), else the waker is
    /// kept.
    pub(crate) fn poll_outcome(
        &mut self,
        t: Ticket,
        waker: &Waker,
    ) -> Option<(Result<JobId, Error>, u32)> {
        let dead = self.dead;
        let s = self.slot(t)?;
        if s.phase == Phase::Done {
            let r = s.outcome.take().expect("a done slot holds its outcome");
            return Some((r, self.release(t.slot)));
        }
        if dead {
            // The driver ended without settling it (its runtime shut down).
            let r = match s.phase {
                Phase::Queued => Err(Error::NotSent(NotSent::Broken)),
                _ => Err(unknown("the producer's driver ended before the reply")),
            };
            return Some((r, self.release(t.slot)));
        }
        match &s.waker {
            Some(w) if w.will_wake(waker) => {}
            _ => s.waker = Some(waker.clone()),
        }
        None
    }

    /// The caller dropped its future before the outcome: a put not yet
    /// written is taken back (never sent); a written one is left to the
    /// driver, which reads its reply and frees it. Returns the weight to
    /// give back when the slot was freed now.
    pub(crate) fn abandon(&mut self, t: Ticket) -> Option<u32> {
        let dead = self.dead;
        let s = self.slot(t)?;
        match s.phase {
            Phase::Written if !dead => {
                s.abandoned = true;
                s.waker = None;
                None
            }
            Phase::Queued => {
                if let Some(at) = self.queued.iter().position(|&i| i == t.slot) {
                    self.queued.remove(at);
                }
                Some(self.release(t.slot))
            }
            _ => Some(self.release(t.slot)),
        }
    }

    /// Frees the slot of an abandoned put, its room to be given back.
    fn release_abandoned(&mut self, i: u32) {
        let w = self.release(i);
        self.freed.0 += 1;
        self.freed.1 += w as usize;
    }

    /// The slots and weight freed since the last call, to give back.
    pub(crate) fn take_freed(&mut self) -> (usize, usize) {
        std::mem::take(&mut self.freed)
    }

    fn release(&mut self, i: u32) -> u32 {
        let s = &mut self.slots[i as usize];
        if s.body.capacity() > KEEP_BODY {
            // A large body's buffer goes: what the slots keep between puts
            // stays within `max_puts` times this, beside the bytes waiting.
            s.body = Vec::new();
        }
        s.phase = Phase::Free;
        s.waker = None;
        s.outcome = None;
        self.free.push(i);
        s.weight
    }

    /// True when a put waits to be written (and sends are not paused at `now`).
    /// (The clock is read only while sends are paused.)
    pub(crate) fn has_queued(&self, now: impl FnOnce() -> Instant) -> bool {
        !self.queued.is_empty() && self.pause_until.is_none_or(|p| now() >= p)
    }

    /// While puts wait and sends are paused past `now`: until when.
    pub(crate) fn paused(&self, now: impl FnOnce() -> Instant) -> Option<Instant> {
        let until = self.pause_until.filter(|_| !self.queued.is_empty())?;
        (until > now()).then_some(until)
    }

    /// Puts back an owed reply taken by mistake (the reply did not fit it),
    /// so a break that follows counts it.
    pub(crate) fn owe_again(&mut self, o: Owed) {
        self.owed.push_front(o);
    }

    /// Puts handed in whose outcome was not taken yet.
    pub(crate) fn in_use(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// True when replies are owed.
    pub(crate) fn owes(&self) -> bool {
        !self.owed.is_empty()
    }

    /// True when the driver may end: no handle left, nothing queued or owed.
    pub(crate) fn finished(&self) -> bool {
        self.handles == 0 && self.queued.is_empty() && self.owed.is_empty()
    }

    /// The next put to write, up to `max_bytes` of bodies in all
    /// (`written` so far this write; one put always goes); none while
    /// sends are paused at `now` (a reply that asks for a pause holds back
    /// every put queued, whatever other replies are owed).
    pub(crate) fn next_queued(
        &self,
        written: usize,
        max_bytes: usize,
        now: impl FnOnce() -> Instant,
    ) -> Option<Ticket> {
        let &i = self.queued.front()?;
        if self.pause_until.is_some_and(|p| now() < p) {
            return None;
        }
        let s = &self.slots[i as usize];
        (written == 0 || written + s.body.len() <= max_bytes).then_some(Ticket {
            slot: i,
            gen: s.gen,
        })
    }

    /// The queued put `t` as the driver encodes it.
    pub(crate) fn queued_put(&mut self, t: Ticket) -> &mut Slot {
        &mut self.slots[t.slot as usize]
    }

    /// The driver inserted a `use` ahead of the next put.
    pub(crate) fn wrote_use(&mut self) {
        self.owed.push_back(Owed::Use);
    }

    /// The head of the queue, `t`, was encoded for the next write with
    /// reply token `token`.
    pub(crate) fn wrote(&mut self, t: Ticket, token: u64) {
        let i = self.queued.pop_front();
        debug_assert_eq!(i, Some(t.slot));
        self.slots[t.slot as usize].phase = Phase::Written;
        self.owed.push_back(Owed::Put { ticket: t, token });
    }

    /// The head of the queue could not be encoded for a reason of its own
    /// (nothing of it was queued): that is its outcome.
    pub(crate) fn refused(&mut self, t: Ticket, e: Error, wake: &mut Vec<Waker>) {
        let i = self.queued.pop_front();
        debug_assert_eq!(i, Some(t.slot));
        self.settle(t, Err(e), wake);
    }

    /// The oldest reply owed (beanstalkd answers in order).
    pub(crate) fn pop_owed(&mut self) -> Option<Owed> {
        self.owed.pop_front()
    }

    /// The owed put whose reply carries `token` (JetStream matches by reply
    /// subject); `None` for a token nothing owes.
    pub(crate) fn take_token(&mut self, token: u64) -> Option<Ticket> {
        let at = self
            .owed
            .iter()
            .position(|o| matches!(o, Owed::Put { token: k, .. } if *k == token))?;
        match self.owed.remove(at) {
            Some(Owed::Put { ticket, .. }) => Some(ticket),
            _ => None,
        }
    }

    /// The reply to put `t` came: `r` is its answer (an id, a rejection, or
    /// JetStream's "no leader", which sends it again after a pause within
    /// `resolve_for`).
    pub(crate) fn answered(
        &mut self,
        t: Ticket,
        r: Result<JobId, Error>,
        now: impl FnOnce() -> Instant,
        wake: &mut Vec<Waker>,
    ) {
        // The clock is read only for a put that may go again.
        if matches!(r, Err(Error::NotSent(_) | Error::Unknown(_))) && self.again(t, &r, now()) {
            return;
        }
        self.settle(t, r, wake);
    }

    /// The last write, of the newest `n` owed replies, left nothing: its
    /// puts are queued again ahead of the rest, as if never written
    /// (no attempt counted), and its `use`s forgotten.
    pub(crate) fn unwrite(&mut self, n: usize) {
        for _ in 0..n {
            match self.owed.pop_back() {
                Some(Owed::Put { ticket, .. }) => {
                    if self.slots[ticket.slot as usize].abandoned {
                        self.release_abandoned(ticket.slot);
                    } else {
                        self.slots[ticket.slot as usize].phase = Phase::Queued;
                        self.queued.push_front(ticket.slot);
                    }
                }
                Some(Owed::Use) => {}
                None => break,
            }
        }
    }

    /// The connection broke: each written put is sent again where the rule
    /// says so (ahead of the queue, in the order written), else its outcome
    /// is unknown (`e` says why). Puts not written stay queued.
    pub(crate) fn broke(
        &mut self,
        e: &taskq_proto::ConnectionError,
        now: Instant,
        wake: &mut Vec<Waker>,
    ) {
        while let Some(o) = self.owed.pop_back() {
            let Owed::Put { ticket, .. } = o else {
                continue;
            };
            let r = Err(Error::Unknown(copy_conn_error(e)));
            if self.slots[ticket.slot as usize].abandoned {
                self.release_abandoned(ticket.slot);
                continue;
            }
            if !self.again(ticket, &r, now) {
                self.settle(ticket, r, wake);
            }
        }
    }

    /// A connect failed with `e`: each queued put counts a failed attempt;
    /// those the rule gives up on end with `e`'s kind (not sent, or unknown
    /// once a copy may have reached the server).
    pub(crate) fn connect_failed(&mut self, e: &Error, now: Instant, wake: &mut Vec<Waker>) {
        for _ in 0..self.queued.len() {
            let i = self.queued.pop_front().expect("counted above");
            let t = Ticket {
                slot: i,
                gen: self.slots[i as usize].gen,
            };
            let r = Err(copy_error(e));
            if self.again_queued(t, &r, now) {
                self.queued.push_back(i);
            } else {
                self.settle(t, r, wake);
            }
        }
    }

    /// Written put `t` failed with `r`: true when it goes again (back at
    /// the front of the queue, its message id kept).
    fn again(&mut self, t: Ticket, r: &Result<JobId, Error>, now: Instant) -> bool {
        // Nobody waits for an abandoned put: it is not sent again.
        if self.slots[t.slot as usize].abandoned || !self.again_queued(t, r, now) {
            return false;
        }
        self.slots[t.slot as usize].phase = Phase::Queued;
        self.queued.push_front(t.slot);
        true
    }

    /// The rule for put `t` after failed attempt `r`.
    fn again_queued(&mut self, t: Ticket, r: &Result<JobId, Error>, now: Instant) -> bool {
        match self.slots[t.slot as usize].attempts.again(r, now) {
            Some(again) => {
                if let Some(pause) = again.pause() {
                    self.pause_until = Some(now + pause);
                }
                true
            }
            None => false,
        }
    }

    /// Put `t`'s outcome is `r`: handed to its caller (woken through
    /// `wake`), or, for an abandoned put, dropped with its slot.
    fn settle(&mut self, t: Ticket, r: Result<JobId, Error>, wake: &mut Vec<Waker>) {
        let s = &mut self.slots[t.slot as usize];
        if s.abandoned {
            self.release_abandoned(t.slot);
            return;
        }
        let r = std::mem::replace(&mut s.attempts, Attempts::new(self.rule)).outcome(r);
        s.outcome = Some(r);
        s.phase = Phase::Done;
        if let Some(w) = s.waker.take() {
            wake.push(w);
        }
    }

    /// Every put fails now: the driver is gone.
    pub(crate) fn kill(&mut self, wake: &mut Vec<Waker>) {
        self.dead = true;
        self.queued.clear();
        self.owed.clear();
        for s in &mut self.slots {
            if let Some(w) = s.waker.take() {
                wake.push(w);
            }
        }
    }
}

/// The unknown outcome of a put whose reply will never come, for `why`.
fn unknown(why: &str) -> Error {
    Error::Unknown(taskq_proto::ConnectionError::Io(std::io::Error::other(
        why.to_owned(),
    )))
}

/// The same connection error again, for the next put it ended.
fn copy_conn_error(e: &taskq_proto::ConnectionError) -> taskq_proto::ConnectionError {
    use taskq_proto::ConnectionError as C;
    match e {
        C::Timeout { waited } => C::Timeout { waited: *waited },
        C::Closed => C::Closed,
        C::Broken => C::Broken,
        C::NothingOwed => C::NothingOwed,
        other => C::Io(std::io::Error::new(io_kind(other), other.to_string())),
    }
}

fn io_kind(e: &taskq_proto::ConnectionError) -> std::io::ErrorKind {
    match e {
        taskq_proto::ConnectionError::Io(io) | taskq_proto::ConnectionError::NotSent(io) => {
            io.kind()
        }
        _ => std::io::ErrorKind::Other,
    }
}

/// The same connect failure again, for the next queued put it ends (its
/// words kept; a not-sent error stays not sent).
fn copy_error(e: &Error) -> Error {
    match e {
        Error::NotSent(NotSent::Backoff { left }) => {
            Error::NotSent(NotSent::Backoff { left: *left })
        }
        Error::NotSent(NotSent::Broken) => Error::NotSent(NotSent::Broken),
        Error::NotSent(NotSent::NoAddress) => Error::NotSent(NotSent::NoAddress),
        Error::NotSent(NotSent::Unavailable) => Error::NotSent(NotSent::Unavailable),
        Error::NotSent(NotSent::Io(io)) => {
            Error::NotSent(NotSent::Io(std::io::Error::new(io.kind(), io.to_string())))
        }
        Error::Unknown(c) => Error::Unknown(copy_conn_error(c)),
        other => Error::NotSent(NotSent::Io(std::io::Error::other(other.to_string()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;
    use std::time::Duration;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn waker() -> (Waker, Arc<Count>) {
        let c = Arc::new(Count(AtomicUsize::new(0)));
        (Waker::from(c.clone()), c)
    }

    fn put(p: &mut Pipeline, tube: &str, body: &[u8]) -> Ticket {
        p.hand_in(tube, body, PutOptions::default(), body.len() as u32)
            .expect("alive")
    }

    /// Writes every queued put, the way a driver does, tokens counting up.
    fn write_all(p: &mut Pipeline, token: &mut u64) -> Vec<Ticket> {
        let mut out = Vec::new();
        while let Some(t) = p.next_queued(0, usize::MAX, Instant::now) {
            *token += 1;
            p.wrote(t, *token);
            out.push(t);
        }
        out
    }

    fn id(r: Option<(Result<JobId, Error>, u32)>) -> u64 {
        r.expect("an outcome").0.expect("an id").get()
    }

    #[test]
    fn replies_reach_only_their_own_puts_in_order() {
        let (w, woken) = waker();
        let mut p = Pipeline::new(8, Rule::Retries(0));
        let a = put(&mut p, "a", b"1");
        let b = put(&mut p, "b", b"22");
        assert!(p.poll_outcome(a, &w).is_none());
        assert!(p.poll_outcome(b, &w).is_none());
        let mut token = 0;
        assert_eq!(write_all(&mut p, &mut token), vec![a, b]);
        let mut wake = Vec::new();
        for n in [7, 9] {
            let Some(Owed::Put { ticket, .. }) = p.pop_owed() else {
                panic!("a put is owed")
            };
            p.answered(ticket, Ok(JobId::new(n)), Instant::now, &mut wake);
        }
        assert_eq!(wake.len(), 2);
        wake.drain(..).for_each(Waker::wake);
        assert_eq!(woken.0.load(Ordering::SeqCst), 2);
        assert_eq!(id(p.poll_outcome(a, &w)), 7);
        assert_eq!(id(p.poll_outcome(b, &w)), 9);
        // Taken: the slot is someone else's now, and the old ticket sees nothing.
        let c = put(&mut p, "c", b"3");
        assert!(p.poll_outcome(a, &w).is_none() || c.slot != a.slot);
        assert!(p.abandon(a).is_none() || c.slot != a.slot);
    }

    #[test]
    fn a_token_matches_its_put_whatever_the_order_of_replies() {
        let (w, _) = waker();
        let mut p = Pipeline::new(4, Rule::Resolve(Duration::from_secs(30)));
        let t: Vec<_> = (0..3).map(|_| put(&mut p, "t", b"x")).collect();
        let mut token = 100;
        write_all(&mut p, &mut token);
        let mut wake = Vec::new();
        for (tok, seq) in [(103, 30), (101, 10), (102, 20)] {
            let ticket = p.take_token(tok).expect("owed");
            p.answered(ticket, Ok(JobId::new(seq)), Instant::now, &mut wake);
        }
        assert!(p.take_token(101).is_none(), "a token is answered once");
        assert_eq!(id(p.poll_outcome(t[0], &w)), 10);
        assert_eq!(id(p.poll_outcome(t[1], &w)), 20);
        assert_eq!(id(p.poll_outcome(t[2], &w)), 30);
        assert!(!p.owes());
    }

    #[test]
    fn a_put_dropped_before_its_write_is_never_written() {
        let mut p = Pipeline::new(4, Rule::Retries(0));
        let a = put(&mut p, "t", b"a");
        let b = put(&mut p, "t", b"b");
        assert_eq!(p.abandon(a), Some(1));
        let mut token = 0;
        assert_eq!(write_all(&mut p, &mut token), vec![b]);
    }

    #[test]
    fn a_put_dropped_after_its_write_keeps_its_reply_from_everyone() {
        let (w, _) = waker();
        let mut p = Pipeline::new(1, Rule::Retries(0));
        let a = put(&mut p, "t", b"a");
        let mut token = 0;
        write_all(&mut p, &mut token);
        assert_eq!(
            p.abandon(a),
            None,
            "written: the slot stays until its reply"
        );
        let mut wake = Vec::new();
        let Some(Owed::Put { ticket, .. }) = p.pop_owed() else {
            panic!("owed")
        };
        p.answered(ticket, Ok(JobId::new(5)), Instant::now, &mut wake);
        assert!(wake.is_empty());
        // The one slot is free again, and the next put never sees id 5.
        let b = put(&mut p, "t", b"b");
        assert!(p.poll_outcome(b, &w).is_none());
        assert!(p.poll_outcome(a, &w).is_none());
    }

    #[test]
    fn a_break_makes_written_puts_unknown_and_keeps_unwritten_ones_queued() {
        let (w, _) = waker();
        let mut p = Pipeline::new(4, Rule::Retries(0));
        let a = put(&mut p, "t", b"a");
        let mut token = 0;
        write_all(&mut p, &mut token);
        let b = put(&mut p, "t", b"b");
        let mut wake = Vec::new();
        p.broke(
            &taskq_proto::ConnectionError::Closed,
            Instant::now(),
            &mut wake,
        );
        let (r, _) = p.poll_outcome(a, &w).expect("settled");
        assert!(r.unwrap_err().outcome_unknown());
        assert!(p.poll_outcome(b, &w).is_none());
        assert_eq!(write_all(&mut p, &mut token), vec![b]);
    }

    #[test]
    fn at_least_once_sends_a_broken_put_again_then_gives_up() {
        let (w, _) = waker();
        let mut p = Pipeline::new(4, Rule::Retries(1));
        let a = put(&mut p, "t", b"a");
        let mut token = 0;
        let mut wake = Vec::new();
        for _ in 0..2 {
            assert_eq!(write_all(&mut p, &mut token), vec![a]);
            p.broke(
                &taskq_proto::ConnectionError::Closed,
                Instant::now(),
                &mut wake,
            );
        }
        assert!(p
            .poll_outcome(a, &w)
            .expect("gave up")
            .0
            .unwrap_err()
            .outcome_unknown());
    }

    #[test]
    fn jetstream_resends_with_the_same_id_until_resolve_for_then_stays_unknown() {
        let (w, _) = waker();
        let mut p = Pipeline::new(4, Rule::Resolve(Duration::from_secs(10)));
        let a = put(&mut p, "t", b"a");
        let t0 = Instant::now();
        let mut token = 0;
        let mut wake = Vec::new();
        write_all(&mut p, &mut token);
        p.queued_put(a).msg = 42;
        p.broke(&taskq_proto::ConnectionError::Closed, t0, &mut wake);
        assert!(p.poll_outcome(a, &w).is_none(), "sent again");
        assert_eq!(p.queued_put(a).msg, 42, "with its id");
        // The connect fails past resolve_for: a copy may be stored, so unknown.
        let e = Error::NotSent(NotSent::Broken);
        p.connect_failed(&e, t0 + Duration::from_secs(11), &mut wake);
        let (r, _) = p.poll_outcome(a, &w).expect("out of time");
        assert!(r.unwrap_err().outcome_unknown());
    }

    #[test]
    fn a_connect_failure_ends_queued_puts_as_not_sent() {
        let (w, _) = waker();
        let mut p = Pipeline::new(4, Rule::Retries(0));
        let a = put(&mut p, "t", b"a");
        let mut wake = Vec::new();
        p.connect_failed(&Error::NotSent(NotSent::Broken), Instant::now(), &mut wake);
        assert!(p
            .poll_outcome(a, &w)
            .expect("ended")
            .0
            .unwrap_err()
            .not_sent());
    }

    #[test]
    fn no_leader_pauses_sends_and_goes_again() {
        let (w, _) = waker();
        let mut p = Pipeline::new(4, Rule::Resolve(Duration::from_secs(10)));
        let a = put(&mut p, "t", b"a");
        let now = Instant::now();
        let mut token = 0;
        let mut wake = Vec::new();
        write_all(&mut p, &mut token);
        let t = p.take_token(1).expect("owed");
        p.answered(
            t,
            Err(Error::NotSent(NotSent::Unavailable)),
            || now,
            &mut wake,
        );
        assert!(p.poll_outcome(a, &w).is_none());
        assert!(!p.has_queued(|| now), "paused");
        assert!(p.has_queued(|| now + Duration::from_millis(100)));
    }

    #[test]
    fn a_dead_driver_fails_every_put_at_once() {
        let (w, _) = waker();
        let mut p = Pipeline::new(4, Rule::Retries(0));
        let a = put(&mut p, "t", b"a");
        let b = put(&mut p, "t", b"b");
        let mut token = 0;
        if let Some(t) = p.next_queued(0, usize::MAX, Instant::now) {
            token += 1;
            p.wrote(t, token);
        }
        let mut wake = Vec::new();
        p.kill(&mut wake);
        assert!(p
            .poll_outcome(a, &w)
            .expect("ended")
            .0
            .unwrap_err()
            .outcome_unknown());
        assert!(p
            .poll_outcome(b, &w)
            .expect("ended")
            .0
            .unwrap_err()
            .not_sent());
        assert!(p.hand_in("t", b"c", PutOptions::default(), 1).is_none());
    }

    #[test]
    fn a_write_holds_at_most_max_bytes_but_always_one_put() {
        let mut p = Pipeline::new(4, Rule::Retries(0));
        put(&mut p, "t", &[0; 10]);
        assert!(p.next_queued(0, 5, Instant::now).is_some());
        assert!(p.next_queued(1, 5, Instant::now).is_none());
    }

    #[test]
    fn a_pause_holds_back_the_queued_puts_while_other_replies_are_owed() {
        let mut p = Pipeline::new(4, Rule::Resolve(Duration::from_secs(10)));
        let a = put(&mut p, "t", b"a");
        let _b = put(&mut p, "t", b"b");
        let now = Instant::now();
        let mut token = 0;
        let mut wake = Vec::new();
        assert_eq!(write_all(&mut p, &mut token).len(), 2);
        // a's reply: no leader now. It goes again, after the pause, and
        // b's reply is still owed.
        let t = p.take_token(1).expect("a's token");
        assert_eq!(t, a);
        p.answered(
            t,
            Err(Error::NotSent(NotSent::Unavailable)),
            || now,
            &mut wake,
        );
        assert!(p.owes());
        let pause = p.pause_until.expect("a pause") - now;
        assert!(pause > Duration::ZERO);
        // Within the pause nothing is written, whatever is owed.
        assert!(!p.has_queued(|| now));
        assert!(p.next_queued(0, usize::MAX, || now).is_none());
        // Once it passed, a goes again.
        assert_eq!(p.next_queued(0, usize::MAX, || now + pause), Some(a));
    }

    #[test]
    fn a_large_bodys_buffer_is_not_kept_by_its_slot_once_done() {
        let (w, _) = waker();
        let mut p = Pipeline::new(2, Rule::Retries(0));
        let big = vec![b'x'; 100 << 10];
        let (a, b) = (put(&mut p, "t", &big), put(&mut p, "t", b"small"));
        let mut token = 0;
        write_all(&mut p, &mut token);
        let mut wake = Vec::new();
        for (k, id) in [(1, 10), (2, 11)] {
            let t = p.take_token(k).unwrap();
            p.answered(t, Ok(JobId::new(id)), Instant::now, &mut wake);
        }
        assert_eq!(id(p.poll_outcome(a, &w)), 10);
        assert_eq!(id(p.poll_outcome(b, &w)), 11);
        let kept: Vec<usize> = p.slots.iter().map(|s| s.body.capacity()).collect();
        assert!(kept.iter().all(|&c| c <= KEEP_BODY), "{kept:?}");
        // A small body's buffer stays for the next put: no allocation.
        assert!(kept.iter().any(|&c| c > 0), "{kept:?}");
    }
}
