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
        self.idle()?;
        let token = self.next_token;
        self.scratch.clear();
        self.scratch.extend_from_slice(&self.inbox);
        self.scratch
            .extend_from_slice(itoa::Buffer::new().format(token).as_bytes());
        let max = self.cfg.limits.max_payload;
        crate::nats::encode_pub(
            &mut self.tx,
            subject.as_bytes(),
            Some(&self.scratch),
            payload,
            max,
        )?;
        self.next_token += 1;
        let started = Instant::now();
        self.flush_tx()?;
        let (m, base) = self.wait_reply(token, started, timeout)?;
        if self.no_responders(&m) {
            return Err(NatsError::NoResponders);
        }
        Ok(m.payload.of(self.rx.from(base)).to_vec())
    }
}
