//! `taskq put`: jobs from arguments or standard input, sent in pipelined
//! batches, one id printed per job in input order.

use std::ffi::OsString;
use std::io::{self, BufRead, BufWriter, IsTerminal, Write};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use taskq_producer::{Outcome, Producer, PutOptions};

use crate::CliResult;

/// Jobs from standard input gathered into one write.
const STDIN_BATCH: usize = 256;
/// Jobs after which a terminal gets a progress display.
const LARGE_INPUT: u64 = 10_000;

/// Arguments of `taskq put`.
#[derive(clap::Args, Debug)]
pub struct PutArgs {
    /// Server address.
    #[arg(long, env = "TASKQ_ADDR", default_value = "127.0.0.1:11300")]
    pub addr: String,
    /// Limit on connecting and on each reply, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
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
    /// Largest body sent; a larger one is refused before anything is sent.
    #[arg(long, value_name = "BYTES", default_value_t = taskq_proto::DEFAULT_MAX_JOB_SIZE)]
    pub max_job_size: usize,
    /// Job bodies; with none, each line of standard input is a job (its LF, and a CR before it, removed).
    #[arg(value_name = "BODY")]
    pub bodies: Vec<OsString>,
}

/// A producer configured from the common command-line settings.
pub(crate) fn connect(
    addr: &str,
    io_timeout_ms: u64,
    max_job_size: usize,
) -> Result<Producer, String> {
    let t = Duration::from_millis(io_timeout_ms.max(1));
    Producer::builder()
        .connect_timeout(t)
        .io_timeout(t)
        .max_job_size(max_job_size)
        .connect(addr)
        .map_err(|e| format!("{addr}: {e}"))
}

/// Runs `taskq put`.
pub fn run(args: PutArgs) -> CliResult {
    let mut p = connect(&args.addr, args.io_timeout, args.max_job_size)?;
    p.use_tube(&args.tube)
        .map_err(|e| format!("use {}: {e}", args.tube))?;
    let opts = PutOptions {
        pri: args.pri,
        delay: args.delay,
        ttr: args.ttr,
    };
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let mut sender = Sender {
        p,
        opts,
        position: args.position,
        done: 0,
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
    // Print what was queued even when a later job failed.
    let flushed = out.flush().map_err(|e| format!("writing ids: {e}"));
    result?;
    flushed?;
    Ok(())
}

struct Sender {
    p: Producer,
    opts: PutOptions,
    position: bool,
    done: u64,
    progress: Option<ProgressBar>,
}

impl Sender {
    fn send_stdin(&mut self, sep: u8, out: &mut impl Write) -> Result<(), String> {
        let stdin = io::stdin();
        let mut input = stdin.lock();
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
            if batch.len() == STDIN_BATCH {
                self.send(&batch, out)?;
                batch.clear();
            }
        }
        self.send(&batch, out)
    }

    /// Sends the jobs (pipelined, unless positions are wanted) and prints their ids.
    fn send(&mut self, bodies: &[Vec<u8>], out: &mut impl Write) -> Result<(), String> {
        let write_err = |e: io::Error| format!("writing ids: {e}");
        if self.position {
            for (i, body) in bodies.iter().enumerate() {
                let pos = self
                    .p
                    .put_with_position(body, self.opts)
                    .map_err(|e| format!("job {}: {e}", self.done + i as u64 + 1))?;
                match pos.ahead() {
                    Some(a) => writeln!(out, "{} {a}", pos.id),
                    None => writeln!(out, "{} ?", pos.id),
                }
                .map_err(write_err)?;
            }
        } else if !bodies.is_empty() {
            let mut outcomes = vec![Outcome::NotSent; bodies.len()];
            let result = self.p.put_batch(bodies, self.opts, &mut outcomes);
            // Ids in input order up to the first job that was not inserted.
            let ok = outcomes
                .iter()
                .take_while(|o| matches!(o, Outcome::Inserted(_)))
                .count();
            for o in &outcomes[..ok] {
                writeln!(out, "{}", o.id().expect("inserted")).map_err(write_err)?;
            }
            if ok < bodies.len() {
                let job = self.done + ok as u64 + 1;
                let why = match (&result, outcomes[ok]) {
                    (_, Outcome::Rejected(r)) => format!("rejected by the server: {r}"),
                    (Err(e), _) => e.error.to_string(),
                    (Ok(_), o) => format!("{o:?}"),
                };
                let later: Vec<String> = outcomes[ok + 1..]
                    .iter()
                    .filter_map(|o| o.id().map(|id| id.to_string()))
                    .collect();
                let mut msg = format!(
                    "job {job}: {why}; the {} job(s) before it are queued",
                    self.done + ok as u64
                );
                if !later.is_empty() {
                    msg += &format!(
                        ", and so are later jobs of its batch as ids {}",
                        later.join(",")
                    );
                }
                return Err(msg);
            }
        }
        self.done += bodies.len() as u64;
        self.tick();
        Ok(())
    }

    fn tick(&mut self) {
        if self.done < LARGE_INPUT || !io::stderr().is_terminal() {
            return;
        }
        let pb = self.progress.get_or_insert_with(|| {
            let pb = ProgressBar::new_spinner();
            if let Ok(style) =
                ProgressStyle::with_template("{spinner} {pos} jobs queued ({per_sec})")
            {
                pb.set_style(style);
            }
            pb.enable_steady_tick(Duration::from_millis(200));
            pb
        });
        pb.set_position(self.done);
    }
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
