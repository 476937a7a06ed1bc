//! The async producer on JetStream, against real nats-servers on loopback,
//! one test per outcome: stored (one write per put, the stream sequence as
//! id), a batch in one write, an unknown outcome resolved by a re-send with
//! the same `Nats-Msg-Id` that the stream answers as a duplicate, a rejection,
//! not sent (nothing listens; no responders past `resolve_for`), an invalid
//! tube, credentials, and TLS (the session the blocking handshake set up,
//! driven by tokio).
#![cfg(feature = "tokio")]

mod common;

use std::future::Future;
use std::time::{Duration, Instant};

use taskq_connect::nats::{
    MsgSelect, NatsAccess, NatsConfig, NatsConnection, StreamInfo, TlsSettings,
};
use taskq_connect::READY_AT_HEADER;
use taskq_producer::{AsyncProducer, Error, NotSent, Producer, PutOptions, PutOutcome};
use taskq_proto::nats::TlsFailure;
use taskq_proto::Secret;
use taskq_testkit::{ChaosProxy, Direction, NatsCluster, Toxic};

/// Runs `f` on a current-thread runtime, bounded in time, and checks that
/// nothing of it ran on tokio's blocking pool: connecting (TLS and
/// credentials included) and the stream's setup are all on the runtime. A
/// current-thread runtime starts no thread but its blocking pool's, so the
/// count of threads it started is that pool's.
fn run<T>(f: impl Future<Output = T>) -> T {
    let started = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = started.clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .on_thread_start(move || {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        })
        .build()
        .unwrap();
    let out = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), f)
            .await
            .expect("the test's async part ends within 60 s")
    });
    drop(rt);
    assert_eq!(
        started.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "threads started on tokio's blocking pool"
    );
    out
}

fn admin(c: &NatsCluster) -> NatsConnection {
    NatsConnection::connect(&[c.addr(0).to_string()], NatsConfig::default()).expect("admin")
}

fn stream(c: &NatsCluster) -> StreamInfo {
    admin(c).stream_info("TASKQ").expect("stream info")
}

#[test]
fn puts_are_stored_with_the_stream_sequence_as_id_one_write_each() {
    let c = NatsCluster::start(1).unwrap();
    let url = c.url();
    let (ids, writes, delayed) = run(async {
        let mut p = Producer::builder()
            .tube("emails")
            .connect_async(&url)
            .await
            .unwrap();
        assert_eq!(p.tube(), "emails");
        let mut ids = Vec::new();
        let before = p.io_counts().unwrap();
        for i in 0..3 {
            let body = format!("job {i}");
            ids.push(
                p.put(body.as_bytes(), PutOptions::default())
                    .await
                    .unwrap()
                    .get(),
            );
        }
        let writes = p.io_counts().unwrap().writes - before.writes;
        let delay = PutOptions {
            delay: 30,
            ..PutOptions::default()
        };
        let delayed = p.put(b"later", delay).await.unwrap().get();
        p.use_tube("other").await.unwrap();
        p.put(b"elsewhere", PutOptions::default()).await.unwrap();
        (ids, writes, delayed)
    });
    assert_eq!(ids, [1, 2, 3]);
    assert_eq!(writes, 3, "one write per put");
    let s = stream(&c);
    assert_eq!((s.messages, s.retention.as_str()), (5, "workqueue"));
    let mut a = admin(&c);
    let m = a.msg_get("TASKQ", MsgSelect::Seq(2)).unwrap();
    assert_eq!(
        (m.subject.as_str(), &m.data[..]),
        ("taskq.emails", &b"job 1"[..])
    );
    let m = a.msg_get("TASKQ", MsgSelect::Seq(delayed)).unwrap();
    let header = String::from_utf8_lossy(&m.headers).into_owned();
    assert!(
        header.contains(std::str::from_utf8(READY_AT_HEADER).unwrap()),
        "{header}"
    );
    assert!(header.contains("Nats-Msg-Id"), "{header}");
    let m = a.msg_get("TASKQ", MsgSelect::Seq(5)).unwrap();
    assert_eq!(m.subject, "taskq.other");
}

#[test]
fn a_batch_goes_out_in_one_write_and_each_job_gets_its_sequence() {
    let c = NatsCluster::start(1).unwrap();
    let url = c.url();
    let bodies: Vec<Vec<u8>> = (0..200).map(|i| format!("b{i}").into_bytes()).collect();
    let (out, writes) = run(async {
        let mut p = AsyncProducer::connect(&url).await.unwrap();
        let mut out = vec![PutOutcome::NotSent; bodies.len()];
        let before = p.io_counts().unwrap();
        let r = p
            .put_batch(&bodies, PutOptions::default(), &mut out)
            .await
            .unwrap();
        assert_eq!((r.inserted, r.rejected), (200, 0));
        (out, p.io_counts().unwrap().writes - before.writes)
    });
    assert_eq!(writes, 1, "one write for 200 jobs");
    for (i, o) in out.iter().enumerate() {
        assert_eq!(o.id().map(|id| id.get()), Some(i as u64 + 1));
    }
    assert_eq!(stream(&c).messages, 200);
}

#[test]
fn an_unknown_outcome_is_resolved_by_a_resend_the_stream_stores_once() {
    let c = NatsCluster::start(1).unwrap();
    let proxy = ChaosProxy::start(c.addr(0)).unwrap();
    let url = format!("nats://{}", proxy.addr());
    let (first, resolved, connects, took) = run(async {
        let mut p = Producer::builder()
            .io_timeout(Duration::from_millis(300))
            .resolve_for(Duration::from_secs(20))
            .connect_async(&url)
            .await
            .unwrap();
        let first = p.put(b"one", PutOptions::default()).await.unwrap().get();
        // The PubAck of the next put never comes back: the put reaches the
        // stream, its outcome is unknown, and new connections hear nothing
        // either until the silence lifts.
        proxy.add(Toxic::Silence, Direction::Downstream, 1.0);
        let t = Instant::now();
        let lift = async {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            proxy.clear();
        };
        let (resolved, ()) = tokio::join!(p.put(b"two", PutOptions::default()), lift);
        let resolved = resolved.unwrap().get();
        let took = t.elapsed();
        (first, resolved, p.connects(), took)
    });
    assert_eq!(
        (first, resolved),
        (1, 2),
        "the re-send got the first copy's sequence"
    );
    assert!(
        connects >= 2,
        "the unknown put dropped its connection: {connects} connects"
    );
    assert!(
        took >= Duration::from_millis(1400),
        "resolved only after the silence: {took:?}"
    );
    let s = stream(&c);
    assert_eq!(s.messages, 2, "the re-sent job is stored once");
    let m = admin(&c).msg_get("TASKQ", MsgSelect::Seq(2)).unwrap();
    assert_eq!(m.data, b"two");
}

#[test]
fn a_full_stream_rejects_and_a_missing_one_is_not_sent_past_resolve_for() {
    let c = NatsCluster::start(1).unwrap();
    // A work queue that takes one message and refuses more.
    admin(&c)
        .request(
            "$JS.API.STREAM.CREATE.TASKQ",
            br#"{"name":"TASKQ","subjects":["taskq.>"],"retention":"workqueue","storage":"memory","max_msgs":1,"discard":"new"}"#,
            Duration::from_secs(2),
        )
        .unwrap();
    let url = c.url();
    run(async {
        let mut p = Producer::builder()
            .resolve_for(Duration::from_millis(800))
            .connect_async(&url)
            .await
            .unwrap();
        p.put(b"fits", PutOptions::default()).await.unwrap();
        match p.put(b"too many", PutOptions::default()).await {
            Err(Error::Rejected(r)) => {
                assert!(!r.queued(), "{r:?}");
                assert!(format!("{r:?}").contains("10077"), "{r:?}");
            }
            r => panic!("a full stream rejects: {r:?}"),
        }
        // The connection stays: a rejection is an answer.
        assert!(p.is_connected());
        // No stream captures the subject any more: 503, re-sent until
        // resolve_for runs out, then not sent.
        assert!(admin(&c).stream_delete("TASKQ").unwrap());
        let t = Instant::now();
        match p.put(b"nowhere", PutOptions::default()).await {
            Err(e @ Error::NotSent(NotSent::Unavailable)) => assert!(e.not_sent()),
            r => panic!("no responders: {r:?}"),
        }
        let took = t.elapsed();
        assert!(
            took >= Duration::from_millis(700) && took < Duration::from_secs(5),
            "{took:?}"
        );
    });
}

#[test]
fn nothing_listening_is_not_sent_and_bad_tubes_are_refused_before_sending() {
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let c = NatsCluster::start(1).unwrap();
    let url = c.url();
    run(async {
        match AsyncProducer::connect(&format!("nats://{free}")).await {
            Err(e @ Error::NotSent(_)) => assert!(e.not_sent(), "{e}"),
            r => panic!("{r:?}"),
        }
        let e = Producer::builder()
            .tube("a.b")
            .connect_async(&url)
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Invalid(_)), "{e}");
        let mut p = Producer::builder()
            .max_job_size(16)
            .connect_async(&url)
            .await
            .unwrap();
        for bad in ["a b", "x.y", "a*", ""] {
            let e = p.use_tube(bad).await.unwrap_err();
            assert!(matches!(e, Error::Invalid(_)), "{bad:?}: {e}");
        }
        assert_eq!(p.tube(), "default");
        let e = p.put(&[b'x'; 17], PutOptions::default()).await.unwrap_err();
        assert!(matches!(e, Error::Invalid(_)), "{e}");
        let mut out = [PutOutcome::NotSent; 2];
        let e = p
            .put_batch(
                &[&b"ok"[..], &[b'x'; 17][..]],
                PutOptions::default(),
                &mut out,
            )
            .await
            .unwrap_err();
        assert!(
            matches!(e.error, Error::Invalid(_)) && e.replied == 0,
            "{e}"
        );
    });
    assert!(admin(&c).stream_info("TASKQ").unwrap().messages == 0);
}

#[test]
fn credentials_come_from_nats_access_and_the_address_wins() {
    let c = NatsCluster::builder()
        .config("authorization { users = [ { user: alice, password: \"s3cret-pw\" } ] }")
        .start()
        .unwrap();
    let host = c.addr(0).to_string();
    let access = |pw: &str| NatsAccess {
        user: Some(("alice".into(), Secret::new(pw))),
        ..NatsAccess::default()
    };
    run(async {
        let mut p = Producer::builder()
            .nats_access(access("s3cret-pw"))
            .connect_async(&format!("nats://{host}"))
            .await
            .unwrap();
        assert_eq!(p.put(b"x", PutOptions::default()).await.unwrap().get(), 1);
        let e = Producer::builder()
            .nats_access(access("wrong"))
            .connect_async(&format!("nats://{host}"))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::NotSent(NotSent::Refused(_))), "{e}");
        // No secret in what a caller can print or log: the error's Display
        // and Debug, and the connected producer's Debug.
        for text in [e.to_string(), format!("{e:?}"), format!("{p:?}")] {
            for secret in ["wrong", "s3cret-pw"] {
                assert!(!text.contains(secret), "{secret} in {text}");
            }
        }
        // The address's user info wins over the builder's.
        Producer::builder()
            .nats_access(access("wrong"))
            .connect_async(&format!("nats://alice:s3cret-pw@{host}"))
            .await
            .unwrap();
    });
}

/// Test-only certificates (`tests/tls/`): a CA, and a server certificate it
/// signed for 127.0.0.1 and localhost, valid 2020-2120 (made with `openssl ca`).
fn tls_file(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/tls")
        .join(name)
}

#[test]
fn over_tls_puts_and_batches_run_through_the_session_the_handshake_made() {
    let c = NatsCluster::builder()
        .config(format!(
            "tls {{ cert_file: \"{}\", key_file: \"{}\" }}",
            tls_file("server.pem").display(),
            tls_file("server-key.pem").display()
        ))
        .start()
        .unwrap();
    let host = c.addr(0).to_string();
    let trusted = NatsAccess {
        tls: TlsSettings {
            ca_file: Some(tls_file("ca.pem")),
            ..TlsSettings::default()
        },
        ..NatsAccess::default()
    };
    let bodies: Vec<Vec<u8>> = (0..100).map(|i| format!("t{i}").into_bytes()).collect();
    run(async {
        let mut p = Producer::builder()
            .nats_access(trusted.clone())
            .tube("secure")
            .connect_async(&format!("tls://{host}"))
            .await
            .unwrap();
        let before = p.io_counts().unwrap();
        for i in 1..=3u64 {
            assert_eq!(
                p.put(b"sealed", PutOptions::default()).await.unwrap().get(),
                i
            );
        }
        // A body larger than one TLS record.
        p.put(&vec![b'z'; 40_000], PutOptions::default())
            .await
            .unwrap();
        let mut out = vec![PutOutcome::NotSent; bodies.len()];
        let r = p
            .put_batch(&bodies, PutOptions::default(), &mut out)
            .await
            .unwrap();
        assert_eq!(r.inserted, 100);
        assert_eq!(out[99].id().map(|id| id.get()), Some(104));
        let writes = p.io_counts().unwrap().writes - before.writes;
        assert_eq!(writes, 5, "one write per put and per batch, through TLS");
        // Without the CA the server's certificate is not trusted: not sent.
        match Producer::builder()
            .connect_async(&format!("tls://{host}"))
            .await
        {
            Err(Error::NotSent(NotSent::Tls(t))) => {
                assert_eq!(t.failure, TlsFailure::UnknownIssuer, "{t}")
            }
            r => panic!("an untrusted certificate: {r:?}"),
        }
    });
    let mut a = NatsConnection::connect(
        &[host],
        NatsConfig {
            access: trusted,
            ..NatsConfig::default()
        },
    )
    .unwrap();
    let info = a.stream_info("TASKQ").unwrap();
    assert_eq!(info.messages, 104);
    let m = a.msg_get("TASKQ", MsgSelect::Seq(2)).unwrap();
    assert_eq!(
        (m.subject.as_str(), &m.data[..]),
        ("taskq.secure", &b"sealed"[..])
    );
}

#[test]
fn a_delayed_put_on_a_current_server_is_a_schedule_and_an_unknown_one_is_stored_once() {
    let Some(c) = common::current_node() else {
        return;
    };
    let proxy = ChaosProxy::start(c.addr(0)).unwrap();
    let url = format!("nats://{}", proxy.addr());
    let later = PutOptions {
        delay: 30,
        ..PutOptions::default()
    };
    let (first, batch, resolved) = run(async {
        let mut p = Producer::builder()
            .tube("t")
            .io_timeout(Duration::from_millis(300))
            .resolve_for(Duration::from_secs(20))
            .connect_async(&url)
            .await
            .unwrap();
        let first = p.put(b"one", later).await.unwrap().get();
        let mut out = [PutOutcome::NotSent; 2];
        p.put_batch(&[&b"b0"[..], b"b1"], later, &mut out)
            .await
            .unwrap();
        let batch: Vec<u64> = out.iter().map(|o| o.id().unwrap().get()).collect();
        // The PubAck of the next delayed put never comes back: it is sent
        // again, with its message id, once the silence lifts.
        proxy.add(Toxic::Silence, Direction::Downstream, 1.0);
        let lift = async {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            proxy.clear();
        };
        let (resolved, ()) = tokio::join!(p.put(b"two", later), lift);
        (first, batch, resolved.unwrap().get())
    });
    assert_eq!(
        resolved,
        batch[1] + 1,
        "the re-send got the first copy's sequence"
    );
    let mut a = admin(&c);
    let s = a.stream_info("TASKQ").unwrap();
    assert!(s.allow_msg_schedules);
    assert_eq!(s.messages, 4, "one schedule per job, the re-sent one once");
    for id in [first, batch[0], batch[1], resolved] {
        let m = a.msg_get("TASKQ", MsgSelect::Seq(id)).unwrap();
        let header = String::from_utf8_lossy(&m.headers).into_owned();
        assert!(m.subject.starts_with("taskq.t.delayed."), "{}", m.subject);
        assert!(header.contains("Nats-Schedule: @at "), "{header}");
        assert!(header.contains("Nats-Schedule-Target: taskq.t"), "{header}");
    }
    assert_eq!(
        a.msg_get("TASKQ", MsgSelect::Seq(resolved)).unwrap().data,
        b"two"
    );
}

/// Polls `f` once in the current task: true when it finished.
async fn poll_once<F: Future>(f: std::pin::Pin<&mut F>) -> bool {
    let mut f = Some(f);
    std::future::poll_fn(|cx| std::task::Poll::Ready(f.take().unwrap().poll(cx).is_ready())).await
}

/// A batch whose future is dropped after its write, while its PubAcks are
/// held back by the proxy (so the drop comes first by construction): the
/// next put and batch replace the connection at once and each gets its own
/// sequence, by the stream's record of which body each holds.
#[test]
fn a_batch_dropped_after_its_write_never_hands_its_pubacks_to_the_next_call() {
    let c = NatsCluster::start(1).unwrap();
    let proxy = ChaosProxy::start(c.addr(0)).unwrap();
    let url = format!("nats://{}", proxy.addr());
    let (ids, took) = run(async {
        let mut p = Producer::builder()
            .resolve_for(Duration::from_secs(20))
            .connect_async(&url)
            .await
            .unwrap();
        let delay = Toxic::Latency {
            delay: Duration::from_millis(200),
            jitter: Duration::ZERO,
        };
        proxy.add(delay, Direction::Downstream, 1.0);
        {
            let bodies = [b"dropped 1".as_slice(), b"dropped 2"];
            let mut out = [PutOutcome::NotSent; 2];
            let batch = std::pin::pin!(p.put_batch(&bodies, PutOptions::default(), &mut out));
            assert!(!poll_once(batch).await, "written, its PubAcks not come yet");
        }
        let t = Instant::now();
        let a = p.put(b"a", PutOptions::default()).await.unwrap().get();
        let took = t.elapsed();
        let bodies = [b"b".as_slice(), b"c"];
        let mut out = [PutOutcome::NotSent; 2];
        p.put_batch(&bodies, PutOptions::default(), &mut out)
            .await
            .unwrap();
        proxy.clear();
        let ids = [a, out[0].id().unwrap().get(), out[1].id().unwrap().get()];
        (ids, took)
    });
    // A new connection and a round trip or two through the proxy's delay.
    assert!(took < Duration::from_secs(5), "{took:?}");
    let mut admin = admin(&c);
    for (id, body) in ids.iter().zip([&b"a"[..], b"b", b"c"]) {
        let m = admin.msg_get("TASKQ", MsgSelect::Seq(*id)).unwrap();
        assert_eq!(m.data, body, "sequence {id}");
    }
}
