//! Fills a tube, or drains it with a no-op handler, for measuring a worker
//! alone (under valgrind's callgrind, say, with the server a process of its
//! own): `drain_loop ADDR TUBE N fill|thread|async [WINDOW]`.
//!
//! `fill` puts N jobs of 64 B. `thread` drains N jobs with the thread
//! `Worker` at `prefetch` WINDOW (default 64); `async` with the
//! `AsyncWorker` at `concurrency` WINDOW, on a current-thread runtime. Both
//! print the wall time and the worker's system-call counters.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use taskq_producer::{Producer, PutOptions};
use taskq_worker::{AsyncJob, AsyncWorker, Config, Job, Outcome, Snapshot, Worker};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 5 {
        eprintln!("usage: drain_loop ADDR TUBE N fill|thread|async [WINDOW]");
        return ExitCode::from(2);
    }
    let (addr, tube, mode) = (args[1].clone(), args[2].clone(), args[4].as_str());
    let n: u64 = args[3].parse().expect("N is a number");
    let window: usize = args
        .get(5)
        .map_or(64, |s| s.parse().expect("WINDOW is a number"));
    let cfg = |prefetch: usize, concurrency: usize| Config {
        servers: vec![addr.clone()],
        tubes: vec![tube.clone()],
        prefetch,
        concurrency,
        max_jobs: Some(n),
        io_timeout: Duration::from_secs(5),
        ..Config::default()
    };
    let t = Instant::now();
    let counts: Snapshot = match mode {
        "fill" => {
            let mut p = Producer::builder()
                .tube(&tube)
                .connect(addr.as_str())
                .expect("connect");
            let body = [b'x'; 64];
            for _ in 0..n {
                p.put(&body, PutOptions::default()).expect("put");
            }
            println!("put {n} in {:?}", t.elapsed());
            return ExitCode::SUCCESS;
        }
        "thread" => Worker::new(cfg(window, 1), |_: &mut Job<'_>| Outcome::Done)
            .expect("config")
            .run(),
        "async" => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            let w = AsyncWorker::new(cfg(1, window), |_: AsyncJob| async { Outcome::Done })
                .expect("config");
            rt.block_on(w.run())
        }
        other => {
            eprintln!("unknown mode {other}");
            return ExitCode::from(2);
        }
    };
    println!(
        "{mode}: {} done in {:?}: {} writes, {} reads",
        counts.deleted,
        t.elapsed(),
        counts.writes,
        counts.reads
    );
    ExitCode::SUCCESS
}
