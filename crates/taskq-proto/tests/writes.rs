//! One write call per request: counted by the connection itself and, separately,
//! by tracing this test's own system calls with `strace`.

use std::process::Command as Process;

use taskq_proto::{Command, Connection, ConnectionConfig, Reply, INLINE_REQUEST};
use taskq_testkit::Beanstalkd;

const BIG: usize = 60_000;

/// Requests of every kind, each answered by the server; returns how many sends it made.
fn every_request(c: &mut Connection) -> u64 {
    let big = vec![b'b'; BIG];
    let small = [b's'; 64];
    let inline_max = vec![b'i'; INLINE_REQUEST - "put 1 0 60 1002\r\n".len() - 2];
    // The largest put that still goes out from the inline buffer.
    let total = format!("put 1 0 60 {}\r\n", inline_max.len()).len() + inline_max.len() + 2;
    assert_eq!(total, INLINE_REQUEST);
    let mut sent = 0;
    let mut one = |c: &mut Connection, cmd: Command<'_>| {
        let before = c.io_counts().writes;
        c.send(&cmd).unwrap();
        assert_eq!(c.io_counts().writes - before, 1, "{:?}", cmd.kind());
        sent += 1;
        let reply = c.recv().unwrap();
        assert!(!reply.is_server_error(), "{:?}: {reply:?}", cmd.kind());
    };
    one(c, Command::Use { tube: "w" });
    one(c, Command::Watch { tube: "w" });
    one(
        c,
        Command::Put {
            pri: 1,
            delay: 0,
            ttr: 60,
            body: &small,
        },
    );
    one(
        c,
        Command::Put {
            pri: 1,
            delay: 0,
            ttr: 60,
            body: &inline_max,
        },
    );
    one(
        c,
        Command::Put {
            pri: 1,
            delay: 0,
            ttr: 60,
            body: &[b'v'; 4096],
        },
    );
    one(
        c,
        Command::Put {
            pri: 1,
            delay: 0,
            ttr: 60,
            body: &big,
        },
    );
    for _ in 0..4 {
        one(c, Command::ReserveWithTimeout { timeout: 0 });
    }
    one(c, Command::PeekReady);
    one(c, Command::Stats);
    one(c, Command::StatsTube { tube: "w" });
    one(c, Command::ListTubes);
    one(c, Command::ListTubeUsed);
    one(c, Command::ListTubesWatched);
    one(c, Command::Kick { bound: 1 });
    one(
        c,
        Command::PauseTube {
            tube: "w",
            delay: 0,
        },
    );
    // A pipelined batch of 20 puts: one write for all of them.
    for _ in 0..20 {
        c.queue(&Command::Put {
            pri: 1,
            delay: 0,
            ttr: 60,
            body: &small,
        })
        .unwrap();
    }
    let before = c.io_counts().writes;
    c.flush().unwrap();
    assert_eq!(c.io_counts().writes - before, 1, "pipelined batch");
    sent += 1;
    for _ in 0..20 {
        assert!(matches!(c.recv().unwrap(), Reply::Inserted { .. }));
    }
    sent
}

#[test]
fn io_counts_one_write_per_request() {
    let server = Beanstalkd::start().expect("start beanstalkd");
    let mut c = Connection::connect(server.addr(), ConnectionConfig::default()).unwrap();
    let sent = every_request(&mut c);
    assert_eq!(c.io_counts().writes, sent);
}

/// Run under strace by `strace_sees_one_send_per_request`: does the requests
/// against the server whose address it is given, and nothing when run alone.
#[test]
fn traced_child() {
    let Ok(addr) = std::env::var("TASKQ_TRACED_ADDR") else {
        return;
    };
    let mut c = Connection::connect(addr.as_str(), ConnectionConfig::default()).unwrap();
    let sent = every_request(&mut c);
    println!("TRACED_SENT={sent}");
}

#[test]
fn strace_sees_one_send_per_request() {
    if Process::new("strace").arg("-V").output().is_err() {
        eprintln!("strace is not installed: only the io_counts test checks write calls");
        return;
    }
    let server = Beanstalkd::start().expect("start beanstalkd");
    let log =
        std::env::temp_dir().join(format!("taskq-proto-writes-{}.strace", std::process::id()));
    let out = Process::new("strace")
        .args([
            "-f",
            "-qq",
            "-e",
            "signal=none",
            "-e",
            "trace=sendto,sendmsg,sendmmsg,write,writev",
            "-s",
            "0",
            "-o",
        ])
        .arg(&log)
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", "traced_child", "--nocapture", "--test-threads=1"])
        .env("TASKQ_TRACED_ADDR", server.addr().to_string())
        .output()
        .expect("run strace");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sent: usize = stdout
        .lines()
        .find_map(|l| l.split_once("TRACED_SENT=").map(|(_, n)| n.trim()))
        .expect("child reported its requests")
        .parse()
        .unwrap();
    let trace = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_file(&log);
    // Only the connection sends on a socket; the harness writes to stdout/stderr.
    let sends: Vec<&str> = trace
        .lines()
        .filter(|l| l.contains(" sendto(") || l.contains(" sendmsg("))
        .collect();
    let socket_writes = trace
        .lines()
        .filter(|l| {
            (l.contains(" write(") || l.contains(" writev("))
                && !l.contains("write(1,")
                && !l.contains("write(2,")
        })
        .count();
    assert_eq!(
        sends.len(),
        sent,
        "one send per request:\n{}",
        sends.join("\n")
    );
    assert_eq!(
        socket_writes, 0,
        "no plain write calls on the socket:\n{trace}"
    );
    // The 60,000-byte put went out whole from one vectored call.
    let whole = format!("put 1 0 60 {BIG}\r\n").len() + BIG + 2;
    assert!(
        sends
            .iter()
            .any(|l| l.contains(" sendmsg(") && l.ends_with(&format!("= {whole}"))),
        "no single sendmsg of {whole} bytes:\n{}",
        sends.join("\n")
    );
}
