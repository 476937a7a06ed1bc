//! Worker settings and their validation.

use std::fmt;
use std::time::Duration;

use taskq_connect::nats::{ConsumerSpec, NatsAccess};
use taskq_connect::{
    redact_address, validate_subject_tube, Address, AddressError, Engine, Layout, DEFAULT_STREAM,
};
use taskq_proto::{validate_tube, Limits, TubeNameError};

use taskq_proto::{defaults, Backoff, Jitter};

/// Settings of a [`Worker`](crate::Worker).
///
/// Build one with struct update syntax from [`Config::default`].
#[derive(Clone, PartialEq, Eq)]
pub struct Config {
    /// Servers as `HOST:PORT` (beanstalkd; the worker holds one connection to
    /// each), or one `nats://HOST:PORT[,HOST:PORT...]` cluster (JetStream;
    /// the nodes listed are seeds). One engine per worker.
    pub servers: Vec<String>,
    /// Tubes to watch; `default` is ignored unless listed.
    pub tubes: Vec<String>,
    /// Weighted tubes: empty for strict mode (the server's order over all
    /// `tubes`), or one weight (at least 1) per tube, in the same order. See the
    /// crate docs for the exact rule.
    pub weights: Vec<u32>,
    /// With weights: jobs taken in a row per unit of weight, so that a tube of
    /// weight 4 gets runs of `4 * run_scale` jobs. Longer runs mean fewer
    /// `watch`/`ignore` commands; shorter runs a finer mix.
    pub run_scale: u32,
    /// Jobs whose handlers run at once, per server, all on one connection
    /// to it (the blocking worker's handler threads; the async worker's
    /// tasks).
    pub concurrency: usize,
    /// Server-side wait of each `reserve-with-timeout`, rounded up to whole
    /// seconds and at least one, so an empty queue costs one request per slice.
    pub reserve_timeout: Duration,
    /// Limit on each reply beyond the server's wait, and on each write
    /// (default [`defaults::IO_TIMEOUT`], 2 s).
    pub io_timeout: Duration,
    /// Limit on each connect attempt (default [`defaults::CONNECT_TIMEOUT`], 2 s).
    pub connect_timeout: Duration,
    /// Failed attempts after which [`Outcome::Fail`](crate::Outcome::Fail) buries a job.
    pub max_attempts: u32,
    /// Delay of the release after a failed attempt: the ceiling for attempt n
    /// (the jitter is not used; whole seconds, rounded up).
    pub retry_backoff: Backoff,
    /// Waits between failed connects to one server, spread by its jitter
    /// (default [`defaults::RECONNECT_BACKOFF`]: 50 ms doubling to 2 s).
    pub reconnect_backoff: Backoff,
    /// Stop once every server's connection is idle: none has reserved a
    /// job, connected or tried to connect for this long, none holds a job or
    /// owes a settle, and the last blocking reserve on each found nothing.
    /// On JetStream also only while the tubes' consumers have
    /// nothing pending and nothing awaiting acknowledgment (a delivery lost
    /// with its connection comes back after its ack wait), and no ack waits
    /// to be sent again.
    pub exit_when_idle: Option<Duration>,
    /// Stop once this many jobs were deleted; never more are reserved at once
    /// than can still be deleted within it.
    pub max_jobs: Option<u64>,
    /// Size limits of replies. `limits.max_job_size` is the largest job body
    /// the worker runs (default 65,535 bytes, as beanstalkd's own default,
    /// `beanstalkd -z 65535`; NATS's `max_payload` defaults to 1 MiB). A job
    /// larger than it is never held in memory or run: it is set aside once,
    /// buried on beanstalkd and terminated (`+TERM`) on JetStream, with a
    /// warning naming its id, its size and this limit, and counted
    /// `too_big`. Raise it to the server's limit (`-z`, up to 1 GiB;
    /// `max_payload`, up to 64 MiB) when such jobs are meant to run.
    pub limits: Limits,
    /// Jobs the connection to each server holds at once, those running
    /// included: the window is `max(concurrency, prefetch)`, `concurrency`
    /// of them running; more reserves the rest ahead of the handlers, so
    /// that short jobs drain near the server's pipelined rate.
    /// Engine-neutral: the number of jobs asked for in one go (beanstalkd:
    /// reserves in one write; a pulling engine: its batch size). Prefetched
    /// jobs wait on their lease: see docs/reliability.md. The same for both
    /// workers.
    pub prefetch: usize,
    /// The JetStream layout and the settings of what the worker creates there.
    pub jetstream: JetStreamConfig,
    /// Whether the [`AsyncWorker`](crate::AsyncWorker) looks each
    /// beanstalkd job up (`stats-job`, pipelined with the other requests)
    /// before its handler runs, so that `AsyncJob::tube()` and
    /// `AsyncJob::attempt()` are known without a wait (default `true`).
    /// That request is half again beanstalkd's work per job: a service whose
    /// quick handlers read neither can turn it off. Then a job starts as
    /// soon as it is reserved, `attempt()` is 0 (not known; a handler that
    /// needs it asks, `AsyncJob::stats().await`), `tube()` is the tube its
    /// reserve watched, and a job that fails is looked up only then, for its
    /// settle (`max_attempts` counts as before). A job reserved while
    /// several tubes were watched at once (tubes without weights, or a
    /// weighted fallback run) is still looked up first, for its tube.
    /// JetStream tells both with the delivery, and the blocking
    /// [`Worker`](crate::Worker) asks only when a handler calls
    /// [`Job::attempt`](crate::Job::attempt), [`Job::tube`](crate::Job::tube)
    /// (when its tube is not known) or [`Job::stats`](crate::Job::stats):
    /// neither reads this setting.
    pub job_lookup: bool,
}

/// Shows every setting, the servers without the credentials their
/// addresses may carry (`nats://alice:***@host`): a config printed with
/// `{:?}` in a log shows no password or token.
impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Taken apart whole, so that a new setting cannot be left out.
        let Config {
            servers,
            tubes,
            weights,
            run_scale,
            concurrency,
            reserve_timeout,
            io_timeout,
            connect_timeout,
            max_attempts,
            retry_backoff,
            reconnect_backoff,
            exit_when_idle,
            max_jobs,
            limits,
            prefetch,
            jetstream,
            job_lookup,
        } = self;
        let servers: Vec<String> = servers
            .iter()
            .map(|s| taskq_connect::redact_address(s))
            .collect();
        f.debug_struct("Config")
            .field("servers", &servers)
            .field("tubes", tubes)
            .field("weights", weights)
            .field("run_scale", run_scale)
            .field("concurrency", concurrency)
            .field("reserve_timeout", reserve_timeout)
            .field("io_timeout", io_timeout)
            .field("connect_timeout", connect_timeout)
            .field("max_attempts", max_attempts)
            .field("retry_backoff", retry_backoff)
            .field("reconnect_backoff", reconnect_backoff)
            .field("exit_when_idle", exit_when_idle)
            .field("max_jobs", max_jobs)
            .field("limits", limits)
            .field("prefetch", prefetch)
            .field("job_lookup", job_lookup)
            .field("jetstream", jetstream)
            .finish()
    }
}

/// Settings that only the JetStream engine reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JetStreamConfig {
    /// The stream (default `TASKQ`, capturing `taskq.>`).
    pub stream: String,
    /// Replicas of the stream when the worker creates it; `None`: 3 when the
    /// cluster has 3 or more nodes, else 1.
    pub replicas: Option<usize>,
    /// The ack wait (every job's lease, the engine's TTR) of a tube's consumer
    /// when the worker creates it. An existing consumer keeps its own.
    pub ack_wait: Duration,
    /// Credentials and TLS. User info in a `nats://` address takes the place
    /// of the user, password or token given here.
    pub access: NatsAccess,
}

/// Deliveries one consumer may have unacked at once, across its workers:
/// room for many prefetching workers (the server's default is 1000).
const MAX_ACK_PENDING: i64 = 20_000;

impl JetStreamConfig {
    /// The durable consumer of `tube` (in `layout`, this config's stream) as
    /// a worker creates it when the tube has none: filtered on the tube's
    /// subject, explicit acks, this config's ack wait, no delivery limit
    /// (the worker counts attempts and buries; the server's limit would
    /// strand a job instead). `taskq pause` creates the same one.
    pub fn consumer_spec(&self, layout: &Layout, tube: &str) -> ConsumerSpec {
        ConsumerSpec {
            filter_subject: layout.subject(tube),
            ack_wait: self.ack_wait,
            max_deliver: -1,
            max_ack_pending: MAX_ACK_PENDING,
            max_waiting: 512,
        }
    }
}

impl Default for JetStreamConfig {
    fn default() -> Self {
        JetStreamConfig {
            stream: DEFAULT_STREAM.to_owned(),
            replicas: None,
            ack_wait: Duration::from_secs(60),
            access: NatsAccess::default(),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            servers: vec!["127.0.0.1:11300".into()],
            tubes: vec!["default".into()],
            weights: Vec::new(),
            run_scale: 8,
            concurrency: 1,
            reserve_timeout: Duration::from_secs(1),
            io_timeout: defaults::IO_TIMEOUT,
            connect_timeout: defaults::CONNECT_TIMEOUT,
            max_attempts: 5,
            retry_backoff: Backoff {
                initial: Duration::from_secs(1),
                max: Duration::from_secs(60),
                jitter: Jitter::None,
            },
            reconnect_backoff: defaults::RECONNECT_BACKOFF,
            exit_when_idle: None,
            max_jobs: None,
            limits: Limits::default(),
            prefetch: 1,
            jetstream: JetStreamConfig::default(),
            job_lookup: true,
        }
    }
}

/// Why a [`Config`] was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// No server to connect to.
    NoServers,
    /// No tube to watch.
    NoTubes,
    /// A tube name the server would refuse.
    BadTube {
        /// The name given.
        name: String,
        /// What is wrong with it.
        error: TubeNameError,
    },
    /// Concurrency of zero.
    ZeroConcurrency,
    /// `max_attempts` of zero.
    ZeroAttempts,
    /// `prefetch` of zero: a connection must hold at least the running job.
    ZeroPrefetch,
    /// Weights given, but not one per tube.
    WeightCount {
        /// Tubes.
        tubes: usize,
        /// Weights.
        weights: usize,
    },
    /// A weight (or `run_scale`) of zero, or a weight that is not a number.
    BadWeight {
        /// The tube, or `run_scale`.
        name: String,
    },
    /// The same tube twice.
    DuplicateTube {
        /// The name.
        name: String,
    },
    /// A server address that cannot be read.
    BadAddress {
        /// The address given.
        addr: String,
        /// What is wrong with it.
        error: AddressError,
    },
    /// beanstalkd and JetStream addresses together, or more than one JetStream
    /// cluster: a worker runs on one engine.
    MixedEngines,
    /// The engine the servers select is not one this kind of worker runs
    /// on. Not returned by this release, whose workers both run on both
    /// engines (the async worker refused JetStream before it did).
    UnsupportedEngine {
        /// The engine the servers select.
        engine: Engine,
    },
    /// A JetStream stream name that is not one subject token.
    BadStream {
        /// The name given.
        name: String,
        /// What is wrong with it.
        error: TubeNameError,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::NoServers => f.write_str("no server address given"),
            ConfigError::NoTubes => f.write_str("no tube given"),
            ConfigError::BadTube { name, error } => write!(f, "tube {name:?}: {error}"),
            ConfigError::ZeroConcurrency => f.write_str("concurrency must be at least 1"),
            ConfigError::ZeroAttempts => f.write_str("max attempts must be at least 1"),
            ConfigError::ZeroPrefetch => f.write_str("prefetch must be at least 1"),
            ConfigError::WeightCount { tubes, weights } => {
                write!(
                    f,
                    "{weights} weights for {tubes} tubes: give one per tube, or none"
                )
            }
            ConfigError::BadWeight { name } => {
                write!(
                    f,
                    "tube {name:?}: the weight must be a whole number of at least 1"
                )
            }
            ConfigError::DuplicateTube { name } => write!(f, "tube {name:?} given twice"),
            ConfigError::BadAddress { addr, error } => write!(f, "server {addr:?}: {error}"),
            ConfigError::MixedEngines => f.write_str(
                "one engine per worker: either beanstalkd addresses or one nats:// cluster",
            ),
            ConfigError::BadStream { name, error } => write!(f, "stream {name:?}: {error}"),
            ConfigError::UnsupportedEngine { engine } => {
                write!(f, "this worker does not run on {}", engine.name())
            }
        }
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    /// Checks the settings.
    ///
    /// ```
    /// use taskq_worker::Config;
    ///
    /// let cfg = Config { concurrency: 0, ..Config::default() };
    /// assert!(cfg.validate().is_err());
    /// assert!(Config::default().validate().is_ok());
    /// ```
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.servers.is_empty() {
            return Err(ConfigError::NoServers);
        }
        if self.tubes.is_empty() {
            return Err(ConfigError::NoTubes);
        }
        let engine = self.engine()?;
        let check = match engine {
            Engine::Beanstalkd => validate_tube,
            Engine::Nats => validate_subject_tube,
        };
        for t in &self.tubes {
            check(t).map_err(|error| ConfigError::BadTube {
                name: t.clone(),
                error,
            })?;
        }
        if engine == Engine::Nats {
            taskq_connect::Layout::new(&self.jetstream.stream).map_err(|error| {
                ConfigError::BadStream {
                    name: self.jetstream.stream.clone(),
                    error,
                }
            })?;
        }
        if let Some(name) = self
            .tubes
            .iter()
            .enumerate()
            .find(|(i, t)| self.tubes[..*i].contains(t))
            .map(|(_, t)| t.clone())
        {
            return Err(ConfigError::DuplicateTube { name });
        }
        if !self.weights.is_empty() {
            if self.weights.len() != self.tubes.len() {
                return Err(ConfigError::WeightCount {
                    tubes: self.tubes.len(),
                    weights: self.weights.len(),
                });
            }
            if let Some(i) = self.weights.iter().position(|&w| w == 0) {
                return Err(ConfigError::BadWeight {
                    name: self.tubes[i].clone(),
                });
            }
            if self.run_scale == 0 {
                return Err(ConfigError::BadWeight {
                    name: "run_scale".into(),
                });
            }
        }
        if self.concurrency == 0 {
            return Err(ConfigError::ZeroConcurrency);
        }
        if self.max_attempts == 0 {
            return Err(ConfigError::ZeroAttempts);
        }
        if self.prefetch == 0 {
            return Err(ConfigError::ZeroPrefetch);
        }
        Ok(())
    }

    /// Sets the tubes from `NAME` or `NAME:WEIGHT` specs (as `--tube` takes
    /// them). Plain names only: strict mode. Any weight: weighted mode, where a
    /// plain name has weight 1.
    ///
    /// ```
    /// use taskq_worker::Config;
    ///
    /// let mut cfg = Config::default();
    /// cfg.set_tubes(&["vip:4", "standard:1"])?;
    /// assert_eq!(cfg.tubes, ["vip", "standard"]);
    /// assert_eq!(cfg.weights, [4, 1]);
    /// # Ok::<(), taskq_worker::ConfigError>(())
    /// ```
    pub fn set_tubes<S: AsRef<str>>(&mut self, specs: &[S]) -> Result<(), ConfigError> {
        let mut tubes = Vec::with_capacity(specs.len());
        let mut weights = Vec::with_capacity(specs.len());
        let mut any = false;
        for spec in specs {
            let spec = spec.as_ref();
            // Tube names cannot hold ':', so the split is unambiguous.
            match spec.split_once(':') {
                Some((name, w)) => {
                    let w: u32 = w.parse().map_err(|_| ConfigError::BadWeight {
                        name: name.to_owned(),
                    })?;
                    tubes.push(name.to_owned());
                    weights.push(w);
                    any = true;
                }
                None => {
                    tubes.push(spec.to_owned());
                    weights.push(1);
                }
            }
        }
        self.tubes = tubes;
        self.weights = if any { weights } else { Vec::new() };
        self.validate()
    }

    /// The engine the servers select: every address must select the same
    /// one, and JetStream takes one cluster address.
    pub fn engine(&self) -> Result<Engine, ConfigError> {
        let mut engine = None;
        for addr in &self.servers {
            let a = Address::parse(addr).map_err(|error| ConfigError::BadAddress {
                addr: redact_address(addr),
                error,
            })?;
            match engine {
                None => engine = Some(a.engine()),
                Some(Engine::Beanstalkd) if a.engine() == Engine::Beanstalkd => {}
                Some(_) => return Err(ConfigError::MixedEngines),
            }
        }
        engine.ok_or(ConfigError::NoServers)
    }

    /// Moves the credentials of a `nats://` address's user info (and what
    /// `tls://` asks) into [`JetStreamConfig::access`], leaving the address
    /// without them: the addresses that reach logs, metrics and a job's
    /// `TASKQ_ADDR` then carry no secret.
    pub(crate) fn lift_credentials(&mut self) {
        for s in &mut self.servers {
            let Ok(a) = Address::parse(s) else { continue };
            if a.is_nats() && (a.user_info().is_some() || a.requires_tls()) {
                self.jetstream.access = self.jetstream.access.for_address(&a);
                *s = a.without_credentials().to_string();
            }
        }
    }

    /// True when tubes are weighted (more than one tube, with weights).
    pub fn is_weighted(&self) -> bool {
        !self.weights.is_empty() && self.tubes.len() > 1
    }

    /// The reserve slice in whole seconds, at least one.
    pub(crate) fn reserve_secs(&self) -> u32 {
        // At most what the server reads as meant (a signed 32-bit count).
        taskq_proto::secs_ceil(self.reserve_timeout).clamp(1, taskq_proto::MAX_RESERVE_TIMEOUT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(servers: &[&str], tubes: &[&str]) -> Result<Engine, ConfigError> {
        let cfg = Config {
            servers: servers.iter().map(|s| s.to_string()).collect(),
            tubes: tubes.iter().map(|s| s.to_string()).collect(),
            ..Config::default()
        };
        cfg.validate().and_then(|()| cfg.engine())
    }

    #[test]
    fn servers_select_one_engine() {
        assert_eq!(with(&["127.0.0.1:11300"], &["a"]), Ok(Engine::Beanstalkd));
        assert_eq!(
            with(&["a:1", "beanstalk://b:2"], &["a"]),
            Ok(Engine::Beanstalkd)
        );
        assert_eq!(with(&["nats://a:1,b:2"], &["a"]), Ok(Engine::Nats));
        assert_eq!(
            with(&["a:1", "nats://b:2"], &["a"]),
            Err(ConfigError::MixedEngines)
        );
        assert_eq!(
            with(&["nats://a:1", "nats://b:2"], &["a"]),
            Err(ConfigError::MixedEngines)
        );
        assert!(matches!(
            with(&["redis://a:1"], &["a"]),
            Err(ConfigError::BadAddress { .. })
        ));
    }

    #[test]
    fn jetstream_tube_names_are_subject_tokens() {
        // Fine for beanstalkd, not a single subject token on JetStream.
        assert_eq!(with(&["a:1"], &["a.b"]), Ok(Engine::Beanstalkd));
        assert_eq!(
            with(&["nats://a:1"], &["a.b"]),
            Err(ConfigError::BadTube {
                name: "a.b".into(),
                error: TubeNameError::BadSubjectByte { byte: b'.', at: 1 },
            })
        );
        let cfg = Config {
            servers: vec!["nats://a:1".into()],
            jetstream: JetStreamConfig {
                stream: "A.B".into(),
                ..JetStreamConfig::default()
            },
            ..Config::default()
        };
        assert!(matches!(cfg.validate(), Err(ConfigError::BadStream { .. })));
    }
}
