//! The producer on JetStream, against real nats-server clusters on loopback:
//! the stream it creates, the ids it returns, batches, and re-sends that the
//! stream stores once.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use taskq_producer::{Error, NotSent, Producer, PutOptions, PutOutcome};
use taskq_proto::nats::{MsgSelect, NatsConfig, NatsConnection, StreamInfo, StreamSpec};
use taskq_testkit::{ChaosProxy, Direction, NatsCluster, Toxic};

fn admin(c: &NatsCluster) -> NatsConnection {
    let seeds: Vec<String> = (0..c.len()).map(|i| c.addr(i).to_string()).collect();
    NatsConnection::connect(&seeds, NatsConfig::default()).expect("admin connection")
}

fn stream(c: &NatsCluster) -> StreamInfo {
    admin(c).stream_info("TASKQ").expect("stream info")
}

/// Every message of the stream: body -> how many times it is there.
fn bodies(c: &NatsCluster) -> HashMap<Vec<u8>, usize> {
    let mut a = admin(c);
    let info = a.stream_info("TASKQ").unwrap();
    let mut out = HashMap::new();
    for seq in info.first_seq..=info.last_seq {
        if let Ok(m) = a.msg_get("TASKQ", MsgSelect::Seq(seq)) {
            *out.entry(m.data).or_insert(0) += 1;
        }
    }
    out
}

#[test]
fn puts_create_a_replicated_work_queue_and_return_stream_sequences() {
    let c = NatsCluster::start(3).unwrap();
    let mut p = Producer::builder().tube("emails").connect(c.url()).unwrap();
    let ids: Vec<u64> = (0..3)
        .map(|i| {
            p.put(format!("job {i}").as_bytes(), PutOptions::default())
                .unwrap()
                .get()
        })
        .collect();
    assert_eq!(ids, [1, 2, 3]);
    let s = stream(&c);
    assert_eq!(s.subjects, ["taskq.>"]);
    assert_eq!(s.retention, "workqueue");
    assert_eq!(s.replicas, 3, "3 nodes: 3 replicas");
    assert_eq!(s.messages, 3);
    let m = admin(&c).msg_get("TASKQ", MsgSelect::Seq(2)).unwrap();
    assert_eq!(
        (m.subject.as_str(), &m.data[..]),
        ("taskq.emails", &b"job 1"[..])
    );
    // One write per put.
    let before = p.io_counts().unwrap();
    p.put(b"x", PutOptions::default()).unwrap();
    let after = p.io_counts().unwrap();
    assert_eq!(after.writes - before.writes, 1);
}

#[test]
fn a_single_node_gets_one_replica_and_batches_map_each_puback() {
    let c = NatsCluster::start(1).unwrap();
    let mut p = Producer::connect(c.url()).unwrap();
    let bodies_in: Vec<Vec<u8>> = (0..200).map(|i| format!("b{i}").into_bytes()).collect();
    let mut out = vec![PutOutcome::NotSent; bodies_in.len()];
    let before = p.io_counts().unwrap();
    let r = p
        .put_batch(&bodies_in, PutOptions::default(), &mut out)
        .unwrap();
    assert_eq!(r.inserted, 200);
    assert_eq!(
        p.io_counts().unwrap().writes - before.writes,
        1,
        "one write"
    );
    for (i, o) in out.iter().enumerate() {
        assert_eq!(o.id().map(|id| id.get()), Some(i as u64 + 1));
    }
    assert_eq!(stream(&c).replicas, 1);
    let got = bodies(&c);
    assert_eq!(got.len(), 200);
    assert!(got.values().all(|&n| n == 1));
}

#[test]
fn tube_names_are_checked_for_jetstream_before_anything_is_sent() {
    let c = NatsCluster::start(1).unwrap();
    let e = Producer::builder().tube("a.b").build(c.url()).unwrap_err();
    assert!(matches!(e, Error::Invalid(_)), "{e}");
    let mut p = Producer::connect(c.url()).unwrap();
    assert!(matches!(p.use_tube("a b"), Err(Error::Invalid(_))));
    // beanstalkd's tube bytes that are not one subject token.
    assert!(matches!(p.use_tube("x.y"), Err(Error::Invalid(_))));
    p.use_tube("ok-tube_1").unwrap();
    p.put(b"x", PutOptions::default()).unwrap();
}

#[test]
fn an_existing_stream_that_does_not_fit_is_a_clear_error_and_left_alone() {
    let c = NatsCluster::start(1).unwrap();
    // Another application's stream already captures taskq's subjects.
    let mut a = admin(&c);
    a.request(
        "$JS.API.STREAM.CREATE.TASKQ",
        br#"{"name":"TASKQ","subjects":["taskq.>"],"retention":"limits","storage":"memory"}"#,
        Duration::from_secs(2),
    )
    .unwrap();
    let e = Producer::connect(c.url()).unwrap_err();
    assert!(matches!(e, Error::NotSent(NotSent::Layout(_))), "{e}");
    assert!(e.to_string().contains("retention"), "{e}");
    assert_eq!(a.stream_info("TASKQ").unwrap().retention, "limits");
}

#[test]
fn puts_through_random_resets_are_stored_exactly_once() {
    let c = NatsCluster::start(1).unwrap();
    // Create the stream directly, so the proxy's resets hit only puts.
    admin(&c)
        .ensure_stream(&StreamSpec {
            name: "TASKQ".into(),
            subjects: vec!["taskq.>".into()],
            replicas: 1,
            duplicate_window: None,
        })
        .unwrap();
    let proxy = ChaosProxy::start_seeded(c.addr(0), 7).unwrap();
    let mut p = Producer::builder()
        .io_timeout(Duration::from_millis(500))
        .connect(format!("nats://{}", proxy.addr()))
        .unwrap();
    let n = 3000;
    let started = Instant::now();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        // Resets at random moments: every 40 ms the toxics are drawn anew, and
        // about a third of the time the connection is reset within 0-20 ms.
        s.spawn(|| {
            let mut rng = fastrand::Rng::with_seed(7);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                proxy.clear();
                proxy.add(
                    Toxic::Reset {
                        after: Duration::from_millis(rng.u64(0..20)),
                    },
                    Direction::Both,
                    0.35,
                );
                std::thread::sleep(Duration::from_millis(40));
            }
            proxy.clear();
        });
        for i in 0..n {
            p.put(format!("line {i}").as_bytes(), PutOptions::default())
                .unwrap_or_else(|e| panic!("put {i}: {e}"));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    assert!(started.elapsed() < Duration::from_secs(120));
    assert!(
        p.connects() > 3,
        "the resets hit: {} connects",
        p.connects()
    );
    let got = bodies(&c);
    for i in 0..n {
        let b = format!("line {i}").into_bytes();
        assert_eq!(got.get(&b), Some(&1), "line {i} stored once");
    }
    assert_eq!(got.len(), n);
}

/// The stream's leader killed, a new producer connects to the nodes left at
/// once: its connect, stream lookup and first put wait the election out
/// (within `resolve_for`) instead of failing on the first unanswered request.
#[test]
fn connect_and_first_put_during_an_election_wait_it_out() {
    let mut c = NatsCluster::start(3).unwrap();
    let mut first = Producer::connect(c.url()).unwrap();
    assert_eq!(
        first.put(b"before", PutOptions::default()).unwrap().get(),
        1
    );
    drop(first);
    let until = Instant::now() + Duration::from_secs(10);
    let leader = loop {
        if let Some(l) = c.stream_leader("TASKQ") {
            break l;
        }
        assert!(Instant::now() < until, "no stream leader");
        std::thread::sleep(Duration::from_millis(50));
    };
    c.kill(leader).unwrap();
    let left: Vec<String> = (0..3)
        .filter(|&i| i != leader)
        .map(|i| c.addr(i).to_string())
        .collect();
    let started = Instant::now();
    let mut p = Producer::builder()
        .io_timeout(Duration::from_millis(500))
        .resolve_for(Duration::from_secs(40))
        .connect(format!("nats://{}", left.join(",")))
        .unwrap_or_else(|e| panic!("connect after {:?}: {e}", started.elapsed()));
    let id = p
        .put(b"after", PutOptions::default())
        .unwrap_or_else(|e| panic!("put after {:?}: {e}", started.elapsed()));
    assert_eq!(id.get(), 2);
    let got = bodies(&c);
    assert_eq!(got.get(&b"after"[..]), Some(&1));
    assert_eq!(got.get(&b"before"[..]), Some(&1));
}

#[test]
fn a_put_sent_once_stays_unknown_when_no_re_send_reaches_the_stream() {
    let c = NatsCluster::start(1).unwrap();
    let mut p = Producer::builder()
        .tube("frozen")
        .io_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300))
        .resolve_for(Duration::from_secs(2))
        .connect(c.url())
        .unwrap();
    p.put(b"before", PutOptions::default()).unwrap();
    // The node stops answering: the put's PubAck never comes, and every
    // re-send's connect finds a socket that never says INFO (not sent).
    c.stop(0).unwrap();
    let started = Instant::now();
    let e = p.put(b"during", PutOptions::default()).unwrap_err();
    let took = started.elapsed();
    c.cont(0).unwrap();
    assert!(e.outcome_unknown() && !e.not_sent(), "{e}");
    assert!(e.maybe_queued(), "{e}");
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(6),
        "resolved for {took:?}"
    );
}
