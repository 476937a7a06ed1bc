//! The deadlines a NATS session keeps, on the instants its driver gives it
//! (as quinn-proto's connection does): the driver says when it begins to
//! wait ([`NatsSession::start_wait`]), wakes at
//! [`NatsSession::poll_timeout`], and lets
//! [`NatsSession::handle_timeout`] act on what fell due.
//!
//! The rules, each kept here alone:
//! - a queued publish's PubAck and an ack's confirmation are due the I/O
//!   timeout after their wait began (after their write);
//! - the reply awaited alone (a lone put's PubAck, a request's reply) is
//!   due its allowance (the I/O timeout, or the request's own) after its
//!   wait began (after its write);
//! - a pull is due its expiry (`no_wait`: none) plus the I/O timeout after
//!   its write: the consumer's leader ends a waiting pull at its expiry
//!   with `408`, so silence past that is a silent connection;
//! - a pull that no status ended by its expiry plus [`pull_grace`] is
//!   probed with a `PING` ([`NatsSession::queue_probe`]), whose `PONG`
//!   coming first ends it as never taken, with the connection kept.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::earliest;
use crate::nats::request_error::NatsError;

use super::pull::pull_grace;
use super::state::{Awaited, NatsSession, PullOwed};

/// Stamps `now` on the owed entries whose wait has not begun, but the
/// newest `unsent` (their requests not written yet). They are owed in the
/// order they were queued and stamped in that order, so the unstamped ones
/// are the newest: the walk stops at the first stamped.
fn stamp<T>(
    owed: &mut VecDeque<T>,
    unsent: usize,
    since: impl Fn(&mut T) -> &mut Option<Instant>,
    now: Instant,
) {
    for e in owed.iter_mut().rev().skip(unsent) {
        let s = since(e);
        if s.is_some() {
            break;
        }
        *s = Some(now);
    }
}

impl PullOwed {
    /// When the server ends this pull by its expiry (for `no_wait`, at
    /// once), once it was sent.
    fn expiry(&self) -> Option<Instant> {
        self.since
            .map(|s| crate::session::deadline_after(s, self.expires))
    }
}

impl Awaited {
    /// The reply to `token` (a lone put's or a request's, whose bytes the
    /// driver writes next), due `wait` after the first wait after the
    /// write. One such reply is awaited at a time: a new one replaces an
    /// earlier one, whose reply is then read past.
    pub(super) fn written_next(token: u64, wait: Duration) -> Awaited {
        Awaited {
            token,
            wait,
            since: None,
            unsent: true,
        }
    }
}

impl NatsSession {
    /// The send buffer was written (or dropped, the reply owed all the
    /// same): the reply awaited alone is waited for from the next wait on.
    pub(super) fn awaited_sent(&mut self) {
        if let Some(a) = &mut self.awaited {
            a.unsent = false;
        }
    }

    /// Sets the I/O timeout the reply deadlines allow (by default
    /// [`defaults::IO_TIMEOUT`](crate::defaults::IO_TIMEOUT)).
    pub fn set_io_timeout(&mut self, io_timeout: Duration) {
        self.io_timeout = io_timeout;
    }

    /// The I/O timeout the reply deadlines allow.
    pub fn io_timeout(&self) -> Duration {
        self.io_timeout
    }

    /// The driver begins, at `now`, to wait for what it wrote: every owed
    /// PubAck, confirmation and pull written whose wait had not begun is
    /// waited for from `now` (one still in the send buffer from the wait
    /// after its write); one already waited for keeps its start (so a read
    /// cancelled and made again keeps its deadline).
    #[inline]
    pub fn start_wait(&mut self, now: Instant) {
        if let Some(a) = self.awaited.as_mut().filter(|a| !a.unsent) {
            a.since.get_or_insert(now);
        }
        if self.lone() {
            return;
        }
        stamp(&mut self.pubacks, self.pubacks_unsent, |e| &mut e.1, now);
        stamp(&mut self.confirms, self.confirms_unsent, |e| &mut e.1, now);
        stamp(&mut self.pulls, 0, |p| &mut p.since, now);
    }

    /// True when nothing is owed but the reply awaited alone (if any): the
    /// deadlines are that reply's alone, and a lone put pays for no more.
    #[inline]
    fn lone(&self) -> bool {
        self.pubacks.is_empty() && self.confirms.is_empty() && self.pulls.is_empty()
    }

    /// When the oldest owed PubAck or confirmation began to be waited for.
    pub fn waiting_since(&self) -> Option<Instant> {
        let first = |q: &VecDeque<(u64, Option<Instant>)>| q.front().and_then(|e| e.1);
        earliest(first(&self.pubacks), first(&self.confirms))
    }

    /// When a reply owed is overdue and the connection is silent: the
    /// oldest PubAck's or confirmation's start plus the I/O timeout, or a
    /// pull's expiry plus the I/O timeout.
    fn reply_due(&self) -> Option<Instant> {
        let io = self.io_timeout;
        let replies = self.waiting_since().and_then(|s| s.checked_add(io));
        let replies = earliest(replies, self.awaited_due());
        let pulls = self
            .pulls
            .iter()
            .filter_map(|p| p.expiry()?.checked_add(io))
            .min();
        earliest(replies, pulls)
    }

    /// When the reply awaited alone is overdue.
    fn awaited_due(&self) -> Option<Instant> {
        let a = self.awaited?;
        a.since?.checked_add(a.wait)
    }

    /// When a pull is to be probed: its expiry plus the grace. `None` for
    /// a pull not yet sent.
    fn probe_at(&self, p: &PullOwed) -> Option<Instant> {
        p.expiry()?.checked_add(pull_grace(self.io_timeout))
    }

    /// The next deadline: a reply's, or a pull's probe (none while a probe
    /// is owed). `None` while no wait has begun, on a broken session, and
    /// for a deadline past what an `Instant` holds (an I/O timeout
    /// configured huge, to mean "wait forever").
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.broken {
            return None;
        }
        if self.lone() {
            return self.awaited_due();
        }
        let probe = if self.probing() {
            None
        } else {
            self.pulls.iter().filter_map(|p| self.probe_at(p)).min()
        };
        earliest(self.reply_due(), probe)
    }

    /// Acts on the deadlines at `now`: a reply overdue breaks the session
    /// ([`NatsError::Timeout`] with the I/O timeout it was allowed);
    /// otherwise pulls past their expiry plus the grace are probed, the
    /// `PING` queued for the next write (see [`probing`](Self::probing)).
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), NatsError> {
        if self.broken {
            return Err(NatsError::Broken);
        }
        if self.reply_due().is_some_and(|d| now >= d) {
            self.broken = true;
            // What it was allowed: a request's own patience when it alone
            // fell due.
            let waited = match self.awaited {
                Some(a) if self.awaited_due().is_some_and(|d| now >= d) => a.wait,
                _ => self.io_timeout,
            };
            return Err(NatsError::Timeout { waited });
        }
        if self.probing() {
            return Ok(());
        }
        // The newest pull due: those before it were sent earlier.
        let through = self
            .pulls
            .iter()
            .filter(|p| self.probe_at(p).is_some_and(|d| d <= now))
            .map(|p| p.token)
            .max();
        if let Some(through) = through {
            self.queue_probe(through)?;
        }
        Ok(())
    }
}
