//! The tokio drivers (feature `tokio`): [`AsyncConn`] over the beanstalkd
//! `Session` and [`AsyncNatsConn`] over the `NatsSession`, each one tokio
//! `TcpStream` with one write per request and a deadline on every whole reply,
//! kept by the one timer a connection holds ([`Deadline`]).

mod beanstalkd;
mod io;
mod nats;

pub use beanstalkd::AsyncConn;
pub use io::{due, open_stream, poll_read_into, setup, write_all, write_rest, Deadline};
pub use nats::AsyncNatsConn;
