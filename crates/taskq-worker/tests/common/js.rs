//! Helpers of the worker's JetStream fault tests: the worker's settings,
//! a recording handler, a producer thread, the cluster's leaders placed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use taskq_producer::{Producer, PutOptions};
use taskq_testkit::NatsCluster;
use taskq_worker::{Backoff, Config, JetStreamConfig, Job, Outcome};

use super::{js_admin, js_setup, wait_until};

/// One cluster test at a time: the machine has two cores, and three nodes
/// plus workers and producers already fill them.
pub static HEAVY: Mutex<()> = Mutex::new(());

pub fn heavy() -> MutexGuard<'static, ()> {
    HEAVY.lock().unwrap_or_else(|e| e.into_inner())
}

/// A worker on `addr` for `tube`: short deadlines, a 5 s ack wait (a lease a
/// broken connection dropped comes back within the test), and an exit once
/// idle for 5 s.
pub fn js_cfg(addr: &str, tube: &str) -> Config {
    Config {
        servers: vec![addr.to_owned()],
        tubes: vec![tube.into()],
        io_timeout: Duration::from_secs(1),
        reserve_timeout: Duration::from_secs(1),
        reconnect_backoff: Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(500),
            jitter: taskq_worker::Jitter::Full,
        },
        exit_when_idle: Some(Duration::from_secs(5)),
        jetstream: JetStreamConfig {
            ack_wait: Duration::from_secs(5),
            ..JetStreamConfig::default()
        },
        ..Config::default()
    }
}

/// Each body the handler ran, how many times, and when it ran last.
#[derive(Default)]
pub struct Runs {
    pub count: HashMap<Vec<u8>, u32>,
    pub times: Vec<Instant>,
}

pub type SharedRuns = Arc<Mutex<Runs>>;

/// A handler that records each run and takes 1 ms.
pub fn recording(runs: &SharedRuns) -> impl Fn(&mut Job<'_>) -> Outcome {
    let runs = runs.clone();
    move |job: &mut Job<'_>| {
        std::thread::sleep(Duration::from_millis(1));
        let mut r = runs.lock().unwrap();
        *r.count.entry(job.body().to_vec()).or_default() += 1;
        r.times.push(Instant::now());
        Outcome::Done
    }
}

pub fn runs_done(runs: &SharedRuns) -> usize {
    runs.lock().unwrap().count.len()
}

/// A job's body and the node its worker took it through.
pub type Peer = (Vec<u8>, std::net::SocketAddr);

/// A handler that records each job's body and the node it came through.
pub fn peer_recording(peers: &Arc<Mutex<Vec<Peer>>>) -> impl Fn(&mut Job<'_>) -> Outcome {
    let peers = peers.clone();
    move |job: &mut Job<'_>| {
        peers
            .lock()
            .unwrap()
            .push((job.body().to_vec(), job.peer_addr()));
        Outcome::Done
    }
}

/// What a producer thread got: the bodies the stream acknowledged, and the
/// puts that failed (their outcome unknown: they may be stored).
pub struct Produced {
    pub acked: Vec<Vec<u8>>,
    pub failed: usize,
}

/// Puts `bodies` one at a time, `gap` apart, through `addr`.
pub fn produce(addr: &str, tube: &str, bodies: &[Vec<u8>], gap: Duration) -> Produced {
    let mut p = Producer::builder()
        .tube(tube)
        .io_timeout(Duration::from_secs(1))
        .resolve_for(Duration::from_secs(30))
        .connect(addr)
        .expect("producer connects");
    let mut out = Produced {
        acked: Vec::with_capacity(bodies.len()),
        failed: 0,
    };
    for b in bodies {
        match p.put(b, PutOptions::default()) {
            Ok(_) => out.acked.push(b.clone()),
            Err(e) => {
                eprintln!("put {:?} failed: {e}", String::from_utf8_lossy(b));
                out.failed += 1;
            }
        }
        std::thread::sleep(gap);
    }
    out
}

/// Asks the cluster (`$JS.API.<what>.LEADER.STEPDOWN...`) to elect another
/// leader; true when it said it would. A cluster busy electing or catching
/// a replica up may refuse (503) or not answer in time: the caller asks
/// again.
fn step_down(c: &NatsCluster, subject: &str) -> bool {
    let reply = js_admin(c).request(subject, b"", Duration::from_secs(5));
    let done = reply
        .as_deref()
        .is_ok_and(|r| String::from_utf8_lossy(r).contains("\"success\":true"));
    if !done {
        std::thread::sleep(Duration::from_millis(500));
    }
    done
}

/// Steps the consumer's leadership down until `fits(stream leader,
/// consumer leader, meta leader)`; returns the three.
pub fn place_consumer_leader(
    c: &NatsCluster,
    consumer: &str,
    fits: impl Fn(usize, usize, usize) -> bool,
) -> (usize, usize, usize) {
    for _ in 0..20 {
        let leaders = (
            c.stream_leader("TASKQ"),
            c.consumer_leader("TASKQ", consumer),
            c.meta_leader(),
        );
        let (Some(s), Some(k), Some(m)) = leaders else {
            std::thread::sleep(Duration::from_millis(500));
            continue;
        };
        if fits(s, k, m) {
            return (s, k, m);
        }
        let subject = format!("$JS.API.CONSUMER.LEADER.STEPDOWN.TASKQ.{consumer}");
        if step_down(c, &subject) {
            // Elected in a moment, or (2.9, with a replica catching up)
            // not at all: the next round asks again.
            wait_until(Duration::from_secs(15), || {
                c.consumer_leader("TASKQ", consumer).is_some_and(|l| l != k)
            });
        }
    }
    panic!("the consumer's leader would not move");
}

/// Steps the stream's leadership down until node `want` leads it.
pub fn place_stream_leader(c: &NatsCluster, want: usize) {
    for _ in 0..20 {
        let Some(s) = c.stream_leader("TASKQ") else {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        if s == want {
            return;
        }
        if step_down(c, "$JS.API.STREAM.LEADER.STEPDOWN.TASKQ") {
            wait_until(Duration::from_secs(15), || {
                c.stream_leader("TASKQ").is_some_and(|l| l != s)
            });
        }
    }
    panic!("the stream's leadership would not move to n{}", want + 1);
}

/// One node with `body` put on `tube` (its consumer made first with
/// `ack_wait`, when given).
pub fn one_job(tube: &str, body: &[u8], ack_wait: Option<Duration>) -> NatsCluster {
    let c = NatsCluster::start(1).unwrap();
    js_setup(&c, tube, ack_wait);
    let put = produce(&c.url(), tube, &[body.to_vec()], Duration::ZERO);
    assert_eq!(put.acked.len(), 1);
    c
}

/// Node `i`'s monitoring port, read from the `-m PORT` its command line
/// was started with (the harness keeps the port to itself).
pub fn monitor_port(c: &NatsCluster, i: usize) -> u16 {
    let pid = c.pid(i).expect("the node runs");
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("the node's command line");
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    let at = args
        .iter()
        .position(|a| *a == b"-m")
        .expect("the node was started with -m");
    std::str::from_utf8(args[at + 1])
        .ok()
        .and_then(|p| p.parse().ok())
        .expect("a monitoring port")
}

/// A GET of `path` on node `i`'s monitoring port (`/varz`, `/connz`, ...),
/// parsed as JSON: a bare HTTP/1.0 request, bounded by two seconds.
pub fn monitor_json(c: &NatsCluster, i: usize, path: &str) -> serde_json::Value {
    use std::io::{Read, Write};
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], monitor_port(c, i)));
    let limit = Duration::from_secs(2);
    let mut s = std::net::TcpStream::connect_timeout(&addr, limit).expect("the monitoring port");
    s.set_read_timeout(Some(limit)).unwrap();
    s.set_write_timeout(Some(limit)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.take(16 << 20).read_to_end(&mut raw).unwrap();
    let start = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("the end of the HTTP headers");
    serde_json::from_slice(&raw[start + 4..])
        .unwrap_or_else(|e| panic!("{path} on n{}: {e}", i + 1))
}

/// Client connections node `i` has accepted since it started (`/varz`
/// `total_connections`; routes and the monitoring port's own are not clients).
pub fn total_connections(c: &NatsCluster, i: usize) -> u64 {
    let v = monitor_json(c, i, "/varz");
    v["total_connections"]
        .as_u64()
        .unwrap_or_else(|| panic!("no total_connections in /varz: {v}"))
}

/// Client connections open on node `i` now (`/connz` `num_connections`).
pub fn open_connections(c: &NatsCluster, i: usize) -> u64 {
    let v = monitor_json(c, i, "/connz");
    v["num_connections"]
        .as_u64()
        .unwrap_or_else(|| panic!("no num_connections in /connz: {v}"))
}

/// The messages stream `TASKQ` holds on each subject, as the stream's own
/// record gives them (`STREAM.INFO` with a subjects filter); a subject with
/// none is absent.
pub fn js_subjects(c: &NatsCluster) -> HashMap<String, u64> {
    js_subjects_on(&mut js_admin(c)).expect("stream info")
}

/// [`js_subjects`] on an open connection.
pub fn js_subjects_on(
    a: &mut taskq_connect::nats::NatsConnection,
) -> Result<HashMap<String, u64>, taskq_proto::nats::NatsError> {
    let v = a.api_request(
        "$JS.API.STREAM.INFO.TASKQ",
        &serde_json::json!({ "subjects_filter": ">" }),
    )?;
    let mut out = HashMap::new();
    if let Some(m) = v["state"]["subjects"].as_object() {
        for (k, n) in m {
            out.insert(k.clone(), n.as_u64().unwrap_or(0));
        }
    }
    Ok(out)
}

/// Consumer `taskq-TUBE`'s info as the server gives it, whole (its ack
/// floor, its pause, its config).
pub fn js_consumer_json(c: &NatsCluster, tube: &str) -> serde_json::Value {
    let subject = format!("$JS.API.CONSUMER.INFO.TASKQ.taskq-{tube}");
    let reply = js_admin(c)
        .request(&subject, b"", Duration::from_secs(5))
        .expect("consumer info");
    serde_json::from_slice(&reply).expect("consumer info is JSON")
}

/// The stream sequence of consumer `taskq-TUBE`'s ack floor.
pub fn js_ack_floor(c: &NatsCluster, tube: &str) -> u64 {
    let v = js_consumer_json(c, tube);
    v["ack_floor"]["stream_seq"]
        .as_u64()
        .unwrap_or_else(|| panic!("no ack floor in {v}"))
}
