//! Operators' commands on one server: `tubes`, `peek`, `kick`, `kick-job`,
//! `delete` and `pause`, each one or a few requests on one connection.

use std::io::Write;
use std::time::Duration;

use taskq_proto::{yaml, Command, Connection, ConnectionConfig, JobStats, Reply, TubeStats};
use taskq_worker::table::Table;

use crate::jetstream::{self, Js, JsTube, Route, StreamArgs, Unsupported};
use crate::CliResult;

/// The server to talk to: `--addr`, then `$TASKQ_ADDR`, then the default.
#[derive(clap::Args, Debug, Clone)]
pub struct ServerArgs {
    /// Server address.
    #[arg(long, env = "TASKQ_ADDR", default_value = "127.0.0.1:11300")]
    pub addr: String,
    /// Limit on connecting and on each reply, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub io_timeout: u64,
    #[command(flatten)]
    pub js: StreamArgs,
}

/// The connection a command got: to beanstalkd, or to a JetStream cluster.
pub enum Conn {
    /// beanstalkd (boxed: its send buffer is inline).
    Beanstalkd(Box<Connection>),
    /// JetStream.
    Nats(Box<Js>),
}

impl ServerArgs {
    /// Connects to the beanstalkd server; a JetStream address is refused
    /// with `what` (the command) as [`Unsupported`].
    pub fn connect(&self) -> Result<Connection, String> {
        match self.open()? {
            Conn::Beanstalkd(c) => Ok(*c),
            Conn::Nats(_) => Err(format!("{} is for beanstalkd", self.addr)),
        }
    }

    /// Refuses a JetStream address for command `what`, before connecting.
    pub fn beanstalkd_only(&self, what: &'static str, why: &'static str) -> CliResult {
        if jetstream::is_nats(&self.addr) {
            return Err(Unsupported::nats(what, why).into());
        }
        Ok(())
    }

    /// Connects to whichever engine the address selects.
    pub fn open(&self) -> Result<Conn, String> {
        match jetstream::route(&self.addr)? {
            Route::Beanstalkd(host) => {
                connect_to(&host, self.io_timeout).map(|c| Conn::Beanstalkd(Box::new(c)))
            }
            Route::Nats(a) => {
                Js::connect(&a, &self.js, self.io_timeout).map(|j| Conn::Nats(Box::new(j)))
            }
        }
    }

    /// Checks `tube` for the engine the address selects, before anything is sent.
    pub fn check_tube(&self, tube: &str) -> Result<(), String> {
        if jetstream::is_nats(&self.addr) {
            jetstream::check_tube(tube)?;
        }
        Ok(())
    }
}

/// Connects to `addr` with `io_timeout_ms` as the limit on connecting and on each reply.
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

/// The statistics of one tube, `Ok(None)` when there is no such tube.
pub fn tube_stats(conn: &mut Connection, tube: &str) -> Result<Option<TubeRow>, String> {
    let cmd = Command::StatsTube { tube };
    request(conn, &cmd, |r| match r {
        Reply::Ok { yaml } => TubeStats::parse(yaml)
            .map(|s| Some(TubeRow::from(&s)))
            .map_err(|e| format!("reading stats-tube {tube}: {e}")),
        Reply::NotFound => Ok(None),
        other => Err(unexpected(&cmd, &other)),
    })
}

/// Every tube's name, in the server's order.
pub fn tube_names(conn: &mut Connection) -> Result<Vec<String>, String> {
    let cmd = Command::ListTubes;
    request(conn, &cmd, |r| match r {
        Reply::Ok { yaml } => yaml::items(yaml)
            .and_then(|items| {
                items
                    .map(|i| i.map(|s| yaml::unquote(s).to_owned()))
                    .collect()
            })
            .map_err(|e| format!("reading list-tubes: {e}")),
        other => Err(unexpected(&cmd, &other)),
    })
}

/// One tube's counts, as `taskq tubes` shows them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TubeRow {
    /// Tube name.
    pub name: String,
    /// Ready jobs.
    pub ready: u64,
    /// Ready jobs with priority below 1024.
    pub urgent: u64,
    /// Reserved jobs.
    pub reserved: u64,
    /// Delayed jobs.
    pub delayed: u64,
    /// Buried jobs.
    pub buried: u64,
    /// Workers waiting for a job from the tube.
    pub waiting: u64,
    /// Seconds of pause left, 0 when not paused.
    pub paused: u64,
    /// Jobs created in the tube.
    pub total_jobs: u64,
    /// `delete` commands for jobs in the tube.
    pub deletes: u64,
}

impl From<&TubeStats<'_>> for TubeRow {
    fn from(s: &TubeStats<'_>) -> TubeRow {
        TubeRow {
            name: s.name.to_owned(),
            ready: s.current_jobs_ready,
            urgent: s.current_jobs_urgent,
            reserved: s.current_jobs_reserved,
            delayed: s.current_jobs_delayed,
            buried: s.current_jobs_buried,
            waiting: s.current_waiting,
            paused: s.pause_time_left,
            total_jobs: s.total_jobs,
            deletes: s.cmd_delete,
        }
    }
}

/// Every tube's statistics (a tube gone between listing and asking is left out).
pub fn all_tubes(conn: &mut Connection) -> Result<Vec<TubeRow>, String> {
    let mut rows = Vec::new();
    for name in tube_names(conn)? {
        if let Some(row) = tube_stats(conn, &name)? {
            rows.push(row);
        }
    }
    Ok(rows)
}

/// The age in seconds of the next ready job of `tube`, the one a reserve
/// would get (`None` when none is ready). Leaves the connection using `tube`.
pub fn ready_age(conn: &mut Connection, tube: &str) -> Result<Option<u64>, String> {
    use_tube(conn, tube)?;
    let Some(id) = request(conn, &Command::PeekReady, |r| match r {
        Reply::Found { id, .. } => Ok(Some(id)),
        Reply::NotFound => Ok(None),
        other => Err(unexpected(&Command::PeekReady, &other)),
    })?
    else {
        return Ok(None);
    };
    let stats = Command::StatsJob { id };
    request(conn, &stats, |r| match r {
        Reply::Ok { yaml } => JobStats::parse(yaml)
            .map(|s| Some(s.age))
            .map_err(|e| format!("reading stats-job: {e}")),
        Reply::NotFound => Ok(None),
        other => Err(unexpected(&stats, &other)),
    })
}

/// Per tube of `tubes` (same order), the age of its next ready job, as [`ready_age`];
/// tubes with no ready job are not asked about.
pub fn ready_ages(conn: &mut Connection, tubes: &[TubeRow]) -> Result<Vec<Option<u64>>, String> {
    tubes
        .iter()
        .map(|t| {
            if t.ready == 0 {
                Ok(None)
            } else {
                ready_age(conn, &t.name)
            }
        })
        .collect()
}

/// Writes `text` to standard output and flushes it.
pub fn print(text: &[u8]) -> CliResult {
    let mut out = std::io::stdout().lock();
    out.write_all(text)
        .and_then(|()| out.flush())
        .map_err(|e| format!("writing: {e}").into())
}

/// Arguments of `taskq tubes`.
#[derive(clap::Args, Debug)]
pub struct TubesArgs {
    #[command(flatten)]
    server: ServerArgs,
    /// Print a JSON array of objects with the keys name, ready, urgent,
    /// reserved, delayed, buried, waiting and paused (seconds of pause left).
    #[arg(long)]
    json: bool,
}

/// Runs `taskq tubes`.
pub fn tubes(args: TubesArgs) -> CliResult {
    let rows: Vec<Listing> = match args.server.open()? {
        Conn::Beanstalkd(mut conn) => all_tubes(&mut conn)?.iter().map(listing).collect(),
        Conn::Nats(mut js) => js.tubes()?.iter().map(js_listing).collect(),
    };
    let text = if args.json {
        let array: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| r.iter().map(|(k, v)| (k.to_string(), v.clone())).collect())
            .collect();
        serde_json::Value::from(array).to_string() + "\n"
    } else {
        // JetStream's last column, the consumer's name, is text.
        let mut t = Table::new().left(10);
        let head = rows
            .first()
            .map_or_else(|| listing(&TubeRow::default()), Clone::clone);
        t.row(head.iter().map(|(k, _)| match *k {
            "name" => "TUBE".to_owned(),
            k => k.to_ascii_uppercase(),
        }));
        for r in &rows {
            t.row(r.iter().map(|(_, v)| match v {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Null => "-".to_owned(),
                v => v.to_string(),
            }));
        }
        t.to_string()
    };
    print(text.as_bytes())
}

/// One tube as `taskq tubes` shows it: (JSON key, value), in column order.
type Listing = Vec<(&'static str, serde_json::Value)>;

/// A beanstalkd tube's listing.
fn listing(r: &TubeRow) -> Listing {
    vec![
        ("name", r.name.clone().into()),
        ("ready", r.ready.into()),
        ("urgent", r.urgent.into()),
        ("reserved", r.reserved.into()),
        ("delayed", r.delayed.into()),
        ("buried", r.buried.into()),
        ("waiting", r.waiting.into()),
        ("paused", r.paused.into()),
    ]
}

/// A JetStream tube's listing: the same keys (no priorities and no pause
/// there, so urgent and paused are 0; a delay is unknown until delivery, so
/// delayed is null and delayed jobs count as ready), then the consumer's own.
fn js_listing(t: &JsTube) -> Listing {
    let c = t.consumer.as_ref();
    vec![
        ("name", t.name.clone().into()),
        ("ready", t.ready().into()),
        ("urgent", 0.into()),
        ("reserved", t.reserved().into()),
        ("delayed", serde_json::Value::Null),
        ("buried", t.buried.into()),
        ("waiting", t.waiting().into()),
        ("paused", 0.into()),
        ("redelivered", c.map(|c| c.redelivered).into()),
        ("stored", t.stored.into()),
        ("consumer", c.map(|c| c.name.clone()).into()),
    ]
}

/// Which job `taskq peek` looks at.
#[derive(clap::Args, Debug)]
#[group(required = true, multiple = false)]
pub struct PeekWhich {
    /// The next ready job.
    #[arg(long)]
    ready: bool,
    /// The delayed job that becomes ready first.
    #[arg(long)]
    delayed: bool,
    /// The oldest buried job.
    #[arg(long)]
    buried: bool,
}

/// Arguments of `taskq peek`.
#[derive(clap::Args, Debug)]
pub struct PeekArgs {
    #[command(flatten)]
    server: ServerArgs,
    /// The tube to look in.
    #[arg(long)]
    tube: String,
    #[command(flatten)]
    which: PeekWhich,
    /// Write the body's bytes alone, nothing added.
    #[arg(long)]
    raw: bool,
}

/// Runs `taskq peek`.
pub fn peek(args: PeekArgs) -> CliResult {
    args.server.check_tube(&args.tube)?;
    let mut conn = match args.server.open()? {
        Conn::Beanstalkd(conn) => *conn,
        Conn::Nats(js) => return peek_nats(args, *js),
    };
    use_tube(&mut conn, &args.tube)?;
    let (cmd, state) = if args.which.ready {
        (Command::PeekReady, "ready")
    } else if args.which.delayed {
        (Command::PeekDelayed, "delayed")
    } else {
        (Command::PeekBuried, "buried")
    };
    let (id, body) = request(&mut conn, &cmd, |r| match r {
        Reply::Found { id, body } => Ok((id, body.to_vec())),
        Reply::NotFound => Err(format!("no {state} job in tube {}", args.tube)),
        other => Err(unexpected(&cmd, &other)),
    })?;
    if args.raw {
        return print(&body);
    }
    let stats = Command::StatsJob { id };
    let mut t = Table::new().left(1);
    t.row(["id".to_string(), id.to_string()]);
    request(&mut conn, &stats, |r| {
        match r {
            Reply::Ok { yaml } => {
                let s = JobStats::parse(yaml).map_err(|e| format!("reading stats-job: {e}"))?;
                for (k, v) in [
                    ("tube", s.tube.to_string()),
                    ("state", s.state.to_string()),
                    ("pri", s.pri.to_string()),
                    ("age", format!("{} s", s.age)),
                    ("delay", format!("{} s", s.delay)),
                    ("ttr", format!("{} s", s.ttr)),
                    ("reserves", s.reserves.to_string()),
                    ("releases", s.releases.to_string()),
                    ("buries", s.buries.to_string()),
                    ("timeouts", s.timeouts.to_string()),
                    ("kicks", s.kicks.to_string()),
                ] {
                    t.row([k.to_string(), v]);
                }
            }
            // Deleted or reserved away between the peek and the lookup.
            Reply::NotFound => {
                t.row(["state", "gone (deleted since the peek)"]);
            }
            other => return Err(unexpected(&stats, &other)),
        }
        Ok(())
    })?;
    t.row(["bytes".to_string(), body.len().to_string()]);
    t.row(["body".to_string(), escape(&body)]);
    print(t.to_string().as_bytes())
}

/// `taskq peek` on JetStream: the first message on `taskq.T.buried`, or
/// the first on `taskq.T` the tube's consumer has not delivered yet.
fn peek_nats(args: PeekArgs, mut js: Js) -> CliResult {
    let tube = &args.tube;
    let (m, state) = if args.which.ready {
        (js.next_ready(tube)?, "ready")
    } else if args.which.buried {
        let buried = js.layout().buried_subject(tube);
        (js.first_on(&buried, 1)?, "buried")
    } else {
        return Err(Unsupported::nats(
            "peek --delayed",
            "a JetStream stream does not order jobs by ready time; a delayed job is counted as ready until a worker is handed it early and gives it back",
        )
        .into());
    };
    let Some(m) = m else {
        return Err(format!("no {state} job in tube {tube}").into());
    };
    if args.raw {
        return print(&m.data);
    }
    let mut t = Table::new().left(1);
    for (k, v) in [
        ("id", m.seq.to_string()),
        ("tube", tube.clone()),
        ("state", state.to_string()),
        ("subject", m.subject.clone()),
        ("stored", m.time.clone()),
    ] {
        t.row([k.to_string(), v]);
    }
    if let Ok(h) = taskq_proto::nats::HeaderBlock::parse(&m.headers) {
        for (k, v) in h.iter() {
            t.row(["header".to_string(), escape(&[k, b": ", v].concat())]);
        }
    }
    t.row(["bytes".to_string(), m.data.len().to_string()]);
    t.row(["body".to_string(), escape(&m.data)]);
    print(t.to_string().as_bytes())
}

/// The body as a quoted string safe to print on a terminal: valid UTF-8 kept,
/// control characters, quotes and backslashes escaped, other bytes as `\xNN`.
pub fn escape(body: &[u8]) -> String {
    let mut s = String::with_capacity(body.len() + 2);
    s.push('"');
    for chunk in body.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c.is_control() || c == '"' || c == '\\' {
                s.extend(c.escape_default());
            } else {
                s.push(c);
            }
        }
        for b in chunk.invalid() {
            s.push_str(&format!("\\x{b:02x}"));
        }
    }
    s.push('"');
    s
}

fn use_tube(conn: &mut Connection, tube: &str) -> Result<(), String> {
    let cmd = Command::Use { tube };
    request(conn, &cmd, |r| match r {
        Reply::Using { .. } => Ok(()),
        other => Err(unexpected(&cmd, &other)),
    })
}

/// Arguments of `taskq kick`.
#[derive(clap::Args, Debug)]
pub struct KickArgs {
    #[command(flatten)]
    server: ServerArgs,
    /// The tube whose jobs to kick.
    #[arg(long)]
    tube: String,
    /// Most jobs to kick (default: all of them).
    #[arg(long, value_name = "N")]
    count: Option<u32>,
}

/// Runs `taskq kick`: buried jobs first, else delayed ones, back to ready.
pub fn kick(args: KickArgs) -> CliResult {
    args.server.check_tube(&args.tube)?;
    let mut conn = match args.server.open()? {
        Conn::Beanstalkd(conn) => *conn,
        Conn::Nats(mut js) => {
            let n = js.kick(&args.tube, args.count.map_or(u64::MAX, u64::from))?;
            if n == 0 {
                return Err(format!(
                    "no buried job to kick in tube {} (on JetStream a delayed job waits for its time)",
                    args.tube
                )
                .into());
            }
            return print(format!("kicked {n}\n").as_bytes());
        }
    };
    use_tube(&mut conn, &args.tube)?;
    let cmd = Command::Kick {
        bound: args.count.unwrap_or(u32::MAX),
    };
    let n = request(&mut conn, &cmd, |r| match r {
        Reply::Kicked { count } => Ok(count),
        other => Err(unexpected(&cmd, &other)),
    })?;
    if n == 0 {
        return Err(format!("no buried or delayed job to kick in tube {}", args.tube).into());
    }
    print(format!("kicked {n}\n").as_bytes())
}

/// Arguments of `taskq kick-job` and `taskq delete`.
#[derive(clap::Args, Debug)]
pub struct JobsArgs {
    #[command(flatten)]
    server: ServerArgs,
    /// Job ids.
    #[arg(value_name = "ID", required = true)]
    ids: Vec<u64>,
}

/// Runs `taskq kick-job`: each buried or delayed job back to ready. On
/// JetStream only a buried job (a message on `taskq.T.buried`) can be kicked.
pub fn kick_job(args: JobsArgs) -> CliResult {
    const MISSING: &str = "not found, or neither buried nor delayed";
    match args.server.open()? {
        Conn::Beanstalkd(mut conn) => each_job(&args.ids, "kicked", |id| {
            beanstalkd_job(&mut conn, &Command::KickJob { id }, MISSING)
        }),
        Conn::Nats(mut js) => each_job(&args.ids, "kicked", |id| {
            let Some(m) = js.job(id)? else {
                return Ok(Err(MISSING.to_owned()));
            };
            match js.layout().tube_of(&m.subject) {
                Some((tube, true)) => {
                    let tube = tube.to_owned();
                    js.kick_one(&m, &tube).map(|_| Ok(()))
                }
                _ => Ok(Err(Unsupported::nats(
                    "kick-job of a job that is not buried",
                    "a ready or reserved job is held by its tube's consumer, and a delayed one waits there for its time",
                )
                .to_string())),
            }
        }),
    }
}

/// Runs `taskq delete`. On JetStream a job's id is its stream sequence;
/// only messages of taskq's layout (`taskq.T`, `taskq.T.buried`) are deleted.
pub fn delete(args: JobsArgs) -> CliResult {
    const MISSING: &str = "not found, or reserved by another connection";
    match args.server.open()? {
        Conn::Beanstalkd(mut conn) => each_job(&args.ids, "deleted", |id| {
            beanstalkd_job(&mut conn, &Command::Delete { id }, MISSING)
        }),
        Conn::Nats(mut js) => each_job(&args.ids, "deleted", |id| {
            let Some(m) = js.job(id)? else {
                return Ok(Err("not found".to_owned()));
            };
            if js.layout().tube_of(&m.subject).is_none() {
                return Ok(Err(format!("not a taskq job (subject {})", m.subject)));
            }
            Ok(if js.delete(id)? {
                Ok(())
            } else {
                Err("not found".to_owned())
            })
        }),
    }
}

/// Sends `cmd` about one job: `Ok(Err(missing))` when the server has no
/// such job (in a state the command acts on).
fn beanstalkd_job(
    conn: &mut Connection,
    cmd: &Command<'_>,
    missing: &str,
) -> Result<Result<(), String>, String> {
    request(conn, cmd, |r| match r {
        Reply::KickedJob | Reply::Deleted => Ok(Ok(())),
        Reply::NotFound => Ok(Err(missing.to_owned())),
        other => Err(unexpected(cmd, &other)),
    })
}

/// Acts on each id, printing `DONE ID` for each success; a job the action
/// did not apply to (`Ok(Err(why))`) is reported on stderr and makes the
/// command fail at the end; an `Err` stops at once.
fn each_job(
    ids: &[u64],
    done: &str,
    mut act: impl FnMut(u64) -> Result<Result<(), String>, String>,
) -> CliResult {
    let mut failed = 0;
    let mut out = String::new();
    for &id in ids {
        match act(id)? {
            Ok(()) => out += &format!("{done} {id}\n"),
            Err(why) => {
                eprintln!("taskq: job {id}: {why}");
                failed += 1;
            }
        }
    }
    print(out.as_bytes())?;
    if failed > 0 {
        return Err(format!("{failed} of {} jobs not {done}", ids.len()).into());
    }
    Ok(())
}

/// Arguments of `taskq pause`.
#[derive(clap::Args, Debug)]
pub struct PauseArgs {
    #[command(flatten)]
    server: ServerArgs,
    /// The tube to pause.
    #[arg(long)]
    tube: String,
    /// Seconds during which no job of the tube is handed out (0 ends a pause).
    #[arg(value_name = "SECS")]
    secs: u32,
}

/// Runs `taskq pause`.
pub fn pause(args: PauseArgs) -> CliResult {
    args.server.beanstalkd_only(
        "pause",
        "nats-server 2.9 cannot pause a consumer; stop the tube's workers instead",
    )?;
    let mut conn = args.server.connect()?;
    let cmd = Command::PauseTube {
        tube: &args.tube,
        delay: args.secs,
    };
    request(&mut conn, &cmd, |r| match r {
        Reply::Paused => Ok(()),
        Reply::NotFound => Err(format!("no tube named {}", args.tube)),
        other => Err(unexpected(&cmd, &other)),
    })?;
    print(format!("paused {} for {} s\n", args.tube, args.secs).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_keeps_text_and_escapes_the_rest() {
        assert_eq!(escape(b"plain text"), "\"plain text\"");
        assert_eq!(
            escape("caf\u{e9} \"q\"\n\t\x1b[2J\\".as_bytes()),
            "\"caf\u{e9} \\\"q\\\"\\n\\t\\u{1b}[2J\\\\\""
        );
        assert_eq!(escape(b"\xff\xfeok"), "\"\\xff\\xfeok\"");
    }
}
