//! Worker drain throughput: the taskq-worker library (no-op handler, one thread,
//! delete pipelined with the next reserve), the same with a window of 64
//! prefetched jobs, and the `AsyncWorker` with 64 jobs in flight on one
//! connection (a current-thread tokio runtime, no-op async handler), with
//! each job looked up before it runs (the default) and without, beside
//! two raw loops on a plain TcpStream against the same
//! local beanstalkd in the same run: reserve/delete one command per write and
//! read, and 64 `reserve-with-timeout 0` in one write then 64 deletes in one
//! write. Prints jobs/s of each and the ratios, with their medians.
//!
//! beanstalkd runs on core 0 and this process on core 1 (`taskset`, when there
//! are two cores or more): on a 2-core machine a raw sync loop sharing cores
//! with the server swings between two speeds. Each round starts with the next
//! of the six drains.
//!
//! `cargo bench --bench worker` (env `TASKQ_BENCH_JOBS`, default 20000; `TASKQ_BENCH_ROUNDS`, default 3).
//!
//! Beside jobs/s it prints, per job, each side's write and read system calls
//! and CPU time (the client's, and beanstalkd's own), to show where time goes:
//! filling the queue is not timed.

#[path = "common/pin.rs"]
mod pin;
use pin::pin;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use taskq_proto::{Command, Connection, ConnectionConfig, Reply};
use taskq_testkit::Beanstalkd;
use taskq_worker::{AsyncJob, AsyncWorker, Config, Job, Outcome, Worker};

fn fill(addr: SocketAddr, n: usize) {
    let mut c = Connection::connect(addr, ConnectionConfig::default()).expect("connect");
    let body = [b'x'; 64];
    // Pipelined in chunks: filling is not what is measured.
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        for _ in chunk {
            c.queue(&Command::Put {
                pri: 0,
                delay: 0,
                ttr: 60,
                body: &body,
            })
            .unwrap();
        }
        c.flush().unwrap();
        for _ in chunk {
            match c.recv().unwrap() {
                Reply::Inserted { .. } => {}
                r => panic!("put: {r:?}"),
            }
        }
    }
}

/// What one drain measured.
struct Drain {
    jobs_per_sec: f64,
    writes: u64,
    reads: u64,
    /// CPU of this process and of beanstalkd, microseconds.
    client_cpu_us: u64,
    server_cpu_us: u64,
}

/// User plus system CPU of a process (or a thread's process: `self`), in microseconds.
fn cpu_us(pid: &str) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
        return 0;
    };
    let f: Vec<&str> = rest.split(' ').collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap_or(0) + f[12].parse::<u64>().unwrap_or(0);
    // USER_HZ is 100 on Linux.
    ticks * 10_000
}

fn measure(server_pid: u32, n: usize, f: impl FnOnce() -> (u64, u64)) -> Drain {
    let spid = server_pid.to_string();
    let (c0, s0) = (cpu_us("self"), cpu_us(&spid));
    let t = Instant::now();
    let (writes, reads) = f();
    let secs = t.elapsed().as_secs_f64();
    Drain {
        jobs_per_sec: n as f64 / secs,
        writes,
        reads,
        client_cpu_us: cpu_us("self") - c0,
        server_cpu_us: cpu_us(&spid) - s0,
    }
}

fn drain_worker(addr: SocketAddr, n: usize, prefetch: usize) -> (u64, u64) {
    let worker = Worker::new(
        Config {
            servers: vec![addr.to_string()],
            concurrency: 1,
            max_jobs: Some(n as u64),
            io_timeout: Duration::from_secs(2),
            prefetch,
            ..Config::default()
        },
        |_: &mut Job<'_>| Outcome::Done,
    )
    .unwrap();
    let counts = worker.run();
    assert_eq!(counts.deleted, n as u64);
    (counts.writes, counts.reads)
}

/// The async worker with `concurrency` jobs in flight on one connection, on
/// a current-thread runtime (one thread, as the blocking worker's).
/// `lookup`: [`Config::job_lookup`] (each job looked up before it runs).
fn drain_async(addr: SocketAddr, n: usize, concurrency: usize, lookup: bool) -> (u64, u64) {
    let worker = AsyncWorker::new(
        Config {
            servers: vec![addr.to_string()],
            concurrency,
            max_jobs: Some(n as u64),
            io_timeout: Duration::from_secs(2),
            job_lookup: lookup,
            ..Config::default()
        },
        |_: AsyncJob| async { Outcome::Done },
    )
    .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let counts = rt.block_on(worker.run());
    assert_eq!(counts.deleted, n as u64);
    (counts.writes, counts.reads)
}

/// Reads one reply: the line, and the body a RESERVED line announces. The
/// bytes of later replies stay in `buf`, for the next call.
fn read_reply(s: &mut TcpStream, buf: &mut Vec<u8>, reads: &mut u64) -> (u64, bool) {
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(2).position(|w| w == b"\r\n") {
            let line = std::str::from_utf8(&buf[..end]).unwrap();
            let mut parts = line.split(' ');
            let whole = match parts.next() {
                Some("RESERVED") => {
                    let id: u64 = parts.next().unwrap().parse().unwrap();
                    let len: usize = parts.next().unwrap().parse().unwrap();
                    (buf.len() >= end + 2 + len + 2).then_some((id, end + 2 + len + 2))
                }
                Some("DELETED") => Some((0, end + 2)),
                _ => panic!("reply {line}"),
            };
            if let Some((id, used)) = whole {
                buf.drain(..used);
                return (id, true);
            }
        }
        let n = s.read(&mut chunk).unwrap();
        *reads += 1;
        assert!(n > 0, "server closed");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The raw pipelined loop: 64 `reserve-with-timeout 0` in one write, their
/// replies, then the 64 deletes in one write and theirs.
fn drain_raw_pipelined(addr: SocketAddr, n: usize) -> (u64, u64) {
    const K: usize = 64;
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    let mut buf = Vec::with_capacity(1 << 16);
    let mut out = Vec::with_capacity(K * 32);
    let mut ids = Vec::with_capacity(K);
    let (mut writes, mut reads) = (0, 0);
    let mut left = n;
    while left > 0 {
        let k = left.min(K);
        out.clear();
        for _ in 0..k {
            out.extend_from_slice(b"reserve-with-timeout 0\r\n");
        }
        s.write_all(&out).unwrap();
        writes += 1;
        ids.clear();
        for _ in 0..k {
            ids.push(read_reply(&mut s, &mut buf, &mut reads).0);
        }
        out.clear();
        for id in &ids {
            write!(out, "delete {id}\r\n").unwrap();
        }
        s.write_all(&out).unwrap();
        writes += 1;
        for _ in 0..k {
            read_reply(&mut s, &mut buf, &mut reads);
        }
        left -= k;
    }
    (writes, reads)
}

fn drain_raw(addr: SocketAddr, n: usize) -> (u64, u64) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    let mut buf = Vec::with_capacity(4096);
    let mut line = Vec::with_capacity(64);
    let mut reads = 0;
    for _ in 0..n {
        s.write_all(b"reserve-with-timeout 1\r\n").unwrap();
        let (id, _) = read_reply(&mut s, &mut buf, &mut reads);
        line.clear();
        write!(line, "delete {id}\r\n").unwrap();
        s.write_all(&line).unwrap();
        read_reply(&mut s, &mut buf, &mut reads);
    }
    // Each write_all of a short line is one write call.
    (2 * n as u64, reads)
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` does not: keep that run short.
    let benching = std::env::args().any(|a| a == "--bench");
    let n = if benching {
        env("TASKQ_BENCH_JOBS", 20_000)
    } else {
        200
    };
    let rounds = if benching {
        env("TASKQ_BENCH_ROUNDS", 3)
    } else {
        1
    };
    let server = Beanstalkd::start().expect("beanstalkd");
    let addr = server.addr();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pinned = cores >= 2 && pin(server.pid(), 0) && pin(std::process::id(), 1);
    println!(
        "beanstalkd pid {}, {cores} cores; {}",
        server.pid(),
        if pinned {
            "beanstalkd pinned to core 0, the client to core 1"
        } else {
            "not pinned"
        }
    );
    let mut ratios: [Vec<f64>; 5] = Default::default();
    for round in 1..=rounds {
        let drains: [&dyn Fn() -> (u64, u64); 6] = [
            &|| drain_raw(addr, n),
            &|| drain_raw_pipelined(addr, n),
            &|| drain_worker(addr, n, 1),
            &|| drain_worker(addr, n, 64),
            &|| drain_async(addr, n, 64, true),
            &|| drain_async(addr, n, 64, false),
        ];
        // Each round starts with the next drain, so that none is always
        // measured in the same moment of a noisy machine.
        let mut d: [Option<Drain>; 6] = Default::default();
        for k in 0..drains.len() {
            let which = (round - 1 + k) % drains.len();
            fill(addr, n);
            d[which] = Some(measure(server.pid(), n, drains[which]));
        }
        let [Some(raw), Some(piped), Some(lib), Some(pre), Some(aw), Some(quick)] = d else {
            unreachable!("every drain ran");
        };
        let r = [
            lib.jobs_per_sec / raw.jobs_per_sec,
            pre.jobs_per_sec / raw.jobs_per_sec,
            pre.jobs_per_sec / piped.jobs_per_sec,
            aw.jobs_per_sec / pre.jobs_per_sec,
            quick.jobs_per_sec / pre.jobs_per_sec,
        ];
        println!(
            "round {round}: {n} jobs  raw sync {:>7.0}/s  raw pipelined K=64 {:>7.0}/s  worker {:>7.0}/s  worker --prefetch 64 {:>7.0}/s  async worker 64 {:>7.0}/s  without lookup {:>7.0}/s",
            raw.jobs_per_sec, piped.jobs_per_sec, lib.jobs_per_sec, pre.jobs_per_sec, aw.jobs_per_sec, quick.jobs_per_sec
        );
        println!(
            "    worker/raw sync {:.2}x  prefetch 64/raw sync {:.2}x  prefetch 64/raw pipelined {:.2}  async 64/prefetch 64 {:.2}  async 64 without lookup/prefetch 64 {:.2}",
            r[0], r[1], r[2], r[3], r[4]
        );
        for (name, d) in [
            ("raw sync", &raw),
            ("raw pipelined", &piped),
            ("worker", &lib),
            ("prefetch 64", &pre),
            ("async 64", &aw),
            ("async no look", &quick),
        ] {
            let per = |x: u64| x as f64 / n as f64;
            println!(
                "    {name:<13} per job: writes {:.3} reads {:.3}  client CPU {:.1} us  beanstalkd CPU {:.1} us  wall {:.1} us",
                per(d.writes),
                per(d.reads),
                per(d.client_cpu_us),
                per(d.server_cpu_us),
                1e6 / d.jobs_per_sec
            );
        }
        for (v, x) in ratios.iter_mut().zip(r) {
            v.push(x);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let [a, b, c, d, e] = &mut ratios;
    println!("worker/raw sync median ratio: {:.2}x", median(a));
    println!(
        "worker --prefetch 64/raw sync median ratio: {:.2}x",
        median(b)
    );
    println!(
        "worker --prefetch 64/raw pipelined K=64 median ratio: {:.2}",
        median(c)
    );
    println!(
        "async worker, 64 in flight/worker --prefetch 64 median ratio: {:.2}",
        median(d)
    );
    println!(
        "async worker, 64 in flight, job_lookup off/worker --prefetch 64 median ratio: {:.2}",
        median(e)
    );
}
