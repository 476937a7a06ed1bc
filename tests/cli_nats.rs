//! The `taskq` command against real nats-server clusters on loopback:
//! `stats` and `tubes` beside the stream's and consumers' own record, `kick`
//! moving buried jobs back byte-exact (and once after a crash), `peek`,
//! `delete` and `kick-job` by sequence, the commands JetStream cannot serve
//! refused, `--stream` and `--replicas`, `bench`, and `demo` on a cluster.
//! (`top`, the exporter and `pause` on JetStream: tests/cli_nats_ops.rs.)

mod cli_common;

use std::collections::BTreeMap;
use std::time::Duration;

use cli_common::{ids, ok, pull_one, taskq};
use serde_json::Value;
use taskq_connect::nats::{ConsumerSpec, MsgSelect, NatsConfig, NatsConnection, StoredMsg};
use taskq_proto::nats::{AckKind, Delivery, HeaderBlock, NatsError};
use taskq_testkit::{NatsCluster, ServerVersion};
use taskq_worker::{Config, Job, Outcome, Snapshot, Worker};

/// Generous for a loaded 2-core machine running 3-node clusters.
const IO: &str = "5000";

fn admin(c: &NatsCluster) -> NatsConnection {
    let seeds: Vec<String> = (0..c.len()).map(|i| c.addr(i).to_string()).collect();
    let cfg = NatsConfig {
        io_timeout: Duration::from_secs(5),
        ..NatsConfig::default()
    };
    NatsConnection::connect(&seeds, cfg).expect("admin connection")
}

/// `taskq ARGS --addr URL --io-timeout 5000`, expected to succeed; its stdout.
fn run(url: &str, args: &[&str]) -> String {
    let mut all = args.to_vec();
    all.extend(["--addr", url, "--io-timeout", IO]);
    ok(&all, b"")
}

/// Expects exit status 1 and one error on stderr containing `want`.
fn fails(url: &str, args: &[&str], want: &str) {
    let mut all = args.to_vec();
    all.extend(["--addr", url, "--io-timeout", IO]);
    let (out, _) = taskq(&all, b"", Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{all:?}: {err}");
    assert!(err.starts_with("taskq: "), "{all:?}: {err}");
    assert!(err.contains(want), "{all:?}: {err}");
}

/// The server holds delayed jobs (message schedules, nats-server 2.12+), so
/// a stream taskq creates has them.
fn schedules(c: &NatsCluster) -> bool {
    c.version().unwrap() >= ServerVersion::new(2, 12, 0)
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// Runs a worker on `tube` until it is idle for 2 s; `f` decides each job.
fn work(c: &NatsCluster, tube: &str, f: fn(&[u8]) -> Outcome) -> Snapshot {
    Worker::new(
        Config {
            servers: vec![c.url()],
            tubes: vec![tube.into()],
            io_timeout: Duration::from_secs(5),
            exit_when_idle: Some(Duration::from_secs(2)),
            max_attempts: 1,
            ..Config::default()
        },
        move |job: &mut Job<'_>| f(job.body()),
    )
    .unwrap()
    .run()
}

/// Every message on `subject`, oldest first.
fn on_subject(a: &mut NatsConnection, stream: &str, subject: &str) -> Vec<StoredMsg> {
    let mut out = Vec::new();
    let mut seq = 1;
    while let Ok(m) = a.msg_get(stream, MsgSelect::NextBySubject { subject, seq }) {
        seq = m.seq + 1;
        out.push(m);
    }
    out
}

/// A stored message's headers, by name.
fn headers(m: &StoredMsg) -> BTreeMap<String, String> {
    HeaderBlock::parse(&m.headers)
        .unwrap()
        .iter()
        .map(|(k, v)| {
            (
                String::from_utf8(k.to_vec()).unwrap(),
                String::from_utf8(v.to_vec()).unwrap(),
            )
        })
        .collect()
}

/// The consumer a worker of `tube` would make.
fn consumer_spec(tube: &str) -> ConsumerSpec {
    ConsumerSpec {
        filter_subject: format!("taskq.{tube}"),
        ack_wait: Duration::from_secs(60),
        max_deliver: -1,
        max_ack_pending: 1000,
        max_waiting: 512,
    }
}

/// The object of `name` in an array of objects keyed by `key`.
fn find<'a>(all: &'a Value, key: &str, name: &str) -> &'a Value {
    all.as_array()
        .unwrap()
        .iter()
        .find(|t| t[key] == name)
        .unwrap_or_else(|| panic!("no {name} in {all}"))
}

#[test]
fn stats_and_tubes_show_the_stream_and_each_consumer_as_the_cluster_records_them() {
    let c = NatsCluster::start(3).unwrap();
    let url = c.url();
    assert_eq!(
        ids(&run(
            &url,
            &["put", "--tube", "a", "1", "2", "3", "4", "5", "6"]
        ))
        .len(),
        6
    );
    run(&url, &["put", "--tube", "b", "x", "y", "z"]);

    // Partial work on a: two done, one held, one nak'ed and held again
    // (redelivered), two never delivered.
    let mut a = admin(&c);
    a.ensure_consumer("TASKQ", "taskq-a", &consumer_spec("a"))
        .unwrap();
    for _ in 0..2 {
        let (ack, _) = pull_one(&mut a, "a");
        assert!(a.ack(&ack, AckKind::Ack, true).unwrap());
    }
    pull_one(&mut a, "a");
    let (ack, _) = pull_one(&mut a, "a");
    assert!(a.ack(&ack, AckKind::Nak { delay: None }, true).unwrap());
    let (_, delivered) = pull_one(&mut a, "a");
    assert_eq!(delivered, 2, "the nak'ed job came back first");
    // Tube c: a consumer and a worker's pull waiting on it, no job.
    let mut waiter = admin(&c);
    waiter
        .ensure_consumer("TASKQ", "taskq-c", &consumer_spec("c"))
        .unwrap();
    // A pull sent before the consumer's interest reached the waiter's node
    // is answered "no responders" and never waits: first a no-wait pull
    // must come back "no messages" through the same path, so that the
    // waiting pull reaches the consumer by construction, not by timing.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        waiter.pull_no_wait("TASKQ", "taskq-c", 1).unwrap();
        match waiter.next_delivery() {
            Ok(Delivery::NoMessages) => break,
            Err(NatsError::NoResponders) => {}
            other => panic!("a no-wait pull of an empty tube: {other:?}"),
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no path to the consumer"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    waiter
        .pull("TASKQ", "taskq-c", 1, Duration::from_secs(40), None)
        .unwrap();
    // The waiting pull reaches the consumer's leader.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while a.consumer_info("TASKQ", "taskq-c").unwrap().num_waiting == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the pull never waited"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // What the cluster itself records.
    let s = a.stream_info("TASKQ").unwrap();
    assert_eq!((s.messages, s.last_seq, s.replicas), (7, 9, 3));
    let ca = a.consumer_info("TASKQ", "taskq-a").unwrap();
    assert_eq!(
        (
            ca.num_pending,
            ca.num_ack_pending,
            ca.num_redelivered,
            ca.num_waiting
        ),
        (2, 2, 1, 0)
    );

    // stats --json: the stream's record, the beanstalkd totals, each consumer.
    let st = json(&run(&url, &["stats", "--json"]));
    assert_eq!(st["engine"], "nats");
    assert_eq!(st["stream"], "TASKQ");
    assert_eq!(st["subjects"], "taskq.>");
    assert_eq!(st["retention"], "workqueue");
    assert_eq!(st["replicas"], 3);
    assert_eq!(st["messages"], s.messages);
    assert_eq!(st["last-seq"], s.last_seq);
    assert_eq!(st["first-seq"], s.first_seq);
    assert_eq!(st["consumer-count"], 2);
    assert_eq!(st["current-tubes"], 3);
    // a: 2 pending; b: 3 stored, no consumer yet; c: none.
    assert_eq!(st["current-jobs-ready"], 5);
    assert_eq!(st["current-jobs-reserved"], 2);
    assert_eq!(st["current-jobs-buried"], 0);
    assert_eq!(st["current-waiting"], 1);
    let list = &st["consumers"];
    assert_eq!(list.as_array().unwrap().len(), 2, "{list}");
    let ja = find(list, "consumer", "taskq-a");
    assert_eq!(ja["tube"], "a");
    assert_eq!(ja["filter-subject"], "taskq.a");
    assert_eq!(ja["num-pending"], ca.num_pending);
    assert_eq!(ja["num-ack-pending"], ca.num_ack_pending);
    assert_eq!(ja["num-redelivered"], ca.num_redelivered);
    assert_eq!(ja["num-waiting"], 0);
    assert_eq!(
        ja["delivered"], 5,
        "5 deliveries: 2 acked, 1 held, 1 nak'ed, its redelivery"
    );
    assert_eq!(ja["ack-wait"], 60);
    let jc = find(list, "consumer", "taskq-c");
    assert_eq!(
        (jc["num-waiting"].as_u64(), jc["num-pending"].as_u64()),
        (Some(1), Some(0))
    );

    // The table: the same pairs, then one row per consumer.
    let table = run(&url, &["stats"]);
    let words: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    for want in [
        vec!["engine", "nats"],
        vec!["messages", "7"],
        vec!["last-seq", "9"],
        vec!["current-jobs-ready", "5"],
        "CONSUMER TUBE PENDING ACK-PENDING REDELIVERED WAITING ACK-WAIT"
            .split(' ')
            .collect(),
        vec!["taskq-a", "a", "2", "2", "1", "0", "60s"],
        vec!["taskq-c", "c", "0", "0", "0", "1", "60s"],
    ] {
        assert!(words.contains(&want), "{want:?} in\n{table}");
    }

    // One tube, as stats-tube names it and as its consumer records it.
    let ta = json(&run(&url, &["stats", "--tube", "a", "--json"]));
    assert_eq!(ta["name"], "a");
    assert_eq!(ta["current-jobs-ready"], 2);
    assert_eq!(ta["current-jobs-reserved"], 2);
    assert_eq!(ta["stored"], 4, "6 put, 2 acked");
    assert_eq!(ta["consumer"], "taskq-a");
    assert_eq!(ta["num-redelivered"], 1);
    let tb = run(&url, &["stats", "--tube", "b"]);
    assert!(
        tb.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["current-jobs-ready", "3"]),
        "{tb}"
    );
    fails(
        &url,
        &["stats", "--tube", "nosuch"],
        "no tube named \"nosuch\"",
    );

    // tubes: beanstalkd's keys, then the consumer's.
    let tubes = json(&run(&url, &["tubes", "--json"]));
    assert_eq!(tubes.as_array().unwrap().len(), 3, "{tubes}");
    let ta = find(&tubes, "name", "a");
    for (k, v) in [
        ("ready", 2),
        ("urgent", 0),
        ("reserved", 2),
        ("buried", 0),
        ("waiting", 0),
        ("paused", 0),
        ("redelivered", 1),
        ("stored", 4),
    ] {
        assert_eq!(ta[k], v, "{k} in {ta}");
    }
    if schedules(&c) {
        assert_eq!(ta["delayed"], 0, "the server holds delayed jobs apart");
    } else {
        assert!(
            ta["delayed"].is_null(),
            "a delay the client holds is not known before delivery"
        );
    }
    assert_eq!(ta["consumer"], "taskq-a");
    let tb = find(&tubes, "name", "b");
    assert_eq!(
        (tb["ready"].as_u64(), tb["reserved"].as_u64()),
        (Some(3), Some(0))
    );
    assert!(tb["consumer"].is_null());
    assert_eq!(find(&tubes, "name", "c")["waiting"], 1);
    let table = run(&url, &["tubes"]);
    let rows: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    // Delayed: none held apart, or unknown without message schedules.
    let delayed = if schedules(&c) { "0" } else { "-" };
    assert_eq!(
        rows,
        [
            vec![
                "TUBE",
                "READY",
                "URGENT",
                "RESERVED",
                "DELAYED",
                "BURIED",
                "WAITING",
                "PAUSED",
                "REDELIVERED",
                "STORED",
                "CONSUMER"
            ],
            vec!["a", "2", "0", "2", delayed, "0", "0", "0", "1", "4", "taskq-a"],
            vec!["b", "3", "0", "0", delayed, "0", "0", "0", "-", "3", "-"],
            vec!["c", "0", "0", "0", delayed, "0", "1", "0", "0", "0", "taskq-c"],
        ]
    );

    // --replicas: a stream this put creates keeps one copy; TASKQ keeps three.
    run(
        &url,
        &[
            "put",
            "--stream",
            "ONE",
            "--replicas",
            "1",
            "--tube",
            "t",
            "j",
        ],
    );
    assert_eq!(a.stream_info("ONE").unwrap().replicas, 1);
    assert_eq!(a.stream_info("TASKQ").unwrap().replicas, 3);
}

/// The jobs the kick test buries: binary bodies, headers with them.
fn kick_jobs() -> Vec<(Vec<u8>, String)> {
    vec![
        (b"\x00\x01\xff\r\nbinary\r\n".to_vec(), "t-0".into()),
        ((0..=255u8).collect(), "t-1 with spaces".into()),
        (b"\r\n\r\nPUB x 1\r\n".to_vec(), "t-2".into()),
    ]
}

#[test]
fn kick_moves_buried_jobs_back_byte_exact_once_and_a_worker_then_does_them() {
    let c = NatsCluster::start(1).unwrap();
    let url = c.url();
    run(&url, &["put", "--tube", "k", "plain"]);
    let mut a = admin(&c);
    for (i, (body, trace)) in kick_jobs().iter().enumerate() {
        let id = format!("orig-{i}");
        a.publish_with(
            "taskq.k",
            id.as_bytes(),
            &[
                (b"Taskq-Trace", trace.as_bytes()),
                (b"Taskq-Ready-At", b"1000"),
            ],
            body,
        )
        .unwrap();
    }
    let counts = work(&c, "k", |b| {
        if b == b"plain" {
            Outcome::Done
        } else {
            Outcome::Bury
        }
    });
    assert_eq!((counts.deleted, counts.buried), (1, 3));
    let buried = on_subject(&mut a, "TASKQ", "taskq.k.buried");
    assert_eq!(buried.len(), 3);
    assert!(on_subject(&mut a, "TASKQ", "taskq.k").is_empty());
    let t = find(&json(&run(&url, &["tubes", "--json"])), "name", "k").clone();
    assert_eq!(
        (t["buried"].as_u64(), t["ready"].as_u64()),
        (Some(3), Some(0))
    );

    // peek: the first buried copy, its headers and body escaped; --raw: its bytes.
    let shown = run(&url, &["peek", "--tube", "k", "--buried"]);
    let first = &buried[0];
    let field = |k: &str| {
        shown
            .lines()
            .filter_map(|l| l.strip_prefix(k).filter(|r| r.starts_with(' ')))
            .map(|r| r.trim().to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(field("id"), [first.seq.to_string()]);
    assert_eq!(field("state"), ["buried"]);
    assert_eq!(field("subject"), ["taskq.k.buried"]);
    assert_eq!(field("bytes"), [first.data.len().to_string()]);
    assert!(
        field("header").contains(&format!(
            "\"Taskq-Trace: {}\"",
            headers(first)["Taskq-Trace"]
        )),
        "{shown}"
    );
    assert!(
        !shown.contains('\r'),
        "no raw control byte reaches the terminal: {shown}"
    );
    let (out, _) = taskq(
        &["peek", "--addr", &url, "--tube", "k", "--buried", "--raw"],
        b"",
        Duration::from_secs(30),
    );
    assert!(out.status.success());
    assert_eq!(out.stdout, first.data);

    // A kick that crashed after its publish: the copy is on taskq.k already.
    let h = headers(first);
    let extra: Vec<(&[u8], &[u8])> = h
        .iter()
        .filter(|(k, _)| *k != "Nats-Msg-Id")
        .map(|(k, v)| (k.as_bytes(), v.as_bytes()))
        .collect();
    a.publish_with(
        "taskq.k",
        format!("taskq-kick-TASKQ-{}", first.seq).as_bytes(),
        &extra,
        &first.data,
    )
    .unwrap();
    assert_eq!(
        run(&url, &["kick", "--tube", "k", "--count", "1"]),
        "kicked 1\n"
    );
    assert_eq!(
        on_subject(&mut a, "TASKQ", "taskq.k").len(),
        1,
        "stored once"
    );
    assert_eq!(on_subject(&mut a, "TASKQ", "taskq.k.buried").len(), 2);
    assert_eq!(run(&url, &["kick", "--tube", "k"]), "kicked 2\n");
    fails(
        &url,
        &["kick", "--tube", "k"],
        "no buried job to kick in tube k",
    );

    // Back on taskq.k, byte-exact, with their headers and a kick's message id.
    let back = on_subject(&mut a, "TASKQ", "taskq.k");
    assert!(on_subject(&mut a, "TASKQ", "taskq.k.buried").is_empty());
    assert_eq!(back.len(), 3);
    for (m, b) in back.iter().zip(&buried) {
        assert_eq!(m.data, b.data);
        let (hm, hb) = (headers(m), headers(b));
        assert_eq!(hm["Nats-Msg-Id"], format!("taskq-kick-TASKQ-{}", b.seq));
        assert_eq!(hm["Taskq-Trace"], hb["Taskq-Trace"]);
        assert_eq!(hm["Taskq-Ready-At"], "1000");
        assert_eq!(hm.len(), 3, "{hm:?}");
    }
    let mut got: Vec<(Vec<u8>, String)> = back
        .iter()
        .map(|m| (m.data.clone(), headers(m)["Taskq-Trace"].clone()))
        .collect();
    let mut want = kick_jobs();
    got.sort();
    want.sort();
    assert_eq!(got, want, "the bodies and headers as first put");

    let counts = work(&c, "k", |_| Outcome::Done);
    assert_eq!((counts.deleted, counts.buried), (3, 0));
    assert_eq!(a.stream_info("TASKQ").unwrap().messages, 0);
}

#[test]
fn delete_and_kick_job_by_sequence_and_what_jetstream_cannot_do_is_refused() {
    let c = NatsCluster::start(1).unwrap();
    let url = c.url();
    // A tube name that is not one subject token: refused before anything is
    // sent, so not even the stream is created.
    for (args, what) in [
        (&["put", "--tube", "a.b", "x"][..], "tube \"a.b\""),
        (&["put", "--tube", "a*", "x"][..], "tube \"a*\""),
        (&["stats", "--tube", "a.b"][..], "tube \"a.b\""),
        (&["kick", "--tube", "a*"][..], "tube \"a*\""),
        (&["peek", "--tube", ">", "--ready"][..], "tube \">\""),
    ] {
        fails(&url, args, what);
    }
    let mut a = admin(&c);
    let e = a.stream_info("TASKQ").unwrap_err();
    assert!(e.to_string().contains("10059"), "no stream yet: {e}");
    fails(&url, &["tubes"], "no stream TASKQ on nats://");

    let jobs = ids(&run(&url, &["put", "--tube", "d", "first", "second"]));
    let (one, two) = (jobs[0].to_string(), jobs[1].to_string());
    assert_eq!(run(&url, &["delete", &one]), format!("deleted {one}\n"));
    assert!(a.msg_get("TASKQ", MsgSelect::Seq(jobs[0])).is_err());
    fails(&url, &["delete", &one], &format!("job {one}: not found"));
    fails(
        &url,
        &["kick-job", &two],
        "kick-job of a job that is not buried is not supported on nats (JetStream)",
    );
    fails(
        &url,
        &["peek", "--tube", "d", "--buried"],
        "no buried job in tube d",
    );
    assert_eq!(
        run(&url, &["peek", "--tube", "d", "--ready", "--raw"]),
        "second"
    );

    // Buried, it can be kicked by its id (the buried copy's sequence).
    let counts = work(&c, "d", |_| Outcome::Bury);
    assert_eq!(counts.buried, 1);
    let copy = on_subject(&mut a, "TASKQ", "taskq.d.buried");
    assert_eq!(copy.len(), 1);
    let id = copy[0].seq.to_string();
    let shown = run(&url, &["peek", "--tube", "d", "--buried"]);
    assert!(
        shown
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["id", id.as_str()]),
        "{shown}"
    );
    assert_eq!(run(&url, &["kick-job", &id]), format!("kicked {id}\n"));
    let back = on_subject(&mut a, "TASKQ", "taskq.d");
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].data, b"second");
    fails(&url, &["kick-job", &id], &format!("job {id}: not found"));
    // peek --ready shows what the consumer has not delivered yet: the kicked job.
    assert_eq!(
        run(&url, &["peek", "--tube", "d", "--ready", "--raw"]),
        "second"
    );

    // What does not map onto JetStream, refused by name (pause, by server
    // version: tests/cli_nats_pause.rs). A stream with message schedules
    // has its delayed jobs apart (tests/cli_nats_delays.rs).
    fails(
        &url,
        &["peek", "--tube", "d", "--delayed"],
        if schedules(&c) {
            "no delayed job in tube d"
        } else {
            "peek --delayed is not supported on nats (JetStream)"
        },
    );
    assert_eq!(
        on_subject(&mut a, "TASKQ", "taskq.d").len(),
        1,
        "nothing changed"
    );
}

#[test]
fn two_streams_share_a_cluster_and_bench_puts_into_one() {
    let c = NatsCluster::start(1).unwrap();
    let url = c.url();
    run(&url, &["put", "--stream", "OTHER", "--tube", "t", "x", "y"]);
    run(&url, &["put", "--tube", "t", "z"]);
    let mut a = admin(&c);
    let other = a.stream_info("OTHER").unwrap();
    assert_eq!(
        (other.subjects.clone(), other.messages),
        (vec!["other.>".to_owned()], 2)
    );
    let taskq = a.stream_info("TASKQ").unwrap();
    assert_eq!(
        (taskq.subjects.clone(), taskq.messages),
        (vec!["taskq.>".to_owned()], 1)
    );
    let bodies: Vec<Vec<u8>> = on_subject(&mut a, "OTHER", "other.t")
        .into_iter()
        .map(|m| m.data)
        .collect();
    assert_eq!(bodies, [b"x".to_vec(), b"y".to_vec()]);

    // Every command reads the stream it is given.
    let st = json(&run(&url, &["stats", "--stream", "OTHER", "--json"]));
    assert_eq!(
        (st["stream"].as_str(), st["messages"].as_u64()),
        (Some("OTHER"), Some(2))
    );
    assert_eq!(st["subjects"], "other.>");
    let t = json(&run(&url, &["tubes", "--stream", "OTHER", "--json"]));
    assert_eq!(find(&t, "name", "t")["ready"], 2);
    assert_eq!(
        run(
            &url,
            &["peek", "--stream", "OTHER", "--tube", "t", "--ready", "--raw"]
        ),
        "x"
    );
    assert_eq!(
        find(&json(&run(&url, &["tubes", "--json"])), "name", "t")["ready"],
        1
    );
    fails(
        &url,
        &["stats", "--stream", "NONE"],
        "no stream NONE on nats://",
    );

    // bench: the puts are in the stream.
    let report = run(&url, &["bench", "-n", "300", "-P", "16", "--tube", "b"]);
    assert!(report.contains("throughput:"), "{report}");
    assert_eq!(a.stream_info("TASKQ").unwrap().messages, 301);
    let t = json(&run(&url, &["stats", "--tube", "b", "--json"]));
    assert_eq!(t["stored"], 300);
}

#[test]
fn demo_on_a_three_node_cluster_reports_counts_equal_to_the_streams_record() {
    let c = NatsCluster::start(3).unwrap();
    let url = c.url();
    let (out, _) = taskq(
        &["demo", "-n", "1000", "--addr", &url, "--io-timeout", IO],
        b"",
        Duration::from_secs(180),
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The report's rows: the workers' count, then the record's.
    let row = |name: &str| -> (u64, String) {
        let line = text
            .lines()
            .find_map(|l| {
                l.trim_start()
                    .strip_prefix(name)
                    .filter(|r| r.starts_with("  "))
            })
            .unwrap_or_else(|| panic!("no row {name} in {text}"));
        let cells: Vec<&str> = line.split_whitespace().collect();
        (cells[0].parse().unwrap(), cells[1].to_owned())
    };
    let mut a = admin(&c);
    let s = a.stream_info("TASKQ").unwrap();
    assert_eq!(
        (s.last_seq, s.messages),
        (1000, 0),
        "every job put once and done"
    );
    assert_eq!(row("jobs put"), (1000, "1000".into()));
    assert_eq!(row("deleted (done)"), (1000, "1000".into()));
    // Job 7 fails once: one release, one redelivery.
    assert_eq!(row("released (retried)"), (1, "1".into()));
    assert_eq!(row("buried"), (0, "0".into()));
    assert!(
        text.contains("taskq demo: 1000 jobs on nats://")
            && text.contains("(JetStream, stream TASKQ)"),
        "{text}"
    );
    let tube = demo_tube(&mut a);
    let consumer = a.consumer_info("TASKQ", &format!("taskq-{tube}")).unwrap();
    assert_eq!((consumer.num_pending, consumer.num_ack_pending), (0, 0));
    let (delivered, record) = row("delivered");
    assert_eq!(delivered, 1001, "each job once, job 7 twice");
    assert_eq!(record, "1001");
    let (touched, none) = row("touched");
    assert!(touched > 0, "job 13 runs long and is touched");
    assert_eq!(none, "-", "JetStream keeps no count of +WPI");
    assert!(text.contains("lost: 0"), "{text}");
    assert!(text.contains("result: every job done"), "{text}");
}

/// The demo's tube: the one whose consumer is the stream's only one.
fn demo_tube(a: &mut NatsConnection) -> String {
    let names = a
        .request("$JS.API.CONSUMER.NAMES.TASKQ", b"", Duration::from_secs(5))
        .unwrap();
    let v: Value = serde_json::from_slice(&names).unwrap();
    let list = v["consumers"].as_array().unwrap();
    assert_eq!(list.len(), 1, "{v}");
    let name = list[0].as_str().unwrap();
    name.strip_prefix("taskq-").unwrap().to_owned()
}

/// The README's JetStream lines (its "```sh jetstream" block), each run in
/// bash with `$TASKQ_ADDR` naming a 3-node cluster and the built commands first
/// on PATH; what they leave is read back from the cluster.
#[test]
fn the_readme_jetstream_commands_run_against_a_cluster() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let mut lines = Vec::new();
    let mut inside = false;
    for line in readme.lines() {
        if let Some(info) = line.trim_start().strip_prefix("```") {
            inside = !inside && info.trim() == "sh jetstream";
        } else if inside && !line.trim().is_empty() {
            lines.push(line.trim().to_owned());
        }
    }
    assert!(
        lines.len() >= 8,
        "the README lost its JetStream lines: {lines:?}"
    );
    let c = NatsCluster::start(3).unwrap();
    let path = format!(
        "{}:{}",
        cli_common::bin_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut outputs = Vec::new();
    for line in &lines {
        use std::os::unix::process::CommandExt;
        // In a group of its own: past the limit, all it started is killed too.
        let mut child = std::process::Command::new("bash")
            .process_group(0)
            .args(["-euo", "pipefail", "-c", line])
            .env("PATH", &path)
            .env("TASKQ_ADDR", c.url())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let until = std::time::Instant::now() + Duration::from_secs(60);
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > until {
                cli_common::kill_group(child.id());
                let _ = child.wait();
                panic!("README line ran past 60 s: {line}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "README line failed: {line}\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        outputs.push((line.clone(), stdout));
    }
    let kicks: Vec<&str> = outputs
        .iter()
        .filter(|(l, _)| l.starts_with("taskq kick"))
        .map(|(_, o)| o.as_str())
        .collect();
    assert_eq!(kicks, ["kicked 1\n", "kicked 1\n"]);
    let mut a = admin(&c);
    let back: Vec<Vec<u8>> = on_subject(&mut a, "TASKQ", "taskq.reports")
        .into_iter()
        .map(|m| m.data)
        .collect();
    assert_eq!(back, [b"monthly 7".to_vec(), b"weekly 3".to_vec()]);
    assert!(on_subject(&mut a, "TASKQ", "taskq.reports.buried").is_empty());
    let staging = &outputs.last().unwrap().1;
    let listed = json(staging.lines().last().unwrap());
    assert_eq!(find(&listed, "name", "reports")["ready"], 1);
    assert_eq!(a.stream_info("STAGING").unwrap().subjects, ["staging.>"]);
}

/// Waits (bounded) until `f` holds.
fn eventually(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let until = std::time::Instant::now() + limit;
    while !f() {
        assert!(
            std::time::Instant::now() < until,
            "{what}: not within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `--retry-for` on JetStream: a put whose acknowledgement does not come is
/// sent again with its message id for that long, then put gives up (after
/// about `--retry-for`, not twice that), and the stream holds each job once.
#[test]
fn put_gives_up_after_retry_for_on_a_frozen_cluster_and_stores_each_job_once() {
    use std::io::Write;
    let c = NatsCluster::start(1).unwrap();
    let url = c.url();
    let retry_for = 5;
    let mut child = cli_common::Reaped(cli_common::spawn(&[
        "put",
        "--addr",
        &url,
        "--tube",
        "r",
        "--retry-for",
        &retry_for.to_string(),
    ]));
    let mut input = child.0.stdin.take().unwrap();
    for i in 1..=50 {
        writeln!(input, "job {i}").unwrap();
    }
    input.flush().unwrap();
    let mut a = admin(&c);
    eventually("the first 50 stored", Duration::from_secs(20), || {
        a.stream_info("TASKQ").is_ok_and(|s| s.messages == 50)
    });
    drop(a);
    c.stop(0).unwrap();
    let frozen = std::time::Instant::now();
    for i in 51..=100 {
        writeln!(input, "job {i}").unwrap();
    }
    drop(input);
    let mut status = None;
    eventually("put gives up", Duration::from_secs(40), || {
        status = child.0.try_wait().unwrap();
        status.is_some()
    });
    let took = frozen.elapsed();
    c.cont(0).unwrap();
    let out = child.output_within(Duration::from_secs(10));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        took >= Duration::from_secs(retry_for - 1),
        "kept sending for --retry-for: {took:?}\n{err}"
    );
    assert!(
        took < Duration::from_secs(retry_for * 2 - 1),
        "gave up after about --retry-for, not twice that: {took:?}\n{err}"
    );
    assert_eq!(out.status.code(), Some(3), "sent, unacknowledged: {err}");
    assert!(err.contains("giving up"), "{err}");
    let acked = ids(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(acked.len(), 50, "{err}");

    // Thawed, the stream holds every job at most once (an unknown one may or
    // may not be there), the acknowledged ones among them.
    let mut a = admin(&c);
    let mut stored = Vec::new();
    eventually("the stream answers", Duration::from_secs(20), || {
        stored = on_subject(&mut a, "TASKQ", "taskq.r");
        stored.len() >= 50
    });
    let mut bodies: Vec<Vec<u8>> = stored.iter().map(|m| m.data.clone()).collect();
    let n = bodies.len();
    bodies.sort();
    bodies.dedup();
    assert_eq!(bodies.len(), n, "no job stored twice");
    assert!(n <= 100);
    let seqs: Vec<u64> = stored.iter().map(|m| m.seq).collect();
    assert!(
        acked.iter().all(|id| seqs.contains(id)),
        "every acknowledged job is stored"
    );
}

/// The length of the `INFO` line node `i` sends a new client, CRLF included.
fn info_len(c: &NatsCluster, i: usize) -> usize {
    use std::io::BufRead;
    let s = std::net::TcpStream::connect(c.addr(i)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut line = String::new();
    std::io::BufReader::new(s).read_line(&mut line).unwrap();
    assert!(line.starts_with("INFO "), "{line}");
    line.len()
}

/// A proxy to node 0 that closes every connection partway through the reply
/// to the stream's lookup: the server's `INFO` and the handshake's `PONG` go
/// through, then 10 bytes of the `MSG` carrying the lookup's answer. (A
/// later client's `INFO` differs only in its client id's digits.)
fn cut_at_stream_lookup(c: &NatsCluster) -> taskq_testkit::ChaosProxy {
    let proxy = taskq_testkit::ChaosProxy::start_seeded(c.addr(0), 16).unwrap();
    let pong = "PONG\r\n".len();
    proxy.add(
        taskq_testkit::Toxic::LimitData {
            bytes: (info_len(c, 0) + pong + 10) as u64,
        },
        taskq_testkit::Direction::Downstream,
        1.0,
    );
    proxy
}

/// A connection cut while `taskq put` looks its stream up is a broken
/// connection like any other: reconnected with the backoff, not the end of
/// the run. Then the connection that carries the jobs is reset partway
/// through them, and after that one connection in three is reset at a
/// random moment; every line is acknowledged and stored once.
#[test]
fn put_rides_out_a_cut_stream_lookup_and_resets_and_stores_each_line_once() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let c = NatsCluster::start(1).unwrap();
    let proxy = cut_at_stream_lookup(&c);
    let n = 3000;
    let input: String = (0..n).map(|i| format!("line {i}\n")).collect();
    let url = format!("nats://{}", proxy.addr());
    let stop = AtomicBool::new(false);
    let (out, took) = std::thread::scope(|s| {
        s.spawn(|| {
            // At least two lookups cut.
            eventually("two stream lookups cut", Duration::from_secs(20), || {
                proxy.closed() >= 2
            });
            // Then a reset 4 KiB into what the put sends on a connection (its
            // jobs are about 150 KiB): a point in its stream, not a moment,
            // so the connection carrying the jobs is reset however fast the
            // server takes them (a reset drawn at random moments missed it
            // when the put was done within a few draws), and the put needs a
            // connection more. A connection open now draws it too, 4 KiB on
            // from where it is.
            proxy.clear();
            proxy.add(
                taskq_testkit::Toxic::ResetAfterData { bytes: 4096 },
                taskq_testkit::Direction::Upstream,
                1.0,
            );
            while proxy.opened() < 4 && !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(5));
            }
            // Then resets at random moments: every 40 ms the toxics are
            // drawn anew.
            let mut k = 0u64;
            while !stop.load(Ordering::Relaxed) {
                k += 1;
                proxy.clear();
                proxy.add(
                    taskq_testkit::Toxic::Reset {
                        after: Duration::from_millis(k * 7 % 20),
                    },
                    taskq_testkit::Direction::Both,
                    0.35,
                );
                std::thread::sleep(Duration::from_millis(40));
            }
            proxy.clear();
        });
        let r = taskq(
            &["put", "--addr", &url, "--tube", "cut"],
            input.as_bytes(),
            Duration::from_secs(120),
        );
        stop.store(true, Ordering::Relaxed);
        r
    });
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{took:?}\n{err}");
    assert!(
        err.contains(&format!(
            "acknowledged {n}, rejected 0, unknown 0, not sent 0"
        )),
        "{err}"
    );
    let acked = ids(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(acked.len(), n);
    assert!(
        proxy.opened() >= 4,
        "the cuts and the reset hit: {}",
        proxy.opened()
    );

    let mut a = admin(&c);
    let stored = on_subject(&mut a, "TASKQ", "taskq.cut");
    assert_eq!(stored.len(), n, "each line stored once");
    for (i, m) in stored.iter().enumerate() {
        assert_eq!(m.data, format!("line {i}").into_bytes(), "in input order");
        assert_eq!(m.seq, acked[i], "the id printed is the job's sequence");
    }
}

/// A stream lookup cut every time, for longer than `--retry-for`: put gives
/// up after about that long and says the jobs were not sent (exit 1, no id),
/// and nothing about an unknown outcome: no job had been written.
#[test]
fn put_whose_stream_lookup_is_always_cut_gives_up_as_not_sent() {
    let c = NatsCluster::start(1).unwrap();
    let proxy = cut_at_stream_lookup(&c);
    let url = format!("nats://{}", proxy.addr());
    let (out, took) = taskq(
        &["put", "--addr", &url, "--retry-for", "3"],
        b"one\ntwo\n",
        Duration::from_secs(30),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(out.stdout.is_empty(), "no id");
    assert!(err.starts_with("taskq: "), "{err}");
    assert!(err.contains("not sent"), "{err}");
    assert!(err.contains("looking up the stream"), "{err}");
    assert!(!err.contains("unknown"), "nothing was written: {err}");
    assert!(
        took >= Duration::from_secs(2),
        "retried for --retry-for: {took:?}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(proxy.opened() >= 3, "reconnected: {}", proxy.opened());
    assert!(admin(&c)
        .stream_info("TASKQ")
        .is_err_and(|e| e.to_string().contains("404")));
}
