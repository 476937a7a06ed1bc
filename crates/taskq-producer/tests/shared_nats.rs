//! The shared producer on JetStream, against real nats-servers on loopback:
//! many tasks on one connection, each PubAck matched to its put by reply
//! subject, checked against the stream's own record (every stored message
//! read back); through cut connections the puts owed are sent again with
//! their `Nats-Msg-Id` and each body is stored once.
#![cfg(feature = "tokio")]

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::time::Duration;

use taskq_producer::{Error, Producer, PutOptions, PutOutcome, SharedProducer};
use taskq_proto::nats::{MsgSelect, NatsConfig, NatsConnection};
use taskq_testkit::{ChaosProxy, Direction, NatsCluster, Toxic};

fn run<T>(f: impl Future<Output = T>) -> T {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(120), f)
            .await
            .expect("the test's async part ends within 120 s")
    })
}

type Outcomes = Vec<(String, Vec<u8>, Result<u64, Error>)>;

async fn put_from_tasks(
    p: &SharedProducer,
    tasks: usize,
    per_task: usize,
    tubes: usize,
) -> Outcomes {
    let mut handles = Vec::new();
    for t in 0..tasks {
        let p = p.clone();
        handles.push(tokio::spawn(async move {
            let tube = format!("tube{}", t % tubes);
            let mut out = Vec::with_capacity(per_task);
            for i in 0..per_task {
                let body = format!("task {t} job {i}").into_bytes();
                let r = p.put(&tube, &body, PutOptions::default()).await;
                out.push((tube.clone(), body, r.map(|id| id.get())));
            }
            out
        }));
    }
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.expect("a caller task"));
    }
    all
}

/// Every message of the stream: sequence → (tube, body).
fn stream_record(c: &NatsCluster) -> HashMap<u64, (String, Vec<u8>)> {
    let mut admin =
        NatsConnection::connect(&[c.addr(0).to_string()], NatsConfig::default()).expect("admin");
    let info = admin.stream_info("TASKQ").expect("stream info");
    let mut jobs = HashMap::new();
    for seq in info.first_seq..=info.last_seq {
        if info.messages == 0 {
            break;
        }
        let m = admin
            .msg_get("TASKQ", MsgSelect::Seq(seq))
            .expect("stored message");
        let tube = m
            .subject
            .strip_prefix("taskq.")
            .expect("a taskq subject")
            .to_owned();
        jobs.insert(seq, (tube, m.data));
    }
    assert_eq!(jobs.len() as u64, info.messages);
    jobs
}

/// Each acknowledged sequence holds its caller's body; no sequence went to
/// two callers; no body is stored twice; stored but unacknowledged messages
/// are no more than the unknown outcomes.
fn check_against_stream(
    outcomes: &Outcomes,
    jobs: &HashMap<u64, (String, Vec<u8>)>,
) -> (usize, usize) {
    let mut acked = HashSet::new();
    let mut unknown = 0;
    for (tube, body, r) in outcomes {
        match r {
            Ok(seq) => {
                assert!(
                    acked.insert(*seq),
                    "sequence {seq} was given to two callers"
                );
                let (t, b) = jobs
                    .get(seq)
                    .unwrap_or_else(|| panic!("acknowledged {seq} is not stored"));
                assert_eq!(
                    (t, b),
                    (tube, body),
                    "message {seq} holds another caller's put"
                );
            }
            Err(e) if e.outcome_unknown() => unknown += 1,
            Err(e) => assert!(e.not_sent(), "neither stored, unknown nor not sent: {e}"),
        }
    }
    let mut bodies = HashSet::new();
    for (seq, (_, b)) in jobs {
        assert!(
            bodies.insert(b.clone()),
            "message {seq}'s body is stored twice"
        );
    }
    let unacked = jobs.keys().filter(|s| !acked.contains(s)).count();
    assert!(
        unacked <= unknown,
        "{unacked} stored unacknowledged, {unknown} unknown"
    );
    (acked.len(), unknown)
}

#[test]
fn two_hundred_fifty_six_tasks_each_get_their_own_sequence_on_one_connection() {
    let c = NatsCluster::start(1).unwrap();
    let url = c.url();
    let (outcomes, connects) = run(async {
        let p = SharedProducer::connect(&url).await.unwrap();
        let outcomes = put_from_tasks(&p, 256, 100, 4).await;
        (outcomes, p.connects())
    });
    assert_eq!(connects, 1);
    let jobs = stream_record(&c);
    let (acked, unknown) = check_against_stream(&outcomes, &jobs);
    assert_eq!((acked, unknown, jobs.len()), (25_600, 0, 25_600));
}

#[test]
fn pubacks_cut_off_mid_run_are_resolved_by_resending_and_each_body_is_stored_once() {
    let c = NatsCluster::start(1).unwrap();
    let proxy = ChaosProxy::start(c.addr(0)).unwrap();
    let url = format!("nats://{}", proxy.addr());
    let (outcomes, connects) = run(async {
        let p = Producer::builder()
            .io_timeout(Duration::from_secs(2))
            .resolve_for(Duration::from_secs(60))
            .connect_shared(&url)
            .await
            .unwrap();
        // From here on every connection closes after 20,000 bytes from the
        // server (its INFO and about 200 PubAcks): the PubAcks then owed
        // are lost, and their puts go again on the next connection.
        proxy.add(
            Toxic::LimitData { bytes: 20_000 },
            Direction::Downstream,
            1.0,
        );
        let outcomes = put_from_tasks(&p, 64, 40, 2).await;
        (outcomes, p.connects())
    });
    let jobs = stream_record(&c);
    let (acked, unknown) = check_against_stream(&outcomes, &jobs);
    eprintln!("acked {acked}, unknown {unknown}, connects {connects}");
    // 2,560 PubAcks of over 40 bytes cannot pass through 20,000-byte connections in fewer than 5.
    assert!(connects >= 5, "{connects} connects");
    assert_eq!(
        (acked, unknown),
        (2_560, 0),
        "every put resolved within resolve_for"
    );
    assert_eq!(jobs.len(), 2_560, "each body stored once");
}

#[test]
fn requests_cut_off_mid_publish_are_resent_with_their_ids_and_stored_once() {
    let c = NatsCluster::start(1).unwrap();
    let proxy = ChaosProxy::start(c.addr(0)).unwrap();
    let url = format!("nats://{}", proxy.addr());
    let (outcomes, connects) = run(async {
        let p = Producer::builder()
            .io_timeout(Duration::from_secs(2))
            .resolve_for(Duration::from_secs(60))
            .connect_shared(&url)
            .await
            .unwrap();
        // Every connection forwards 30,000 bytes of requests (its CONNECT,
        // and about 230 publishes), then closes: the last is cut mid-way.
        proxy.add(Toxic::LimitData { bytes: 30_000 }, Direction::Upstream, 1.0);
        let outcomes = put_from_tasks(&p, 32, 60, 2).await;
        (outcomes, p.connects())
    });
    let jobs = stream_record(&c);
    let (acked, unknown) = check_against_stream(&outcomes, &jobs);
    eprintln!("acked {acked}, unknown {unknown}, connects {connects}");
    assert!(
        connects >= 4,
        "1,920 publishes of over 100 bytes need at least 7 connections of 30,000: {connects}"
    );
    assert_eq!((acked, unknown, jobs.len()), (1_920, 0, 1_920));
}

#[test]
fn a_batch_and_lone_puts_share_the_connection_and_get_their_own_sequences() {
    let c = NatsCluster::start(1).unwrap();
    let url = c.url();
    let (out, lone) = run(async {
        let p = SharedProducer::connect(&url).await.unwrap();
        let bodies: Vec<Vec<u8>> = (0..300).map(|i| format!("b{i}").into_bytes()).collect();
        let mut out = vec![PutOutcome::NotSent; 300];
        let batch = p.put_batch("tube0", &bodies, PutOptions::default(), &mut out);
        let lone = p.put("tube1", b"alone", PutOptions::default());
        let (r, lone) = tokio::join!(batch, lone);
        assert_eq!(r.unwrap().inserted, 300);
        (out, lone.unwrap().get())
    });
    let jobs = stream_record(&c);
    for (i, o) in out.iter().enumerate() {
        let seq = o.id().expect("stored").get();
        assert_eq!(
            jobs[&seq],
            ("tube0".to_owned(), format!("b{i}").into_bytes())
        );
    }
    assert_eq!(jobs[&lone], ("tube1".to_owned(), b"alone".to_vec()));
    assert_eq!(jobs.len(), 301);
}

#[test]
fn a_tube_that_is_not_one_subject_token_is_refused_before_sending() {
    let c = NatsCluster::start(1).unwrap();
    let url = c.url();
    run(async {
        let p = SharedProducer::connect(&url).await.unwrap();
        let r = p.put("a.b", b"x", PutOptions::default()).await;
        assert!(matches!(r, Err(Error::Invalid(_))), "{r:?}");
        p.put("ok", b"x", PutOptions::default()).await.unwrap();
    });
    assert_eq!(stream_record(&c).len(), 1);
}

#[test]
fn a_stopped_server_holds_puts_back_within_the_bound_and_they_go_on_after() {
    let c = NatsCluster::start(1).unwrap();
    let url = c.url();
    let (outcomes, most_waiting) = run(async {
        let p = Producer::builder()
            .io_timeout(Duration::from_secs(60))
            .max_queued_puts(32)
            .connect_shared(&url)
            .await
            .unwrap();
        p.put("tube0", b"before", PutOptions::default())
            .await
            .unwrap();
        // The node stops (SIGSTOP, every thread stopped before this returns).
        c.stop(0).unwrap();
        let callers = tokio::spawn({
            let p = p.clone();
            async move { put_from_tasks(&p, 200, 2, 1).await }
        });
        let mut most = 0;
        let mut full_for = 0;
        while full_for < 50 {
            let w = p.waiting();
            most = most.max(w);
            if w == 32 {
                full_for += 1;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert!(
            !callers.is_finished(),
            "400 puts cannot finish while the server is stopped"
        );
        c.cont(0).unwrap();
        (callers.await.unwrap(), most)
    });
    assert_eq!(most_waiting, 32, "at most max_queued_puts wait");
    let mut jobs = stream_record(&c);
    jobs.retain(|_, (_, b)| b != b"before");
    let (acked, unknown) = check_against_stream(&outcomes, &jobs);
    assert_eq!((acked, unknown, jobs.len()), (400, 0, 400));
}
