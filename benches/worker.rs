//! Worker drain throughput: the taskq-worker library (no-op handler, one thread,
//! delete pipelined with the next reserve) beside a raw reserve/delete loop on a
//! plain TcpStream (one write and one read per command), against the same local
//! beanstalkd in the same run. Prints jobs/s of each and the ratio.
//!
//! `cargo bench --bench worker` (env `TASKQ_BENCH_JOBS`, default 20000; `TASKQ_BENCH_ROUNDS`, default 3).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use taskq_proto::{Command, Config as ConnConfig, Connection, Reply};
use taskq_testkit::Beanstalkd;
use taskq_worker::{Config, Job, Outcome, Worker};

fn fill(addr: SocketAddr, n: usize) {
    let mut c = Connection::connect(addr, ConnConfig::default()).expect("connect");
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
            match c.recv(taskq_proto::CommandKind::Put).unwrap() {
                Reply::Inserted { .. } => {}
                r => panic!("put: {r:?}"),
            }
        }
    }
}

fn drain_worker(addr: SocketAddr, n: usize) -> f64 {
    let worker = Worker::new(
        Config {
            servers: vec![addr.to_string()],
            concurrency: 1,
            max_jobs: Some(n as u64),
            io_timeout: Duration::from_secs(2),
            ..Config::default()
        },
        |_: &mut Job<'_>| Outcome::Done,
    )
    .unwrap();
    let t = Instant::now();
    let counts = worker.run();
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(counts.deleted, n as u64);
    n as f64 / secs
}

/// Reads one reply: the line, and the body a RESERVED line announces.
fn read_reply(s: &mut TcpStream, buf: &mut Vec<u8>) -> (u64, bool) {
    buf.clear();
    let mut chunk = [0u8; 4096];
    loop {
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0, "server closed");
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(2).position(|w| w == b"\r\n") {
            let line = std::str::from_utf8(&buf[..end]).unwrap();
            let mut parts = line.split(' ');
            match parts.next() {
                Some("RESERVED") => {
                    let id: u64 = parts.next().unwrap().parse().unwrap();
                    let len: usize = parts.next().unwrap().parse().unwrap();
                    if buf.len() >= end + 2 + len + 2 {
                        return (id, true);
                    }
                }
                Some("DELETED") => return (0, true),
                _ => panic!("reply {line}"),
            }
        }
    }
}

fn drain_raw(addr: SocketAddr, n: usize) -> f64 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    let mut buf = Vec::with_capacity(4096);
    let mut line = Vec::with_capacity(64);
    let t = Instant::now();
    for _ in 0..n {
        s.write_all(b"reserve-with-timeout 1\r\n").unwrap();
        let (id, _) = read_reply(&mut s, &mut buf);
        line.clear();
        write!(line, "delete {id}\r\n").unwrap();
        s.write_all(&line).unwrap();
        read_reply(&mut s, &mut buf);
    }
    n as f64 / t.elapsed().as_secs_f64()
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
    let mut ratios = Vec::new();
    for round in 1..=rounds {
        fill(addr, n);
        let raw = drain_raw(addr, n);
        fill(addr, n);
        let lib = drain_worker(addr, n);
        let ratio = lib / raw;
        println!(
            "round {round}: {n} jobs  raw reserve/delete loop {raw:>9.0} jobs/s  taskq-worker {lib:>9.0} jobs/s  ratio {ratio:.2}x"
        );
        ratios.push(ratio);
    }
    ratios.sort_by(f64::total_cmp);
    println!("worker/raw median ratio: {:.2}x", ratios[ratios.len() / 2]);
}
