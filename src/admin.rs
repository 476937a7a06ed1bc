//! Operators' commands on one server: `tubes`, `peek`, `kick`, `kick-job`,
//! `delete` and `pause`, each one or a few requests on one connection.

use std::io::Write;
use std::time::Duration;

use taskq_proto::{yaml, Command, Connection, ConnectionConfig, JobStats, Reply, TubeStats};
use taskq_worker::table::Table;

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
}

impl ServerArgs {
    /// Connects to the server.
    pub fn connect(&self) -> Result<Connection, String> {
        connect_to(&self.addr, self.io_timeout)
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
    let mut conn = args.server.connect()?;
    let rows = all_tubes(&mut conn)?;
    let text = if args.json {
        let array: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "name": r.name, "ready": r.ready, "urgent": r.urgent,
                    "reserved": r.reserved, "delayed": r.delayed, "buried": r.buried,
                    "waiting": r.waiting, "paused": r.paused,
                })
            })
            .collect();
        serde_json::Value::from(array).to_string() + "\n"
    } else {
        let mut t = Table::new();
        t.row([
            "TUBE", "READY", "URGENT", "RESERVED", "DELAYED", "BURIED", "WAITING", "PAUSED",
        ]);
        for r in &rows {
            t.row([
                r.name.clone(),
                r.ready.to_string(),
                r.urgent.to_string(),
                r.reserved.to_string(),
                r.delayed.to_string(),
                r.buried.to_string(),
                r.waiting.to_string(),
                r.paused.to_string(),
            ]);
        }
        t.to_string()
    };
    print(text.as_bytes())
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
    let mut conn = args.server.connect()?;
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
    let mut conn = args.server.connect()?;
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

/// Runs `taskq kick-job`: each buried or delayed job back to ready.
pub fn kick_job(args: JobsArgs) -> CliResult {
    each_job(
        args,
        "kicked",
        "not found, or neither buried nor delayed",
        |id| Command::KickJob { id },
    )
}

/// Runs `taskq delete`.
pub fn delete(args: JobsArgs) -> CliResult {
    each_job(
        args,
        "deleted",
        "not found, or reserved by another connection",
        |id| Command::Delete { id },
    )
}

/// Sends `cmd(id)` for each id, printing `DONE ID` for each success; any
/// failure is reported on stderr and makes the command fail at the end.
fn each_job(
    args: JobsArgs,
    done: &str,
    missing: &str,
    cmd: impl Fn(u64) -> Command<'static>,
) -> CliResult {
    let mut conn = args.server.connect()?;
    let mut failed = 0;
    let mut out = String::new();
    for &id in &args.ids {
        let c = cmd(id);
        let ok = request(&mut conn, &c, |r| match r {
            Reply::KickedJob | Reply::Deleted => Ok(true),
            Reply::NotFound => Ok(false),
            other => Err(unexpected(&c, &other)),
        })?;
        if ok {
            out += &format!("{done} {id}\n");
        } else {
            eprintln!("taskq: job {id}: {missing}");
            failed += 1;
        }
    }
    print(out.as_bytes())?;
    if failed > 0 {
        return Err(format!("{failed} of {} jobs not {done}", args.ids.len()).into());
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
