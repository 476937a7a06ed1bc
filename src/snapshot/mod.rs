//! One picture of a server, whatever its engine: the server's totals and,
//! per tube, its jobs by state, the age of its next ready job and the
//! counters rates are made from. `stats`, `tubes`, `top`, the exporter, the
//! demo's report and `taskq web` all read a server through [`read`]; the
//! engines' own figures (beanstalkd's `stats` pairs, JetStream's stream and
//! consumers) ride along for the commands that print them.
//!
//! beanstalkd is read with `stats`, `list-tubes`, one `stats-tube` per tube
//! and, for the ages, `peek-ready` and `stats-job` per tube with a ready job.
//! JetStream is read from the stream's info (with the count of messages on
//! each subject of taskq's layout), its consumers' info and, for the ages,
//! the first undelivered message of each tube; see [`nats`].

mod beanstalkd;
mod model;
pub mod nats;
mod rates;

pub use model::{
    too_many_tubes, ConsumerRow, Counts, NatsRecord, Scope, Snapshot, Tube, MAX_TUBES,
};
pub use rates::{History, Rates, Trend};

use crate::server::Conn;

/// Reads the server `conn` is connected to.
pub fn read(conn: &mut Conn, scope: Scope<'_>) -> Result<Snapshot, String> {
    match conn {
        Conn::Beanstalkd(c) => beanstalkd::read(c, scope),
        Conn::Nats(js) => nats::read(js, scope),
    }
}
