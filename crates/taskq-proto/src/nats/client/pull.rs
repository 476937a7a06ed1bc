//! Pulling from a JetStream consumer and settling what it delivers: a pull
//! request (sent with any queued acks in one write), its deliveries and
//! statuses read one at a time, and acks with optional confirmation.

use std::time::{Duration, Instant};

use super::{Event, NatsConnection, NatsError, PullState};
use crate::nats::{encode_pub, AckInfo, AckKind, HeaderBlock, NatsProtoError};

/// What [`NatsConnection::next_delivery`] read, borrowed from the receive buffer
/// until the next call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Delivery<'a> {
    /// A message of the stream.
    Msg {
        /// The subject it was published to.
        subject: &'a [u8],
        /// Its ack subject.
        reply: &'a [u8],
        /// Its headers, if it has any.
        headers: Option<HeaderBlock<'a>>,
        /// Its body.
        body: &'a [u8],
        /// What the ack subject says (delivery count, sequences).
        info: AckInfo<'a>,
    },
    /// `404 No Messages`: a `no_wait` pull found nothing. The pull is over.
    NoMessages,
    /// `408 Request Timeout`: the pull expired. The pull is over.
    Timeout,
    /// `100 Idle Heartbeat`: the server is there; the pull goes on.
    Heartbeat,
    /// `409 ...`: the server ended the pull (its description says why:
    /// `Exceeded MaxWaiting`, `Consumer Deleted`, `Leadership Change`, ...).
    Conflict(&'a [u8]),
    /// Another status ended the pull.
    Status {
        /// The status code.
        code: u16,
        /// Its description.
        description: &'a [u8],
    },
    /// The ack queued with confirmation under this token was confirmed.
    Confirmed(u64),
}

/// What `next_delivery` decided before it borrows the buffer for its answer.
enum Next {
    Msg(crate::nats::op::MsgFrame),
    Status(u16, crate::nats::op::Span, crate::nats::op::Span),
    Confirmed(u64),
}

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
        self.usable()?;
        if self.pull.is_some() || !self.pubacks.is_empty() {
            return Err(NatsError::Busy);
        }
        let token = self.next_token;
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let mut n = itoa::Buffer::new();
        // The body first, at the end of the scratch buffer's use: subject, reply, body.
        self.scratch.clear();
        self.scratch
            .extend_from_slice(b"$JS.API.CONSUMER.MSG.NEXT.");
        self.scratch.extend_from_slice(stream.as_bytes());
        self.scratch.push(b'.');
        self.scratch.extend_from_slice(consumer.as_bytes());
        let subject_end = self.scratch.len();
        self.scratch.extend_from_slice(&self.inbox);
        self.scratch.extend_from_slice(n.format(token).as_bytes());
        let reply_end = self.scratch.len();
        self.scratch.extend_from_slice(b"{\"batch\":");
        self.scratch.extend_from_slice(n.format(batch).as_bytes());
        match expires {
            Some(e) => {
                self.scratch.extend_from_slice(b",\"expires\":");
                self.scratch
                    .extend_from_slice(n.format(nanos(e)).as_bytes());
            }
            None => self.scratch.extend_from_slice(b",\"no_wait\":true"),
        }
        if let Some(h) = heartbeat {
            self.scratch.extend_from_slice(b",\"idle_heartbeat\":");
            self.scratch
                .extend_from_slice(n.format(nanos(h)).as_bytes());
        }
        self.scratch.push(b'}');
        let queued = self.tx.len();
        let (subject, rest) = self.scratch.split_at(subject_end);
        let (reply, body) = rest.split_at(reply_end - subject_end);
        if let Err(e) = encode_pub(
            &mut self.tx,
            subject,
            Some(reply),
            body,
            self.cfg.limits.max_payload,
        ) {
            self.tx.truncate(queued);
            return Err(e.into());
        }
        self.next_token += 1;
        let started = Instant::now();
        self.flush_tx()?;
        self.pull = Some(PullState {
            token,
            remaining: u64::from(batch),
            started,
            wait: expires
                .unwrap_or_default()
                .saturating_add(self.cfg.io_timeout),
        });
        Ok(())
    }

    /// True while a pull may still deliver.
    pub fn pulling(&self) -> bool {
        self.pull.is_some()
    }

    /// Ack confirmations owed.
    pub fn confirms_owed(&self) -> usize {
        self.confirms.len()
    }

    /// Reads what comes next for the pull under way (or, with none, for the
    /// owed ack confirmations). The deadline is the pull's `expires` plus the
    /// I/O timeout from when it was sent (the I/O timeout from now when no
    /// pull is under way). A pull is over after `batch` messages or a status
    /// other than a heartbeat.
    pub fn next_delivery(&mut self) -> Result<Delivery<'_>, NatsError> {
        self.usable()?;
        let (started, wait) = match self.pull {
            Some(p) => (p.started, p.wait),
            None if !self.confirms.is_empty() => (Instant::now(), self.cfg.io_timeout),
            None => return Err(NatsError::NothingOwed),
        };
        // Not the wait's first read: an earlier call may have used part of it,
        // so every read checks the clock.
        let mut first = false;
        let (next, base) = loop {
            match self.next_event(started, wait, &mut first)? {
                (Event::Pong, _) => {}
                (Event::Delivery(m), base) => {
                    let Some(p) = self.pull.as_mut() else {
                        continue; // a late delivery nobody waits for: redelivered after ack wait
                    };
                    p.remaining = p.remaining.saturating_sub(1);
                    if p.remaining == 0 {
                        self.pull = None;
                    }
                    break (Next::Msg(m), base);
                }
                (Event::Reply { token, m }, base) => {
                    if self.pull.is_some_and(|p| p.token == token) {
                        let Some((_, code, desc)) = m.headers else {
                            let e = NatsProtoError::Malformed { op: "HMSG" };
                            return Err(self.broke(NatsError::Protocol(e)));
                        };
                        if code != 100 {
                            self.pull = None;
                        }
                        let raw = m.headers.map(|h| h.0).unwrap_or_default();
                        break (Next::Status(code, raw, desc), base);
                    }
                    if let Some(i) = self.confirms.iter().position(|&t| t == token) {
                        self.confirms.remove(i);
                        if self.no_responders(&m) {
                            return Err(NatsError::NoResponders);
                        }
                        break (Next::Confirmed(token), base);
                    }
                }
            }
        };
        let buf = self.rx.from(base);
        Ok(match next {
            Next::Confirmed(t) => Delivery::Confirmed(t),
            Next::Status(code, raw, desc) => {
                let description = desc.of(raw.of(buf));
                match code {
                    404 => Delivery::NoMessages,
                    408 => Delivery::Timeout,
                    100 => Delivery::Heartbeat,
                    409 => Delivery::Conflict(description),
                    503 => return Err(NatsError::NoResponders),
                    code => Delivery::Status { code, description },
                }
            }
            Next::Msg(m) => {
                let m = m.attach(buf);
                let reply = m.reply.unwrap_or_default();
                match AckInfo::parse(reply) {
                    Ok(info) => Delivery::Msg {
                        subject: m.subject,
                        reply,
                        headers: m.headers,
                        body: m.payload,
                        info,
                    },
                    Err(e) => {
                        self.broken = true;
                        return Err(NatsError::Protocol(e));
                    }
                }
            }
        })
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
        self.usable()?;
        let token = confirm.then_some(self.next_token);
        self.scratch.clear();
        self.scratch.extend_from_slice(&self.inbox);
        self.scratch
            .extend_from_slice(itoa::Buffer::new().format(self.next_token).as_bytes());
        let reply_end = self.scratch.len();
        kind.encode_body(&mut self.scratch);
        let (reply, body) = self.scratch.split_at(reply_end);
        let max = self.cfg.limits.max_payload;
        encode_pub(
            &mut self.tx,
            ack_subject,
            confirm.then_some(reply),
            body,
            max,
        )?;
        if let Some(t) = token {
            self.next_token += 1;
            self.confirms.push_back(t);
        }
        Ok(token)
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
            self.idle()?;
        }
        let token = self.queue_ack(ack_subject, kind, confirm)?;
        let started = Instant::now();
        self.flush_tx()?;
        let Some(token) = token else {
            return Ok(false);
        };
        let (m, _) = self.wait_reply(token, started, self.cfg.io_timeout)?;
        self.confirms.clear();
        if self.no_responders(&m) {
            return Err(NatsError::NoResponders);
        }
        Ok(true)
    }
}
