//! Pulling from a JetStream consumer and settling what it delivers: a pull
//! request (queued with any acks for one write), its deliveries and statuses
//! read one at a time, and acks with optional confirmation.

use std::time::Duration;

use crate::nats::op::MsgFrame;
use crate::nats::request_error::NatsError;
use crate::nats::span::Span;
use crate::nats::{encode_pub, AckInfo, AckKind, HeaderBlock, NatsProtoError};

use super::state::{no_responders, Event, NatsSession, PullOwed};

/// How long after a pull's expiry its driver waits for the status that
/// ends it before probing the connection ([`NatsSession::queue_probe`]):
/// room for the `408` to come from the consumer's leader, which a loaded
/// server has sent more than a second late (a pull ended by its probe while
/// the server still holds it can take a message the client then drops). At
/// most half the I/O timeout ([`pull_grace`]): the pull's deadline stays its
/// expiry plus the I/O timeout, and the probe's `PONG` must come within
/// what is left of it.
pub const PULL_GRACE: Duration = Duration::from_secs(5);

/// The grace after a pull's expiry under I/O timeout `io_timeout`:
/// [`PULL_GRACE`], or half the I/O timeout when that is less.
pub fn pull_grace(io_timeout: Duration) -> Duration {
    PULL_GRACE.min(io_timeout / 2)
}

/// What [`NatsSession::take_delivery`] read, borrowed from the receive
/// buffer until the next read.
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
    /// The server never answered the pull: a probe
    /// ([`queue_probe`](NatsSession::queue_probe)) sent after the pull's
    /// expiry came back first. The pull is over, with nothing delivered;
    /// the connection is sound.
    Unanswered,
}

/// A delivery found by [`NatsSession::poll_delivery`], as offsets: what a
/// driver holds while it may still read, before
/// [`take_delivery`](NatsSession::take_delivery) borrows the buffer for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliveryFrame(Next);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// A message, for the pull with this token (`None`: for a pull no
    /// longer under way).
    Msg(MsgFrame, Option<u64>),
    /// A status of the pull with this token.
    Status(u16, Span, Span, u64),
    Confirmed(u64),
    /// The pull with this token was never answered.
    Unanswered(u64),
}

impl DeliveryFrame {
    /// The token of the pull this delivery or status answers (as
    /// [`queue_pull_behind`](NatsSession::queue_pull_behind) returned it);
    /// `None` for an ack's confirmation, and for a message that came with
    /// no pull under way (for one the client had ended first).
    pub fn pull(&self) -> Option<u64> {
        match self.0 {
            Next::Msg(_, t) => t,
            Next::Status(.., t) | Next::Unanswered(t) => Some(t),
            Next::Confirmed(_) => None,
        }
    }
}

impl NatsSession {
    /// Queues a pull of up to `batch` messages from consumer `consumer` of
    /// `stream`: with `expires` the server waits that long, without it the
    /// pull is `no_wait`; with `heartbeat` the server sends idle heartbeats
    /// meanwhile. The pull is under way once the queue is written
    /// ([`queue_sent`](Self::queue_sent)). Refused ([`NatsError::Busy`])
    /// while another pull or PubAcks are owed.
    pub fn queue_pull(
        &mut self,
        stream: &str,
        consumer: &str,
        batch: u32,
        expires: Option<Duration>,
        heartbeat: Option<Duration>,
    ) -> Result<(), NatsError> {
        self.usable()?;
        if !self.pulls.is_empty() || !self.pulls_queued.is_empty() {
            return Err(NatsError::Busy);
        }
        self.queue_pull_behind(stream, consumer, batch, expires, heartbeat)
            .map(|_| ())
    }

    /// Queues a pull as [`queue_pull`](Self::queue_pull) does, behind the
    /// pulls already under way or queued, and returns its token (which
    /// [`DeliveryFrame::pull`] names for what answers it). The consumer
    /// serves its waiting pulls in order, a delivery answering the oldest;
    /// so the pulls under way at once must be of one consumer, each
    /// waiting (with `expires`): a `no_wait` pull's status may come before
    /// an older pull is over. Refused ([`NatsError::Busy`]) while PubAcks
    /// are owed.
    pub fn queue_pull_behind(
        &mut self,
        stream: &str,
        consumer: &str,
        batch: u32,
        expires: Option<Duration>,
        heartbeat: Option<Duration>,
    ) -> Result<u64, NatsError> {
        self.usable()?;
        if !self.pubacks.is_empty() {
            return Err(NatsError::Busy);
        }
        let token = self.peek_token();
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let mut n = itoa::Buffer::new();
        // Subject, reply and body one after the other in the scratch buffer.
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
            self.limits.max_payload,
        ) {
            self.tx.truncate(queued);
            return Err(e.into());
        }
        self.token();
        self.pulls_queued.push_back(PullOwed {
            token,
            remaining: u64::from(batch),
            expires: expires.unwrap_or_default(),
            since: None,
        });
        Ok(token)
    }

    /// True while a pull may still deliver, or the end of one never
    /// answered is still to be reported.
    pub fn pulling(&self) -> bool {
        !self.pulls.is_empty() || !self.unanswered.is_empty()
    }

    /// The token of the newest pull under way.
    pub fn newest_pull(&self) -> Option<u64> {
        self.pulls.back().map(|p| p.token)
    }

    /// Queues a probe, a `PING`, about the pulls under way up to the one
    /// with token `through`, for the next write. A driver probes a pull
    /// once its expiry has passed, with [`pull_grace`] for the route from
    /// the consumer's leader, and no status ended it: the leader ends a
    /// waiting pull at its expiry with `408`. When the `PONG` comes and such
    /// a pull is still under way, the server never took it (it may drop a
    /// pull sent before a newly made or newly elected consumer leader's
    /// interest has reached the server the client is connected to), and
    /// [`poll_delivery`](Self::poll_delivery) reports it
    /// [`Delivery::Unanswered`]: over, with the connection sound. A pull
    /// still under way at its expiry plus the I/O timeout leaves the
    /// connection silent: broken.
    pub fn queue_probe(&mut self, through: u64) -> Result<(), NatsError> {
        self.usable()?;
        self.tx.extend_from_slice(b"PING\r\n");
        self.probes_queued.push_back(through);
        Ok(())
    }

    /// True while a pull its probe ended may still deliver: the server may
    /// have held it after all (its `408` was late, not missing). A message
    /// read meanwhile may be that pull's, whatever pull it is counted
    /// against, so its lease may have started as early as that pull was
    /// sent. Over at that pull's own late answer, or at a later waiting
    /// pull's `408`; requests are refused until then.
    pub fn strays_possible(&self) -> bool {
        self.strays.is_some()
    }

    /// True while a probe is queued or its `PONG` owed.
    pub fn probing(&self) -> bool {
        !self.probes.is_empty() || !self.probes_queued.is_empty()
    }

    /// A probe's `PONG` came: the pulls up to token `through` still under
    /// way were never answered.
    pub(super) fn pulls_unanswered(&mut self, through: u64) {
        while self.pulls.front().is_some_and(|p| p.token <= through) {
            if let Some(p) = self.pulls.pop_front() {
                self.unanswered.push_back(p.token);
                self.strays = Some(self.strays.map_or(p.token, |s| s.max(p.token)));
            }
        }
    }

    /// Pulls under way.
    pub fn pulls_under_way(&self) -> usize {
        self.pulls.len()
    }

    /// Ack confirmations owed.
    pub fn confirms_owed(&self) -> usize {
        self.confirms.len()
    }

    /// Reads until what comes next for the pull under way (or, with none,
    /// for the owed ack confirmations); `None` when more bytes are needed.
    /// A pull is over after `batch` messages or a status other than a
    /// heartbeat. A message that comes with no pull under way is passed on
    /// with no pull ([`DeliveryFrame::pull`] `None`). When nothing is owed,
    /// what was read is looked through for such a message, and then
    /// [`NatsError::NothingOwed`].
    pub fn poll_delivery(&mut self) -> Result<Option<DeliveryFrame>, NatsError> {
        self.usable()?;
        // With nothing owed, what was read is still looked through for a
        // message of a pull the client ended first (see below).
        let owed =
            !self.pulls.is_empty() || !self.confirms.is_empty() || !self.unanswered.is_empty();
        loop {
            if let Some(t) = self.unanswered.pop_front() {
                return Ok(Some(DeliveryFrame(Next::Unanswered(t))));
            }
            let next = match self.poll_event()? {
                None if owed => return Ok(None),
                None => return Err(NatsError::NothingOwed),
                Some(Event::Pong) => continue,
                Some(Event::Delivery(m)) => {
                    // A delivery answers the oldest pull under way. One that
                    // comes with none under way was sent for a pull the
                    // client ended first (its probe came back before the
                    // server's own answer): it is passed on all the same,
                    // with no pull, for the driver to run or give back.
                    // Dropped, its job would wait out its ack wait.
                    let pull = self.pulls.front_mut().map(|p| {
                        p.remaining = p.remaining.saturating_sub(1);
                        p.token
                    });
                    if self.pulls.front().is_some_and(|p| p.remaining == 0) {
                        self.pulls.pop_front();
                    }
                    Next::Msg(m, pull)
                }
                Some(Event::Reply { token, m }) => {
                    if let (Some(newest), Some((_, code, _))) = (self.strays, m.headers) {
                        // The newest pull a probe ended is over at its own
                        // late answer, and at a later waiting pull's `408`
                        // (that pull's expiry came after the older one's).
                        if (token == newest && code != 100) || (token > newest && code == 408) {
                            self.strays = None;
                        }
                    }
                    if let Some(i) = self.pulls.iter().position(|p| p.token == token) {
                        let Some((raw, code, desc)) = m.headers else {
                            let e = NatsProtoError::Malformed { op: "HMSG" };
                            return Err(self.broke(NatsError::Protocol(e)));
                        };
                        if code != 100 {
                            self.pulls.remove(i);
                        }
                        Next::Status(code, raw, desc, token)
                    } else if let Some(i) = self.confirms.iter().position(|e| e.0 == token) {
                        self.confirms.remove(i);
                        if no_responders(&m) {
                            return Err(NatsError::NoResponders);
                        }
                        Next::Confirmed(token)
                    } else {
                        continue;
                    }
                }
            };
            return Ok(Some(DeliveryFrame(next)));
        }
    }

    /// The delivery [`poll_delivery`](Self::poll_delivery) found, borrowed
    /// from the receive buffer. A status `503` is [`NatsError::NoResponders`];
    /// a message whose ack subject cannot be read breaks the session.
    pub fn take_delivery(&mut self, f: DeliveryFrame) -> Result<Delivery<'_>, NatsError> {
        match f.0 {
            Next::Confirmed(t) => Ok(Delivery::Confirmed(t)),
            Next::Unanswered(_) => Ok(Delivery::Unanswered),
            Next::Status(code, raw, desc, _) => {
                let description = desc.of(raw.of(self.event_bytes()));
                Ok(match code {
                    404 => Delivery::NoMessages,
                    408 => Delivery::Timeout,
                    100 => Delivery::Heartbeat,
                    409 => Delivery::Conflict(description),
                    503 => return Err(NatsError::NoResponders),
                    code => Delivery::Status { code, description },
                })
            }
            Next::Msg(m, _) => {
                // The buffer through its field, so that breaking the session
                // on a bad ack subject does not conflict with the borrow.
                let m = m.attach(self.rx.from(self.base));
                let reply = m.reply.unwrap_or_default();
                match AckInfo::parse(reply) {
                    Ok(info) => Ok(Delivery::Msg {
                        subject: m.subject,
                        reply,
                        headers: m.headers,
                        body: m.payload,
                        info,
                    }),
                    Err(e) => {
                        self.broken = true;
                        Err(NatsError::Protocol(e))
                    }
                }
            }
        }
    }

    /// Queues an ack of the delivery whose ack subject is `ack_subject`, for
    /// the next write. With `confirm` the server confirms it under the token
    /// returned here ([`Delivery::Confirmed`], or
    /// [`ack_confirmed`](Self::ack_confirmed) for an ack awaited alone).
    pub fn queue_ack(
        &mut self,
        ack_subject: &[u8],
        kind: AckKind,
        confirm: bool,
    ) -> Result<Option<u64>, NatsError> {
        self.usable()?;
        let next = self.peek_token();
        let token = confirm.then_some(next);
        self.scratch.clear();
        self.scratch.extend_from_slice(&self.inbox);
        self.scratch
            .extend_from_slice(itoa::Buffer::new().format(next).as_bytes());
        let reply_end = self.scratch.len();
        kind.encode_body(&mut self.scratch);
        let (reply, body) = self.scratch.split_at(reply_end);
        let max = self.limits.max_payload;
        encode_pub(
            &mut self.tx,
            ack_subject,
            confirm.then_some(reply),
            body,
            max,
        )?;
        if let Some(t) = token {
            self.token();
            self.confirms.push_back((t, None));
            self.confirms_unsent += 1;
        }
        Ok(token)
    }

    /// The confirmation `m` of the one ack awaited alone (nothing else was
    /// owed when it was queued): true once confirmed.
    pub fn ack_confirmed(&mut self, m: MsgFrame) -> Result<bool, NatsError> {
        self.confirms.clear();
        self.confirms_unsent = 0;
        if no_responders(&m) {
            return Err(NatsError::NoResponders);
        }
        Ok(true)
    }
}
