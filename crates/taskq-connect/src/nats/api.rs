//! The JetStream management API, written once for both drivers.
//!
//! Each call (look a stream up, create it, turn schedules on, make a
//! consumer, pause it, read or delete a stored message) is an `async fn` of
//! [`JetStream`] over an [`ApiLink`]: a connection that can make one request
//! and wait between tries. The calls do no I/O of their own: the link does.
//! The tokio driver ([`AsyncNatsConn`](crate::tokio::AsyncNatsConn), feature
//! `tokio`) is a link whose requests wait on the runtime; the blocking
//! [`NatsConnection`](crate::nats::NatsConnection) is a link whose requests
//! are blocking calls that are done when they return, so its calls run to
//! their end in one poll ([`run_blocking`]). The rules (what a reply means,
//! what is created when, what is tried again while the cluster has no
//! leader, for how long) are in `client/js.rs` alone.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use taskq_proto::nats::NatsError;

/// A connection the JetStream API runs over.
pub trait ApiLink {
    /// Sends `payload` to `subject` with a reply subject and returns the
    /// reply's payload, within the connection's I/O timeout. A `503` status
    /// is [`NatsError::NoResponders`].
    fn request(
        &mut self,
        subject: &str,
        payload: &[u8],
    ) -> impl Future<Output = Result<Vec<u8>, NatsError>> + Send;

    /// Waits `pause` before a call is tried again.
    fn pause(&mut self, pause: Duration) -> impl Future<Output = ()> + Send;

    /// The server's release as its `INFO` gave it (`2.9.10`).
    fn server_version(&self) -> &str;

    /// How long calls are tried again while the cluster has no leader.
    fn api_patience(&self) -> Duration;
}

/// The JetStream management API over a link (see the module docs).
#[derive(Debug)]
pub struct JetStream<'a, L>(pub &'a mut L);

/// Runs `f` to its end on this thread, for futures whose every wait is a
/// blocking call that is done when it returns (the JetStream API over a
/// [`NatsConnection`](crate::nats::NatsConnection)): such a future is ready
/// at its first poll.
pub fn run_blocking<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        // A future made of blocking calls is ready at once; were one to
        // pend, polling again waits on the same blocking calls.
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
    }
}

impl ApiLink for crate::nats::NatsConnection {
    fn request(
        &mut self,
        subject: &str,
        payload: &[u8],
    ) -> impl Future<Output = Result<Vec<u8>, NatsError>> + Send {
        let timeout = self.io_timeout();
        std::future::ready(crate::nats::NatsConnection::request(
            self, subject, payload, timeout,
        ))
    }

    fn pause(&mut self, pause: Duration) -> impl Future<Output = ()> + Send {
        std::thread::sleep(pause);
        std::future::ready(())
    }

    fn server_version(&self) -> &str {
        crate::nats::NatsConnection::server_version(self)
    }

    fn api_patience(&self) -> Duration {
        self.api_patience_setting()
    }
}
