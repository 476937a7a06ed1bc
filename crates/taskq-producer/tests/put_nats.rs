//! The producer on JetStream, against real nats-server clusters on loopback:
//! the stream it creates, the ids it returns, batches, re-sends that the
//! stream stores once, and delayed jobs (held by a current server, by the
//! client on 2.9.10 or on a stream kept as it is).

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{current_node, oldest_node};
use taskq_connect::nats::{
    ConsumerSpec, MsgSelect, NatsConfig, NatsConnection, StreamInfo, StreamSpec,
};
use taskq_connect::{Layout, SubjectKind};
use taskq_producer::{Error, NotSent, Producer, PutOptions, PutOutcome};
use taskq_proto::nats::{schedule, AckKind, Delivery, HeaderBlock, NatsError};
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

#[test]
fn a_stream_with_a_short_duplicate_window_cuts_resolution_short_so_a_put_is_stored_once() {
    let c = NatsCluster::start(1).unwrap();
    // The stream is made by a producer, and then someone gives it a 1 s
    // duplicate window, shorter than the 20 s asked below.
    Producer::connect(c.url()).unwrap();
    let mut a = admin(&c);
    let reply = update_stream(&mut a, "duplicate_window", 1_000_000_000u64.into());
    assert!(reply.get("error").is_none(), "{reply}");
    assert_eq!(stream(&c).duplicate_window, Duration::from_secs(1));
    let (proxy, mut p) = through_a_proxy(&c, "short");
    p.put(b"one", PutOptions::default()).unwrap();
    // The next put reaches the stream, but no reply comes back, on this
    // connection or on any new one, for 2.5 s: past the window, a copy
    // sent again would be stored a second time.
    proxy.add(Toxic::Silence, Direction::Downstream, 1.0);
    let started = Instant::now();
    let (e, took) = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(2500));
            proxy.clear();
        });
        let e = p.put(b"two", PutOptions::default()).unwrap_err();
        (e, started.elapsed())
    });
    assert!(e.outcome_unknown() && e.maybe_queued(), "{e}");
    assert!(
        took < Duration::from_millis(2500),
        "gave up within the window, not after 20 s: {took:?}"
    );
    // The stream has each body once: the put was not re-sent past the
    // window, once replies came again.
    p.put(b"three", PutOptions::default()).unwrap();
    let got = bodies(&c);
    for b in [&b"one"[..], b"two", b"three"] {
        assert_eq!(
            got.get(b),
            Some(&1),
            "{:?}: {got:?}",
            String::from_utf8_lossy(b)
        );
    }
}

/// `put_with_position` is a put like any other: an unknown outcome is sent
/// again with its message id until the stream answers, and stored once.
#[test]
fn put_with_position_resolves_an_unknown_outcome_and_stores_the_job_once() {
    let c = NatsCluster::start(1).unwrap();
    let (proxy, mut p) = through_a_proxy(&c, "position");
    p.put(b"one", PutOptions::default()).unwrap();
    // The put reaches the stream and its PubAck is dropped, on this
    // connection and on every new one, until the silence ends: its first
    // attempt cannot learn its outcome.
    proxy.add(Toxic::Silence, Direction::Downstream, 1.0);
    let connects = p.connects();
    let got = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(700));
            proxy.clear();
        });
        p.put_with_position(b"two", PutOptions::default())
    });
    let pos = got.unwrap_or_else(|e| panic!("resolved, not {e}"));
    assert!(p.connects() > connects, "the silence hit");
    assert_eq!((pos.id.get(), pos.ready, pos.is_ready), (2, None, true));
    let stored = bodies(&c);
    assert_eq!(stored.get(&b"two"[..]), Some(&1), "{stored:?}");
    assert_eq!(stored.len(), 2, "{stored:?}");
}

/// A producer on `tube` through a chaos proxy to node 0, with short
/// deadlines (200 ms) and 20 s to resolve an unknown outcome.
fn through_a_proxy(c: &NatsCluster, tube: &str) -> (ChaosProxy, Producer) {
    let proxy = ChaosProxy::start(c.addr(0)).unwrap();
    let p = Producer::builder()
        .tube(tube)
        .io_timeout(Duration::from_millis(200))
        .connect_timeout(Duration::from_millis(200))
        .resolve_for(Duration::from_secs(20))
        .connect(format!("nats://{}", proxy.addr()))
        .unwrap();
    (proxy, p)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Asks the server to set one `key` of the stream's configuration to
/// `value`, the rest as it is; the server's reply.
fn update_stream(a: &mut NatsConnection, key: &str, value: serde_json::Value) -> serde_json::Value {
    let mut cfg = stream_config(a);
    cfg[key] = value;
    let reply = a
        .request(
            "$JS.API.STREAM.UPDATE.TASKQ",
            cfg.to_string().as_bytes(),
            Duration::from_secs(2),
        )
        .unwrap();
    serde_json::from_slice(&reply).unwrap()
}

/// The stream's configuration as the server gives it.
fn stream_config(a: &mut NatsConnection) -> serde_json::Value {
    let raw = a
        .request("$JS.API.STREAM.INFO.TASKQ", b"", Duration::from_secs(2))
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&raw).unwrap();
    v["config"].clone()
}

/// A stored message's headers, `name: value` each.
fn header_lines(raw: &[u8]) -> Vec<String> {
    match HeaderBlock::parse(raw) {
        Ok(h) => h
            .iter()
            .map(|(k, v)| {
                format!(
                    "{}: {}",
                    String::from_utf8_lossy(k),
                    String::from_utf8_lossy(v)
                )
            })
            .collect(),
        Err(_) => Vec::new(),
    }
}

fn header<'a>(lines: &'a [String], name: &str) -> Option<&'a str> {
    lines
        .iter()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(": "))
}

/// One delivery as a test looks at it.
#[derive(Debug)]
struct Delivered {
    body: Vec<u8>,
    subject: String,
    delivered: u64,
    headers: Vec<String>,
    /// When it arrived, in Unix milliseconds.
    at_ms: u64,
}

/// Pulls from `taskq-t` (made here, filtered on `taskq.t`) until `n` jobs
/// came or `within` passed, acking each (confirmed).
fn deliveries(a: &mut NatsConnection, n: usize, within: Duration) -> Vec<Delivered> {
    a.ensure_consumer(
        "TASKQ",
        "taskq-t",
        &ConsumerSpec {
            filter_subject: "taskq.t".into(),
            ack_wait: Duration::from_secs(30),
            max_deliver: -1,
            max_ack_pending: 1000,
            max_waiting: 64,
        },
    )
    .unwrap();
    let until = Instant::now() + within;
    let mut got = Vec::new();
    while got.len() < n && Instant::now() < until {
        let want = (n - got.len()) as u32;
        a.pull("TASKQ", "taskq-t", want, Duration::from_millis(500), None)
            .unwrap();
        let mut acks = Vec::new();
        loop {
            match a.next_delivery().unwrap() {
                Delivery::Msg {
                    subject,
                    reply,
                    headers,
                    body,
                    info,
                } => {
                    got.push(Delivered {
                        body: body.to_vec(),
                        subject: String::from_utf8_lossy(subject).into_owned(),
                        delivered: info.delivered,
                        headers: headers.map_or_else(Vec::new, |h| header_lines(h.as_bytes())),
                        at_ms: now_ms(),
                    });
                    acks.push(reply.to_vec());
                    if acks.len() as u32 == want {
                        break;
                    }
                }
                Delivery::Heartbeat => {}
                Delivery::Timeout | Delivery::NoMessages | Delivery::Unanswered => break,
                d => panic!("unexpected {d:?}"),
            }
        }
        for ack in acks {
            assert!(a.ack(&ack, AckKind::Ack, true).unwrap(), "ack confirmed");
        }
    }
    got
}

#[test]
fn delayed_jobs_wait_on_a_current_server_and_are_delivered_once_never_early() {
    let Some(c) = current_node() else { return };
    let mut p = Producer::builder().tube("t").connect(c.url()).unwrap();
    let opts = PutOptions {
        delay: 2,
        ..PutOptions::default()
    };
    let put_ms = now_ms();
    let one = p.put(b"one", opts).unwrap().get();
    let mut out = [PutOutcome::NotSent; 3];
    p.put_batch(&[&b"b0"[..], b"b1", b"b2"], opts, &mut out)
        .unwrap();
    p.put(b"now", PutOptions::default()).unwrap();
    let mut a = admin(&c);
    assert!(
        a.stream_info("TASKQ").unwrap().allow_msg_schedules,
        "the stream taskq created allows message schedules"
    );
    // Each delayed job is a schedule on a subject of its own, none on taskq.t.
    let layout = Layout::default();
    let ids = [
        one,
        out[0].id().unwrap().get(),
        out[1].id().unwrap().get(),
        out[2].id().unwrap().get(),
    ];
    let mut subjects = Vec::new();
    for id in ids {
        let m = a.msg_get("TASKQ", MsgSelect::Seq(id)).unwrap();
        let Some(("t", SubjectKind::Delayed { at })) = layout.tube_of(&m.subject) else {
            panic!("job {id} on {}", m.subject);
        };
        let h = header_lines(&m.headers);
        let ready: u64 = header(&h, "Taskq-Ready-At").unwrap().parse().unwrap();
        assert!(ready >= put_ms + 2000, "{h:?}");
        assert_eq!(at, ready.div_ceil(1000), "the second after its ready time");
        let when = String::from_utf8(schedule::rfc3339_utc(at).to_vec()).unwrap();
        assert_eq!(
            header(&h, "Nats-Schedule"),
            Some(format!("@at {when}").as_str())
        );
        assert_eq!(header(&h, "Nats-Schedule-Target"), Some("taskq.t"));
        assert!(header(&h, "Nats-Msg-Id").is_some(), "{h:?}");
        subjects.push(m.subject);
    }
    subjects.sort();
    subjects.dedup();
    assert_eq!(subjects.len(), 4, "one subject per job");

    let got = deliveries(&mut a, 5, Duration::from_secs(10));
    let bodies: Vec<&[u8]> = got.iter().map(|d| &d.body[..]).collect();
    assert_eq!(bodies.len(), 5, "{got:?}");
    assert_eq!(bodies[0], b"now", "the job put without delay comes first");
    for d in &got {
        assert_eq!((d.subject.as_str(), d.delivered), ("taskq.t", 1), "{d:?}");
        if d.body == b"now" {
            continue;
        }
        let ready: u64 = header(&d.headers, "Taskq-Ready-At")
            .unwrap()
            .parse()
            .unwrap();
        assert!(d.at_ms >= ready, "delivered {} ms early", ready - d.at_ms);
        eprintln!(
            "{}: ready at {ready}, delivered {} ms after",
            String::from_utf8_lossy(&d.body),
            d.at_ms - ready
        );
        assert!(d.at_ms >= put_ms + 2000, "{d:?}");
        assert!(
            d.at_ms < put_ms + 6000,
            "fired within seconds of its time: {d:?}"
        );
        // What the fired copy carries: the schedule's subject, our ready
        // time; not the schedule nor the schedule's message id.
        let from = header(&d.headers, "Nats-Scheduler").unwrap();
        assert!(subjects.iter().any(|s| s == from), "{d:?}");
        assert_eq!(header(&d.headers, "Nats-Schedule-Next"), Some("purge"));
        for gone in ["Nats-Msg-Id", "Nats-Schedule", "Nats-Schedule-Target"] {
            assert_eq!(header(&d.headers, gone), None, "{gone}: {d:?}");
        }
    }
    // One delivery per job, as the consumer counts them; nothing left.
    let ci = a.consumer_info("TASKQ", "taskq-t").unwrap();
    assert_eq!(
        (ci.delivered, ci.num_pending, ci.num_ack_pending),
        (5, 0, 0)
    );
    let until = Instant::now() + Duration::from_secs(5);
    while a.stream_info("TASKQ").unwrap().messages > 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(a.stream_info("TASKQ").unwrap().messages, 0, "nothing left");
}

#[test]
fn keep_stream_config_leaves_an_existing_stream_untouched_and_delays_with_the_client() {
    let Some(c) = current_node() else { return };
    let mut a = admin(&c);
    // The operator's stream, made without message schedules.
    a.ensure_stream(&StreamSpec {
        name: "TASKQ".into(),
        subjects: vec!["taskq.>".into()],
        replicas: 1,
        duplicate_window: None,
    })
    .unwrap();
    let before = stream_config(&mut a);
    assert_ne!(before["allow_msg_schedules"], true, "{before}");
    let later = PutOptions {
        delay: 30,
        ..PutOptions::default()
    };
    let mut kept = Producer::builder()
        .tube("t")
        .keep_stream_config(true)
        .connect(c.url())
        .unwrap();
    let id = kept.put(b"kept", later).unwrap().get();
    assert_eq!(stream_config(&mut a), before, "the stream is untouched");
    let m = a.msg_get("TASKQ", MsgSelect::Seq(id)).unwrap();
    let h = header_lines(&m.headers);
    assert_eq!(m.subject, "taskq.t", "held by the client: on the tube");
    assert!(header(&h, "Taskq-Ready-At").is_some(), "{h:?}");
    assert_eq!(header(&h, "Nats-Schedule"), None, "{h:?}");
    // Without the switch the stream is updated to allow schedules (and the
    // server turns rollup headers on with them: a schedule rolls its subject
    // up), and nothing else of it changes.
    let mut p = Producer::builder().tube("t").connect(c.url()).unwrap();
    let after = stream_config(&mut a);
    assert_eq!(after["allow_msg_schedules"], true, "{after}");
    assert_eq!(
        (&before["allow_rollup_hdrs"], &after["allow_rollup_hdrs"]),
        (&false.into(), &true.into())
    );
    let strip = |mut v: serde_json::Value| {
        let o = v.as_object_mut().unwrap();
        for changed in ["allow_msg_schedules", "allow_rollup_hdrs", "metadata"] {
            o.remove(changed);
        }
        v
    };
    assert_eq!(strip(after), strip(before));
    let id = p.put(b"held", later).unwrap().get();
    let m = a.msg_get("TASKQ", MsgSelect::Seq(id)).unwrap();
    assert!(m.subject.starts_with("taskq.t.delayed."), "{}", m.subject);
    // The producer kept as it was goes on the client's way.
    let id = kept.put(b"kept 2", later).unwrap().get();
    assert_eq!(
        a.msg_get("TASKQ", MsgSelect::Seq(id)).unwrap().subject,
        "taskq.t"
    );
}

#[test]
fn on_2_9_10_a_delayed_job_waits_in_its_tube_with_its_ready_time() {
    let Some(c) = oldest_node() else { return };
    let mut p = Producer::builder().tube("t").connect(c.url()).unwrap();
    let put_ms = now_ms();
    let id = p
        .put(
            b"later",
            PutOptions {
                delay: 30,
                ..PutOptions::default()
            },
        )
        .unwrap()
        .get();
    let mut a = admin(&c);
    assert!(!a.stream_info("TASKQ").unwrap().allow_msg_schedules);
    let m = a.msg_get("TASKQ", MsgSelect::Seq(id)).unwrap();
    let h = header_lines(&m.headers);
    assert_eq!(m.subject, "taskq.t");
    let ready: u64 = header(&h, "Taskq-Ready-At").unwrap().parse().unwrap();
    assert!((put_ms + 30_000..put_ms + 31_000).contains(&ready), "{h:?}");
    assert_eq!(header(&h, "Nats-Schedule"), None, "{h:?}");
}

#[test]
fn server_facts_the_schedule_layout_relies_on() {
    let Some(c) = current_node() else { return };
    let mut a = admin(&c);
    a.ensure_stream_with_schedules(&StreamSpec {
        name: "TASKQ".into(),
        subjects: vec!["taskq.>".into()],
        replicas: 1,
        duplicate_window: None,
    })
    .unwrap();
    let at = |s: &str| format!("@at {s}").into_bytes();
    let schedule =
        |a: &mut NatsConnection, subject: &str, id: &[u8], when: &[u8], target: &[u8]| {
            a.publish_with(
                subject,
                id,
                &[(b"Nats-Schedule", when), (b"Nats-Schedule-Target", target)],
                b"x",
            )
        };
    // A second schedule on one subject replaces the first: one subject per job.
    let far = at("2099-01-01T00:00:00Z");
    schedule(&mut a, "taskq.t.delayed.1", b"a", &far, b"taskq.t").unwrap();
    schedule(&mut a, "taskq.t.delayed.1", b"b", &far, b"taskq.t").unwrap();
    let s = a.stream_info("TASKQ").unwrap();
    assert_eq!(s.messages, 1, "the later schedule replaced the earlier");
    let m = a
        .msg_get(
            "TASKQ",
            MsgSelect::NextBySubject {
                subject: "taskq.t.delayed.1",
                seq: 1,
            },
        )
        .unwrap();
    let h = header_lines(&m.headers);
    assert_eq!(header(&h, "Nats-Rollup"), Some("sub"), "{h:?}");
    // A target outside the stream is refused.
    match schedule(&mut a, "taskq.t.delayed.2", b"c", &far, b"elsewhere.t") {
        Err(NatsError::Api(e)) => assert_eq!(e.err_code, 10190, "{e}"),
        r => panic!("{r:?}"),
    }
    // Schedules cannot be turned off again.
    let reply = update_stream(&mut a, "allow_msg_schedules", false.into());
    assert_eq!(reply["error"]["err_code"], 10052, "{reply}");
    assert!(a.stream_info("TASKQ").unwrap().allow_msg_schedules);
}
