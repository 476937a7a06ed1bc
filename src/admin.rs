//! Operators' commands on one server: `tubes`, `peek`, `kick`, `kick-job`,
//! `delete` and `pause`, each one or a few requests on one connection.

use taskq_worker::table::Table;

use crate::cli::CliResult;
use crate::jobs::{self, JobView, Which};
use crate::server::{print, ServerArgs};
use crate::snapshot::{self, Scope, Tube};

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
    let s = snapshot::read(
        &mut args.server.open()?,
        Scope {
            tubes: None,
            ready_age: false,
        },
    )?;
    let rows: Vec<Listing> = s.tubes.iter().map(listing).collect();
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
            .map_or_else(|| listing(&Tube::default()), Clone::clone);
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

/// A tube's listing: beanstalkd's keys; on JetStream (no priorities there,
/// so urgent is 0; delayed counts the schedules the server holds for the
/// tube, and is null on a stream without message schedules, where delayed
/// jobs count as ready; paused is the consumer's pause) then the consumer's
/// own.
fn listing(t: &Tube) -> Listing {
    let mut row = vec![
        ("name", t.name.clone().into()),
        ("ready", t.jobs.ready.into()),
        ("urgent", t.jobs.urgent.into()),
        ("reserved", t.jobs.reserved.into()),
        ("delayed", t.jobs.delayed.into()),
        ("buried", t.jobs.buried.into()),
        ("waiting", t.jobs.waiting.into()),
        ("paused", t.paused.into()),
    ];
    if let Some(n) = &t.nats {
        let c = n.consumer.as_ref();
        row.extend([
            ("redelivered", c.map(|c| c.redelivered).into()),
            ("stored", n.stored.into()),
            ("consumer", c.map(|c| c.name.clone()).into()),
        ]);
    }
    row
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
    let which = if args.which.ready {
        Which::Ready
    } else if args.which.delayed {
        Which::Delayed
    } else {
        Which::Buried
    };
    let mut conn = args.server.open()?;
    let Some(job) = jobs::peek(&mut conn, &args.tube, which)? else {
        return Err(format!("no {} job in tube {}", which.name(), args.tube).into());
    };
    if args.raw {
        return print(&job.body);
    }
    print(job_table(&job).as_bytes())
}

/// A job as `taskq peek` prints it: id, the server's figures, headers, bytes, body.
fn job_table(job: &JobView) -> String {
    let mut t = Table::new().left(1);
    t.row(["id".to_string(), job.id.to_string()]);
    for (k, v) in &job.details {
        t.row([k.clone(), v.clone()]);
    }
    for h in &job.headers {
        t.row(["header".to_string(), escape(h)]);
    }
    t.row(["bytes".to_string(), job.body.len().to_string()]);
    t.row(["body".to_string(), escape(&job.body)]);
    t.to_string()
}

/// The body as a quoted string safe to print on a terminal: valid UTF-8 kept,
/// control characters, quotes and backslashes escaped, other bytes as `\xNN`.
pub fn escape(body: &[u8]) -> String {
    let mut s = String::with_capacity(body.len() + 2);
    s.push('"');
    taskq_proto::push_printable(&mut s, body, true, usize::MAX);
    s.push('"');
    s
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

/// Runs `taskq kick`: buried jobs first, else (beanstalkd) delayed ones, back to ready.
pub fn kick(args: KickArgs) -> CliResult {
    args.server.check_tube(&args.tube)?;
    let mut conn = args.server.open()?;
    let n = jobs::kick(&mut conn, &args.tube, args.count.unwrap_or(u32::MAX))?;
    if n == 0 {
        let what = match jobs::engine(&conn) {
            taskq_connect::Engine::Beanstalkd => "no buried or delayed job to kick",
            taskq_connect::Engine::Nats => {
                return Err(format!(
                "no buried job to kick in tube {} (on JetStream a delayed job waits for its time)",
                args.tube
            )
                .into())
            }
        };
        return Err(format!("{what} in tube {}", args.tube).into());
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
    let mut conn = args.server.open()?;
    each_job(&args.ids, "kicked", |id| jobs::kick_job(&mut conn, id))
}

/// Runs `taskq delete`. On JetStream a job's id is its stream sequence;
/// only messages of taskq's layout (`taskq.T`, `taskq.T.buried`,
/// `taskq.T.delayed.>`: deleting a schedule cancels its delayed job) are deleted.
pub fn delete(args: JobsArgs) -> CliResult {
    let mut conn = args.server.open()?;
    each_job(&args.ids, "deleted", |id| jobs::delete(&mut conn, id))
}

/// Acts on each id, printing `DONE ID` for each success; a job the action
/// did not apply to (`Ok(Err(why))`) is reported on stderr and makes the
/// command fail at the end; an `Err` stops at once, after printing the jobs
/// already acted on (they are done on the server: left out, the output
/// would contradict its record).
fn each_job(
    ids: &[u64],
    done: &str,
    mut act: impl FnMut(u64) -> Result<Result<(), String>, String>,
) -> CliResult {
    let mut failed = 0;
    let mut out = String::new();
    for &id in ids {
        match act(id) {
            Ok(Ok(())) => out += &format!("{done} {id}\n"),
            Ok(Err(why)) => {
                eprintln!("taskq: job {id}: {why}");
                failed += 1;
            }
            Err(e) => {
                print(out.as_bytes())?;
                return Err(e.into());
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
    /// JetStream: the ack wait (every job's lease) of the tube's consumer
    /// if this command creates it, as taskq-worker's --ack-wait (default:
    /// the worker's, 60 s); an existing consumer keeps its own.
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    ack_wait: Option<u64>,
}

/// Runs `taskq pause`: on JetStream, through the tube's consumer (nats-server
/// 2.11+), created paused when no worker has made it yet.
pub fn pause(args: PauseArgs) -> CliResult {
    args.server.check_tube(&args.tube)?;
    let mut conn = args.server.open()?;
    let ack_wait = args.ack_wait.map(std::time::Duration::from_secs);
    jobs::pause(&mut conn, &args.tube, args.secs, ack_wait)?;
    let text = if args.secs == 0 {
        format!("resumed {}\n", args.tube)
    } else {
        format!("paused {} for {} s\n", args.tube, args.secs)
    };
    print(text.as_bytes())
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
