//! A request with a reply: the generic call under the JetStream API (and
//! anything else that answers on a reply subject).

use std::time::{Duration, Instant};

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
        let token = self.s.queue_request(subject.as_bytes(), payload)?;
        let started = Instant::now();
        self.flush_tx()?;
        let m = self.wait_reply(token, started, timeout)?;
        self.s.reply_payload(m).map(<[u8]>::to_vec)
    }
}
