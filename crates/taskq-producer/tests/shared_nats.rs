//! The shared producer on JetStream, against real nats-servers on loopback:
//! many tasks on one connection, each PubAck matched to its put by reply
//! subject, checked against the stream's own record (every stored message
//! read back); through cut connections the puts owed are sent again with
//! their `Nats-Msg-Id` and each body is stored once; a put's future dropped
//! before its write is never published, and one dropped after leaves its
//! PubAck to nobody. Each test that puts runs on nats-server 2.9.10 and
//! again on the pinned current release.
#![cfg(feature = "tokio")]

mod common;

use common::current_node;
use common::shared::{
    check_against_record, cut_run, drop_one_before_its_write_then_put, put_from_tasks, run,
    stalled_run, Record,
};
use taskq_connect::nats::{MsgSelect, NatsConfig, NatsConnection};
use taskq_producer::{Error, Producer, PutOptions, PutOutcome, SharedProducer};
use taskq_testkit::{ChaosProxy, Direction, NatsCluster, Toxic};

/// A test of `body` (given the node, then any further arguments) on
/// nats-server 2.9.10 (`name`) and the same on the pinned current release
/// (`current`, which says it skipped where that binary is not here, and
/// fails instead where `TASKQ_NATS_CURRENT` is set).
macro_rules! on_both_servers {
    ($name:ident, $current:ident, $body:ident $(, $arg:expr)*) => {
        #[test]
        fn $name() {
            $body(&NatsCluster::start(1).unwrap() $(, $arg)*);
        }

        #[test]
        fn $current() {
            if let Some(c) = current_node() {
                $body(&c $(, $arg)*);
            }
        }
    };
}

/// Every message of the stream: sequence → (tube, body).
fn stream_record(c: &NatsCluster) -> Record {
    let mut admin =
        NatsConnection::connect(&[c.addr(0).to_string()], NatsConfig::default()).expect("admin");
    let info = admin.stream_info("TASKQ").expect("stream info");
    let mut jobs = Record::new();
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

on_both_servers!(
    two_hundred_fifty_six_tasks_each_get_their_own_sequence_on_one_connection,
    on_a_current_server_two_hundred_fifty_six_tasks_each_get_their_own_sequence_on_one_connection,
    two_hundred_fifty_six_tasks_each_get_their_own_sequence_on_one_connection_on
);

fn two_hundred_fifty_six_tasks_each_get_their_own_sequence_on_one_connection_on(c: &NatsCluster) {
    let url = c.url();
    let (outcomes, connects) = run(async {
        let p = SharedProducer::connect(&url).await.unwrap();
        let outcomes = put_from_tasks(&p, 256, 100, 4).await;
        (outcomes, p.connects())
    });
    assert_eq!(connects, 1);
    let jobs = stream_record(c);
    let (acked, unknown) = check_against_record(&outcomes, &jobs);
    assert_eq!((acked, unknown, jobs.len()), (25_600, 0, 25_600));
}

on_both_servers!(
    pubacks_cut_off_mid_run_are_resolved_by_resending_and_each_body_is_stored_once,
    on_a_current_server_pubacks_cut_off_mid_run_are_resolved_by_resending_and_each_body_is_stored_once,
    pubacks_cut_off,
    Toxic::LimitData { bytes: 20_000 }
);

on_both_servers!(
    pubacks_reset_mid_run_are_resolved_by_resending_and_each_body_is_stored_once,
    on_a_current_server_pubacks_reset_mid_run_are_resolved_by_resending_and_each_body_is_stored_once,
    pubacks_cut_off,
    Toxic::ResetAfterData { bytes: 20_000 }
);

fn pubacks_cut_off(c: &NatsCluster, cut: Toxic) {
    let proxy = ChaosProxy::start(c.addr(0)).unwrap();
    let url = format!("nats://{}", proxy.addr());
    // Every connection closes (or is reset) after 20,000 bytes from the
    // server (its INFO and about 200 PubAcks): the PubAcks then owed are
    // lost, and their puts go again, with their ids, on the next connection.
    let (outcomes, connects) = cut_run(&proxy, &url, (Direction::Downstream, cut), 64, 40);
    let jobs = stream_record(c);
    let (acked, unknown) = check_against_record(&outcomes, &jobs);
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

on_both_servers!(
    requests_cut_off_mid_publish_are_resent_with_their_ids_and_stored_once,
    on_a_current_server_requests_cut_off_mid_publish_are_resent_with_their_ids_and_stored_once,
    requests_cut_off,
    Toxic::LimitData { bytes: 30_000 }
);

on_both_servers!(
    requests_reset_mid_publish_are_resent_with_their_ids_and_stored_once,
    on_a_current_server_requests_reset_mid_publish_are_resent_with_their_ids_and_stored_once,
    requests_cut_off,
    Toxic::ResetAfterData { bytes: 30_000 }
);

fn requests_cut_off(c: &NatsCluster, cut: Toxic) {
    let proxy = ChaosProxy::start(c.addr(0)).unwrap();
    let url = format!("nats://{}", proxy.addr());
    // Every connection forwards 30,000 bytes of requests (its CONNECT, and
    // about 230 publishes), then closes (or is reset): the last is cut
    // mid-way.
    let (outcomes, connects) = cut_run(&proxy, &url, (Direction::Upstream, cut), 32, 60);
    let jobs = stream_record(c);
    let (acked, unknown) = check_against_record(&outcomes, &jobs);
    eprintln!("acked {acked}, unknown {unknown}, connects {connects}");
    // 1,920 publishes of over 100 bytes need at least 7 connections of 30,000.
    assert!(connects >= 7, "{connects} connects");
    assert_eq!((acked, unknown, jobs.len()), (1_920, 0, 1_920));
}

on_both_servers!(
    a_batch_and_lone_puts_share_the_connection_and_get_their_own_sequences,
    on_a_current_server_a_batch_and_lone_puts_share_the_connection_and_get_their_own_sequences,
    a_batch_and_lone_puts_share_the_connection_and_get_their_own_sequences_on
);

fn a_batch_and_lone_puts_share_the_connection_and_get_their_own_sequences_on(c: &NatsCluster) {
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
    let jobs = stream_record(c);
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

on_both_servers!(
    a_stopped_server_holds_puts_back_within_the_bound_and_they_go_on_after,
    on_a_current_server_a_stopped_server_holds_puts_back_within_the_bound_and_they_go_on_after,
    a_stopped_server_holds_puts_back_within_the_bound_and_they_go_on_after_on
);

fn a_stopped_server_holds_puts_back_within_the_bound_and_they_go_on_after_on(c: &NatsCluster) {
    // SIGSTOP: every thread of the node stopped before `stop` returns.
    let (outcomes, most_waiting) =
        stalled_run(&c.url(), 32, || c.stop(0).unwrap(), || c.cont(0).unwrap());
    assert_eq!(most_waiting, 32, "at most max_queued_puts wait");
    let mut jobs = stream_record(c);
    jobs.retain(|_, (_, b)| b != b"before");
    let (acked, unknown) = check_against_record(&outcomes, &jobs);
    assert_eq!((acked, unknown, jobs.len()), (400, 0, 400));
}

on_both_servers!(
    a_put_dropped_before_its_write_is_never_published,
    on_a_current_server_a_put_dropped_before_its_write_is_never_published,
    a_put_dropped_before_its_write_is_never_published_on
);

fn a_put_dropped_before_its_write_is_never_published_on(c: &NatsCluster) {
    let kept = drop_one_before_its_write_then_put(&c.url());
    let jobs = stream_record(c);
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[&kept], ("tube0".to_owned(), b"kept".to_vec()));
}

on_both_servers!(
    a_put_dropped_after_its_write_keeps_its_puback_from_the_next_caller,
    on_a_current_server_a_put_dropped_after_its_write_keeps_its_puback_from_the_next_caller,
    a_put_dropped_after_its_write_keeps_its_puback_from_the_next_caller_on
);

/// The first put's publish is stored, and its PubAck held back by the proxy
/// (5 s of latency from the server) while its future is dropped: the PubAck
/// then goes to nobody, and the next caller gets its own sequence, on the
/// same connection.
fn a_put_dropped_after_its_write_keeps_its_puback_from_the_next_caller_on(c: &NatsCluster) {
    let proxy = ChaosProxy::start(c.addr(0)).unwrap();
    let url = format!("nats://{}", proxy.addr());
    let (warm, second, waiting, connects) = run(async {
        let p = Producer::builder()
            // Far beyond the held PubAcks: no deadline breaks the connection.
            .io_timeout(std::time::Duration::from_secs(60))
            .connect_shared(&url)
            .await
            .unwrap();
        let warm = p
            .put("tube0", b"warm", PutOptions::default())
            .await
            .unwrap();
        proxy.add(
            Toxic::Latency {
                delay: std::time::Duration::from_secs(5),
                jitter: std::time::Duration::ZERO,
            },
            Direction::Downstream,
            1.0,
        );
        let first = tokio::spawn({
            let p = p.clone();
            async move { p.put("tube0", b"first", PutOptions::default()).await }
        });
        let admin = c.addr(0);
        let stored = tokio::task::spawn_blocking(move || {
            let mut a = NatsConnection::connect(&[admin.to_string()], NatsConfig::default())
                .expect("admin");
            let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while std::time::Instant::now() < until {
                if a.stream_info("TASKQ").expect("stream info").messages == 2 {
                    return true;
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            false
        })
        .await
        .unwrap();
        assert!(stored, "the first put's publish reached the stream");
        first.abort();
        assert!(
            first.await.unwrap_err().is_cancelled(),
            "dropped while its PubAck was held"
        );
        let second = p.put("tube0", b"second", PutOptions::default()).await;
        (
            warm.get(),
            second.map(|id| id.get()),
            p.waiting(),
            p.connects(),
        )
    });
    let jobs = stream_record(c);
    let second = second.unwrap();
    assert_eq!(jobs[&warm], ("tube0".to_owned(), b"warm".to_vec()));
    assert_eq!(jobs[&second], ("tube0".to_owned(), b"second".to_vec()));
    assert_eq!(jobs.len(), 3, "{jobs:?}");
    assert!(
        jobs.values().any(|(_, b)| b == b"first"),
        "the dropped put was stored once: {jobs:?}"
    );
    assert_eq!((waiting, connects), (0, 1), "nothing waits, one connection");
}
