//! The README's tokio service (`examples/tokio_service.rs`), run as a user
//! would run it against a real beanstalkd: 200 requests enqueue through its
//! one shared producer, its async worker does every job on the same
//! runtime (no thread of its own), and SIGTERM stops it cleanly with
//! nothing left in the tube.

mod cli_common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use cli_common::Reaped;
use taskq_proto::{Command as Bq, Connection, ConnectionConfig, Reply, ServerStats};
use taskq_testkit::Beanstalkd;

/// The example's binary. `cargo test` builds examples in test mode (with
/// the test harness, not the service), so the test has cargo build it as
/// the example it is, and takes the path cargo reports.
fn example() -> PathBuf {
    let cargo = option_env!("CARGO").unwrap_or("cargo");
    let mut build = Command::new(cargo);
    // What cargo sets for a test run (the package's name, version, paths)
    // is not the example build's: left in, it makes that build differ from
    // the one the workspace's own commands make, and each remakes the other.
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if (k.starts_with("CARGO_") && k != "CARGO_HOME" && k != "CARGO_TARGET_DIR")
            || k == "OUT_DIR"
        {
            build.env_remove(k);
        }
    }
    let out = build
        .args([
            "build",
            "--quiet",
            "--example",
            "tokio_service",
            "--message-format=json",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stderr(Stdio::inherit())
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo build --example tokio_service: {}",
        out.status
    );
    let report = String::from_utf8_lossy(&out.stdout);
    let line = report
        .lines()
        .filter(|l| l.contains("\"compiler-artifact\"") && l.contains("\"tokio_service\""))
        .find(|l| l.contains("\"executable\":\""))
        .unwrap_or_else(|| panic!("no executable for tokio_service in cargo's report: {report}"));
    let start = line.find("\"executable\":\"").unwrap() + "\"executable\":\"".len();
    let end = start + line[start..].find('"').unwrap();
    PathBuf::from(&line[start..end])
}

/// One HTTP/1.1 request on its own connection; the status and the body.
fn post(addr: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    let status = reply[9..12].parse().unwrap();
    let body = reply.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
    (status, body)
}

/// The server's (ready, reserved, total jobs, deletes), as it counts them
/// (server-wide: a tube nobody uses or watches any more is gone).
fn server_stats(server: &Beanstalkd) -> (u64, u64, u64, u64) {
    let mut c = Connection::connect(server.addr(), ConnectionConfig::default()).unwrap();
    match c.request(&Bq::Stats).unwrap() {
        Reply::Ok { yaml } => {
            let s = ServerStats::parse(yaml).unwrap();
            (
                s.current_jobs_ready,
                s.current_jobs_reserved,
                s.total_jobs,
                s.cmd_delete,
            )
        }
        r => panic!("stats: {r:?}"),
    }
}

#[test]
fn the_service_enqueues_from_its_handlers_works_every_job_and_stops_on_sigterm() {
    let server = Beanstalkd::start().unwrap();
    // Killed and reaped however the test ends.
    let mut child = Reaped(
        Command::new(example())
            .env("TASKQ_ADDR", server.addr().to_string())
            .env("LISTEN", "127.0.0.1:0")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // Its lines, read on a thread of their own so that every wait is bounded.
    let stdout = child.0.stdout.take().unwrap();
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let line = lines
        .recv_timeout(Duration::from_secs(30))
        .expect("the service says where it listens within 30 s");
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .expect(&line)
        .to_owned();

    // 200 requests from 8 threads at once: every one answered with its own id.
    let mut ids: Vec<u64> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..8)
            .map(|t| {
                let addr = &addr;
                s.spawn(move || {
                    (0..25)
                        .map(|i| {
                            let (status, body) = post(addr, "/signup", &format!("user {t}-{i}"));
                            assert_eq!(status, 200, "{body}");
                            body.trim().parse::<u64>().unwrap()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 200, "200 distinct ids");

    // The worker does them all; the server's record says so.
    let t = Instant::now();
    while server_stats(&server).3 < 200 {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{:?}",
            server_stats(&server)
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // The worker works on the service's runtime: the process runs the main
    // thread and the runtime's two workers, and no thread per job.
    let threads = std::fs::read_to_string(format!("/proc/{}/status", child.0.id()))
        .unwrap()
        .lines()
        .find_map(|l| {
            l.strip_prefix("Threads:")
                .map(|n| n.trim().parse::<u32>().unwrap())
        })
        .unwrap();
    assert!(threads <= 3, "{threads} threads: main and the runtime's 2");

    // SIGTERM: it stops cleanly, and says what its worker did.
    assert_eq!(sigterm(child.0.id()), 0);
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "stopped within 20 s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
    // The rest of what it printed, up to the end of its output.
    let mut rest = String::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(l) => rest.push_str(&(l + "\n")),
            Err(RecvTimeoutError::Disconnected) => break,
            Err(RecvTimeoutError::Timeout) => panic!("its output still open 10 s after it exited"),
        }
    }
    assert!(
        rest.contains("stopped: welcomed 200, deleted 200, buried 0"),
        "{rest}"
    );
    assert_eq!(
        server_stats(&server),
        (0, 0, 200, 200),
        "(ready, reserved, total, deleted)"
    );
}

/// SIGTERM through kill(1), as an operator sends it.
fn sigterm(pid: u32) -> i32 {
    Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap()
        .code()
        .unwrap_or(-1)
}
