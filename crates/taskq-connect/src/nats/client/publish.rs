//! Publishing to a JetStream stream: one `HPUB` with a `Nats-Msg-Id` and a
//! reply token per put, answered by a PubAck on the inbox; or many queued and
//! flushed in one write, their PubAcks read in order.

use std::io::IoSlice;

use super::{NatsConnection, NatsError};
use taskq_proto::nats::PubAck;

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
        let put = self
            .s
            .start_put(subject.as_bytes(), msg_id, extra, body.len())?;
        let token = put.token;
        // Anything queued (acks without confirmation) goes out in the same write.
        let (head, body, end) = (
            IoSlice::new(put.head),
            IoSlice::new(body),
            IoSlice::new(b"\r\n"),
        );
        let r = if put.queued.is_empty() {
            self.io.write_all(&mut [head, body, end])
        } else {
            self.io
                .write_all(&mut [IoSlice::new(put.queued), head, body, end])
        };
        if let Err(e) = r {
            self.s.clear_queue();
            return Err(self.broke(e));
        }
        self.s.queue_sent();
        let m = self.wait_owed(|s| s.poll_reply(token))?;
        self.s.puback(m)
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
        self.s
            .queue_publish(subject.as_bytes(), msg_id, extra, body)
            .map(|_| ())
    }

    /// Sends everything queued (publishes, acks) with one write.
    pub fn flush(&mut self) -> Result<(), NatsError> {
        match self.s.to_flush()? {
            Some(_) => self.flush_tx(),
            None => Ok(()),
        }
    }

    /// PubAcks owed by flushed or queued publishes.
    pub fn pubacks_owed(&self) -> usize {
        self.s.pubacks_owed()
    }

    /// Reads the PubAck of the oldest queued publish (after [`flush`](Self::flush)).
    pub fn recv_puback(&mut self) -> Result<PubAck, NatsError> {
        self.s.next_puback()?;
        if !self.s.queued().is_empty() {
            self.flush()?;
        }
        self.wait_owed(taskq_proto::nats::NatsSession::poll_puback)
    }
}
