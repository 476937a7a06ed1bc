//! `taskq bench`: enqueue throughput and latency, in the manner of redis-benchmark.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use taskq_producer::{PutOptions, PutOutcome};

use crate::cli::CliResult;

/// Arguments of `taskq bench`.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Server address; without it (and without $TASKQ_ADDR) the embedded
    /// reference server is started in this process and measured.
    #[arg(long, env = "TASKQ_ADDR")]
    pub addr: Option<String>,
    /// Limit on connecting and on each reply, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = crate::server::IO_TIMEOUT_MS)]
    pub io_timeout: u64,
    /// Jobs to put in all.
    #[arg(short = 'n', long = "jobs", default_value_t = 100_000)]
    pub jobs: u64,
    /// Connections, each on its own thread.
    #[arg(short = 'c', long = "connections", default_value_t = 1)]
    pub connections: usize,
    /// Jobs sent per write (1: one put, one reply, then the next).
    #[arg(short = 'P', long, value_name = "K", default_value_t = 1)]
    pub pipeline: usize,
    /// Body size in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 64)]
    pub size: usize,
    /// Tube the jobs go to (they stay there: drain or drop it afterwards).
    #[arg(long, default_value = "taskq-bench")]
    pub tube: String,
    #[command(flatten)]
    pub js: crate::jetstream::CreateArgs,
}

/// Runs `taskq bench`.
pub fn run(args: BenchArgs) -> CliResult {
    if args.connections == 0 || args.pipeline == 0 || args.jobs == 0 {
        return Err("-n, -c and --pipeline must be at least 1".into());
    }
    // The embedded server lives until the measurement is over.
    let (addr, target, _server) = match &args.addr {
        Some(a) => (a.clone(), a.clone(), None),
        None => {
            let s = taskq_testkit::TestServer::start()
                .map_err(|e| format!("starting the embedded reference server: {e}"))?;
            let a = s.addr().to_string();
            (
                a.clone(),
                format!("embedded reference server on {a}"),
                Some(s),
            )
        }
    };
    if crate::jetstream::is_nats(&addr) {
        crate::jetstream::check_tube(&args.tube)?;
    }
    let max_job_size = args.size.max(taskq_proto::DEFAULT_MAX_JOB_SIZE);
    let body = vec![b'x'; args.size];
    let per_conn: Vec<u64> = (0..args.connections as u64)
        .map(|i| {
            args.jobs / args.connections as u64 + u64::from(i < args.jobs % args.connections as u64)
        })
        .collect();

    // Connect everyone first, so connecting is not measured.
    let mut producers = Vec::with_capacity(args.connections);
    for _ in 0..args.connections {
        let mut p =
            crate::put::connect(&addr, args.io_timeout, max_job_size, &args.js, None, false)?;
        p.use_tube(&args.tube)
            .map_err(|e| format!("use {}: {e}", args.tube))?;
        producers.push(p);
    }

    let started = Instant::now();
    let results: Vec<Result<Histogram<u64>, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = producers
            .into_iter()
            .zip(&per_conn)
            .map(|(mut p, &n)| {
                let body = &body;
                let k = args.pipeline;
                s.spawn(move || -> Result<Histogram<u64>, String> {
                    let mut h = new_histogram()?;
                    let bodies: Vec<&[u8]> = vec![body.as_slice(); k];
                    let mut out = vec![PutOutcome::NotSent; k];
                    let mut left = n;
                    while left > 0 {
                        let m = left.min(k as u64) as usize;
                        let t = Instant::now();
                        if m == 1 {
                            p.put(body, PutOptions::default())
                                .map_err(|e| e.to_string())?;
                        } else {
                            let r = p
                                .put_batch(&bodies[..m], PutOptions::default(), &mut out[..m])
                                .map_err(|e| e.to_string())?;
                            if r.rejected > 0 {
                                let first = out[..m]
                                    .iter()
                                    .find(|o| !matches!(o, PutOutcome::Inserted(_)));
                                return Err(format!(
                                    "the server rejected {} jobs: {first:?}",
                                    r.rejected
                                ));
                            }
                        }
                        let ns = t.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
                        h.saturating_record_n(ns.max(1), m as u64);
                        left -= m as u64;
                    }
                    Ok(h)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a bench thread panicked".into()))
            })
            .collect()
    });
    let elapsed = started.elapsed();

    let mut all = new_histogram()?;
    for r in results {
        all.add(r?)
            .map_err(|e| format!("merging histograms: {e}"))?;
    }
    print!("{}", report(&args, &target, elapsed, &all));
    Ok(())
}

fn new_histogram() -> Result<Histogram<u64>, String> {
    // 1 ns to 60 s at 3 significant figures.
    Histogram::new_with_bounds(1, 60_000_000_000, 3).map_err(|e| format!("histogram: {e}"))
}

fn report(args: &BenchArgs, target: &str, elapsed: Duration, h: &Histogram<u64>) -> String {
    let secs = elapsed.as_secs_f64().max(1e-9);
    let mut s = format!(
        "target:      {target}\n\
         jobs:        {} of {} bytes, {} connection(s), pipeline {}\n\
         throughput:  {:.0} jobs/s ({:.3} s)\n\
         latency per job{}:\n",
        args.jobs,
        args.size,
        args.connections,
        args.pipeline,
        args.jobs as f64 / secs,
        secs,
        if args.pipeline > 1 {
            " (the round trip of its batch)"
        } else {
            ""
        },
    );
    for (name, q) in [("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p99.9", 0.999)] {
        s += &format!("  {name:<6} {}\n", micros(h.value_at_quantile(q)));
    }
    s += &format!("  {:<6} {}\n", "max", micros(h.max()));
    s
}

fn micros(ns: u64) -> String {
    format!("{:.1} µs", ns as f64 / 1000.0)
}
