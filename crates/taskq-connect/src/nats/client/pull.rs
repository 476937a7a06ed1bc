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
        // Its expiry counts from its write, however late it is read for.
        self.s.start_wait(started);
        Ok(())
    }

    /// True while a pull may still deliver.
    pub fn pulling(&self) -> bool {
        self.s.pulling()
    }

    /// True while a pull its probe ended may still deliver after all (see
    /// `NatsSession::strays_possible`).
    pub fn strays_possible(&self) -> bool {
        self.s.strays_possible()
    }

    /// Ack confirmations owed.
    pub fn confirms_owed(&self) -> usize {
        self.s.confirms_owed()
    }

    /// Reads what comes next for the pull under way (or, with none, for the
    /// owed ack confirmations). A pull is over after `batch` messages or a
    /// status other than a heartbeat.
    ///
    /// The deadlines are the session's (`NatsSession::poll_timeout`): a pull
    /// no status ended by its expiry plus [`pull_grace`](taskq_proto::nats::pull_grace) is probed with a
    /// `PING` meanwhile, whose `PONG` coming first ends it
    /// [`Delivery::Unanswered`] with the connection kept; a pull still owed
    /// at its expiry plus the I/O timeout, or an ack's confirmation owed the
    /// I/O timeout after its write, leaves the connection silent: broken.
    ///
    /// Acks queued and not yet written go out first: the confirmation of
    /// one never written would be waited for with no deadline (the session
    /// starts a reply's clock at its write).
    pub fn next_delivery(&mut self) -> Result<Delivery<'_>, NatsError> {
        self.s.usable()?;
        // Writes nothing when nothing is queued.
        self.flush()?;
        let f = self.wait_owed(NatsSession::poll_delivery)?;
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
        self.flush_tx()?;
        let Some(token) = token else {
            return Ok(false);
        };
        let m = self.wait_owed(|s| s.poll_reply(token))?;
        self.s.ack_confirmed(m)
    }
}
