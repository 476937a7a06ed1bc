//! A request with a reply: the generic call under the JetStream API (and
//! anything else that answers on a reply subject).

use std::time::Duration;

use crate::nats::encode_pub;
use crate::nats::op::MsgFrame;
use crate::nats::request_error::NatsError;

use super::state::{no_responders, Awaited, NatsSession};

impl NatsSession {
    /// Queues `payload` to `subject` with a reply token, for one write;
    /// returns the token its reply comes back with
    /// ([`poll_reply`](Self::poll_reply)). Refused ([`NatsError::Busy`])
    /// while other replies are owed, and while a pull its probe ended may
    /// still deliver ([`strays_possible`](Self::strays_possible)): a
    /// message that came while the reply was awaited would be read past and
    /// its job left to its ack wait.
    ///
    /// Its reply is due the I/O timeout after the first wait after its
    /// write ([`start_wait`](Self::start_wait)); see
    /// [`queue_request_within`](Self::queue_request_within) for another
    /// allowance.
    pub fn queue_request(&mut self, subject: &[u8], payload: &[u8]) -> Result<u64, NatsError> {
        self.queue_request_within(subject, payload, self.io_timeout)
    }

    /// [`queue_request`](Self::queue_request) whose reply is due `wait`
    /// after its wait began.
    pub fn queue_request_within(
        &mut self,
        subject: &[u8],
        payload: &[u8],
        wait: Duration,
    ) -> Result<u64, NatsError> {
        self.idle()?;
        if self.strays.is_some() {
            return Err(NatsError::Busy);
        }
        let token = self.peek_token();
        self.scratch.clear();
        self.scratch.extend_from_slice(&self.inbox);
        self.scratch
            .extend_from_slice(itoa::Buffer::new().format(token).as_bytes());
        let max = self.limits.max_payload;
        encode_pub(&mut self.tx, subject, Some(&self.scratch), payload, max)?;
        self.token();
        self.awaited = Some(Awaited::written_next(token, wait));
        Ok(token)
    }

    /// The payload of the reply `m` just polled; a `503` status is
    /// [`NatsError::NoResponders`].
    pub fn reply_payload(&self, m: MsgFrame) -> Result<&[u8], NatsError> {
        if no_responders(&m) {
            return Err(NatsError::NoResponders);
        }
        Ok(m.payload.of(self.event_bytes()))
    }
}
