//! Worker settings and their validation.

use std::fmt;
use std::time::Duration;

use taskq_proto::{validate_tube, Limits, TubeNameError};

use crate::backoff::Backoff;

/// Settings of a [`Worker`](crate::Worker).
///
/// Build one with struct update syntax from [`Config::default`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Servers as `HOST:PORT`; every thread connects to each.
    pub servers: Vec<String>,
    /// Tubes to watch; `default` is ignored unless listed.
    pub tubes: Vec<String>,
    /// Worker threads, each running one job at a time.
    pub concurrency: usize,
    /// Server-side wait of each `reserve-with-timeout`, rounded up to whole
    /// seconds and at least one, so an empty queue costs one request per slice.
    pub reserve_timeout: Duration,
    /// Limit on each reply beyond the server's wait, and on each write.
    pub io_timeout: Duration,
    /// Limit on each connect attempt.
    pub connect_timeout: Duration,
    /// Failed attempts after which [`Outcome::Fail`](crate::Outcome::Fail) buries a job.
    pub max_attempts: u32,
    /// Delay of the release after a failed attempt: the ceiling for attempt n
    /// (no jitter, whole seconds, rounded up).
    pub retry_backoff: Backoff,
    /// Waits between failed connects to one server, with full jitter.
    pub reconnect_backoff: Backoff,
    /// Stop once no job was reserved for this long on any thread.
    pub exit_when_idle: Option<Duration>,
    /// Stop once this many jobs were deleted; never more are reserved at once
    /// than can still be deleted within it.
    pub max_jobs: Option<u64>,
    /// Size limits of replies.
    pub limits: Limits,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            servers: vec!["127.0.0.1:11300".into()],
            tubes: vec!["default".into()],
            concurrency: 1,
            reserve_timeout: Duration::from_secs(1),
            io_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(2),
            max_attempts: 5,
            retry_backoff: Backoff {
                base: Duration::from_secs(1),
                cap: Duration::from_secs(60),
            },
            reconnect_backoff: Backoff {
                base: Duration::from_millis(100),
                cap: Duration::from_secs(5),
            },
            exit_when_idle: None,
            max_jobs: None,
            limits: Limits::default(),
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
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::NoServers => f.write_str("no server address given"),
            ConfigError::NoTubes => f.write_str("no tube given"),
            ConfigError::BadTube { name, error } => write!(f, "tube {name:?}: {error}"),
            ConfigError::ZeroConcurrency => f.write_str("concurrency must be at least 1"),
            ConfigError::ZeroAttempts => f.write_str("max attempts must be at least 1"),
        }
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.servers.is_empty() {
            return Err(ConfigError::NoServers);
        }
        if self.tubes.is_empty() {
            return Err(ConfigError::NoTubes);
        }
        for t in &self.tubes {
            validate_tube(t).map_err(|error| ConfigError::BadTube {
                name: t.clone(),
                error,
            })?;
        }
        if self.concurrency == 0 {
            return Err(ConfigError::ZeroConcurrency);
        }
        if self.max_attempts == 0 {
            return Err(ConfigError::ZeroAttempts);
        }
        Ok(())
    }

    /// The reserve slice in whole seconds, at least one.
    pub(crate) fn reserve_secs(&self) -> u32 {
        taskq_proto::secs_ceil(self.reserve_timeout).max(1)
    }
}
