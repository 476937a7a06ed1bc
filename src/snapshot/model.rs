//! What a snapshot holds, for both engines: what to read, the server's
//! totals, each tube's jobs by state, and JetStream's own figures. The
//! engines' readers fill it in; everything else reads it.

use std::time::Instant;

use taskq_connect::nats::StreamInfo;

pub use crate::jetstream::ConsumerRow;

/// What to read.
#[derive(Debug, Clone, Copy, Default)]
pub struct Scope<'a> {
    /// These tubes, in this order (a tube the server does not have is kept,
    /// all zero, with [`Tube::known`] false); `None`: every tube the server has.
    pub tubes: Option<&'a [String]>,
    /// Also read the age of each tube's next ready job.
    pub ready_age: bool,
}

impl<'a> Scope<'a> {
    /// Every tube, with the ages of their next ready jobs.
    pub fn everything() -> Scope<'a> {
        Scope {
            tubes: None,
            ready_age: true,
        }
    }

    /// The server's totals and the tubes `tubes` (none when empty), without ages.
    pub fn only(tubes: &'a [String]) -> Scope<'a> {
        Scope {
            tubes: Some(tubes),
            ready_age: false,
        }
    }
}

/// The most tubes a snapshot holds. A server that lists more, or a stream
/// whose subjects or consumers name more, gets an error instead of memory
/// that grows with what it sends (every sampler reads again each second).
pub const MAX_TUBES: usize = 100_000;

/// The error of a server past [`MAX_TUBES`]: `what` names more.
pub fn too_many_tubes(what: &str) -> String {
    format!("{what} names more than {MAX_TUBES} tubes, more than taskq reads at once")
}

/// A server at one moment.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// When the counters were read (after the tubes' statistics, before the ages).
    pub at: Instant,
    /// The server's totals.
    pub totals: Totals,
    /// The tubes asked for, in the server's order (or the order asked in).
    pub tubes: Vec<Tube>,
    /// JetStream's own record: the stream and its consumers.
    pub nats: Option<NatsRecord>,
}

/// Jobs by state, and the counters rates come from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Jobs ready to be handed out.
    pub ready: u64,
    /// Ready jobs with priority below 1024 (JetStream has no priorities: 0).
    pub urgent: u64,
    /// Jobs handed out and not settled.
    pub reserved: u64,
    /// Delayed jobs (`None` on JetStream: a delay is known only at delivery,
    /// and a delayed job counts as ready until then).
    pub delayed: Option<u64>,
    /// Buried jobs.
    pub buried: u64,
    /// Connections (beanstalkd) or pull requests (JetStream) waiting for a job.
    pub waiting: u64,
    /// Jobs put since the start (`None` where the engine keeps no count).
    pub puts: Option<u64>,
    /// Jobs done since the start (`None` where the engine keeps no count).
    pub done: Option<u64>,
}

/// The server's totals.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Totals {
    /// The server's version (beanstalkd's `version`; empty on JetStream,
    /// whose stream record has none).
    pub version: String,
    /// Seconds since the server started (beanstalkd).
    pub uptime: Option<u64>,
    /// Tubes: beanstalkd's `current-tubes`; on JetStream the tubes of the layout.
    pub tubes: u64,
    /// Jobs by state over every tube, and the counters of puts and of jobs
    /// done: `cmd-put` and `cmd-delete`; on JetStream the stream's last
    /// sequence (every message stored) and the messages it no longer holds
    /// (acked or deleted: last sequence less messages).
    pub jobs: Counts,
    /// Open connections (beanstalkd).
    pub connections: Option<u64>,
    /// Connections that have put a job (beanstalkd).
    pub producers: Option<u64>,
    /// Connections that have reserved a job (beanstalkd).
    pub workers: Option<u64>,
    /// beanstalkd's `stats` reply, every pair in the server's order (empty on JetStream).
    pub pairs: Vec<(String, String)>,
}

impl Totals {
    /// A numeric field of beanstalkd's `stats` reply.
    pub fn counter(&self, key: &str) -> Option<u64> {
        self.pairs
            .iter()
            .find(|(k, _)| k == key)
            .and_then(|(_, v)| v.parse().ok())
    }
}

/// One tube.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tube {
    /// Its name.
    pub name: String,
    /// False for a tube asked for by name that the server does not have
    /// (all its figures are then 0).
    pub known: bool,
    /// Its jobs by state, and the counters of puts (`total-jobs`) and of
    /// jobs done (`cmd-delete`); JetStream keeps neither count per subject.
    pub jobs: Counts,
    /// Seconds of pause left, 0 when not paused.
    pub paused: u64,
    /// Age in seconds of the job the next reserve would get, when asked for
    /// and one is ready.
    pub ready_age: Option<u64>,
    /// beanstalkd's `stats-tube` reply, every pair in the server's order.
    pub pairs: Vec<(String, String)>,
    /// JetStream's own figures of the tube.
    pub nats: Option<NatsTube>,
}

impl Tube {
    /// A tube the server does not have.
    pub fn unknown(name: &str) -> Tube {
        Tube {
            name: name.to_owned(),
            ..Tube::default()
        }
    }

    /// Deliveries made since the tube's consumer was made (JetStream only).
    pub fn delivered(&self) -> Option<u64> {
        self.nats
            .as_ref()
            .and_then(|n| n.consumer.as_ref())
            .map(|c| c.delivered)
    }
}

/// JetStream's own figures of one tube.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NatsTube {
    /// Its consumer `taskq-T`, once a worker made it.
    pub consumer: Option<ConsumerRow>,
    /// Messages stored on `taskq.T` (ready and reserved, and delayed ones
    /// the client holds).
    pub stored: u64,
}

impl NatsTube {
    /// Unacked messages among those delivered more than once (0 without a consumer).
    pub fn redelivered(&self) -> u64 {
        self.consumer.as_ref().map_or(0, |c| c.redelivered)
    }
}

/// The stream and its consumers, as the cluster records them.
#[derive(Debug, Clone)]
pub struct NatsRecord {
    /// The stream.
    pub stream: StreamInfo,
    /// Its consumers by name: every one when every tube was read, else
    /// those of the tubes read.
    pub consumers: Vec<ConsumerRow>,
}
