//! The blocking NATS client against a real nats-server with JetStream:
//! publish and dedup, PINGs met while waiting, pulls and their statuses,
//! every kind of ack, and the management calls' idempotence.

mod nats_common;

use std::time::{Duration, Instant};

use nats_common::{connect, consumer_spec, node, ready, stream_spec, CONSUMER, STREAM, SUBJECT};
use taskq_connect::nats::{MsgSelect, StreamSpec};
use taskq_proto::nats::{AckKind, Delivery, NatsError};

/// Pulls one message and returns its ack subject and delivery count.
fn pull_one(
    conn: &mut taskq_connect::nats::NatsConnection,
    expires: Duration,
) -> Option<(Vec<u8>, u64, Vec<u8>)> {
    conn.pull(STREAM, CONSUMER, 1, expires, None).unwrap();
    match conn.next_delivery().unwrap() {
        Delivery::Msg {
            reply, info, body, ..
        } => Some((reply.to_vec(), info.delivered, body.to_vec())),
        Delivery::Timeout => None,
        d => panic!("unexpected {d:?}"),
    }
}

#[test]
fn publish_gets_the_sequence_and_a_repeated_id_is_a_duplicate() {
    let c = node();
    let mut conn = connect(&c);
    conn.ensure_stream(&stream_spec()).unwrap();
    let a = conn.publish(SUBJECT, b"id-1", b"one").unwrap();
    assert_eq!((a.stream_seq, a.duplicate), (1, false));
    let b = conn.publish(SUBJECT, b"id-2", b"two").unwrap();
    assert_eq!((b.stream_seq, b.duplicate), (2, false));
    let again = conn.publish(SUBJECT, b"id-1", b"one").unwrap();
    assert_eq!((again.stream_seq, again.duplicate), (1, true));
    assert_eq!(conn.stream_info(STREAM).unwrap().messages, 2);
    let m = conn.msg_get(STREAM, MsgSelect::Seq(1)).unwrap();
    assert_eq!((m.subject.as_str(), &m.data[..]), (SUBJECT, &b"one"[..]));
    assert!(String::from_utf8_lossy(&m.headers).contains("Nats-Msg-Id: id-1"));
    let n = conn
        .msg_get(
            STREAM,
            MsgSelect::NextBySubject {
                subject: SUBJECT,
                seq: 2,
            },
        )
        .unwrap();
    assert_eq!(n.seq, 2);
    assert!(conn.msg_delete(STREAM, 2).unwrap());
    assert_eq!(conn.stream_info(STREAM).unwrap().messages, 1);
    // A subject no stream captures has no responders.
    assert!(matches!(
        conn.publish("nowhere.x", b"i", b""),
        Err(NatsError::NoResponders)
    ));
    assert!(!conn.is_broken());
}

#[test]
fn a_batch_goes_out_in_one_write_and_its_pubacks_come_in_order() {
    let c = node();
    let mut conn = connect(&c);
    conn.ensure_stream(&stream_spec()).unwrap();
    let before = conn.io_counts().writes;
    for i in 0..50 {
        conn.queue_publish(
            SUBJECT,
            format!("b{i}").as_bytes(),
            &[(b"Taskq-Pri", b"1")],
            b"x",
        )
        .unwrap();
    }
    conn.flush().unwrap();
    let pings = conn.pings_answered();
    assert_eq!(conn.io_counts().writes - before, 1);
    for i in 0..50 {
        assert_eq!(conn.recv_puback().unwrap().stream_seq, i + 1);
    }
    assert_eq!(
        conn.io_counts().writes - before,
        1 + conn.pings_answered() - pings
    );
    assert!(matches!(conn.recv_puback(), Err(NatsError::NothingOwed)));
}

#[test]
fn a_ping_met_while_idle_is_answered_and_the_connection_goes_on() {
    let c = node();
    let mut conn = connect(&c);
    conn.ensure_stream(&stream_spec()).unwrap();
    // The server pings a new client about 2 s after connecting.
    std::thread::sleep(Duration::from_millis(3500));
    assert_eq!(conn.publish(SUBJECT, b"late", b"x").unwrap().stream_seq, 1);
    assert!(
        conn.pings_answered() >= 1,
        "the server's first PING was answered"
    );
    // Answered in time: the server keeps the connection.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(conn.publish(SUBJECT, b"later", b"x").unwrap().stream_seq, 2);
}

#[test]
fn pulls_deliver_their_batch_then_end_with_408_or_404() {
    let (_c, mut conn) = ready(Duration::from_secs(30));
    for i in 0..3 {
        conn.publish(
            SUBJECT,
            format!("p{i}").as_bytes(),
            format!("job{i}").as_bytes(),
        )
        .unwrap();
    }
    conn.pull(STREAM, CONSUMER, 2, Duration::from_secs(1), None)
        .unwrap();
    let mut acks = Vec::new();
    for i in 0..2 {
        match conn.next_delivery().unwrap() {
            Delivery::Msg {
                subject,
                reply,
                body,
                info,
                ..
            } => {
                assert_eq!(subject, SUBJECT.as_bytes());
                assert_eq!(body, format!("job{i}").as_bytes());
                assert_eq!(
                    (info.stream, info.consumer),
                    (STREAM.as_bytes(), CONSUMER.as_bytes())
                );
                assert_eq!((info.delivered, info.stream_seq), (1, i + 1));
                acks.push(reply.to_vec());
            }
            d => panic!("{d:?}"),
        }
    }
    assert!(!conn.pulling(), "the batch was delivered in full");
    // One left: a batch of 5 gets it, then expires.
    let t = Instant::now();
    conn.pull(STREAM, CONSUMER, 5, Duration::from_millis(500), None)
        .unwrap();
    assert!(matches!(
        conn.next_delivery().unwrap(),
        Delivery::Msg { .. }
    ));
    assert_eq!(conn.next_delivery().unwrap(), Delivery::Timeout);
    assert!(t.elapsed() >= Duration::from_millis(400));
    // Nothing left: no_wait answers 404 at once.
    conn.pull_no_wait(STREAM, CONSUMER, 1).unwrap();
    assert_eq!(conn.next_delivery().unwrap(), Delivery::NoMessages);
    assert!(matches!(conn.next_delivery(), Err(NatsError::NothingOwed)));
    for a in &acks {
        assert!(conn.ack(a, AckKind::Ack, true).unwrap(), "confirmed");
    }
    let info = conn.consumer_info(STREAM, CONSUMER).unwrap();
    assert_eq!((info.num_pending, info.num_ack_pending), (0, 1));
}

/// A pull the server never takes: on 2.9.10 a pull for a consumer that has
/// no leader listening (here, none at all) is swallowed by the server's
/// JetStream API with no answer, as it is for a consumer just made or
/// during an election. Past the pull's expiry and the grace, a `PING` goes,
/// and its `PONG` ends the pull as unanswered: the connection stays. A
/// current server answers such a pull `503` (no responders) at once.
#[test]
fn a_pull_the_server_never_takes_ends_unanswered_and_the_connection_stays() {
    let (c, mut conn) = ready(Duration::from_secs(30));
    let v = c.version().unwrap();
    let old = (v.major, v.minor) < (2, 10);
    let t = Instant::now();
    conn.pull(STREAM, "nobody", 1, Duration::from_millis(300), None)
        .unwrap();
    let d = conn.next_delivery();
    let took = t.elapsed();
    if old {
        assert_eq!(d.unwrap(), Delivery::Unanswered);
        assert!(
            took >= Duration::from_millis(300)
                + taskq_proto::nats::pull_grace(
                    taskq_connect::nats::NatsConfig::default().io_timeout
                ),
            "{took:?}"
        );
    } else {
        assert!(matches!(d, Err(NatsError::NoResponders)), "{d:?}");
    }
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(!conn.pulling());
    assert!(!conn.is_broken());
    // The same connection goes on: a pull from the real consumer ends at
    // its expiry as usual.
    assert!(pull_one(&mut conn, Duration::from_millis(300)).is_none());
    assert!(conn.consumer_info(STREAM, CONSUMER).is_ok());
}

#[test]
fn heartbeats_arrive_during_a_long_pull() {
    let (_c, mut conn) = ready(Duration::from_secs(30));
    conn.pull(
        STREAM,
        CONSUMER,
        1,
        Duration::from_secs(2),
        Some(Duration::from_millis(300)),
    )
    .unwrap();
    assert_eq!(conn.next_delivery().unwrap(), Delivery::Heartbeat);
    assert!(conn.pulling());
}

#[test]
fn a_nak_with_delay_redelivers_after_the_delay_with_delivered_2() {
    let (_c, mut conn) = ready(Duration::from_secs(30));
    conn.publish(SUBJECT, b"n1", b"job").unwrap();
    let (ack, delivered, _) = pull_one(&mut conn, Duration::from_secs(1)).unwrap();
    assert_eq!(delivered, 1);
    let t = Instant::now();
    let delay = Duration::from_millis(1200);
    assert!(conn
        .ack(&ack, AckKind::Nak { delay: Some(delay) }, true)
        .unwrap());
    assert!(
        pull_one(&mut conn, Duration::from_millis(300)).is_none(),
        "not before the delay"
    );
    let (ack2, delivered, body) = pull_one(&mut conn, Duration::from_secs(3)).unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(1100),
        "{:?}",
        t.elapsed()
    );
    assert_eq!((delivered, &body[..]), (2, &b"job"[..]));
    assert!(conn.ack(&ack2, AckKind::Ack, true).unwrap());
}

#[test]
fn in_progress_extends_the_lease_past_the_ack_wait() {
    let (_c, mut conn) = ready(Duration::from_secs(1));
    conn.publish(SUBJECT, b"w1", b"job").unwrap();
    let (ack, _, _) = pull_one(&mut conn, Duration::from_secs(1)).unwrap();
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(2500) {
        std::thread::sleep(Duration::from_millis(400));
        assert!(conn.ack(&ack, AckKind::InProgress, true).unwrap());
    }
    // Past twice the ack wait and never redelivered.
    conn.pull_no_wait(STREAM, CONSUMER, 1).unwrap();
    assert_eq!(conn.next_delivery().unwrap(), Delivery::NoMessages);
    assert!(conn.ack(&ack, AckKind::Ack, true).unwrap());
    assert_eq!(
        conn.consumer_info(STREAM, CONSUMER)
            .unwrap()
            .num_redelivered,
        0
    );
}

#[test]
fn term_stops_redelivery_and_an_unacked_message_comes_back() {
    let (_c, mut conn) = ready(Duration::from_secs(1));
    conn.publish(SUBJECT, b"t1", b"term me").unwrap();
    conn.publish(SUBJECT, b"t2", b"forget me").unwrap();
    let (ack, _, body) = pull_one(&mut conn, Duration::from_secs(1)).unwrap();
    assert_eq!(body, b"term me");
    assert!(conn.ack(&ack, AckKind::Term, true).unwrap());
    let (_, d, body) = pull_one(&mut conn, Duration::from_secs(1)).unwrap();
    assert_eq!((d, &body[..]), (1, &b"forget me"[..]));
    // Past the ack wait the unacked one is delivered again; the terminated one never.
    let (ack, d, body) = pull_one(&mut conn, Duration::from_secs(3)).unwrap();
    assert_eq!((d, &body[..]), (2, &b"forget me"[..]));
    assert!(conn.ack(&ack, AckKind::Ack, true).unwrap());
    conn.pull(STREAM, CONSUMER, 1, Duration::from_millis(1500), None)
        .unwrap();
    assert_eq!(conn.next_delivery().unwrap(), Delivery::Timeout);
}

#[test]
fn an_ack_and_the_next_pull_go_out_in_one_write() {
    let (_c, mut conn) = ready(Duration::from_secs(30));
    for i in 0..2 {
        conn.publish(SUBJECT, format!("s{i}").as_bytes(), b"x")
            .unwrap();
    }
    let (ack, _, _) = pull_one(&mut conn, Duration::from_secs(1)).unwrap();
    let w = conn.io_counts().writes;
    let p = conn.pings_answered();
    let token = conn.queue_ack(&ack, AckKind::Ack, true).unwrap().unwrap();
    conn.pull(STREAM, CONSUMER, 1, Duration::from_secs(1), None)
        .unwrap();
    let (mut confirmed, mut msg) = (false, false);
    while !(confirmed && msg) {
        match conn.next_delivery().unwrap() {
            Delivery::Confirmed(t) => {
                assert_eq!(t, token);
                confirmed = true;
            }
            Delivery::Msg { info, .. } => {
                assert_eq!(info.stream_seq, 2);
                msg = true;
            }
            d => panic!("{d:?}"),
        }
    }
    assert_eq!(conn.io_counts().writes - w, 1 + conn.pings_answered() - p);
}

/// Runs `f` on a thread of its own; a panic when it has not ended within
/// `limit` (a read waiting for a reply that no write asked for).
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).expect("ended within its limit")
}

#[test]
fn an_ack_queued_alone_goes_out_when_its_confirmation_is_read() {
    let (c, mut conn) = ready(Duration::from_secs(30));
    conn.publish(SUBJECT, b"q1", b"x").unwrap();
    let (ack, _, _) = pull_one(&mut conn, Duration::from_secs(1)).unwrap();
    // Queued, and read for at once: no pull or flush between.
    let token = conn.queue_ack(&ack, AckKind::Ack, true).unwrap().unwrap();
    let got = within(Duration::from_secs(10), move || {
        let d = conn.next_delivery().map(|d| format!("{d:?}"));
        (d, conn)
    });
    assert_eq!(got.0.unwrap(), format!("{:?}", Delivery::Confirmed(token)));
    drop(c);
}

#[cfg(feature = "tokio")]
#[test]
fn an_async_publish_queued_alone_goes_out_when_its_puback_is_read() {
    use taskq_connect::tokio::AsyncNatsConn;
    let (c, _conn) = ready(Duration::from_secs(30));
    let seeds = [c.addr(0).to_string()];
    let got = within(Duration::from_secs(10), move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let cfg = taskq_connect::nats::NatsConfig::default();
            let mut a = AsyncNatsConn::connect(&seeds, &cfg).await.unwrap();
            let one = a
                .queue_publish(SUBJECT.as_bytes(), b"a1", &[], b"one")
                .unwrap();
            let first = a.recv_puback().await.map(|p| p.stream_seq);
            let two = a
                .queue_publish(SUBJECT.as_bytes(), b"a2", &[], b"two")
                .unwrap();
            let second = a
                .recv_any_puback()
                .await
                .map(|(t, p)| (t, p.map(|p| p.stream_seq)));
            (one, first, two, second)
        })
    });
    let (one, first, two, second) = got;
    assert_ne!(one, two);
    assert_eq!(first.unwrap(), 1);
    let (token, seq) = second.unwrap();
    assert_eq!((token, seq.unwrap()), (two, 2));
    drop(c);
}

#[test]
fn ensure_is_idempotent_and_never_changes_what_exists() {
    let c = node();
    let mut conn = connect(&c);
    let s1 = conn.ensure_stream(&stream_spec()).unwrap();
    let s2 = conn.ensure_stream(&stream_spec()).unwrap();
    assert_eq!(
        (s1.name.as_str(), s1.retention.as_str()),
        (STREAM, "workqueue")
    );
    assert_eq!(s2.subjects, vec!["taskq.>".to_string()]);
    // The server writes `>` as `\u003e`: only parsed JSON compares.
    let raw = conn
        .request("$JS.API.STREAM.INFO.TASKQ", b"", Duration::from_secs(2))
        .unwrap();
    assert!(String::from_utf8_lossy(&raw).contains(r"taskq.\u003e"));
    // A narrower need is covered by the wildcard.
    let narrow = StreamSpec {
        subjects: vec!["taskq.T".into()],
        ..stream_spec()
    };
    conn.ensure_stream(&narrow).unwrap();
    let c1 = conn
        .ensure_consumer(STREAM, CONSUMER, &consumer_spec(Duration::from_secs(30)))
        .unwrap();
    assert_eq!(c1.ack_wait, Duration::from_secs(30));
    // Asked again with another ack wait: the existing consumer is left as it is.
    let c2 = conn
        .ensure_consumer(STREAM, CONSUMER, &consumer_spec(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(c2.ack_wait, Duration::from_secs(30));
    assert_eq!(
        conn.consumer_info(STREAM, CONSUMER).unwrap().ack_wait,
        Duration::from_secs(30)
    );
    // A stream that does not capture what we need is a typed error, unchanged.
    let other = StreamSpec {
        subjects: vec!["elsewhere.x".into()],
        ..stream_spec()
    };
    assert!(matches!(
        conn.ensure_stream(&other),
        Err(NatsError::Mismatch(_))
    ));
    assert_eq!(
        conn.stream_info(STREAM).unwrap().subjects,
        vec!["taskq.>".to_string()]
    );
    // A stream that is not a work queue: a typed error, unchanged.
    let cfg = br#"{"name":"LOGS","subjects":["logs.>"],"retention":"limits","storage":"memory"}"#;
    let reply = conn
        .request("$JS.API.STREAM.CREATE.LOGS", cfg, Duration::from_secs(2))
        .unwrap();
    assert!(!String::from_utf8_lossy(&reply).contains("\"error\""));
    let logs = StreamSpec {
        name: "LOGS".into(),
        subjects: vec!["logs.x".into()],
        ..stream_spec()
    };
    match conn.ensure_stream(&logs) {
        Err(NatsError::Mismatch(m)) => assert!(m.contains("limits"), "{m}"),
        r => panic!("{r:?}"),
    }
    assert_eq!(conn.stream_info("LOGS").unwrap().retention, "limits");
    // A missing stream is an API error 404.
    match conn.stream_info("NOPE") {
        Err(NatsError::Api(e)) => assert_eq!((e.code, e.err_code), (404, 10059)),
        r => panic!("{r:?}"),
    }
    assert!(!conn.is_broken());
}

/// What the server does that makes `ensure_*` look before they create.
#[test]
fn server_facts_the_ensure_calls_rely_on() {
    let (_c, mut conn) = ready(Duration::from_secs(30));
    let err = |reply: Vec<u8>| -> (u64, u64) {
        let v: serde_json::Value = serde_json::from_slice(&reply).unwrap();
        let e = &v["error"];
        (
            e["code"].as_u64().unwrap_or(0),
            e["err_code"].as_u64().unwrap_or(0),
        )
    };
    let t = Duration::from_secs(2);
    // The same stream config again succeeds; another one fails with 10058.
    let same = br#"{"name":"TASKQ","subjects":["taskq.>"],"retention":"workqueue","storage":"file","num_replicas":1}"#;
    assert_eq!(
        err(conn
            .request("$JS.API.STREAM.CREATE.TASKQ", same, t)
            .unwrap()),
        (0, 0)
    );
    let other = br#"{"name":"TASKQ","subjects":["taskq.>"],"retention":"workqueue","storage":"memory","num_replicas":1}"#;
    assert_eq!(
        err(conn
            .request("$JS.API.STREAM.CREATE.TASKQ", other, t)
            .unwrap())
        .1,
        10058
    );
    // A stream whose subjects overlap an existing one: 10065.
    let overlap = br#"{"name":"OVER","subjects":["taskq.T"],"storage":"memory"}"#;
    assert_eq!(
        err(conn
            .request("$JS.API.STREAM.CREATE.OVER", overlap, t)
            .unwrap())
        .1,
        10065
    );
    // A work queue refuses a second consumer with an overlapping filter (10100)
    // and an unfiltered one (10099).
    // The config ensure_consumer sends (consumer_spec) but for a 5 s ack wait.
    let create = |conn: &mut taskq_connect::nats::NatsConnection, name: &str, filter: &str| {
        let f = if filter.is_empty() {
            String::new()
        } else {
            format!(",\"filter_subject\":\"{filter}\"")
        };
        let body = format!(
            r#"{{"stream_name":"TASKQ","config":{{"durable_name":"{name}","ack_policy":"explicit","deliver_policy":"all","ack_wait":5000000000,"max_deliver":-1,"max_ack_pending":1000,"max_waiting":64{f}}}}}"#
        );
        err(conn
            .request(
                &format!("$JS.API.CONSUMER.DURABLE.CREATE.TASKQ.{name}"),
                body.as_bytes(),
                t,
            )
            .unwrap())
    };
    assert_eq!(create(&mut conn, "second", SUBJECT).1, 10100);
    assert_eq!(create(&mut conn, "third", "").1, 10099);
    // Creating the existing durable with another ack wait silently changes it
    // (nats-server 2.9): why ensure_consumer never creates what exists.
    assert_eq!(create(&mut conn, CONSUMER, SUBJECT), (0, 0));
    assert_eq!(
        conn.consumer_info(STREAM, CONSUMER).unwrap().ack_wait,
        Duration::from_secs(5)
    );
}

#[test]
fn a_deleted_consumer_ends_the_pull_with_409_and_an_interrupter_cuts_a_pull() {
    let (c, mut conn) = ready(Duration::from_secs(30));
    let mut admin = connect(&c);
    conn.pull(STREAM, CONSUMER, 1, Duration::from_secs(5), None)
        .unwrap();
    // The consumer is deleted only once the pull waits on it.
    let deadline = Instant::now() + Duration::from_secs(4);
    while admin.consumer_info(STREAM, CONSUMER).unwrap().num_waiting != 1 {
        assert!(Instant::now() < deadline, "the pull never waited");
        std::thread::sleep(Duration::from_millis(20));
    }
    let reply = admin
        .request(
            &format!("$JS.API.CONSUMER.DELETE.{STREAM}.{CONSUMER}"),
            b"",
            Duration::from_secs(2),
        )
        .unwrap();
    assert!(String::from_utf8_lossy(&reply).contains("\"success\":true"));
    match conn.next_delivery().unwrap() {
        Delivery::Conflict(why) => assert_eq!(why, b"Consumer Deleted"),
        d => panic!("{d:?}"),
    }
    assert!(!conn.pulling() && !conn.is_broken());

    conn.ensure_consumer(STREAM, CONSUMER, &consumer_spec(Duration::from_secs(30)))
        .unwrap();
    conn.pull(STREAM, CONSUMER, 1, Duration::from_secs(10), None)
        .unwrap();
    let cut = conn.interrupter().unwrap();
    let t = Instant::now();
    let h = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        cut.interrupt();
    });
    let e = conn.next_delivery().unwrap_err();
    assert!(matches!(e, NatsError::Closed | NatsError::Io(_)), "{e:?}");
    assert!(t.elapsed() < Duration::from_secs(3));
    assert!(conn.is_broken());
    assert!(matches!(
        conn.publish(SUBJECT, b"x", b""),
        Err(NatsError::Broken)
    ));
    h.join().unwrap();
}
