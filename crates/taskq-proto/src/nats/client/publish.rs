//! Publishing to a JetStream stream: one `HPUB` with a `Nats-Msg-Id` and a
//! reply token per put, answered by a PubAck on the inbox; or many queued and
//! flushed in one write, their PubAcks read in order.

use std::io::IoSlice;
use std::time::Instant;

use super::{ApiError, NatsConnection, NatsError};
use crate::nats::json::{parse_js_reply, JsReply};
use crate::nats::op::MsgFrame;

/// Where JetStream stored a published message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PubAck {
    /// The message's sequence number in its stream.
    pub stream_seq: u64,
    /// True when the stream had this message id already (nothing new was stored).
    pub duplicate: bool,
}

impl NatsConnection {
    /// Publishes `body` to `subject` with dedup id `msg_id` and waits for
    /// its PubAck: one write, then reads until the reply with this request's
    /// token (answering `PING`s on the way).
    #[inline]
    pub fn publish(
        &mut self,
        subject: &str,
        msg_id: &[u8],
        body: &[u8],
    ) -> Result<PubAck, NatsError> {
        self.publish_with(subject, msg_id, &[], body)
    }

    /// [`publish`](Self::publish) with extra headers (`Taskq-*`).
    pub fn publish_with(
        &mut self,
        subject: &str,
        msg_id: &[u8],
        extra: &[(&[u8], &[u8])],
        body: &[u8],
    ) -> Result<PubAck, NatsError> {
        self.idle()?;
        let token = self.token();
        let max = self.cfg.limits.max_payload;
        let started = Instant::now();
        let head = self
            .put
            .head(subject.as_bytes(), token, msg_id, extra, body.len(), max)?;
        // Anything queued (acks without confirmation) goes out in the same write.
        let (head, body, end) = (
            IoSlice::new(head),
            IoSlice::new(body),
            IoSlice::new(b"\r\n"),
        );
        let r = if self.tx.is_empty() {
            self.io.write_all(&mut [head, body, end])
        } else {
            self.io
                .write_all(&mut [IoSlice::new(&self.tx), head, body, end])
        };
        self.tx.clear();
        if let Err(e) = r {
            return Err(self.broke(e));
        }
        let (m, base) = self.wait_reply(token, started, self.cfg.io_timeout)?;
        self.puback(m, base)
    }

    /// Queues a publish for [`flush`](Self::flush); its PubAck is read by
    /// [`recv_puback`](Self::recv_puback), in the order of queueing.
    pub fn queue_publish(
        &mut self,
        subject: &str,
        msg_id: &[u8],
        extra: &[(&[u8], &[u8])],
        body: &[u8],
    ) -> Result<(), NatsError> {
        self.usable()?;
        if self.pull.is_some() {
            return Err(NatsError::Busy);
        }
        let token = self.next_token;
        let max = self.cfg.limits.max_payload;
        let bytes = self
            .put
            .encode(subject.as_bytes(), token, msg_id, extra, body, max)?;
        self.tx.extend_from_slice(bytes);
        self.next_token += 1;
        self.pubacks.push_back(token);
        Ok(())
    }

    /// Sends everything queued (publishes, acks) with one write.
    pub fn flush(&mut self) -> Result<(), NatsError> {
        if self.broken {
            self.tx.clear();
            return Err(NatsError::Broken);
        }
        if self.tx.is_empty() {
            return Ok(());
        }
        self.flush_tx()
    }

    /// PubAcks owed by flushed or queued publishes.
    pub fn pubacks_owed(&self) -> usize {
        self.pubacks.len()
    }

    /// Reads the PubAck of the oldest queued publish (after [`flush`](Self::flush)).
    pub fn recv_puback(&mut self) -> Result<PubAck, NatsError> {
        self.usable()?;
        let Some(&token) = self.pubacks.front() else {
            return Err(NatsError::NothingOwed);
        };
        if !self.tx.is_empty() {
            self.flush()?;
        }
        let (m, base) = self.wait_reply(token, Instant::now(), self.cfg.io_timeout)?;
        self.pubacks.pop_front();
        self.puback(m, base)
    }

    /// Reads a PubAck (or its error, or a no-responders status).
    fn puback(&mut self, m: MsgFrame, base: usize) -> Result<PubAck, NatsError> {
        if self.no_responders(&m) {
            return Err(NatsError::NoResponders);
        }
        let payload = m.payload.of(self.rx.from(base));
        match parse_js_reply(payload) {
            Ok(JsReply::Ack(a)) => Ok(PubAck {
                stream_seq: a.seq,
                duplicate: a.duplicate,
            }),
            Ok(JsReply::Error(e)) => Err(NatsError::Api(ApiError {
                code: e.code,
                err_code: e.err_code,
                description: String::from_utf8_lossy(e.description).into_owned(),
            })),
            Err(e) => Err(self.broke(NatsError::Protocol(e))),
        }
    }
}
