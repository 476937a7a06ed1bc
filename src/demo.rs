//! `taskq demo`: the whole system in one command.
//!
//! Enqueues a batch of jobs (every tenth one urgent), works them off with one
//! in-process worker running `--workers` handler threads, on a handler that
//! fails a few jobs once and runs a few past their TTR (touching them), shows
//! live progress, and ends with the worker's counts beside the server's own
//! record. It exits non-zero when the
//! two disagree, a job is lost, or the tube is not drained.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use taskq_producer::{Producer, PutOptions};
use taskq_testkit::TestServer;
use taskq_worker::{
    Backoff, Config as WorkerConfig, Job, Outcome, Snapshot as WorkerCounts, Worker,
};

use taskq_worker::table::Table;

use crate::cli::CliResult;
use crate::jetstream::{CreateArgs, Route};
use crate::server::Conn;
use crate::snapshot::{self, Scope, Snapshot};

/// Arguments of `taskq demo`.
#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Jobs to enqueue.
    #[arg(short = 'n', long = "jobs", default_value_t = 100_000)]
    pub jobs: u64,
    /// A beanstalkd (HOST:PORT) or a JetStream cluster (nats://HOST:PORT,...)
    /// to run against; without it the embedded reference server is started in
    /// this process. ($TASKQ_ADDR is deliberately not read: a demo should never
    /// pour jobs into a server nobody named.)
    #[arg(long)]
    pub addr: Option<String>,
    /// Limit on each reply, in milliseconds.
    #[arg(long, default_value_t = crate::server::IO_TIMEOUT_MS)]
    pub io_timeout: u64,
    /// Handler threads of the one in-process worker (its concurrency).
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// Producer threads, each with its own connection.
    #[arg(long, default_value_t = 2)]
    pub producers: usize,
    #[command(flatten)]
    pub js: CreateArgs,
}

/// What the handler does with job `i`: the schedule is fixed so every run, and
/// every report, can be checked against it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Plain,
    /// Fails its first attempt, then succeeds: shows up as one release.
    FailOnce,
    /// Runs past its two-second TTR, touching it: shows up as touches, never as a lost lease
    /// (a touch every 300 ms leaves 1.7 s of slack for a loaded machine).
    Slow,
}

fn kind_of(i: u64) -> Kind {
    if i % 25_000 == 13 {
        Kind::Slow
    } else if i % 1_000 == 7 {
        Kind::FailOnce
    } else {
        Kind::Plain
    }
}

fn options_of(i: u64) -> PutOptions {
    PutOptions {
        // Every tenth job is urgent (below 1024), so it goes first.
        pri: if i.is_multiple_of(10) { 0 } else { 1024 },
        delay: 0,
        ttr: if kind_of(i) == Kind::Slow { 2 } else { 60 },
    }
}

const SLOW_JOB: Duration = Duration::from_millis(2600);
const TOUCH_EVERY: Duration = Duration::from_millis(300);

fn handle(job: &mut Job<'_>) -> Outcome {
    let body = job.body();
    let i = body
        .strip_prefix(b"demo-job ")
        .and_then(|rest| std::str::from_utf8(rest).ok())
        .and_then(|s| s.parse::<u64>().ok());
    let Some(i) = i else {
        // Not ours: bury it rather than delete somebody else's work.
        return Outcome::Bury;
    };
    match kind_of(i) {
        Kind::Plain => Outcome::Done,
        Kind::FailOnce => match job.stats() {
            Ok(info) if info.releases == 0 => Outcome::Fail,
            Ok(_) => Outcome::Done,
            Err(_) => Outcome::Fail,
        },
        Kind::Slow => {
            let until = Instant::now() + SLOW_JOB;
            while Instant::now() < until {
                thread::sleep(TOUCH_EVERY);
                if job.touch().is_err() {
                    return Outcome::Fail;
                }
            }
            Outcome::Done
        }
    }
}

/// Enqueue results of one producer thread.
struct Enqueued {
    latency: Histogram<u64>,
    failed: u64,
}

/// The server the demo runs against, and its record before the run.
struct Setup {
    /// The embedded reference server, when no address was given.
    embedded: Option<TestServer>,
    addr: String,
    tube: String,
    io_timeout: Duration,
    /// A connection for the server's record.
    admin: Conn,
    /// The server's record before the run.
    before: Snapshot,
}

/// A line of the report: what, the worker's count, the server's record of
/// it (`None`: the server keeps none), and where in the record it is.
type Row = (&'static str, u64, Option<u64>, String);

/// What the run came to, on the client side.
struct Driven {
    counts: WorkerCounts,
    latency: Histogram<u64>,
    put_failed: u64,
    /// False when the run hit its time budget.
    finished: bool,
    budget: Duration,
    enqueue_done_at: Option<Duration>,
    wall: Duration,
}

/// Runs `taskq demo`: set up, drive the producers and the worker, report.
pub fn run(args: DemoArgs) -> CliResult {
    let mut setup = setup(&args)?;
    let driven = drive(&args, &setup)?;
    report(&args, &mut setup, driven)
}

/// Starts the embedded server when no address is given, picks a fresh tube,
/// and reads the server's record before the run.
fn setup(args: &DemoArgs) -> Result<Setup, Box<dyn std::error::Error + Send + Sync>> {
    if args.workers == 0 || args.producers == 0 {
        return Err("--workers and --producers must be at least 1".into());
    }
    let io_timeout = Duration::from_millis(args.io_timeout.max(1));
    let embedded = match args.addr {
        Some(_) => None,
        None => Some(
            TestServer::start().map_err(|e| format!("cannot start the reference server: {e}"))?,
        ),
    };
    let addr = match (&args.addr, &embedded) {
        (Some(a), _) => a.clone(),
        (None, Some(server)) => server.addr().to_string(),
        (None, None) => return Err("no server".into()),
    };
    if embedded.is_some() {
        eprintln!("taskq demo: reference server on {addr} (in this process)");
    }
    let tube = format!(
        "taskq-demo-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() % 1_000_000)
            .unwrap_or(0)
    );

    if let Route::Nats(_) = crate::jetstream::route(&addr)? {
        // The stream is made here, once, before the producers and the
        // worker start and each look for it.
        args.js
            .producer(Producer::builder(), addr.as_str())
            .io_timeout(io_timeout)
            .connect(addr.as_str())
            .map_err(|e| format!("cannot set the stream up on {addr}: {e}"))?;
    }
    let mut admin = crate::server::open(&addr, args.io_timeout, &args.js.stream)
        .map_err(|e| format!("cannot reach {e}"))?;
    let before = snapshot::read(&mut admin, Scope::only(&[]))?;
    Ok(Setup {
        embedded,
        addr,
        tube,
        io_timeout,
        admin,
        before,
    })
}

/// Works the jobs off with the worker while the producers put them, showing
/// progress, until every job is done (or buried) or the time budget is spent.
fn drive(
    args: &DemoArgs,
    setup: &Setup,
) -> Result<Driven, Box<dyn std::error::Error + Send + Sync>> {
    let (addr, tube, io_timeout) = (&setup.addr, &setup.tube, setup.io_timeout);
    let worker = Worker::new(
        WorkerConfig {
            servers: vec![addr.clone()],
            tubes: vec![tube.clone()],
            concurrency: args.workers,
            io_timeout,
            max_attempts: 3,
            retry_backoff: Backoff {
                initial: Duration::from_secs(1),
                max: Duration::from_secs(1),
                jitter: taskq_worker::Jitter::None,
            },
            jetstream: args.js.worker(addr.as_str()),
            ..WorkerConfig::default()
        },
        handle,
    )?;
    let control = worker.control();
    let started = Instant::now();
    let running = worker.start();

    let queued = Arc::new(AtomicU64::new(0));
    // Set when the time budget runs out: the producers put nothing more (a
    // server gone for good would otherwise keep each remaining put waiting
    // out its reconnect, long after the report).
    let out_of_time = Arc::new(AtomicBool::new(false));
    let mut producers = Vec::new();
    let builder = args
        .js
        .producer(Producer::builder(), addr.as_str())
        .io_timeout(io_timeout)
        .tube(tube);
    for p in 0..args.producers as u64 {
        let (addr, builder, queued) = (addr.clone(), builder.clone(), queued.clone());
        let out_of_time = out_of_time.clone();
        let (jobs, stride) = (args.jobs, args.producers as u64);
        producers.push(thread::spawn(move || -> Result<Enqueued, String> {
            let mut producer = builder
                .connect(addr.as_str())
                .map_err(|e| format!("producer cannot connect: {e}"))?;
            let mut latency =
                Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).map_err(|e| e.to_string())?;
            let mut failed = 0;
            let mut body = Vec::with_capacity(32);
            let mut i = p;
            while i < jobs && !out_of_time.load(Ordering::Relaxed) {
                body.clear();
                body.extend_from_slice(b"demo-job ");
                body.extend_from_slice(itoa::Buffer::new().format(i).as_bytes());
                let t = Instant::now();
                match producer.put(&body, options_of(i)) {
                    Ok(_) => {
                        latency.saturating_record(t.elapsed().as_micros() as u64);
                        queued.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        failed += 1;
                        if failed <= 3 {
                            eprintln!("taskq demo: put of job {i} failed: {e}");
                        }
                    }
                }
                i += stride;
            }
            Ok(Enqueued { latency, failed })
        }));
    }

    let tty = std::io::stderr().is_terminal();
    let mut last_print = Instant::now();
    let mut enqueue_done_at = None;
    let budget = Duration::from_secs(60 + args.jobs / 1_000);
    let finished = loop {
        thread::sleep(Duration::from_millis(100));
        let q = queued.load(Ordering::Relaxed);
        let all_put = producers.iter().all(|h| h.is_finished());
        if all_put && enqueue_done_at.is_none() {
            enqueue_done_at = Some(started.elapsed());
        }
        let c = control.counters();
        if tty || last_print.elapsed() >= Duration::from_secs(1) {
            progress(q, args.jobs, &c, started.elapsed(), tty);
            last_print = Instant::now();
        }
        if all_put && c.deleted + c.buried >= q {
            break true;
        }
        if started.elapsed() > budget {
            out_of_time.store(true, Ordering::Relaxed);
            break false;
        }
    };
    control.shutdown();
    let counts = running.join();
    let wall = started.elapsed();
    progress(
        queued.load(Ordering::Relaxed),
        args.jobs,
        &counts,
        wall,
        tty,
    );
    if tty {
        eprintln!();
    }

    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut put_failed = 0;
    for h in producers {
        let e = h.join().map_err(|_| "a producer thread panicked")??;
        latency.add(&e.latency)?;
        put_failed += e.failed;
    }
    Ok(Driven {
        counts,
        latency,
        put_failed,
        finished,
        budget,
        enqueue_done_at,
        wall,
    })
}

/// Prints the worker's counts beside the server's own record (and the ledger,
/// on the embedded server); any difference, loss or leftover is an error.
fn report(args: &DemoArgs, setup: &mut Setup, driven: Driven) -> CliResult {
    let Driven {
        counts,
        latency,
        put_failed,
        finished,
        budget,
        enqueue_done_at,
        wall,
    } = driven;
    let inserted = latency.len();
    let (rows, left) = record(setup, &counts, inserted)?;
    let (addr, tube, embedded) = (&setup.addr, &setup.tube, &setup.embedded);
    let ledger = embedded.as_ref().map(|s| s.ledger().check());

    let expect_releases = (0..args.jobs)
        .filter(|&i| kind_of(i) == Kind::FailOnce)
        .count() as u64;
    println!();
    println!(
        "taskq demo: {} jobs on {} ({}), {} workers, {} producers",
        args.jobs,
        addr,
        match (&embedded, &setup.admin) {
            (Some(_), _) => "embedded reference server".to_owned(),
            (None, Conn::Nats(js)) => format!("JetStream, stream {}", js.layout().stream()),
            (None, Conn::Beanstalkd(..)) => "external server".to_owned(),
        },
        args.workers,
        args.producers
    );
    println!();
    let mut table = Table::new().indent(2).left(3);
    table.row(["", "taskq", "server", "(server's field)"]);
    let mut mismatches = Vec::new();
    for (name, ours, theirs, field) in rows {
        let differs = theirs.is_some_and(|t| t != ours);
        let mark = if differs { "  <-- differs" } else { "" };
        table.row([
            name.to_string(),
            ours.to_string(),
            theirs.map_or_else(|| "-".to_owned(), |t| t.to_string()),
            format!("({field}){mark}"),
        ]);
        if differs {
            mismatches.push(name);
        }
    }
    for (name, n) in [
        ("reserved", counts.reserved),
        ("lost lease", counts.lost_lease),
        ("ack unknown", counts.ack_unknown),
        ("put failed", put_failed),
    ] {
        table.row([name.to_string(), n.to_string()]);
    }
    table.row([
        "left in tube".to_string(),
        left.total().to_string(),
        String::new(),
        format!(
            "(ready {}, reserved {}, delayed {}, buried {})",
            left.ready, left.reserved, left.delayed, left.buried
        ),
    ]);
    print!("{table}");
    let lost = match &ledger {
        Some(r) => {
            println!(
                "  ledger: added {}, done {}, lost {}, unexpected {}, held twice {}",
                r.added,
                r.done,
                r.lost.len(),
                r.unexpected.len(),
                r.double_held.len()
            );
            r.lost.len() as u64 + r.unexpected.len() as u64 + r.double_held.len() as u64
        }
        // Without a ledger, a job is lost when it was acknowledged and is
        // neither done nor still in the tube.
        None => inserted.saturating_sub(counts.deleted + left.total()),
    };
    println!("  lost: {lost}");
    println!();
    let q = |p: f64| latency.value_at_quantile(p);
    println!(
        "  enqueue latency (us): p50 {}  p90 {}  p99 {}  p99.9 {}  max {}",
        q(0.50),
        q(0.90),
        q(0.99),
        q(0.999),
        latency.max()
    );
    let enq = enqueue_done_at.unwrap_or(wall).as_secs_f64().max(1e-9);
    println!(
        "  throughput: enqueue {:.0} jobs/s, end to end {:.0} jobs/s, wall {:.2} s",
        inserted as f64 / enq,
        counts.deleted as f64 / wall.as_secs_f64().max(1e-9),
        wall.as_secs_f64()
    );
    println!("  failed once and retried as planned: {expect_releases}");

    let mut problems = Vec::new();
    if !finished {
        problems.push(format!("not finished within {} s", budget.as_secs()));
    }
    if !mismatches.is_empty() {
        problems.push(format!(
            "counts differ from the server's: {}",
            mismatches.join(", ")
        ));
    }
    if lost != 0 {
        problems.push(format!("{lost} jobs lost"));
    }
    if put_failed != 0 || inserted != args.jobs {
        problems.push(format!(
            "{} of {} puts failed",
            args.jobs - inserted,
            args.jobs
        ));
    }
    if left.total() != 0 {
        problems.push(format!("{} jobs left in tube {tube}", left.total()));
    }
    if counts.deleted != inserted {
        problems.push(format!("{} jobs done of {inserted} put", counts.deleted));
    }
    if problems.is_empty() {
        println!("  result: every job done, counts equal to the server's record, lost 0");
        Ok(())
    } else {
        Err(format!("demo failed: {}", problems.join("; ")).into())
    }
}

fn progress(queued: u64, total: u64, c: &WorkerCounts, elapsed: Duration, tty: bool) {
    let in_flight = c.reserved.saturating_sub(c.settled());
    let rate = c.deleted as f64 / elapsed.as_secs_f64().max(1e-9);
    let line = format!(
        "queued {queued}/{total}  in flight {in_flight}  done {}  retried {}  buried {}  {rate:.0} jobs/s",
        c.deleted, c.released, c.buried
    );
    if tty {
        eprint!("\r\x1b[2K{line}");
    } else {
        eprintln!("{line}");
    }
}

/// The server's record of the run beside the worker's counts, and what is
/// left in the tube.
fn record(
    setup: &mut Setup,
    counts: &WorkerCounts,
    inserted: u64,
) -> Result<(Vec<Row>, Left), String> {
    let only = [setup.tube.clone()];
    let after = snapshot::read(&mut setup.admin, Scope::only(&only))?;
    let before = &setup.before;
    let t = after.tubes.first().cloned().unwrap_or_default();
    let left = Left {
        ready: t.jobs.ready,
        reserved: t.jobs.reserved,
        delayed: t.jobs.delayed.unwrap_or(0),
        buried: t.jobs.buried,
    };
    let Some(n) = &after.nats else {
        let d = |key: &str| Some(after.totals.counter(key)? - before.totals.counter(key)?);
        let rows = vec![
            ("jobs put", inserted, d("cmd-put"), "cmd-put".into()),
            (
                "deleted (done)",
                counts.deleted,
                d("cmd-delete"),
                "cmd-delete".into(),
            ),
            (
                "released (retried)",
                counts.released,
                d("cmd-release"),
                "cmd-release".into(),
            ),
            ("buried", counts.buried, d("cmd-bury"), "cmd-bury".into()),
            (
                "touched",
                counts.touched,
                d("cmd-touch"),
                "cmd-touch".into(),
            ),
        ];
        return Ok((rows, left));
    };
    let last_before = before.nats.as_ref().map_or(0, |b| b.stream.last_seq);
    let nt = t.nats.clone().unwrap_or_default();
    let c = nt.consumer.clone().unwrap_or_default();
    // The run's new sequences: its jobs and their bury copies (the tube is
    // new, so every copy on its buried subject is the run's).
    let put = n
        .stream
        .last_seq
        .saturating_sub(last_before)
        .saturating_sub(t.jobs.buried);
    let buried_on = match &setup.admin {
        Conn::Nats(js) => js.layout().buried_subject(&setup.tube),
        Conn::Beanstalkd(_) => String::new(),
    };
    let rows = vec![
        (
            "jobs put",
            inserted,
            Some(put),
            "stream last-seq, less bury copies".into(),
        ),
        (
            "delivered",
            counts.reserved,
            Some(c.delivered),
            "consumer delivered".into(),
        ),
        (
            "deleted (done)",
            counts.deleted,
            Some(put.saturating_sub(nt.stored + t.jobs.buried)),
            "acked: put, less stored and buried".into(),
        ),
        (
            "released (retried)",
            counts.released,
            Some(c.delivered.saturating_sub(put.saturating_sub(c.pending))),
            "redeliveries".into(),
        ),
        (
            "buried",
            counts.buried,
            Some(t.jobs.buried),
            format!("on {buried_on}"),
        ),
        (
            "touched",
            counts.touched,
            None,
            "+WPI: JetStream keeps no count".into(),
        ),
    ];
    Ok((rows, left))
}

/// Jobs still in the demo's tube, by state.
#[derive(Default)]
struct Left {
    ready: u64,
    reserved: u64,
    delayed: u64,
    buried: u64,
}

impl Left {
    fn total(&self) -> u64 {
        self.ready + self.reserved + self.delayed + self.buried
    }
}
