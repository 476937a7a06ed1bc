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
