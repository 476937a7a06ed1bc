//! `taskq pause` on JetStream: the tube's consumer paused and resumed on a
//! current nats-server, and refused, naming the version, on Debian's 2.9.10,
//! with nothing changed. Each cluster is started from the binary it needs,
//! whatever `PATH` holds.

mod cli_common;

use std::path::Path;
use std::time::Duration;

use cli_common::taskq;
use serde_json::Value;
use taskq_proto::nats::{ConsumerSpec, Delivery, NatsConfig, NatsConnection};
use taskq_testkit::NatsCluster;

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
    let (out, _) = taskq(
        &["put", "--addr", &c.url(), "--tube", "p", "1", "2", "3"],
        b"",
        Duration::from_secs(30),
    );
    assert!(out.status.success());
    let mut a = admin(c);
    let spec = ConsumerSpec {
        filter_subject: "taskq.p".into(),
        ack_wait: Duration::from_secs(60),
        max_deliver: -1,
        max_ack_pending: 1000,
        max_waiting: 512,
    };
    a.ensure_consumer("TASKQ", "taskq-p", &spec).unwrap();
    a
}

/// The consumer's info as the server gives it.
fn consumer_json(a: &mut NatsConnection) -> Value {
    let reply = a
        .request(
            "$JS.API.CONSUMER.INFO.TASKQ.taskq-p",
            b"",
            Duration::from_secs(5),
        )
        .unwrap();
    serde_json::from_slice(&reply).unwrap()
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
    // A tube no worker has asked for has no consumer to pause.
    let (code, _, err) = run(&c, &["pause", "--tube", "nobody", "5"]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("tube nobody has no consumer taskq-nobody yet"),
        "{err}"
    );
    drop(c);

    // nats-server 2.9.10 has no consumer pause: refused by name, nothing changed.
    let c = cluster_of(Path::new("/usr/sbin/nats-server"));
    let mut a = tube_with_consumer(&c);
    let (code, out, err) = run(&c, &["pause", "--tube", "p", "30"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        err.starts_with("taskq: pause is not supported on nats-server 2.9.10 at nats://"),
        "{err}"
    );
    assert!(err.contains("2.11"), "{err}");
    assert!(consumer_json(&mut a).get("paused").is_none());
    assert!(pull_gets_a_job(&mut a), "the tube still hands jobs out");
}
