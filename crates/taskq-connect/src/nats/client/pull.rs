//! Pulling from a JetStream consumer and settling what it delivers: a pull
//! request (sent with any queued acks in one write), its deliveries and
//! statuses read one at a time, and acks with optional confirmation.

use std::time::{Duration, Instant};

use super::{NatsConnection, NatsError};
use taskq_proto::nats::{AckKind, Delivery, NatsSession};

impl NatsConnection {
    /// Asks consumer `consumer` of `stream` for up to `batch` messages,
    /// waiting at most `expires` on the server; with `heartbeat` the server
    /// sends idle heartbeats meanwhile. Queued acks go out in the same write.
    /// Read what comes with [`next_delivery`](Self::next_delivery) until the pull is over.
    pub fn pull(
        &mut self,
        stream: &str,
        consumer: &str,
        batch: u32,
        expires: Duration,
        heartbeat: Option<Duration>,
    ) -> Result<(), NatsError> {
        self.send_pull(stream, consumer, batch, Some(expires), heartbeat)
    }

    /// Asks for up to `batch` messages that are there now: the server ends
    /// the pull with `404 No Messages` when it has none (or fewer), at once.
    pub fn pull_no_wait(
        &mut self,
        stream: &str,
        consumer: &str,
        batch: u32,
    ) -> Result<(), NatsError> {
        self.send_pull(stream, consumer, batch, None, None)
    }

    /// A pull request: with `expires` the server waits that long, without it
    /// the pull is `no_wait`.
    fn send_pull(
        &mut self,
        stream: &str,
        consumer: &str,
        batch: u32,
        expires: Option<Duration>,
        heartbeat: Option<Duration>,
    ) -> Result<(), NatsError> {
        self.s
            .queue_pull(stream, consumer, batch, expires, heartbeat)?;
        let started = Instant::now();
        self.flush_tx()?;
        let wait = expires
            .unwrap_or_default()
            .saturating_add(self.cfg.io_timeout);
        self.pull_clock = (started, wait);
        Ok(())
    }

    /// True while a pull may still deliver.
    pub fn pulling(&self) -> bool {
        self.s.pulling()
    }

    /// Ack confirmations owed.
    pub fn confirms_owed(&self) -> usize {
        self.s.confirms_owed()
    }

    /// Reads what comes next for the pull under way (or, with none, for the
    /// owed ack confirmations). The deadline is the pull's `expires` plus the
    /// I/O timeout from when it was sent (the I/O timeout from now when no
    /// pull is under way). A pull is over after `batch` messages or a status
    /// other than a heartbeat.
    pub fn next_delivery(&mut self) -> Result<Delivery<'_>, NatsError> {
        self.s.usable()?;
        let (started, wait) = if self.s.pulling() {
            self.pull_clock
        } else if self.s.confirms_owed() > 0 {
            (Instant::now(), self.cfg.io_timeout)
        } else {
            return Err(NatsError::NothingOwed);
        };
        // Not the wait's first read: an earlier call may have used part of it,
        // so every read checks the clock.
        let mut first = false;
        let f = self.wait_for(started, wait, &mut first, NatsSession::poll_delivery)?;
        self.s.take_delivery(f)
    }

    /// Queues an ack of the delivery whose ack subject is `ack_subject`, for
    /// the next write (a [`pull`](Self::pull), [`flush`](Self::flush) or
    /// publish). With `confirm` the server confirms it and
    /// [`next_delivery`](Self::next_delivery) reports [`Delivery::Confirmed`] with the token
    /// returned here.
    pub fn queue_ack(
        &mut self,
        ack_subject: &[u8],
        kind: AckKind,
        confirm: bool,
    ) -> Result<Option<u64>, NatsError> {
        self.s.queue_ack(ack_subject, kind, confirm)
    }

    /// Acks a delivery now, with one write (with anything queued). With
    /// `confirm`, waits for the server's confirmation: `Ok(true)` once
    /// confirmed; a timeout means the outcome is unknown. Without, `Ok(false)`
    /// once written.
    pub fn ack(
        &mut self,
        ack_subject: &[u8],
        kind: AckKind,
        confirm: bool,
    ) -> Result<bool, NatsError> {
        if confirm {
            self.s.idle()?;
        }
        let token = self.s.queue_ack(ack_subject, kind, confirm)?;
        let started = Instant::now();
        self.flush_tx()?;
        let Some(token) = token else {
            return Ok(false);
        };
        let m = self.wait_reply(token, started, self.cfg.io_timeout)?;
        self.s.ack_confirmed(m)
    }
}
