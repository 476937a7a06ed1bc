//! `taskq pause` on JetStream: the tube's consumer paused and resumed on a
//! current nats-server, created paused (as a worker would create it) when no
//! worker has run yet, and kept paused by a worker started later; refused,
//! naming the version, on Debian's 2.9.10, with nothing changed or created.
//! Each cluster is started from the binary it needs, whatever `PATH` holds.

mod cli_common;

use std::path::Path;
use std::time::{Duration, Instant};

use cli_common::taskq;
use serde_json::Value;
use taskq_connect::nats::{ConsumerSpec, NatsConfig, NatsConnection};
use taskq_connect::Layout;
use taskq_proto::nats::Delivery;
use taskq_testkit::NatsCluster;
use taskq_worker::{Config, JetStreamConfig, Job, Outcome, Snapshot, Worker};

/// A 1-node cluster of `binary`.
fn cluster_of(binary: &Path) -> NatsCluster {
    NatsCluster::builder().binary(binary).start().unwrap()
}

fn admin(c: &NatsCluster) -> NatsConnection {
    let cfg = NatsConfig {
        io_timeout: Duration::from_secs(5),
        ..NatsConfig::default()
    };
    NatsConnection::connect(&[c.addr(0).to_string()], cfg).unwrap()
}

/// Tube `p` with three jobs and its consumer, as a worker would make it.
fn tube_with_consumer(c: &NatsCluster) -> NatsConnection {
    let mut a = tube_without_consumer(c);
    a.ensure_consumer("TASKQ", "taskq-p", &worker_spec("p"))
        .unwrap();
    a
}

/// The consumer a worker with the default settings makes for `tube`.
fn worker_spec(tube: &str) -> ConsumerSpec {
    let layout = Layout::new("TASKQ").unwrap();
    JetStreamConfig::default().consumer_spec(&layout, tube)
}

/// Consumer `name`'s info as the server gives it.
fn info_of(a: &mut NatsConnection, name: &str) -> Value {
    let reply = a
        .request(
            &format!("$JS.API.CONSUMER.INFO.TASKQ.{name}"),
            b"",
            Duration::from_secs(5),
        )
        .unwrap();
    serde_json::from_slice(&reply).unwrap()
}

/// Tube `p`'s consumer's info as the server gives it.
fn consumer_json(a: &mut NatsConnection) -> Value {
    info_of(a, "taskq-p")
}

/// Puts jobs `1`, `2` and `3` on tube `p`, and nothing else: no consumer.
fn tube_without_consumer(c: &NatsCluster) -> NatsConnection {
    let (out, _) = taskq(
        &["put", "--addr", &c.url(), "--tube", "p", "1", "2", "3"],
        b"",
        Duration::from_secs(30),
    );
    assert!(out.status.success());
    admin(c)
}

/// A library worker on `tube` for `secs` seconds (then stopped), each job done.
fn worker_for(c: &NatsCluster, tube: &str, secs: u64) -> Snapshot {
    worker_until(c, tube, || true, Duration::from_secs(secs))
}

/// A library worker on `tube`, each job done, stopped `hold` after `ready`
/// first holds (checked every 50 ms; the test fails if it does not within
/// 20 s).
fn worker_until(
    c: &NatsCluster,
    tube: &str,
    mut ready: impl FnMut() -> bool,
    hold: Duration,
) -> Snapshot {
    let running = Worker::new(
        Config {
            servers: vec![c.url()],
            tubes: vec![tube.into()],
            io_timeout: Duration::from_secs(5),
            reserve_timeout: Duration::from_secs(1),
            ..Config::default()
        },
        |_: &mut Job<'_>| Outcome::Done,
    )
    .unwrap()
    .start();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut in_time = true;
    while !ready() {
        if Instant::now() > deadline {
            in_time = false;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if in_time {
        std::thread::sleep(hold);
    }
    running.control().shutdown();
    let snapshot = running.join();
    assert!(in_time, "not ready within 20 s: {snapshot:?}");
    snapshot
}

/// `taskq pause --tube p 30` on nats-server 2.9.10: refused, naming the
/// version and the first with consumer pause.
fn pause_is_refused_by_version(c: &NatsCluster) {
    let (code, out, err) = run(c, &["pause", "--tube", "p", "30"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        err.starts_with("taskq: pause is not supported on nats-server 2.9.10 at nats://"),
        "{err}"
    );
    assert!(err.contains("2.11"), "{err}");
}

/// True when the consumer looked up is not there.
fn missing(r: Result<taskq_connect::nats::ConsumerInfo, taskq_proto::nats::NatsError>) -> bool {
    matches!(r, Err(taskq_proto::nats::NatsError::Api(e)) if e.code == 404)
}

/// The consumer's settings that a worker chooses: its config without its
/// names, its filter and its pause, and without the API level the server
/// records that config needs (`_nats.req.level`: 1 with a pause, else 0).
fn settings(info: &Value) -> Value {
    let mut cfg = info["config"].clone();
    let m = cfg.as_object_mut().unwrap();
    for k in ["name", "durable_name", "filter_subject", "pause_until"] {
        m.remove(k);
    }
    if let Some(meta) = m.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("_nats.req.level");
    }
    cfg
}

/// Whether a pull of one message, waiting up to a second, gets one.
fn pull_gets_a_job(a: &mut NatsConnection) -> bool {
    a.pull("TASKQ", "taskq-p", 1, Duration::from_secs(1), None)
        .unwrap();
    matches!(a.next_delivery().unwrap(), Delivery::Msg { .. })
}

/// `taskq ARGS --addr URL`: exit status, stdout, stderr.
fn run(c: &NatsCluster, args: &[&str]) -> (Option<i32>, String, String) {
    let url = c.url();
    let mut all = args.to_vec();
    all.extend(["--addr", &url, "--io-timeout", "5000"]);
    let (out, _) = taskq(&all, b"", Duration::from_secs(30));
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn pause_holds_a_tubes_jobs_on_a_current_server_and_is_refused_on_2_9_10() {
    // A current server: the consumer is paused, hands out nothing, and resumes.
    let c = cluster_of(&taskq_testkit::current_server_binary().unwrap());
    let mut a = tube_with_consumer(&c);
    let (code, out, err) = run(&c, &["pause", "--tube", "p", "30"]);
    assert_eq!(
        (code, out.as_str()),
        (Some(0), "paused p for 30 s\n"),
        "{err}"
    );
    let info = consumer_json(&mut a);
    assert_eq!(info["paused"], true, "{info}");
    let left = info["pause_remaining"].as_u64().unwrap();
    assert!(
        (25_000_000_000..=31_000_000_000).contains(&left),
        "{left} ns left"
    );
    assert!(
        !pull_gets_a_job(&mut a),
        "a paused consumer handed out a job"
    );
    let tubes: Value = serde_json::from_str(&run(&c, &["tubes", "--json"]).1).unwrap();
    let paused = tubes[0]["paused"].as_u64().unwrap();
    assert!((25..=30).contains(&paused), "{tubes}");
    let (code, out, err) = run(&c, &["pause", "--tube", "p", "0"]);
    assert_eq!((code, out.as_str()), (Some(0), "resumed p\n"), "{err}");
    assert_ne!(consumer_json(&mut a)["paused"], true, "no longer paused");
    assert!(pull_gets_a_job(&mut a), "resumed, it hands jobs out again");
    // A tube no worker has asked for has no pause to end.
    let (code, _, err) = run(&c, &["pause", "--tube", "nobody", "0"]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("tube nobody has no consumer taskq-nobody yet") && err.contains("not paused"),
        "{err}"
    );
    drop(c);

    // nats-server 2.9.10 has no consumer pause: refused by name, nothing changed.
    let c = cluster_of(Path::new("/usr/sbin/nats-server"));
    let mut a = tube_with_consumer(&c);
    pause_is_refused_by_version(&c);
    assert!(consumer_json(&mut a).get("paused").is_none());
    assert!(pull_gets_a_job(&mut a), "the tube still hands jobs out");
}

/// Before any worker has run, on a current server: `pause` creates the tube's
/// consumer with the settings a worker gives it, paused from the start; a
/// worker started later is handed nothing and leaves the pause as it was;
/// nor does the create request a worker sends when it finds no consumer
/// (it would update an existing one). Resumed, the jobs are done.
#[test]
fn pause_before_any_worker_creates_the_consumer_paused_and_a_later_worker_keeps_the_pause() {
    let c = cluster_of(&taskq_testkit::current_server_binary().unwrap());
    let mut a = tube_without_consumer(&c);
    assert!(
        missing(a.consumer_info("TASKQ", "taskq-p")),
        "no consumer yet"
    );
    let (code, out, err) = run(&c, &["pause", "--tube", "p", "30"]);
    assert_eq!(
        (code, out.as_str()),
        (Some(0), "paused p for 30 s\n"),
        "{err}"
    );
    let paused_at = Instant::now();
    let info = consumer_json(&mut a);
    assert_eq!(info["paused"], true, "{info}");
    let until = info["config"]["pause_until"].clone();
    assert!(until.is_string(), "{info}");

    // The worker's settings, by the one function that makes them ...
    let spec = worker_spec("p");
    let got = a.consumer_info("TASKQ", "taskq-p").unwrap();
    assert_eq!(got.filter_subject, "taskq.p");
    assert_eq!(
        (
            got.filter_subject.as_str(),
            got.ack_wait,
            got.max_deliver,
            got.max_ack_pending
        ),
        (
            spec.filter_subject.as_str(),
            spec.ack_wait,
            spec.max_deliver,
            spec.max_ack_pending
        )
    );
    assert_eq!(info["config"]["ack_policy"], "explicit", "{info}");
    // ... and as a worker really made its own tube's: the same config.
    let w = worker_until(
        &c,
        "w",
        || a.consumer_info("TASKQ", "taskq-w").is_ok(),
        Duration::ZERO,
    );
    assert_eq!(w.deleted, 0);
    let worker_made = info_of(&mut a, "taskq-w");
    assert_eq!(worker_made["config"]["filter_subject"], "taskq.w");
    assert_eq!(
        settings(&info),
        settings(&worker_made),
        "{info}\n{worker_made}"
    );

    // A worker started during the pause gets nothing, though its pull waits
    // on the consumer (which holds three jobs), and the pause stays.
    let done = worker_until(
        &c,
        "p",
        || a.consumer_info("TASKQ", "taskq-p").unwrap().num_waiting > 0,
        Duration::from_secs(2),
    );
    assert_eq!((done.reserved, done.deleted), (0, 0), "{done:?}");
    let after = consumer_json(&mut a);
    assert_eq!(after["paused"], true, "{after}");
    assert_eq!(after["config"]["pause_until"], until, "the same pause");
    let left = Duration::from_nanos(after["pause_remaining"].as_u64().unwrap());
    let gone = paused_at.elapsed();
    assert!(
        left <= Duration::from_secs(31).saturating_sub(gone),
        "{left:?} left {gone:?} after a 30 s pause"
    );
    assert_eq!(after["num_pending"], 3, "{after}");

    // The create request a worker sends when it finds no consumer, sent to
    // this existing one (a worker that lost the race with pause): still paused.
    let raced = a.create_consumer("TASKQ", "taskq-p", &spec, None).unwrap();
    assert!(raced.paused, "{raced:?}");
    assert_eq!(consumer_json(&mut a)["config"]["pause_until"], until);

    // Resumed: a worker does the three jobs.
    let (code, out, err) = run(&c, &["pause", "--tube", "p", "0"]);
    assert_eq!((code, out.as_str()), (Some(0), "resumed p\n"), "{err}");
    // A create request with a pause does not pause an existing consumer
    // (why pause, when a worker made the consumer first, pauses it after).
    let later = std::time::SystemTime::now() + Duration::from_secs(30);
    let raced = a
        .create_consumer("TASKQ", "taskq-p", &spec, Some(later))
        .unwrap();
    assert!(!raced.paused, "{raced:?}");
    let done = worker_for(&c, "p", 3);
    assert_eq!(done.deleted, 3, "{done:?}");

    // --ack-wait: the consumer pause creates has the worker's --ack-wait.
    let (code, _, err) = run(&c, &["pause", "--tube", "q", "30", "--ack-wait", "90"]);
    assert_eq!(code, Some(0), "{err}");
    let q = a.consumer_info("TASKQ", "taskq-q").unwrap();
    assert_eq!((q.ack_wait, q.paused), (Duration::from_secs(90), true));
}

/// Before any worker has run, on nats-server 2.9.10: refused by version, and
/// no consumer made (2.9.10 would create one from a config with `pause_until`,
/// ignoring the pause).
#[test]
fn pause_before_any_worker_on_2_9_10_is_refused_by_version_and_creates_nothing() {
    let c = cluster_of(Path::new("/usr/sbin/nats-server"));
    let mut a = tube_without_consumer(&c);
    pause_is_refused_by_version(&c);
    assert!(
        missing(a.consumer_info("TASKQ", "taskq-p")),
        "no consumer made"
    );
}
