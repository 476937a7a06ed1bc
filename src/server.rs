//! Reaching a server: the `--addr` options, the connection a command gets
//! for the engine the address selects (the one place connections of the
//! operators' commands are made), and the request helpers over beanstalkd.

use std::io::Write;
use std::time::Duration;

use taskq_proto::{Command, Connection, ConnectionConfig, Reply};

use crate::cli::CliResult;
use crate::jetstream::{self, Js, Route, StreamArgs};

/// `--io-timeout`'s default, in milliseconds: the I/O timeout every part of
/// taskq shares ([`taskq_proto::defaults::IO_TIMEOUT`]). The commands'
/// one flag bounds connecting too, which keeps the shared connect timeout
/// only while the two defaults agree: the assertion below says they do.
pub const IO_TIMEOUT_MS: u64 = taskq_proto::defaults::IO_TIMEOUT.as_millis() as u64;

const _: () = assert!(
    taskq_proto::defaults::IO_TIMEOUT.as_millis()
        == taskq_proto::defaults::CONNECT_TIMEOUT.as_millis(),
    "--io-timeout bounds connecting too: give the commands a --connect-timeout first"
);

/// The server to talk to: `--addr`, then `$TASKQ_ADDR`, then the default.
#[derive(clap::Args, Debug, Clone)]
pub struct ServerArgs {
    /// Server address.
    #[arg(long, env = "TASKQ_ADDR", default_value = "127.0.0.1:11300")]
    pub addr: String,
    /// Limit on connecting and on each reply, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = IO_TIMEOUT_MS)]
    pub io_timeout: u64,
    #[command(flatten)]
    pub js: StreamArgs,
}

/// Several servers to read: `--addr` repeated, then `$TASKQ_ADDR`, then the default.
#[derive(clap::Args, Debug, Clone)]
pub struct ServersArgs {
    /// A server (repeat for several): beanstalkd HOST:PORT or a JetStream
    /// cluster nats://HOST:PORT[,HOST:PORT...]; defaults to $TASKQ_ADDR, then
    /// 127.0.0.1:11300.
    #[arg(
        long,
        value_name = "ADDR",
        env = "TASKQ_ADDR",
        default_value = "127.0.0.1:11300"
    )]
    addr: Vec<String>,
    /// Limit on connecting to a server and on each reply, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = IO_TIMEOUT_MS)]
    pub io_timeout: u64,
    #[command(flatten)]
    pub js: StreamArgs,
}

impl ServersArgs {
    /// Each server's address, checked: a nats:// address names one cluster
    /// (its seeds comma-separated); beanstalkd servers may come
    /// comma-separated, as `$TASKQ_ADDR` gives them.
    pub fn addrs(&self) -> Result<Vec<String>, String> {
        let mut out = Vec::new();
        for a in &self.addr {
            if jetstream::is_nats(a) {
                out.push(a.clone());
            } else {
                out.extend(a.split(',').map(str::to_owned));
            }
        }
        for a in &out {
            jetstream::route(a)?;
        }
        Ok(out)
    }
}

/// The connection a command got: to beanstalkd, or to a JetStream cluster.
pub enum Conn {
    /// beanstalkd (boxed: its send buffer is inline).
    Beanstalkd(Box<Connection>),
    /// JetStream.
    Nats(Box<Js>),
}

impl ServerArgs {
    /// Connects to whichever engine the address selects.
    pub fn open(&self) -> Result<Conn, String> {
        open(&self.addr, self.io_timeout, &self.js)
    }

    /// Checks `tube` for the engine the address selects, before anything is sent.
    pub fn check_tube(&self, tube: &str) -> Result<(), String> {
        check_tube(&self.addr, tube)
    }
}

/// Connects to `addr`, beanstalkd or a JetStream cluster (`stream` names
/// the stream there), with `io_timeout_ms` as the limit on connecting and on each reply.
pub fn open(addr: &str, io_timeout_ms: u64, stream: &StreamArgs) -> Result<Conn, String> {
    match jetstream::route(addr)? {
        Route::Beanstalkd(host) => {
            connect_to(&host, io_timeout_ms).map(|c| Conn::Beanstalkd(Box::new(c)))
        }
        Route::Nats(a) => Js::connect(&a, stream, io_timeout_ms).map(|j| Conn::Nats(Box::new(j))),
    }
}

/// Checks `tube` for the engine `addr` selects, before anything is sent.
pub fn check_tube(addr: &str, tube: &str) -> Result<(), String> {
    if jetstream::is_nats(addr) {
        jetstream::check_tube(tube)?;
    }
    Ok(())
}

/// Connects to beanstalkd at `addr` with `io_timeout_ms` as the limit on
/// connecting and on each reply.
pub fn connect_to(addr: &str, io_timeout_ms: u64) -> Result<Connection, String> {
    let t = Duration::from_millis(io_timeout_ms.max(1));
    let cfg = ConnectionConfig {
        connect_timeout: t,
        io_timeout: t,
        ..ConnectionConfig::default()
    };
    Connection::connect(addr, cfg).map_err(|e| format!("{addr}: {e}"))
}

/// Sends `cmd` and hands its reply to `f`; a failed request becomes an error naming the command.
pub fn request<T>(
    conn: &mut Connection,
    cmd: &Command<'_>,
    f: impl FnOnce(Reply<'_>) -> Result<T, String>,
) -> Result<T, String> {
    let reply = conn
        .request(cmd)
        .map_err(|e| format!("{}: {e}", cmd.kind().name()))?;
    f(reply)
}

/// The error for a reply that does not answer `cmd`.
pub fn unexpected(cmd: &Command<'_>, reply: &Reply<'_>) -> String {
    format!("{}: server answered {}", cmd.kind().name(), reply.word())
}

/// `use TUBE`.
pub fn use_tube(conn: &mut Connection, tube: &str) -> Result<(), String> {
    let cmd = Command::Use { tube };
    request(conn, &cmd, |r| match r {
        Reply::Using { .. } => Ok(()),
        other => Err(unexpected(&cmd, &other)),
    })
}

/// Writes `text` to standard output and flushes it.
pub fn print(text: &[u8]) -> CliResult {
    let mut out = std::io::stdout().lock();
    out.write_all(text)
        .and_then(|()| out.flush())
        .map_err(|e| format!("writing: {e}").into())
}
