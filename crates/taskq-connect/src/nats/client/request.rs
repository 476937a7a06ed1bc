//! A request with a reply: the generic call under the JetStream API (and
//! anything else that answers on a reply subject).

use std::time::Duration;

use super::{NatsConnection, NatsError};

impl NatsConnection {
    /// Sends `payload` to `subject` with a reply token and returns the
    /// reply's payload, waiting at most `timeout`. A `503` status is
    /// [`NatsError::NoResponders`].
    pub fn request(
        &mut self,
        subject: &str,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, NatsError> {
        let token = self
            .s
            .queue_request_within(subject.as_bytes(), payload, timeout)?;
        self.flush_tx()?;
        let m = self.wait_owed(|s| s.poll_reply(token))?;
        self.s.reply_payload(m).map(<[u8]>::to_vec)
    }
}
