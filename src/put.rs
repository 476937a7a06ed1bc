//! `taskq put`: jobs from arguments or standard input, sent in pipelined
//! batches, one id printed per acknowledged job in input order. A broken
//! connection is replaced (the producer's reconnect and backoff) and the jobs
//! not yet sent go on; every job's fate is accounted for in the summary line.

use std::ffi::OsString;
use std::fmt;
use std::io::{self, BufRead, BufWriter, IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use taskq_connect::redact_address;
use taskq_producer::{Error, Producer, PutOptions, PutOutcome, Rejection};

use crate::jetstream::CreateArgs;

/// Jobs from standard input gathered into one write.
const STDIN_BATCH: usize = 256;
/// Jobs after which a terminal gets a progress display.
const LARGE_INPUT: u64 = 10_000;

/// What `taskq put --help` says about the exit status.
pub const EXIT_STATUS_HELP: &str = "\
Standard output: one id per acknowledged job, in input order (\"ID AHEAD\" with --position).
Standard error: every job not acknowledged, by input position (1-based), and at the end one line
  taskq put: acknowledged A, rejected R, unknown U, not sent S (positions)

A broken connection is reopened and the jobs not yet sent go on; a job whose outcome is unknown
(sent, no reply) is never sent again unless --at-least-once. After --retry-for seconds without a
reply the rest of the input is read and counted as not sent. The first connection is not retried,
except on JetStream while a server that answered breaks the connection, does not reply, or has no
leader (an election): then it is tried again, with backoff, for up to --retry-for seconds.

Exit status:
  0  every job was acknowledged
  3  some outcomes are unknown (those jobs may be queued)
  4  none is unknown, but some jobs were rejected or not sent
  2  usage error
  1  error before any job was sent (server unreachable, bad tube name)
An error after some jobs were sent (the ids cannot be written, the input cannot be read) ends the
command with 3 or 4 as above: the rest of the input is not sent.";

/// Arguments of `taskq put`.
#[derive(clap::Args, Debug)]
pub struct PutArgs {
    /// Server address.
    #[arg(long, env = "TASKQ_ADDR", default_value = "127.0.0.1:11300")]
    pub addr: String,
    /// Limit on connecting and on each reply, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = crate::server::IO_TIMEOUT_MS)]
    pub io_timeout: u64,
    /// Tube to put the jobs into.
    #[arg(long, default_value = "default")]
    pub tube: String,
    /// Priority: 0 is most urgent; below 1024 counts as urgent.
    #[arg(long, default_value_t = 1024)]
    pub pri: u32,
    /// Seconds before a job becomes ready.
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub delay: u32,
    /// Seconds a worker may hold a job before it goes back to ready.
    #[arg(long, value_name = "S", default_value_t = 60)]
    pub ttr: u32,
    /// Standard input holds NUL-terminated bodies (as `find -print0` writes), so
    /// a body may hold any other byte; an empty item between two NULs is an
    /// empty job, a trailing NUL adds none.
    #[arg(long, short = '0')]
    pub null: bool,
    /// Also print how many ready jobs are ahead of each job: "ID AHEAD" per line.
    #[arg(long)]
    pub position: bool,
    /// Largest body sent; a larger one is not sent (and counted so), the others go on.
    #[arg(long, value_name = "BYTES", default_value_t = taskq_proto::DEFAULT_MAX_JOB_SIZE)]
    pub max_job_size: usize,
    /// After a broken connection, keep reconnecting for this many seconds without
    /// a reply before giving up on the rest. On JetStream a put whose PubAck did
    /// not come is sent again with its message id for as long (stored once),
    /// and so is the first connection and the stream's lookup during an election.
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    pub retry_for: u64,
    /// Send jobs whose outcome is unknown again after reconnecting (a job may
    /// then be queued twice); by default they are only reported.
    #[arg(long)]
    pub at_least_once: bool,
    /// JetStream: never change an existing stream. On nats-server 2.12 and
    /// later a delayed job is held by the server (a message schedule) on a
    /// stream that allows message schedules: a stream taskq creates does, and
    /// an existing one without them is updated to allow them (the server
    /// cannot undo that). With this flag such a stream is left as it is, and
    /// delayed jobs are held by the client (a worker handed one early gives
    /// it back), as on older servers.
    #[arg(long)]
    pub keep_stream_config: bool,
    #[command(flatten)]
    pub js: CreateArgs,
    /// Job bodies; with none, each line of standard input is a job (its LF, and a CR before it, removed).
    #[arg(value_name = "BODY")]
    pub bodies: Vec<OsString>,
}

/// A producer configured from the common command-line settings. On
/// JetStream `resolve_for` bounds how long a put whose PubAck did not come
/// is sent again with its message id (stored once however often it arrives).
pub(crate) fn connect(
    addr: &str,
    io_timeout_ms: u64,
    max_job_size: usize,
    js: &CreateArgs,
    resolve_for: Option<Duration>,
    keep_stream_config: bool,
) -> Result<Producer, String> {
    let t = Duration::from_millis(io_timeout_ms.max(1));
    let mut b = js
        .producer(Producer::builder(), addr)
        .keep_stream_config(keep_stream_config)
        .connect_timeout(t)
        .io_timeout(t)
        .max_job_size(max_job_size);
    if let Some(d) = resolve_for {
        b = b.resolve_for(d);
    }
    b.connect(addr)
        .map_err(|e| format!("{}: {e}", redact_address(addr)))
}

/// Runs `taskq put`; the exit status follows [`EXIT_STATUS_HELP`].
pub fn run(args: PutArgs) -> ExitCode {
    let fail = |e: String| {
        eprintln!("taskq: {e}");
        ExitCode::FAILURE
    };
    let nats = crate::jetstream::is_nats(&args.addr);
    if nats {
        // Refused before the stream is even looked up.
        if let Err(e) = crate::jetstream::check_tube(&args.tube) {
            return fail(format!("use {}: {e}", args.tube));
        }
    }
    let retry_for = Duration::from_secs(args.retry_for);
    let connected = connect(
        &args.addr,
        args.io_timeout,
        args.max_job_size,
        &args.js,
        Some(retry_for),
        args.keep_stream_config,
    );
    let mut p = match connected {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    match p.use_tube(&args.tube) {
        Ok(()) => {}
        Err(e @ taskq_producer::Error::Invalid(_)) => {
            return fail(format!("use {}: {e}", args.tube));
        }
        // The connection broke under the `use`: the producer keeps the tube and
        // issues it again on the reconnect that the first job makes.
        Err(e) => eprintln!("taskq put: use {}: {e}; reconnecting", args.tube),
    }
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let mut sender = Sender {
        p,
        opts: PutOptions {
            pri: args.pri,
            delay: args.delay,
            ttr: args.ttr,
        },
        position: args.position,
        at_least_once: args.at_least_once,
        retry_for,
        outage_from_attempt: nats,
        max_job_size: args.max_job_size,
        gave_up: false,
        tally: Tally::default(),
        progress: None,
    };
    let result = if args.bodies.is_empty() {
        sender.send_stdin(if args.null { b'\0' } else { b'\n' }, &mut out)
    } else {
        let bodies: Vec<Vec<u8>> = args.bodies.into_iter().map(os_bytes).collect();
        sender.send(&bodies, &mut out)
    };
    if let Some(pb) = &sender.progress {
        pb.finish_and_clear();
    }
    let flushed = out.flush().map_err(|e| format!("writing ids: {e}"));
    let tally = &sender.tally;
    eprintln!("taskq put: {tally}");
    if let Err(e) = result.and(flushed) {
        eprintln!("taskq: {e}");
        return ExitCode::from(tally.status_after_error());
    }
    ExitCode::from(tally.status())
}

/// What became of one job of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Not sent yet: sent on the next attempt.
    Pending,
    /// Sent and no reply came.
    Unsure,
    /// Acknowledged with this id (and, with `--position`, the jobs ahead).
    Acked(u64, Option<Option<u64>>),
    /// The server rejected it: nothing queued.
    Rejected,
    /// Given up on without sending.
    NotSent,
}

/// Input positions (1-based) as runs of consecutive numbers.
#[derive(Debug, Default)]
pub(crate) struct Positions {
    runs: Vec<(u64, u64)>,
    count: u64,
}

impl Positions {
    /// Adds `n`, which is larger than every position already added.
    pub(crate) fn push(&mut self, n: u64) {
        self.count += 1;
        match self.runs.last_mut() {
            Some((_, end)) if *end + 1 == n => *end = n,
            _ => self.runs.push((n, n)),
        }
    }

    /// How many positions.
    pub(crate) fn count(&self) -> u64 {
        self.count
    }
}

impl fmt::Display for Positions {
    /// `job 7` or `jobs 3, 921-930`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.count == 1 { "job " } else { "jobs " })?;
        for (i, (a, b)) in self.runs.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            if a == b {
                write!(f, "{a}")?;
            } else {
                write!(f, "{a}-{b}")?;
            }
        }
        Ok(())
    }
}

/// The count of every outcome, and where each job that was not acknowledged stands in the input.
#[derive(Debug, Default)]
struct Tally {
    acknowledged: u64,
    rejected: Positions,
    unknown: Positions,
    not_sent: Positions,
}

impl Tally {
    fn jobs(&self) -> u64 {
        self.acknowledged + self.rejected.count() + self.unknown.count() + self.not_sent.count()
    }

    /// The exit status when an error stopped the command (the ids could
    /// not be written, the input could not be read, the first connection
    /// failed): 1 only while no job was sent, which a caller may take for
    /// "try it all again"; once some were, 3 when some outcomes are
    /// unknown, else 4 (the rest of the input was not sent).
    fn status_after_error(&self) -> u8 {
        match self.status() {
            _ if self.jobs() == 0 => 1,
            3 => 3,
            _ => 4,
        }
    }

    /// The exit status: 0 all acknowledged, 3 some unknown, 4 some rejected or not sent.
    fn status(&self) -> u8 {
        if self.unknown.count() > 0 {
            3
        } else if self.rejected.count() + self.not_sent.count() > 0 {
            4
        } else {
            0
        }
    }
}

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "acknowledged {}, rejected {}, unknown {}, not sent {}",
            self.acknowledged,
            self.rejected.count(),
            self.unknown.count(),
            self.not_sent.count()
        )?;
        let parts: Vec<String> = [
            ("rejected", &self.rejected),
            ("unknown", &self.unknown),
            ("not sent", &self.not_sent),
        ]
        .iter()
        .filter(|(_, p)| p.count() > 0)
        .map(|(what, p)| format!("{what}: {p}"))
        .collect();
        if !parts.is_empty() {
            write!(f, " ({})", parts.join("; "))?;
        }
        Ok(())
    }
}

struct Sender {
    p: Producer,
    opts: PutOptions,
    position: bool,
    at_least_once: bool,
    retry_for: Duration,
    /// JetStream: an attempt that fails has already re-sent for up to
    /// `retry_for` (the producer's `resolve_for`), so an outage is counted
    /// from the start of the attempt, not from its failure.
    outage_from_attempt: bool,
    max_job_size: usize,
    /// The server stayed out of reach for `retry_for`: nothing more is sent.
    gave_up: bool,
    tally: Tally,
    progress: Option<ProgressBar>,
}

impl Sender {
    fn send_stdin(&mut self, sep: u8, out: &mut impl Write) -> Result<(), String> {
        // Our own buffer, so that we can tell when the input read so far is used
        // up: a stream of lines goes out as it comes, not a full batch later.
        let mut input = io::BufReader::with_capacity(1 << 16, io::stdin().lock());
        let mut batch: Vec<Vec<u8>> = Vec::with_capacity(STDIN_BATCH);
        loop {
            let mut item = Vec::new();
            let n = input
                .read_until(sep, &mut item)
                .map_err(|e| format!("reading standard input: {e}"))?;
            if n == 0 {
                break;
            }
            if item.last() == Some(&sep) {
                item.pop();
                if sep == b'\n' && item.last() == Some(&b'\r') {
                    item.pop();
                }
            }
            batch.push(item);
            if batch.len() == STDIN_BATCH || input.buffer().is_empty() {
                self.send(&batch, out)?;
                batch.clear();
            }
        }
        self.send(&batch, out)
    }

    /// Sends the jobs until each is acknowledged, rejected, unknown or given up
    /// on, then prints the acknowledged ids in input order and tallies the rest.
    fn send(&mut self, bodies: &[Vec<u8>], out: &mut impl Write) -> Result<(), String> {
        let first = self.tally.jobs() + 1;
        let mut fate = vec![Fate::Pending; bodies.len()];
        for (i, b) in bodies.iter().enumerate() {
            if b.len() > self.max_job_size {
                eprintln!(
                    "taskq put: job {}: {} bytes is over --max-job-size {}; not sent",
                    first + i as u64,
                    b.len(),
                    self.max_job_size
                );
                fate[i] = Fate::NotSent;
            }
        }
        let mut outage: Option<Instant> = None;
        loop {
            let todo: Vec<usize> = (0..bodies.len())
                .filter(|&i| match fate[i] {
                    Fate::Pending => true,
                    Fate::Unsure => self.at_least_once,
                    _ => false,
                })
                .collect();
            if todo.is_empty() {
                break;
            }
            if self.gave_up {
                for &i in &todo {
                    if fate[i] == Fate::Pending {
                        fate[i] = Fate::NotSent;
                    }
                }
                break;
            }
            let attempt = Instant::now();
            let (replies, err) = if self.position {
                self.attempt_each(bodies, &todo, &mut fate, first)
            } else {
                self.attempt_batch(bodies, &todo, &mut fate, first)
            };
            let Some(err) = err else {
                continue;
            };
            if replies > 0 {
                outage = None;
            }
            let since = *outage.get_or_insert_with(|| {
                if self.outage_from_attempt {
                    attempt
                } else {
                    Instant::now()
                }
            });
            let unsure: Positions = positions(&todo, &fate, first, Fate::Unsure);
            let what = if unsure.count() == 0 {
                String::new()
            } else if self.at_least_once {
                format!("; {unsure}: outcome unknown, sending again")
            } else {
                format!("; {unsure}: outcome unknown, not sent again")
            };
            if err.is_invalid() {
                // Refused before sending (cannot happen for a checked body): stop here.
                eprintln!("taskq put: {}{what}", err.0);
                self.gave_up = true;
            } else if since.elapsed() >= self.retry_for {
                eprintln!(
                    "taskq put: {}{what}; no reply for {} s (--retry-for), giving up",
                    err.0,
                    self.retry_for.as_secs()
                );
                self.gave_up = true;
            } else {
                eprintln!("taskq put: {}{what}; reconnecting", err.0);
            }
        }
        // Every job of the batch is counted, whether or not its id can be
        // written: the tally (and the exit status) says what the server has.
        let mut written = Ok(());
        for (i, f) in fate.iter().enumerate() {
            let pos = first + i as u64;
            match *f {
                Fate::Acked(id, ahead) => {
                    self.tally.acknowledged += 1;
                    if written.is_ok() {
                        written = match ahead {
                            None => writeln!(out, "{id}"),
                            Some(Some(a)) => writeln!(out, "{id} {a}"),
                            Some(None) => writeln!(out, "{id} ?"),
                        };
                    }
                }
                Fate::Rejected => self.tally.rejected.push(pos),
                Fate::Unsure => self.tally.unknown.push(pos),
                Fate::NotSent | Fate::Pending => self.tally.not_sent.push(pos),
            }
        }
        // The ids of this batch reach a pipe or file now, not at the end:
        // a reader takes each job as soon as it is acknowledged.
        if written.is_ok() && fate.iter().any(|f| matches!(f, Fate::Acked(..))) {
            written = out.flush();
        }
        written.map_err(|e| format!("writing ids: {e}"))?;
        self.tick();
        Ok(())
    }

    /// One pipelined write of the jobs in `todo`; returns how many replies were
    /// read and what broke the batch off, if anything did.
    fn attempt_batch(
        &mut self,
        bodies: &[Vec<u8>],
        todo: &[usize],
        fate: &mut [Fate],
        first: u64,
    ) -> (usize, Option<Broke>) {
        let batch: Vec<&[u8]> = todo.iter().map(|&i| bodies[i].as_slice()).collect();
        let mut outcomes = vec![PutOutcome::NotSent; batch.len()];
        let result = self.p.put_batch(&batch, self.opts, &mut outcomes);
        for (k, &i) in todo.iter().enumerate() {
            fate[i] = match outcomes[k] {
                PutOutcome::Inserted(id) => Fate::Acked(id.get(), None),
                PutOutcome::Rejected(r) => rejected(first + i as u64, r, None),
                PutOutcome::Unknown => Fate::Unsure,
                // Never reached the server: still to send (or, once sent
                // before, still unknown).
                PutOutcome::NotSent => fate[i],
            };
        }
        match result {
            Ok(_) => (batch.len(), None),
            Err(e) => (e.replied, Some(Broke(e.error))),
        }
    }

    /// `--position`: one put with its tube's statistics per job, in order.
    fn attempt_each(
        &mut self,
        bodies: &[Vec<u8>],
        todo: &[usize],
        fate: &mut [Fate],
        first: u64,
    ) -> (usize, Option<Broke>) {
        for (k, &i) in todo.iter().enumerate() {
            match self.p.put_with_position(&bodies[i], self.opts) {
                Ok(pos) => fate[i] = Fate::Acked(pos.id.get(), Some(pos.ahead())),
                Err(Error::Rejected(r)) => fate[i] = rejected(first + i as u64, r, Some(None)),
                Err(e) => {
                    if e.outcome_unknown() {
                        fate[i] = Fate::Unsure;
                    }
                    return (k, Some(Broke(e)));
                }
            }
        }
        (todo.len(), None)
    }

    fn tick(&mut self) {
        let done = self.tally.jobs();
        if done < LARGE_INPUT || !io::stderr().is_terminal() {
            return;
        }
        let pb = self.progress.get_or_insert_with(|| {
            let pb = ProgressBar::new_spinner();
            if let Ok(style) =
                ProgressStyle::with_template("{spinner} {pos} jobs handled ({per_sec})")
            {
                pb.set_style(style);
            }
            pb.enable_steady_tick(Duration::from_millis(200));
            pb
        });
        pb.set_position(done);
    }
}

/// What broke an attempt off.
struct Broke(Error);

impl Broke {
    fn is_invalid(&self) -> bool {
        matches!(self.0, Error::Invalid(_))
    }
}

/// The fate of a rejected job: `BURIED <id>` is in the queue (acknowledged,
/// with a note); every other rejection queued nothing.
fn rejected(pos: u64, r: Rejection, ahead: Option<Option<u64>>) -> Fate {
    match r {
        Rejection::InsertedBuried { id } => {
            eprintln!("taskq put: job {pos}: {r}");
            Fate::Acked(id.get(), ahead)
        }
        _ => {
            eprintln!("taskq put: job {pos}: rejected by the server: {r}");
            Fate::Rejected
        }
    }
}

/// The input positions of the jobs of `todo` whose fate is `which`.
fn positions(todo: &[usize], fate: &[Fate], first: u64, which: Fate) -> Positions {
    let mut p = Positions::default();
    for &i in todo {
        if fate[i] == which {
            p.push(first + i as u64);
        }
    }
    p
}

#[cfg(unix)]
fn os_bytes(s: OsString) -> Vec<u8> {
    use std::os::unix::ffi::OsStringExt;
    s.into_vec()
}

#[cfg(not(unix))]
fn os_bytes(s: OsString) -> Vec<u8> {
    s.to_string_lossy().into_owned().into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_print_as_runs_and_the_summary_names_them() {
        let mut p = Positions::default();
        for n in [3, 921, 922, 923, 930] {
            p.push(n);
        }
        assert_eq!(p.to_string(), "jobs 3, 921-923, 930");
        let mut t = Tally {
            acknowledged: 5,
            ..Tally::default()
        };
        assert_eq!(
            t.to_string(),
            "acknowledged 5, rejected 0, unknown 0, not sent 0"
        );
        assert_eq!(t.status(), 0);
        t.not_sent.push(7);
        assert_eq!(t.status(), 4);
        t.unknown = p;
        assert_eq!(t.status(), 3);
        assert_eq!(
            t.to_string(),
            "acknowledged 5, rejected 0, unknown 5, not sent 1 \
             (unknown: jobs 3, 921-923, 930; not sent: job 7)"
        );
        assert_eq!(t.jobs(), 11);
    }

    #[test]
    fn an_error_after_jobs_were_sent_never_exits_as_nothing_sent() {
        let mut t = Tally::default();
        assert_eq!(t.status_after_error(), 1, "nothing sent yet");
        t.acknowledged = 2;
        assert_eq!(t.status_after_error(), 4, "the rest of the input not sent");
        t.unknown.push(3);
        assert_eq!(t.status_after_error(), 3, "some may be queued");
    }
}
