//! `taskq put` under faults: connections reset at random by the chaos proxy, and
//! a beanstalkd killed with -9 and restarted on its binlog. Every printed id is
//! the job of its own line, the summary accounts for every line, and nothing is
//! implied queued or unqueued that the server's record contradicts.

mod cli_common;

use std::collections::HashMap;
use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cli_common::drain;
use taskq_testkit::{Beanstalkd, ChaosProxy, Direction, TempDir, Toxic};

/// Lines fed to each run.
const LINES: usize = 3000;

/// The counts and positions of the summary line.
#[derive(Debug, Default)]
struct Summary {
    acknowledged: u64,
    rejected: Vec<u64>,
    unknown: Vec<u64>,
    not_sent: Vec<u64>,
}

/// Reads `taskq put: acknowledged A, rejected R, unknown U, not sent S (what: jobs 3, 5-9; ...)`.
fn summary(stderr: &str) -> Summary {
    let line = stderr
        .lines()
        .last()
        .and_then(|l| l.strip_prefix("taskq put: "))
        .unwrap_or_else(|| panic!("no summary line:\n{stderr}"));
    let (counts, details) = match line.split_once(" (") {
        Some((c, d)) => (c, d.strip_suffix(')').expect("closing parenthesis")),
        None => (line, ""),
    };
    let n: Vec<u64> = counts
        .split(", ")
        .map(|part| part.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(n.len(), 4, "{line}");
    let mut s = Summary {
        acknowledged: n[0],
        ..Summary::default()
    };
    for group in details.split("; ").filter(|g| !g.is_empty()) {
        let (what, list) = group.split_once(": ").unwrap();
        let list = list
            .strip_prefix("jobs ")
            .or_else(|| list.strip_prefix("job "))
            .unwrap();
        let mut positions = Vec::new();
        for run in list.split(", ") {
            match run.split_once('-') {
                Some((a, b)) => positions.extend(a.parse::<u64>().unwrap()..=b.parse().unwrap()),
                None => positions.push(run.parse().unwrap()),
            }
        }
        match what {
            "rejected" => s.rejected = positions,
            "unknown" => s.unknown = positions,
            "not sent" => s.not_sent = positions,
            other => panic!("unknown group {other:?} in {line}"),
        }
    }
    assert_eq!(s.rejected.len() as u64, n[1], "{line}");
    assert_eq!(s.unknown.len() as u64, n[2], "{line}");
    assert_eq!(s.not_sent.len() as u64, n[3], "{line}");
    s
}

/// Runs `taskq put ARGS`, writing `LINES` lines `line N` (1-based) to its
/// standard input 25 at a time, `pause` apart, so that it sends many small batches.
fn put_trickled(args: &[&str], pause: Duration, limit: Duration) -> Output {
    let started = Instant::now();
    let mut child = cli_common::spawn(&[&["put"], args].concat());
    let mut input = child.stdin.take().unwrap();
    let feeder = std::thread::spawn(move || {
        for chunk in (1..=LINES).collect::<Vec<_>>().chunks(25) {
            let text: String = chunk.iter().map(|i| format!("line {i}\n")).collect();
            if input.write_all(text.as_bytes()).is_err() {
                return;
            }
            std::thread::sleep(pause);
        }
    });
    let pid = child.id();
    let out = std::thread::spawn(move || child.wait_with_output().unwrap());
    while !out.is_finished() {
        if started.elapsed() > limit {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("taskq put ran past {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = feeder.join();
    out.join().unwrap()
}

/// Checks a run against the server's content: returns (jobs in the server, summary).
fn check(
    out: &Output,
    server: std::net::SocketAddr,
    tube: &str,
    at_least_once: bool,
) -> (usize, Summary) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let s = summary(&stderr);
    let printed: Vec<u64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    let total = s.acknowledged + (s.rejected.len() + s.unknown.len() + s.not_sent.len()) as u64;
    assert_eq!(
        total, LINES as u64,
        "the summary adds up to the input:\n{stderr}"
    );
    assert_eq!(
        printed.len() as u64,
        s.acknowledged,
        "one id per acknowledged job"
    );
    assert!(s.rejected.is_empty(), "{stderr}");
    let want_status = if !s.unknown.is_empty() {
        3
    } else if s.not_sent.is_empty() {
        0
    } else {
        4
    };
    assert_eq!(out.status.code(), Some(want_status), "{stderr}");

    // The acknowledged positions, in input order, are the ones not reported.
    let reported: std::collections::HashSet<u64> =
        s.unknown.iter().chain(&s.not_sent).copied().collect();
    let acked: Vec<u64> = (1..=LINES as u64)
        .filter(|p| !reported.contains(p))
        .collect();
    assert_eq!(acked.len(), printed.len());

    let jobs: HashMap<u64, Vec<u8>> = drain(server, tube).into_iter().collect();
    for (pos, id) in acked.iter().zip(&printed) {
        let body = jobs
            .get(id)
            .unwrap_or_else(|| panic!("printed id {id} (line {pos}) is not in the server"));
        assert_eq!(
            body,
            format!("line {pos}").as_bytes(),
            "id {id} is line {pos}"
        );
    }
    let extra = jobs.len() as u64 - s.acknowledged;
    assert!(
        extra <= s.unknown.len() as u64 || at_least_once,
        "{extra} jobs in the server beyond the acknowledged ones, only {} reported unknown",
        s.unknown.len()
    );
    if !at_least_once {
        // Only lines reported unknown can be in the server unacknowledged.
        let printed_ids: std::collections::HashSet<&u64> = printed.iter().collect();
        for (id, body) in &jobs {
            if !printed_ids.contains(id) {
                let line: u64 = String::from_utf8_lossy(body)["line ".len()..]
                    .parse()
                    .unwrap();
                assert!(
                    s.unknown.contains(&line),
                    "line {line} queued as {id}, not reported"
                );
            }
        }
    } else {
        let mut lines: Vec<&[u8]> = jobs.values().map(Vec::as_slice).collect();
        lines.sort();
        lines.dedup();
        assert_eq!(
            lines.len(),
            LINES,
            "with --at-least-once every line is in the server"
        );
    }
    (jobs.len(), s)
}

/// Resets about half the connections at a random moment, in rounds of 20 ms, until `stop`.
fn chaos(proxy: &ChaosProxy, seed: u64, stop: &AtomicBool) -> u64 {
    let mut rng = seed;
    let mut rounds = 0;
    while !stop.load(Ordering::SeqCst) {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let after = Duration::from_millis((rng >> 33) % 15);
        proxy.add(Toxic::Reset { after }, Direction::Both, 0.5);
        std::thread::sleep(Duration::from_millis(20));
        proxy.clear();
        std::thread::sleep(Duration::from_millis(5));
        rounds += 1;
    }
    rounds
}

fn chaos_run(seed: u64, at_least_once: bool) {
    let server = Beanstalkd::start().unwrap();
    let proxy = ChaosProxy::start_seeded(server.addr(), seed).unwrap();
    let addr = proxy.addr().to_string();
    let stop = AtomicBool::new(false);
    let mut args = vec!["--addr", &addr, "--tube", "chaos", "--io-timeout", "500"];
    if at_least_once {
        args.push("--at-least-once");
    }
    let (out, rounds) = std::thread::scope(|s| {
        let h = s.spawn(|| chaos(&proxy, seed, &stop));
        let out = put_trickled(&args, Duration::from_millis(3), Duration::from_secs(120));
        stop.store(true, Ordering::SeqCst);
        (out, h.join().unwrap())
    });
    let (in_server, s) = check(&out, server.addr(), "chaos", at_least_once);
    eprintln!(
        "seed {seed}, at-least-once {at_least_once}: {rounds} fault rounds, {} connections; \
         acknowledged {}, unknown {}, not sent {}, jobs in the server {in_server}",
        proxy.opened(),
        s.acknowledged,
        s.unknown.len(),
        s.not_sent.len()
    );
    assert!(
        proxy.opened() >= 5,
        "too few faults to prove anything: seed {seed}"
    );
    assert!(
        s.not_sent.is_empty(),
        "a reachable server: nothing given up"
    );
    if at_least_once {
        assert!(s.unknown.is_empty(), "re-sent until acknowledged");
    }
}

#[test]
fn reset_connections_lose_no_line_and_unknown_ones_are_all_reported() {
    for seed in [11, 12, 13] {
        chaos_run(seed, false);
    }
}

#[test]
fn at_least_once_puts_every_line_through_reset_connections() {
    for seed in [21, 22] {
        chaos_run(seed, true);
    }
}

#[test]
fn a_server_killed_and_restarted_on_its_binlog_costs_only_time() {
    let dir = TempDir::new("binlog");
    let binlog = dir.0.to_str().unwrap().to_string();
    let mut server = Beanstalkd::start_with(&["-b", &binlog]).unwrap();
    let addr = server.addr();
    let port = addr.port().to_string();
    let addr_s = addr.to_string();
    let restarted = Arc::new(std::sync::Mutex::new(None));
    let out = std::thread::scope(|s| {
        let r = restarted.clone();
        let (binlog, port) = (&binlog, &port);
        let server = &mut server;
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(1000));
            server.kill().unwrap();
            std::thread::sleep(Duration::from_secs(1));
            // The same port and the same binlog (the harness picks a new port, so
            // this one is started by hand and killed on drop).
            let again = Command::new("beanstalkd")
                .args(["-l", "127.0.0.1", "-p", port, "-b", binlog])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            *r.lock().unwrap() = Some(cli_common::Reaped(again));
        });
        put_trickled(
            &["--addr", &addr_s, "--tube", "restart"],
            Duration::from_millis(25),
            Duration::from_secs(60),
        )
    });
    let _again = restarted
        .lock()
        .unwrap()
        .take()
        .expect("the server came back");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("reconnecting"),
        "the restart was seen: {stderr}"
    );
    let (in_server, s) = check(&out, addr, "restart", false);
    eprintln!(
        "kill -9 and restart: acknowledged {}, unknown {}, not sent {}, jobs in the server {in_server}",
        s.acknowledged,
        s.unknown.len(),
        s.not_sent.len()
    );
    assert!(
        s.not_sent.is_empty(),
        "it went on after the restart:\n{stderr}"
    );
    assert!(s.acknowledged > LINES as u64 / 2, "{stderr}");
}
