//! Publishing to a JetStream stream: one `HPUB` with a `Nats-Msg-Id` and a
//! reply token per put, answered by a PubAck on the inbox; or many queued
//! for one write, their PubAcks read in the order of queueing.

use crate::nats::json::{parse_js_reply, JsReply};
use crate::nats::op::MsgFrame;
use crate::nats::request_error::{ApiError, NatsError};

use super::state::{no_responders, Awaited, NatsSession};

/// Where JetStream stored a published message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PubAck {
    /// The message's sequence number in its stream.
    pub stream_seq: u64,
    /// True when the stream had this message id already (nothing new was stored).
    pub duplicate: bool,
}

/// A put encoded for one write: the operations queued before it, then
/// `head`, then (unless `head` holds it) the body and `\r\n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Put<'a> {
    /// The token its PubAck comes back with ([`NatsSession::poll_reply`]).
    pub token: u64,
    /// Operations queued earlier (acks without confirmation), sent first.
    pub queued: &'a [u8],
    /// The `HPUB` line and header block, or the whole put.
    pub head: &'a [u8],
}

/// A lone put's body: copied behind its header block, or only its length
/// (the driver writes it after the head).
#[derive(Clone, Copy)]
enum Body<'a> {
    Whole(&'a [u8]),
    Len(usize),
}

impl NatsSession {
    /// Encodes a put of a `body_len`-byte body to `subject` with dedup id
    /// `msg_id` and `extra` headers, to be written now: its `head` is the
    /// line and header block, and the body and `\r\n` follow it on the wire.
    /// Refused ([`NatsError::Busy`]) while other replies are owed. After the
    /// write, call [`queue_sent`](Self::queue_sent), then wait for the
    /// PubAck with [`poll_reply`](Self::poll_reply) and read it with
    /// [`puback`](Self::puback).
    #[inline]
    pub fn start_put(
        &mut self,
        subject: &[u8],
        msg_id: &[u8],
        extra: &[(&[u8], &[u8])],
        body_len: usize,
    ) -> Result<Put<'_>, NatsError> {
        self.begin_put(subject, msg_id, extra, Body::Len(body_len))
    }

    /// [`start_put`](Self::start_put) with the body copied behind the
    /// header block: `head` is the whole put (for a small body, one
    /// contiguous write).
    #[inline]
    pub fn start_put_whole(
        &mut self,
        subject: &[u8],
        msg_id: &[u8],
        extra: &[(&[u8], &[u8])],
        body: &[u8],
    ) -> Result<Put<'_>, NatsError> {
        self.begin_put(subject, msg_id, extra, Body::Whole(body))
    }

    /// The one way a lone put starts: encoded with its reply token, and
    /// its PubAck awaited alone.
    #[inline(always)]
    fn begin_put(
        &mut self,
        subject: &[u8],
        msg_id: &[u8],
        extra: &[(&[u8], &[u8])],
        body: Body<'_>,
    ) -> Result<Put<'_>, NatsError> {
        self.idle()?;
        let token = self.token();
        let max = self.limits.max_payload;
        let head = match body {
            Body::Whole(body) => self.put.encode(subject, token, msg_id, extra, body, max)?,
            Body::Len(len) => self.put.head(subject, token, msg_id, extra, len, max)?,
        };
        self.awaited = Some(Awaited::written_next(token, self.io_timeout));
        Ok(Put {
            token,
            queued: &self.tx,
            head,
        })
    }

    /// Reads a PubAck (or its error, or a no-responders status) from the
    /// reply `m` just polled. A reply that is neither breaks the session.
    #[inline]
    pub fn puback(&mut self, m: MsgFrame) -> Result<PubAck, NatsError> {
        if no_responders(&m) {
            return Err(NatsError::NoResponders);
        }
        let payload = m.payload.of(self.event_bytes());
        match parse_js_reply(payload) {
            Ok(JsReply::Ack(a)) => Ok(PubAck {
                stream_seq: a.seq,
                duplicate: a.duplicate,
            }),
            Ok(JsReply::Error(e)) => Err(NatsError::Api(ApiError {
                code: e.code,
                err_code: e.err_code,
                description: crate::peer_text(e.description),
            })),
            Err(e) => Err(self.broke(NatsError::Protocol(e))),
        }
    }

    /// Queues a publish for the next write and returns its reply token; its
    /// PubAck is read with [`poll_puback`](Self::poll_puback), in the order
    /// of queueing, or by token with [`take_puback_of`](Self::take_puback_of).
    pub fn queue_publish(
        &mut self,
        subject: &[u8],
        msg_id: &[u8],
        extra: &[(&[u8], &[u8])],
        body: &[u8],
    ) -> Result<u64, NatsError> {
        self.usable()?;
        if !self.pulls.is_empty() || !self.pulls_queued.is_empty() {
            return Err(NatsError::Busy);
        }
        let token = self.peek_token();
        let max = self.limits.max_payload;
        let bytes = self.put.encode(subject, token, msg_id, extra, body, max)?;
        self.tx.extend_from_slice(bytes);
        self.token();
        self.pubacks.push_back((token, None));
        self.pubacks_unsent += 1;
        Ok(token)
    }

    /// PubAcks owed by queued publishes.
    pub fn pubacks_owed(&self) -> usize {
        self.pubacks.len()
    }

    /// The token of the oldest PubAck owed; [`NatsError::NothingOwed`] when none is.
    pub fn next_puback(&self) -> Result<u64, NatsError> {
        self.usable()?;
        self.pubacks
            .front()
            .map(|e| e.0)
            .ok_or(NatsError::NothingOwed)
    }

    /// The PubAck of the oldest queued publish when it has arrived (replies
    /// to other requests are skipped); `None` when more bytes are needed.
    pub fn poll_puback(&mut self) -> Result<Option<PubAck>, NatsError> {
        let token = self.next_puback()?;
        match self.poll_reply(token)? {
            Some(m) => self.take_puback(m).map(Some),
            None => Ok(None),
        }
    }

    /// Reads the reply `m` to the oldest queued publish (polled with
    /// [`poll_reply`](Self::poll_reply) for [`next_puback`](Self::next_puback)'s
    /// token) as its PubAck, which is then no longer owed.
    pub fn take_puback(&mut self, m: MsgFrame) -> Result<PubAck, NatsError> {
        self.pubacks.pop_front();
        self.puback(m)
    }

    /// Reads the reply `m` to the queued publish of `token` (an
    /// [`Event::Reply`](super::Event::Reply) polled with
    /// [`poll_event`](Self::poll_event)), in whatever order replies come:
    /// `None` when no publish owes that token (a stale reply, read and
    /// dropped), else its PubAck, which is then no longer owed.
    pub fn take_puback_of(&mut self, token: u64, m: MsgFrame) -> Option<Result<PubAck, NatsError>> {
        let at = self.pubacks.iter().position(|e| e.0 == token)?;
        self.pubacks.remove(at);
        Some(self.puback(m))
    }
}
