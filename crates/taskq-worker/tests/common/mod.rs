//! Helpers shared by the worker's integration tests.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use taskq_proto::{Command as Cmd, Connection, ConnectionConfig, Reply, ServerStats};

mod js;
#[allow(unused_imports)]
pub use js::*;

/// Connects with test-friendly timeouts.
pub fn connect(addr: SocketAddr) -> Connection {
    let mut cfg = ConnectionConfig::default();
    cfg.limits.max_job_size = 1 << 20;
    Connection::connect(addr, cfg).expect("connect")
}

/// Puts `bodies` into `tube` with the given TTR; returns the ids in order.
pub fn put_all(addr: SocketAddr, tube: &str, ttr: u32, bodies: &[Vec<u8>]) -> Vec<u64> {
    let mut c = connect(addr);
    match c.request(&Cmd::Use { tube }).unwrap() {
        Reply::Using { .. } => {}
        r => panic!("use: {r:?}"),
    }
    bodies
        .iter()
        .map(|body| {
            match c
                .request(&Cmd::Put {
                    pri: 100,
                    delay: 0,
                    ttr,
                    body,
                })
                .unwrap()
            {
                Reply::Inserted { id } => id,
                r => panic!("put: {r:?}"),
            }
        })
        .collect()
}

/// The numbers of the server's `stats` that the tests compare against.
#[derive(Debug, Clone, Copy)]
pub struct Record {
    pub cmd_delete: u64,
    pub cmd_reserve_with_timeout: u64,
    pub cmd_touch: u64,
    pub cmd_stats_job: u64,
    pub ready: u64,
    pub reserved: u64,
    pub delayed: u64,
    pub buried: u64,
    pub job_timeouts: u64,
    pub total_jobs: u64,
}

pub fn record(addr: SocketAddr) -> Record {
    let mut c = connect(addr);
    match c.request(&Cmd::Stats).unwrap() {
        Reply::Ok { yaml } => {
            let s = ServerStats::parse(yaml).unwrap();
            Record {
                cmd_delete: s.cmd_delete,
                cmd_reserve_with_timeout: s.cmd_reserve_with_timeout,
                cmd_touch: s.cmd_touch,
                cmd_stats_job: s.cmd_stats_job,
                ready: s.current_jobs_ready,
                reserved: s.current_jobs_reserved,
                delayed: s.current_jobs_delayed,
                buried: s.current_jobs_buried,
                job_timeouts: s.job_timeouts,
                total_jobs: s.total_jobs,
            }
        }
        r => panic!("stats: {r:?}"),
    }
}

/// `stats-job`: (state, reserves, timeouts, releases), or None when the job is gone.
pub fn job_state(addr: SocketAddr, id: u64) -> Option<(String, u64, u64, u64)> {
    let mut c = connect(addr);
    match c.request(&Cmd::StatsJob { id }).unwrap() {
        Reply::Ok { yaml } => {
            let s = taskq_proto::JobStats::parse(yaml).unwrap();
            Some((s.state.to_owned(), s.reserves, s.timeouts, s.releases))
        }
        Reply::NotFound => None,
        r => panic!("stats-job: {r:?}"),
    }
}

/// Polls `f` every 20 ms until it is true or `limit` passes; returns whether it became true.
pub fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + limit;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A `taskq-worker` child process, killed (SIGKILL) and reaped on drop,
/// with the process groups of its job commands named by
/// [`kill_groups_on_drop`](WorkerProc::kill_groups_on_drop).
pub struct WorkerProc {
    pub child: Child,
    pub stats: PathBuf,
    groups: Vec<PathBuf>,
    _dir: TempDir,
}

pub use taskq_testkit::TempDir;

impl WorkerProc {
    /// Starts `taskq-worker ARGS -- sh -c SCRIPT`.
    pub fn start(args: &[&str], script: &str) -> WorkerProc {
        let dir = TempDir::new("proc");
        let stats = dir.0.join("stats.json");
        let child = Command::new(env!("CARGO_BIN_EXE_taskq-worker"))
            .args(args)
            .arg("--stats-json")
            .arg(&stats)
            .args(["--", "sh", "-c", script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start taskq-worker");
        WorkerProc {
            child,
            stats,
            groups: Vec::new(),
            _dir: dir,
        }
    }

    /// Starts `taskq-worker ARGS -- PROGRAM...` with `env` set (`PATH`
    /// among them, if given).
    pub fn start_program(args: &[&str], program: &[&str], env: &[(&str, &str)]) -> WorkerProc {
        let dir = TempDir::new("proc");
        let stats = dir.0.join("stats.json");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_taskq-worker"));
        cmd.args(args)
            .arg("--stats-json")
            .arg(&stats)
            .arg("--")
            .args(program)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        WorkerProc {
            child: cmd.spawn().expect("start taskq-worker"),
            stats,
            groups: Vec::new(),
            _dir: dir,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// On drop, after the worker, kills (SIGKILL) the process groups whose
    /// ids are in `file`, one a line: job commands run in groups of their
    /// own (a command writes its `$$` there), which a kill of the worker
    /// leaves running.
    pub fn kill_groups_on_drop(&mut self, file: impl Into<PathBuf>) {
        self.groups.push(file.into());
    }

    pub fn signal(&self, name: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{name}"), &self.pid().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{name}");
    }

    /// Waits for the exit within `limit`; panics (after killing it) if it does not come.
    pub fn wait(&mut self, limit: Duration) -> ExitStatus {
        let until = Instant::now() + limit;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            if Instant::now() > until {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("taskq-worker did not exit within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Standard error, after exit.
    pub fn stderr(&mut self) -> String {
        use std::io::Read;
        let mut s = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut s);
        }
        s
    }

    /// The --stats-json counters, after exit.
    pub fn counters(&self) -> serde_json::Map<String, serde_json::Value> {
        let text = std::fs::read_to_string(&self.stats).expect("stats json written");
        match serde_json::from_str(&text).unwrap() {
            serde_json::Value::Object(m) => m,
            v => panic!("not an object: {v}"),
        }
    }
}

pub fn get(m: &serde_json::Map<String, serde_json::Value>, k: &str) -> u64 {
    m.get(k)
        .and_then(|v| v.as_u64())
        .unwrap_or_else(|| panic!("key {k} missing in {m:?}"))
}

impl Drop for WorkerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for file in &self.groups {
            for pgid in lines(file) {
                kill_group(&pgid);
            }
        }
    }
}

/// Kills (SIGKILL) process group `pgid`, given as text; anything but a
/// group id above 1 is left alone.
pub fn kill_group(pgid: &str) {
    if pgid.trim().parse::<u32>().is_ok_and(|g| g > 1) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", pgid.trim())])
            .stderr(Stdio::null())
            .status();
    }
}

/// A child process, killed (SIGKILL) and reaped on drop.
pub struct KillOnDrop(pub Child);

impl KillOnDrop {
    pub fn kill_9(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        self.kill_9();
    }
}

/// Runs `cmd` (standard input closed) to its end, which must come within
/// `limit`: else it is killed and the test fails. Returns its output.
pub fn output_bounded(cmd: &mut Command, limit: Duration) -> std::process::Output {
    use std::io::Read;
    let mut child = KillOnDrop(
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the program"),
    );
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut v);
            }
            v
        })
    };
    let out = drain(child.0.stdout.take().map(|r| Box::new(r) as _));
    let err = drain(child.0.stderr.take().map(|r| Box::new(r) as _));
    let until = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.0.try_wait().unwrap() {
            break st;
        }
        assert!(
            Instant::now() < until,
            "{cmd:?} did not end within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    std::process::Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// The lines of a file, or nothing when it does not exist yet.
pub fn lines(p: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(p)
        .map(|s| s.lines().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// The `taskq` command of the root package, built from this tree when a
/// `cargo test -p taskq-worker` run has not built it yet.
pub fn taskq_cli() -> std::path::PathBuf {
    let worker = std::path::PathBuf::from(env!("CARGO_BIN_EXE_taskq-worker"));
    let taskq = worker.with_file_name("taskq");
    if !taskq.exists() {
        let mut build = std::process::Command::new(env!("CARGO"));
        build.args(["build", "-q", "-p", "taskq", "--bin", "taskq"]);
        if worker.parent().is_some_and(|d| d.ends_with("release")) {
            build.arg("--release");
        }
        assert!(build.status().unwrap().success(), "building taskq failed");
    }
    taskq
}

/// 10,000 jobs drained by four threads, each connection holding up to
/// `prefetch` jobs, against the reference server: counts equal its ledger and
/// its `stats`, nothing lost, nothing held twice. Returns the worker's counts.
pub fn ten_thousand_jobs_four_threads(prefetch: usize) -> taskq_worker::Snapshot {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    use taskq_worker::{Config, Job, Outcome, Worker};

    let server = taskq_testkit::TestServer::start().unwrap();
    let n = 10_000usize;
    let bodies: Vec<Vec<u8>> = (0..n).map(|i| format!("job-{i}").into_bytes()).collect();
    put_all(server.addr(), "default", 60, &bodies);
    let before = record(server.addr());
    let seen: Arc<Mutex<HashMap<u64, u32>>> = Arc::default();
    let seen2 = seen.clone();
    let worker = Worker::new(
        Config {
            servers: vec![server.addr().to_string()],
            io_timeout: Duration::from_secs(2),
            concurrency: 4,
            max_jobs: Some(n as u64),
            prefetch,
            ..Config::default()
        },
        move |job: &mut Job<'_>| {
            *seen2.lock().unwrap().entry(job.id().get()).or_default() += 1;
            Outcome::Done
        },
    )
    .unwrap();
    let counts = run_bounded(worker, Duration::from_secs(120));
    let after = record(server.addr());
    let report = server.ledger().check();
    eprintln!("prefetch {prefetch}: {report}; worker {counts}");

    assert!(report.is_clean(), "{report}");
    assert!(report.lost.is_empty() && report.double_held.is_empty());
    assert_eq!(report.done, n as u64);
    assert_eq!(report.handed_out_again, 0);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), n);
    assert!(seen.values().all(|&k| k == 1));

    assert_eq!(counts.deleted, n as u64);
    assert_eq!(counts.reserved, n as u64);
    assert_eq!(
        counts.lost_lease
            + counts.lost_lease_on_release
            + counts.ack_unknown
            + counts.lease_dropped,
        0,
        "{counts}"
    );
    // The server's `stats` and its ledger agree with the worker.
    assert_eq!(after.cmd_delete - before.cmd_delete, counts.deleted);
    let workers: Vec<_> = report
        .connections
        .values()
        .filter(|c| c.reserved > 0 || c.cmd_delete > 0)
        .collect();
    // Four handler threads share the worker's one connection to the server.
    assert_eq!(workers.len(), 1, "one connection per server");
    let sum = |f: fn(&taskq_testkit::ConnCounts) -> u64| workers.iter().map(|c| f(c)).sum::<u64>();
    assert_eq!(sum(|c| c.reserved), counts.reserved);
    assert_eq!(sum(|c| c.cmd_delete), counts.deleted);
    assert_eq!(sum(|c| c.deleted), counts.deleted);
    assert_eq!(sum(|c| c.delete_not_found), counts.lost_lease);
    assert_eq!(sum(|c| c.released + c.buried + c.expired), 0);
    assert_eq!(server.job_count(), 0);
    counts
}

/// Runs a worker to its end, or aborts it and fails after `limit`.
pub fn run_bounded(worker: taskq_worker::Worker, limit: Duration) -> taskq_worker::Snapshot {
    join_bounded(worker.start(), limit)
}

/// Waits for a started worker's end, or aborts it and fails after `limit`.
pub fn join_bounded(running: taskq_worker::Running, limit: Duration) -> taskq_worker::Snapshot {
    let control = running.control();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(running.join());
    });
    match rx.recv_timeout(limit) {
        Ok(s) => s,
        Err(_) => {
            control.abort();
            panic!("worker did not finish within {limit:?}");
        }
    }
}

/// JetStream: a management connection to every node of `c` as seeds.
pub fn js_admin(c: &taskq_testkit::NatsCluster) -> taskq_connect::nats::NatsConnection {
    let seeds: Vec<String> = (0..c.len()).map(|i| c.addr(i).to_string()).collect();
    taskq_connect::nats::NatsConnection::connect(&seeds, taskq_connect::nats::NatsConfig::default())
        .expect("admin connection")
}

/// JetStream: the record of tube `tube`'s consumer `taskq-TUBE` on stream `TASKQ`.
pub fn js_consumer(
    c: &taskq_testkit::NatsCluster,
    tube: &str,
) -> taskq_connect::nats::ConsumerInfo {
    js_admin(c)
        .consumer_info("TASKQ", &format!("taskq-{tube}"))
        .expect("consumer info")
}

/// JetStream: the nats-server release `c` runs, `(major, minor, patch)`,
/// as its monitoring port reports it.
pub fn nats_version(c: &taskq_testkit::NatsCluster) -> (u32, u32, u32) {
    let v = c.version().expect("the server's version");
    (v.major, v.minor, v.patch)
}

/// Sends the library worker's logs to the test's output when `RUST_LOG` is
/// set (`RUST_LOG=taskq_worker=debug cargo test ... -- --nocapture`).
pub fn log_from_env() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
}

/// JetStream: creates taskq's stream `TASKQ` (3 replicas on 3 nodes or
/// more) and, with `ack_wait`, tube `tube`'s consumer, before any worker or
/// producer starts. A fresh cluster (or one with a node down) can take
/// longer to answer than a request's deadline: each is asked again, on a
/// new connection, up to ten times (both calls look up before they create).
/// A placement refused while the cluster is still forming (10005, peer
/// offline) the API call itself waits out, as for `taskq` and the workers.
pub fn js_setup(c: &taskq_testkit::NatsCluster, tube: &str, ack_wait: Option<Duration>) {
    use taskq_connect::nats::{ConsumerSpec, StreamSpec};
    use taskq_proto::nats::NatsError;
    let again =
        |what: &str,
         f: &dyn Fn(&mut taskq_connect::nats::NatsConnection) -> Result<(), NatsError>| {
            let mut last = None;
            for _ in 0..10 {
                match f(&mut js_admin(c)) {
                    Ok(()) => return,
                    Err(e @ NatsError::Timeout { .. }) => last = Some(e),
                    Err(e) => panic!("{what}: {e:?}"),
                }
            }
            panic!("{what}: {last:?}");
        };
    again("create the stream", &|a| {
        a.ensure_stream(&StreamSpec {
            name: "TASKQ".into(),
            subjects: vec!["taskq.>".into()],
            replicas: c.len().min(3),
            duplicate_window: None,
        })
        .map(|_| ())
    });
    if let Some(ack_wait) = ack_wait {
        again("create the consumer", &|a| {
            a.ensure_consumer(
                "TASKQ",
                &format!("taskq-{tube}"),
                &ConsumerSpec {
                    filter_subject: format!("taskq.{tube}"),
                    ack_wait,
                    max_deliver: -1,
                    max_ack_pending: 1000,
                    max_waiting: 512,
                },
            )
            .map(|_| ())
        });
    }
}

/// Runs `python3 ARGS...` with a 30 s limit; panics with its output on failure.
pub fn python3(args: &[&std::ffi::OsStr]) {
    let out = Command::new("timeout")
        .args(["30", "python3"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python: {}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Puts `bodies` (none holding NUL) into `tube` at `addr` with the `taskq
/// put --null` command; returns the ids it printed, one per job in order.
pub fn taskq_put_null(addr: &str, tube: &str, bodies: &[&Vec<u8>]) -> Vec<u64> {
    let mut input = Vec::new();
    for b in bodies {
        assert!(!b.contains(&0), "a NUL ends a job on `taskq put --null`");
        input.extend_from_slice(b);
        input.push(0);
    }
    let mut put = Command::new(taskq_cli())
        .args(["put", "--null", "--tube", tube, "--addr", addr])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut put.stdin.take().unwrap(), &input).unwrap();
    let out = put.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "taskq put: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ids: Vec<u64> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(ids.len(), bodies.len(), "one id per job, in input order");
    ids
}

/// The total-queue check of a fault run (docs/reliability.md): the jobs the
/// handler ran (`runs`: times each id ran) against the ids put, and the
/// worker's counts against the server's `cmd-delete` over the run. Asserts
/// lost 0, unexpected 0, duplicates no more than the faults that hit a held
/// job, and the bracket; `what` names the run in the messages. Returns the
/// duplicates.
pub fn check_ledger(
    ids: &std::collections::HashSet<u64>,
    runs: &std::collections::HashMap<u64, u32>,
    counts: &taskq_worker::Snapshot,
    cmd_delete: u64,
    what: &str,
) -> u64 {
    let lost = ids.iter().filter(|id| !runs.contains_key(id)).count();
    let unexpected = runs.keys().filter(|id| !ids.contains(id)).count();
    let duplicates: u64 = runs.values().map(|&k| u64::from(k - 1)).sum();
    eprintln!(
        "{what}: lost {lost}, unexpected {unexpected}, duplicates {duplicates}; {counts}; server cmd-delete {cmd_delete}"
    );
    assert_eq!(lost, 0, "{what}");
    assert_eq!(unexpected, 0, "{what}");
    // A fault can repeat at most the jobs its connection held.
    let hit = counts.lease_dropped
        + counts.ack_unknown
        + counts.lost_lease
        + counts.lost_lease_on_release;
    assert!(
        duplicates <= hit,
        "{what}: duplicates {duplicates} beyond the faults that hit a held job: {counts}"
    );
    assert!(
        counts.deleted + counts.lost_lease <= cmd_delete,
        "{what}: {counts} vs {cmd_delete}"
    );
    assert!(
        cmd_delete <= counts.deleted + counts.lost_lease + counts.ack_unknown,
        "{what}: {counts} vs {cmd_delete}"
    );
    duplicates
}

/// Silences the replies through `proxy` and waits (5 s at most) until the
/// worker whose counters `counters` reads counts a reply deadline missed;
/// returns how long that took.
pub fn silence_until_detected(
    proxy: &taskq_testkit::ChaosProxy,
    counters: impl Fn() -> taskq_worker::Snapshot,
) -> Duration {
    let t = Instant::now();
    proxy.add(
        taskq_testkit::Toxic::Silence,
        taskq_testkit::Direction::Downstream,
        1.0,
    );
    assert!(
        wait_until(Duration::from_secs(5), || counters().io_timeouts >= 1),
        "silence never detected: {}",
        counters()
    );
    t.elapsed()
}

/// User plus system CPU of this process, in clock ticks.
pub fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// One scrape of a metrics endpoint at `addr`: (head, body).
pub fn scrape(addr: &str, path: &str) -> (String, String) {
    let mut s = std::net::TcpStream::connect(addr).expect("connect to metrics");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    std::io::Write::write_fmt(
        &mut s,
        format_args!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n"),
    )
    .unwrap();
    let mut out = String::new();
    std::io::Read::read_to_string(&mut s, &mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("a head");
    (head.to_owned(), body.to_owned())
}

/// Counter `name`'s value in a scrape's body.
pub fn value(body: &str, name: &str) -> u64 {
    let metric = format!("taskq_worker_{name}_total ");
    body.lines()
        .find_map(|l| l.strip_prefix(&metric))
        .unwrap_or_else(|| panic!("{metric} missing in:\n{body}"))
        .trim()
        .parse()
        .unwrap()
}

/// One of `n` async handlers meeting: counts itself in `arrived`, then
/// waits (at most `within`) until all `n` have; true when they all did.
pub async fn rendezvous(
    arrived: &std::sync::atomic::AtomicUsize,
    n: usize,
    within: Duration,
) -> bool {
    use std::sync::atomic::Ordering;
    arrived.fetch_add(1, Ordering::SeqCst);
    let until = Instant::now() + within;
    while arrived.load(Ordering::SeqCst) < n && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    arrived.load(Ordering::SeqCst) >= n
}

/// Runs `f` on `rt` to its end, which must come within `limit`.
pub fn run_within<T>(
    rt: &tokio::runtime::Runtime,
    f: impl std::future::Future<Output = T>,
    limit: Duration,
) -> T {
    rt.block_on(async {
        tokio::time::timeout(limit, f)
            .await
            .expect("the worker ends in time")
    })
}

/// The end of an async worker's panic run (both engines' twins): 2,000
/// jobs, 20 poisoned (each panicking on its three attempts), then, once
/// `settled`, one last job per slot (`concurrency`), which must all run at
/// once (`met`, one entry each). Waits for the last jobs, stops the worker (`h` on
/// `rt`), and checks the counts; `panics`: before the last jobs and in all.
pub fn end_panic_run(
    (rt, h): (
        &tokio::runtime::Runtime,
        tokio::task::JoinHandle<taskq_worker::Snapshot>,
    ),
    control: &taskq_worker::Control,
    settled: bool,
    panics: [u64; 2],
    met: &std::sync::Mutex<Vec<bool>>,
    done_good: &std::sync::atomic::AtomicU64,
    concurrency: usize,
) -> taskq_worker::Snapshot {
    let finished = settled
        && wait_until(Duration::from_secs(30), || {
            control.counters().deleted == 1980 + concurrency as u64
        });
    control.shutdown();
    let counts = run_within(rt, async { h.await.unwrap() }, Duration::from_secs(30));
    eprintln!("{counts}");
    assert!(settled, "not settled within 60 s: {counts}");
    assert!(finished, "the last jobs not done: {counts}");
    assert_eq!(panics, [60, 60], "each poison job three times");
    assert_eq!(
        *met.lock().unwrap(),
        vec![true; concurrency],
        "full concurrency after the last panic"
    );
    assert_eq!(counts.deleted, 1980 + concurrency as u64, "{counts}");
    assert_eq!(done_good.load(std::sync::atomic::Ordering::SeqCst), 1980);
    assert_eq!(counts.panicked, 60, "each poison job three times: {counts}");
    counts
}

/// How many handlers ran at once, at most: each handler [`enter`]s when
/// it starts and [`leave`]s when it ends.
///
/// [`enter`]: Overlap::enter
/// [`leave`]: Overlap::leave
#[derive(Default)]
pub struct Overlap {
    running: std::sync::atomic::AtomicU64,
    most: std::sync::atomic::AtomicU64,
}

impl Overlap {
    pub fn enter(&self) {
        use std::sync::atomic::Ordering;
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
    }

    pub fn leave(&self) {
        self.running
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn most(&self) -> u64 {
        self.most.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// This process's threads now.
pub fn threads() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("Threads:")).unwrap();
    line[8..].trim().parse().unwrap()
}
