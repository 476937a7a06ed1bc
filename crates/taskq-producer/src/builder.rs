//! A producer's settings: what [`Builder`] holds and checks before a
//! producer is made from it (the making is the producer's own, in
//! `Builder::connect` and `Builder::build`).

use std::net::SocketAddr;
use std::time::Duration;

use taskq_connect::nats::NatsAccess;
use taskq_proto::{defaults, Backoff, ConnectionConfig};

use crate::classify::check_tube;
use crate::error::{Error, NotSent};
use crate::nats::NatsSetup;

/// How long a JetStream put whose outcome is unknown is re-sent with its
/// message id before the producer gives up (well inside the stream's default
/// 2-minute duplicate window, and past a leader election's 4 to 9 seconds).
pub const DEFAULT_RESOLVE_FOR: Duration = Duration::from_secs(30);

/// Settings for a [`Producer`](crate::Producer); `Producer::builder()` starts one.
#[derive(Debug, Clone, Default)]
pub struct Builder {
    pub(crate) cfg: ConnectionConfig,
    pub(crate) backoff: Backoff,
    pub(crate) retries: u32,
    pub(crate) tube: Option<String>,
    pub(crate) stream: Option<String>,
    pub(crate) replicas: Option<usize>,
    pub(crate) resolve_for: Option<Duration>,
    pub(crate) access: NatsAccess,
    pub(crate) keep_stream_config: bool,
    /// `None`: [`defaults::API_PATIENCE`].
    pub(crate) api_patience: Option<Duration>,
    /// The shared producer's bounds; `None`: the defaults.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) max_queued: (Option<usize>, Option<usize>),
}

impl Builder {
    /// Limit on each connect attempt (default [`defaults::CONNECT_TIMEOUT`], 2 s).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use taskq_producer::Producer;
    ///
    /// let p = Producer::builder().connect_timeout(Duration::from_secs(1)).connect("127.0.0.1:11300")?;
    /// # Ok::<(), taskq_producer::Error>(())
    /// ```
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.cfg.connect_timeout = d;
        self
    }

    /// Limit on each whole reply and each write (default
    /// [`defaults::IO_TIMEOUT`], 2 s).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use taskq_producer::Producer;
    ///
    /// let p = Producer::builder().io_timeout(Duration::from_millis(500)).connect("127.0.0.1:11300")?;
    /// # Ok::<(), taskq_producer::Error>(())
    /// ```
    pub fn io_timeout(mut self, d: Duration) -> Self {
        self.cfg.io_timeout = d;
        self
    }

    /// Largest body accepted; larger ones are refused before sending
    /// (default 65535, beanstalkd's default `-z`).
    ///
    /// ```no_run
    /// use taskq_producer::Producer;
    ///
    /// let p = Producer::builder().max_job_size(1 << 20).connect("127.0.0.1:11300")?;
    /// # Ok::<(), taskq_producer::Error>(())
    /// ```
    pub fn max_job_size(mut self, bytes: usize) -> Self {
        self.cfg.limits.max_job_size = bytes;
        self
    }

    /// Waits between reconnect attempts (default
    /// [`defaults::RECONNECT_BACKOFF`]: 50 ms doubling to 2 s).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use taskq_producer::{Backoff, Jitter};
    /// use taskq_producer::Producer;
    ///
    /// let p = Producer::builder().backoff(Backoff { initial: Duration::from_millis(50), max: Duration::from_secs(2), jitter: Jitter::Full }).connect("127.0.0.1:11300")?;
    /// # Ok::<(), taskq_producer::Error>(())
    /// ```
    pub fn backoff(mut self, b: Backoff) -> Self {
        self.backoff = b;
        self
    }

    /// TCP keepalive idle time; `None` turns keepalive off (default
    /// [`defaults::KEEPALIVE`], 30 s).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use taskq_producer::Producer;
    ///
    /// let p = Producer::builder().keepalive(Some(Duration::from_secs(10))).connect("127.0.0.1:11300")?;
    /// # Ok::<(), taskq_producer::Error>(())
    /// ```
    pub fn keepalive(mut self, idle: Option<Duration>) -> Self {
        self.cfg.keepalive = idle;
        self
    }

    /// At-least-once mode: a put whose outcome is unknown (or that was not sent)
    /// is sent again on a fresh connection, up to `retries` more times. A job
    /// may then be queued twice; the default, 0, never re-sends.
    ///
    /// ```no_run
    /// use taskq_producer::Producer;
    ///
    /// let p = Producer::builder().at_least_once(2).connect("127.0.0.1:11300")?;
    /// # Ok::<(), taskq_producer::Error>(())
    /// ```
    pub fn at_least_once(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    /// The tube puts go to from the start (default `default`).
    ///
    /// ```no_run
    /// use taskq_producer::Producer;
    ///
    /// let p = Producer::builder().tube("emails").connect("127.0.0.1:11300")?;
    /// # Ok::<(), taskq_producer::Error>(())
    /// ```
    pub fn tube(mut self, tube: &str) -> Self {
        self.tube = Some(tube.to_owned());
        self
    }

    /// JetStream: the stream (default `TASKQ`, capturing `taskq.>`; another
    /// name captures its lower-case self followed by `.>`).
    ///
    /// ```no_run
    /// use taskq_producer::Producer;
    ///
    /// // Puts on subjects `orders.<tube>` of stream ORDERS.
    /// let p = Producer::builder().stream("ORDERS").connect("nats://127.0.0.1:4222")?;
    /// # Ok::<(), taskq_producer::Error>(())
    /// ```
    pub fn stream(mut self, name: &str) -> Self {
        self.stream = Some(name.to_owned());
        self
    }

    /// JetStream: replicas of the stream when the producer creates it
    /// (default: 3 on a cluster of 3 or more nodes, else 1). An existing
    /// stream keeps its replicas (and all of its configuration but message
    /// schedules: see [`keep_stream_config`](Self::keep_stream_config)).
    ///
    /// ```no_run
    /// use taskq_producer::Producer;
    ///
    /// let p = Producer::builder().replicas(3).connect("nats://127.0.0.1:4222")?;
    /// # Ok::<(), taskq_producer::Error>(())
    /// ```
    pub fn replicas(mut self, n: usize) -> Self {
        self.replicas = Some(n);
        self
    }

    /// JetStream: how long a put whose PubAck did not come is re-sent, with
    /// the same message id, on fresh connections (default 30 s). The stream
    /// stores it once; past this time the put fails as unknown. A stream
    /// whose duplicate window is shorter (the server's default is 2
    /// minutes) cuts this to nine tenths of the window, with a warning,
    /// since a copy sent after the window would be stored again.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use taskq_producer::Producer;
    ///
    /// let p = Producer::builder().resolve_for(Duration::from_secs(10)).connect("nats://127.0.0.1:4222")?;
    /// # Ok::<(), taskq_producer::Error>(())
    /// ```
    pub fn resolve_for(mut self, d: Duration) -> Self {
        self.resolve_for = Some(d);
        self
    }

    /// JetStream: never change an existing stream's configuration (default
    /// false). On nats-server 2.12 and later a delayed job is held by the
    /// server (a message schedule) when the stream allows message
    /// schedules: a stream the producer creates does, and an existing
    /// stream without them is updated to allow them, a change the server
    /// cannot undo. With `true` such a stream is left as it is, and delayed
    /// jobs stay with the client (carried to the tube at once, given back
    /// by a worker handed them early), as on older servers.
    ///
    /// ```no_run
    /// use taskq_producer::Producer;
    ///
    /// let p = Producer::builder().keep_stream_config(true).connect("nats://127.0.0.1:4222")?;
    /// # Ok::<(), taskq_producer::Error>(())
    /// ```
    pub fn keep_stream_config(mut self, keep: bool) -> Self {
        self.keep_stream_config = keep;
        self
    }

    /// JetStream: credentials and TLS (the address's own user info, and
    /// `tls://`, take precedence). Not read from the environment: the
    /// commands do that. [`NatsAccess`](crate::NatsAccess) and
    /// [`TlsSettings`](crate::TlsSettings) are re-exported here, so a
    /// program reaches a secured cluster with this crate alone:
    ///
    /// ```
    /// use taskq_producer::{NatsAccess, Producer, Secret, TlsSettings};
    ///
    /// let access = NatsAccess {
    ///     user: Some(("alice".into(), Secret::new("s3cret"))),
    ///     tls: TlsSettings {
    ///         ca_file: Some("/etc/app/ca.pem".into()),
    ///         ..TlsSettings::default()
    ///     },
    ///     ..NatsAccess::default()
    /// };
    /// assert!(access.tls.wanted());
    /// assert_eq!(access.describe(), "user alice");
    /// assert!(!format!("{access:?}").contains("s3cret"));
    /// let builder = Producer::builder().nats_access(access);
    /// # let _ = builder;
    /// // let mut p = builder.connect("tls://nats1.example:4222")?;
    /// ```
    ///
    /// With a credentials file:
    ///
    /// ```no_run
    /// use taskq_producer::{NatsAccess, Producer};
    ///
    /// let access = NatsAccess { creds_file: Some("/etc/taskq/user.creds".into()), ..NatsAccess::default() };
    /// let p = Producer::builder().nats_access(access).connect("tls://nats.internal:4222")?;
    /// # Ok::<(), taskq_producer::Error>(())
    /// ```
    pub fn nats_access(mut self, access: NatsAccess) -> Self {
        self.access = access;
        self
    }

    /// JetStream: how long the stream's lookup and creation, at each
    /// connect, are asked again while the cluster has no leader (default
    /// [`defaults::API_PATIENCE`], 10 s). Past it the connect fails, not sent.
    pub fn api_patience(mut self, d: Duration) -> Self {
        self.api_patience = Some(d);
        self
    }
}

impl Builder {
    /// JetStream's layout, message ids, credentials and seeds for a
    /// producer of `address` (its user info and `tls://` win over the
    /// builder's access; `None` when given socket addresses).
    pub(crate) fn nats_setup(
        &self,
        address: Option<&taskq_connect::Address>,
    ) -> Result<NatsSetup, Error> {
        let stream = self
            .stream
            .as_deref()
            .unwrap_or(taskq_connect::DEFAULT_STREAM);
        let layout = taskq_connect::Layout::new(stream)
            .map_err(|e| Error::from(taskq_proto::EncodeError::BadTubeName(e)))?;
        let (access, seeds) = match address {
            Some(a) => (self.access.for_address(a), a.hosts().to_vec()),
            None => (self.access.clone(), Vec::new()),
        };
        Ok(NatsSetup::new(
            layout,
            self.replicas,
            access,
            seeds,
            self.keep_stream_config,
            self.api_patience.unwrap_or(defaults::API_PATIENCE),
            self.resolve_for.unwrap_or(DEFAULT_RESOLVE_FOR),
        ))
    }

    /// Refuses an empty address list or a bad tube name; the tube to restore
    /// on each connection (`None` for `default`, which a connection starts with).
    pub(crate) fn checked_tube(
        &self,
        addrs: &[SocketAddr],
        jetstream: bool,
    ) -> Result<Option<String>, Error> {
        if addrs.is_empty() {
            return Err(Error::NotSent(NotSent::NoAddress));
        }
        if let Some(t) = &self.tube {
            check_tube(t, jetstream)?;
        }
        Ok(self.tube.clone().filter(|t| t != "default"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_builder_starts_from_the_shared_defaults() {
        let b = Builder::default();
        assert_eq!(
            (b.cfg.connect_timeout, b.cfg.io_timeout, b.cfg.keepalive),
            (
                defaults::CONNECT_TIMEOUT,
                defaults::IO_TIMEOUT,
                defaults::KEEPALIVE
            )
        );
        assert_eq!(b.backoff, defaults::RECONNECT_BACKOFF);
        assert_eq!(b.access, NatsAccess::default());
        // What JetStream connections are opened with.
        let n = crate::nats::nats_config(&b.cfg);
        assert_eq!(
            (n.connect_timeout, n.io_timeout, n.keepalive),
            (
                defaults::CONNECT_TIMEOUT,
                defaults::IO_TIMEOUT,
                defaults::KEEPALIVE
            )
        );
        assert_eq!(
            b.nats_setup(None).unwrap().api_patience,
            defaults::API_PATIENCE
        );
        let short = Duration::from_millis(300);
        let b = b.api_patience(short);
        assert_eq!(b.nats_setup(None).unwrap().api_patience, short);
    }
}
