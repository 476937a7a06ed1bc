//! `taskq-worker`: runs a command for each job of a beanstalkd-protocol
//! queue or a NATS JetStream cluster (a `nats://` or `tls://` address).

use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use signal_hook::consts::{SIGINT, SIGTERM};
use taskq_worker::command::{resolve_program, CommandHandler};
use taskq_worker::{Config, Snapshot, Worker};

/// Runs COMMAND for each job, with the job body on its standard input and
/// TASKQ_JOB_ID and TASKQ_ADDR in its environment. Exit 0 deletes the job,
/// 75 releases it for later, anything else is a failed attempt.
// No `Debug`: its addresses may carry a password.
#[derive(Parser)]
#[command(name = "taskq-worker", version, about)]
struct Args {
    /// Server address (repeat for several beanstalkd servers), or one
    /// `nats://HOST:PORT[,HOST:PORT...]` JetStream cluster; defaults to
    /// $TASKQ_ADDR (beanstalkd servers separated by commas, or one nats://
    /// cluster), then 127.0.0.1:11300.
    #[arg(long = "addr", value_name = "HOST:PORT")]
    addrs: Vec<String>,
    #[command(flatten)]
    nats: taskq_worker::nats_cli::NatsArgs,
    /// JetStream: the stream (capturing `<name in lower case>.>`).
    #[arg(long, value_name = "NAME", default_value = taskq_connect::DEFAULT_STREAM)]
    stream: String,
    /// JetStream: replicas of the stream if the worker creates it (default:
    /// 3 on a cluster of 3 or more nodes, else 1).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=5))]
    replicas: Option<u64>,
    /// JetStream: the ack wait (every job's lease, the TTR) of a tube's
    /// consumer if the worker creates it; an existing consumer keeps its own.
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    ack_wait: f64,
    /// Tube to watch (repeat for several). NAME:WEIGHT weights the tubes:
    /// `--tube vip:4 --tube standard:1` takes about four vip jobs per standard
    /// one while both have jobs ready; plain names keep the server's strict order.
    #[arg(long = "tube", value_name = "NAME[:WEIGHT]", default_value = "default")]
    tubes: Vec<String>,
    /// Jobs run at once (threads), per server, on one connection to it.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
    concurrency: u32,
    /// Jobs the connection holds at once, those running included (at least
    /// --concurrency): more reserves jobs ahead of the commands (fast for short jobs; a crash
    /// leaves up to K jobs invisible for their TTR, so keep it small for long
    /// or uneven jobs).
    #[arg(long, value_name = "K", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    prefetch: u32,
    /// Server-side wait of each reserve, seconds.
    #[arg(long, value_name = "SECS", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    reserve_timeout: u32,
    /// Limit on each reply beyond the server's wait, milliseconds.
    #[arg(long, value_name = "MS", default_value_t = taskq_proto::defaults::IO_TIMEOUT.as_millis() as u64, value_parser = clap::value_parser!(u64).range(1..))]
    io_timeout: u64,
    /// Failed attempts after which a job is buried.
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    max_attempts: u32,
    /// Kill the command after this long and count a failed attempt.
    #[arg(long, value_name = "SECS")]
    job_timeout: Option<f64>,
    /// Exit 0 once no job was reserved for this long (on JetStream, and
    /// nothing is pending or awaiting acknowledgment on the tubes' consumers).
    #[arg(long, value_name = "SECS")]
    exit_when_idle: Option<f64>,
    /// Exit 0 once this many jobs were deleted.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max_jobs: Option<u64>,
    /// Write the counters as one flat JSON object to PATH on exit.
    #[arg(long, value_name = "PATH")]
    stats_json: Option<std::path::PathBuf>,
    /// Print the counters at exit as one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Serve the counters in the Prometheus text format over HTTP at HOST:PORT.
    #[arg(long, value_name = "HOST:PORT")]
    metrics_addr: Option<String>,
    /// The command to run for each job, and its arguments.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

fn seconds(flag: &str, v: Option<f64>) -> Result<Option<Duration>, String> {
    match v {
        None => Ok(None),
        Some(s) if s.is_finite() && s > 0.0 && s < 1e9 => Ok(Some(Duration::from_secs_f64(s))),
        Some(s) => Err(format!(
            "{flag} must be a positive number of seconds, not {s}"
        )),
    }
}

fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(warning) = taskq_worker::nats_cli::secrets_on_argv(&argv) {
        eprintln!("taskq-worker: warning: {warning}");
    }
    let args = match Args::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        // Colour only on a terminal: logs in a file or a pipe stay plain text.
        .with_ansi(use_colour())
        .init();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("taskq-worker: {msg}");
            ExitCode::from(2)
        }
    }
}

/// True when standard error is a terminal and `NO_COLOR` is not set.
fn use_colour() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

fn run(args: Args) -> Result<(), String> {
    let (program, rest) = args.command.split_first().ok_or("no command given")?;
    if resolve_program(Path::new(program)).is_none() {
        return Err(format!(
            "cannot run {}: not found or not executable",
            program.to_string_lossy()
        ));
    }
    let (access, context_url) = args.nats.from_env()?;
    let servers = if args.addrs.is_empty() {
        match std::env::var("TASKQ_ADDR") {
            // One JetStream cluster (its seeds are comma-separated), or
            // beanstalkd servers separated by commas. An address with user
            // info is kept whole even when it does not parse (a comma in
            // its password): cut at the comma, a piece of the password
            // would be shown as an address in the error.
            Ok(a)
                if a.contains('@')
                    || taskq_connect::Address::parse(&a).is_ok_and(|a| a.is_nats()) =>
            {
                vec![a.trim().to_owned()]
            }
            Ok(a) if !a.trim().is_empty() => a.split(',').map(|s| s.trim().to_owned()).collect(),
            // A `nats` CLI context's servers, as `nats --context` uses them.
            _ => match context_url {
                Some(url) => vec![taskq_worker::nats_cli::context_address(&url)],
                None => vec!["127.0.0.1:11300".to_owned()],
            },
        }
    } else {
        args.addrs
    };
    let job_timeout = seconds("--job-timeout", args.job_timeout)?;
    let mut cfg = Config {
        servers,
        concurrency: args.concurrency as usize,
        reserve_timeout: Duration::from_secs(u64::from(args.reserve_timeout)),
        io_timeout: Duration::from_millis(args.io_timeout),
        max_attempts: args.max_attempts,
        exit_when_idle: seconds("--exit-when-idle", args.exit_when_idle)?,
        max_jobs: args.max_jobs,
        prefetch: args.prefetch as usize,
        jetstream: taskq_worker::JetStreamConfig {
            stream: args.stream.clone(),
            replicas: args.replicas.map(|n| n as usize),
            ack_wait: seconds("--ack-wait", Some(args.ack_wait))?
                .unwrap_or(Duration::from_secs(60)),
            access,
        },
        // Any job the server accepts must be readable, or it would come back
        // forever: allow beanstalkd's own ceiling. The buffer grows only when a
        // job that large arrives.
        limits: taskq_proto::Limits {
            max_job_size: 1 << 30,
            ..taskq_proto::Limits::default()
        },
        ..Config::default()
    };
    cfg.set_tubes(&args.tubes).map_err(|e| e.to_string())?;
    let handler = CommandHandler::new(program.clone(), rest.to_vec(), job_timeout);
    let worker = Worker::new(cfg, handler).map_err(|e| e.to_string())?;
    let control = worker.control();
    let metrics = match &args.metrics_addr {
        Some(addr) => Some(
            taskq_worker::metrics::MetricsServer::start(addr, control.clone())
                .map_err(|e| format!("cannot serve metrics on {addr}: {e}"))?,
        ),
        None => None,
    };
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])
        .map_err(|e| format!("cannot handle signals: {e}"))?;
    std::thread::Builder::new()
        .name("taskq-worker-signals".into())
        .spawn(move || {
            for (n, _) in signals.forever().enumerate() {
                if n == 0 {
                    eprintln!("taskq-worker: stopping; running jobs finish (signal again to release them)");
                    control.shutdown();
                } else {
                    eprintln!("taskq-worker: releasing running jobs");
                    control.abort();
                }
            }
        })
        .map_err(|e| format!("cannot start the signal thread: {e}"))?;
    let counts = worker.run();
    if let Some(path) = &args.stats_json {
        std::fs::write(path, counts.to_json() + "\n")
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    drop(metrics);
    if args.json {
        eprintln!("{}", counts.to_json());
    } else {
        eprint!("{}", counts.table());
        eprintln!("{}", summary(&counts));
    }
    Ok(())
}

fn summary(c: &Snapshot) -> String {
    format!(
        "taskq-worker: done {} (reserved {}, released {}, buried {}, lost leases {}, unconfirmed deletes {}, reconnects {}, I/O timeouts {})",
        c.deleted, c.reserved, c.released, c.buried, c.lost_lease, c.ack_unknown, c.reconnects, c.io_timeouts
    )
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    #[test]
    fn the_flags_default_to_the_shared_settings() {
        let a = super::Args::parse_from(["taskq-worker", "--", "true"]);
        let io = std::time::Duration::from_millis(a.io_timeout);
        assert_eq!(io, taskq_proto::defaults::IO_TIMEOUT);
    }
}
