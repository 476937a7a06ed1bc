//! Running the built `taskq` binary from tests, bounded in time.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use taskq_connect::nats::{MsgSelect, NatsConnection};
use taskq_proto::nats::Delivery;
use taskq_proto::{Command as Cmd, Connection, ConnectionConfig, Reply, TubeStats};

/// Runs `taskq ARGS` with `stdin` fed in, killing it after `limit`.
/// Returns the output and how long it ran.
pub fn taskq(args: &[&str], stdin: &[u8], limit: Duration) -> (Output, Duration) {
    bounded(command(args), stdin, limit)
}

/// Runs `cmd` with its standard streams piped and `stdin` fed in, killing
/// it after `limit`. Returns the output and how long it ran.
pub fn bounded(mut cmd: Command, stdin: &[u8], limit: Duration) -> (Output, Duration) {
    let started = Instant::now();
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let data = stdin.to_vec();
    let feeder = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} ran past {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    let _ = feeder.join();
    (out, started.elapsed())
}

/// `taskq ARGS` with no `$TASKQ_ADDR`, not started.
pub fn command(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_taskq"));
    cmd.args(args).env_remove("TASKQ_ADDR");
    cmd
}

/// Starts `taskq ARGS` with its standard streams piped and no `$TASKQ_ADDR`.
pub fn spawn(args: &[&str]) -> std::process::Child {
    command(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Runs and expects success; returns stdout.
pub fn ok(args: &[&str], stdin: &[u8]) -> String {
    let (out, _) = taskq(args, stdin, Duration::from_secs(30));
    assert!(
        out.status.success(),
        "taskq {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Reserves and deletes every ready job of `tube`: (id, body) in order.
pub fn drain(addr: SocketAddr, tube: &str) -> Vec<(u64, Vec<u8>)> {
    let mut c = Connection::connect(addr, ConnectionConfig::default()).unwrap();
    c.request(&Cmd::Watch { tube }).unwrap();
    let mut out = Vec::new();
    loop {
        let (id, body) = match c.request(&Cmd::ReserveWithTimeout { timeout: 0 }).unwrap() {
            Reply::Reserved { id, body } => (id, body.to_vec()),
            Reply::TimedOut => return out,
            r => panic!("unexpected {r:?}"),
        };
        assert_eq!(c.request(&Cmd::Delete { id }).unwrap(), Reply::Deleted);
        out.push((id, body));
    }
}

/// The ids printed one per line.
pub fn ids(stdout: &str) -> Vec<u64> {
    stdout.lines().map(|l| l.trim().parse().unwrap()).collect()
}

/// A directory holding `taskq` and `taskq-worker`, both built from this tree
/// (`taskq-worker` is built here: a test of this package does not build it).
pub fn bin_dir() -> PathBuf {
    let taskq = PathBuf::from(env!("CARGO_BIN_EXE_taskq"));
    let dir = taskq
        .parent()
        .expect("binary has a directory")
        .to_path_buf();
    {
        let profile_release = dir.ends_with("release");
        let mut build = Command::new(env!("CARGO"));
        build.args(["build", "-q", "-p", "taskq-worker", "--bin", "taskq-worker"]);
        if profile_release {
            build.arg("--release");
        }
        let status = build
            .current_dir(PathBuf::from(env!("CARGO_MANIFEST_DIR")))
            .status()
            .expect("cargo build runs");
        assert!(status.success(), "building taskq-worker failed");
    }
    assert!(
        dir.join("taskq-worker").exists(),
        "taskq-worker not found in {}",
        dir.display()
    );
    dir
}

/// The pinned current nats-server's node ([`taskq_testkit::current_node`]):
/// `None`, and the test skips, where that binary is not available, unless
/// `TASKQ_NATS_CURRENT` is set (scripts/test sets it, and CI runs that):
/// then a missing server fails the test.
pub fn current_node() -> Option<taskq_testkit::NatsCluster> {
    let node = taskq_testkit::current_node();
    let env = taskq_testkit::nats::CURRENT_SERVER_ENV;
    if let (None, Some(v)) = (&node, std::env::var_os(env).filter(|v| !v.is_empty())) {
        panic!(
            "the current nats-server is not available, yet {env}={v:?}: this run must not skip it"
        );
    }
    node
}

/// A child process killed and reaped on drop.
pub struct Reaped(pub std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Reaped {
    /// Waits up to `limit` for the child to exit (past it the test fails,
    /// and the drop kills it): its status and what it printed on whichever
    /// of its stdout and stderr are piped, read meanwhile on threads within
    /// the same deadline.
    pub fn output_within(&mut self, limit: Duration) -> Output {
        let deadline = Instant::now() + limit;
        let read = |pipe: Option<Box<dyn Read + Send>>| {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let mut all = Vec::new();
                if let Some(mut p) = pipe {
                    let _ = p.read_to_end(&mut all);
                }
                let _ = tx.send(all);
            });
            rx
        };
        let out = read(self.0.stdout.take().map(|p| Box::new(p) as _));
        let err = read(self.0.stderr.take().map(|p| Box::new(p) as _));
        let status = loop {
            if let Some(s) = self.0.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "the child ran past {limit:?}");
            std::thread::sleep(Duration::from_millis(10));
        };
        let left = || deadline.saturating_duration_since(Instant::now());
        Output {
            status,
            stdout: out.recv_timeout(left()).expect("its stdout ends in time"),
            stderr: err.recv_timeout(left()).expect("its stderr ends in time"),
        }
    }
}

/// Sends SIGKILL to every process of process group `pgid` (a child started
/// with `process_group(0)` leads a group of its own, named by its pid).
pub fn kill_group(pgid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// A child started with `process_group(0)`: on drop its whole group (the
/// child and whatever it started) is killed, then the child is reaped.
pub struct ReapedGroup(pub std::process::Child);

impl Drop for ReapedGroup {
    fn drop(&mut self) {
        kill_group(self.0.id());
        let _ = self.0.wait();
    }
}

/// `stats-tube TUBE` on the server at `addr`, handed to `f`.
pub fn with_tube_stats<T>(
    addr: impl ToSocketAddrs,
    tube: &str,
    f: impl FnOnce(&TubeStats<'_>) -> T,
) -> T {
    let mut c = Connection::connect(addr, ConnectionConfig::default()).unwrap();
    match c.request(&Cmd::StatsTube { tube }).unwrap() {
        Reply::Ok { yaml } => f(&TubeStats::parse(yaml).unwrap()),
        r => panic!("stats-tube {tube}: {r:?}"),
    }
}

/// GET /metrics: each sample line as (name{labels}, value); `None` while
/// nothing answers.
pub fn scrape(at: SocketAddr) -> Option<HashMap<String, f64>> {
    let mut s = TcpStream::connect_timeout(&at, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(20))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let body = text.split_once("\r\n\r\n")?.1;
    Some(
        body.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (k, v) = l.rsplit_once(' ')?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect(),
    )
}

/// Pulls one message of tube `tube` from its consumer `taskq-TUBE` on stream
/// TASKQ (waiting up to 5 s): its ack subject and delivery count.
pub fn pull_one(a: &mut NatsConnection, tube: &str) -> (Vec<u8>, u64) {
    a.pull(
        "TASKQ",
        &format!("taskq-{tube}"),
        1,
        Duration::from_secs(5),
        None,
    )
    .unwrap();
    match a.next_delivery().unwrap() {
        Delivery::Msg { reply, info, .. } => (reply.to_vec(), info.delivered),
        other => panic!("no message: {other:?}"),
    }
}

/// The messages stream TASKQ holds on `subject`, counted one by one.
pub fn count_on(a: &mut NatsConnection, subject: &str) -> u64 {
    let (mut n, mut seq) = (0, 1);
    while let Ok(m) = a.msg_get("TASKQ", MsgSelect::NextBySubject { subject, seq }) {
        (n, seq) = (n + 1, m.seq + 1);
    }
    n
}
