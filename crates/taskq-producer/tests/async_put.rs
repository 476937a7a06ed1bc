//! The async producer against a real beanstalkd (and, where beanstalkd cannot
//! be made to misbehave on cue, the loopback fake peer): each outcome the
//! blocking producer has, with the same meaning, the whole-reply deadline,
//! the reconnect rule and batches in one write.
#![cfg(feature = "tokio")]

mod common;

use std::future::Future;
use std::time::{Duration, Instant};

use common::{Act, FakePeer};
use taskq_producer::{
    AsyncProducer, Backoff, Error, Invalid, Producer, PutOptions, PutOutcome, Rejection,
};
use taskq_testkit::beanstalkd::free_port;
use taskq_testkit::Beanstalkd;

/// Every test is bounded in time.
async fn bounded<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f)
        .await
        .expect("test took longer than 30 s")
}

async fn connect(addr: std::net::SocketAddr) -> AsyncProducer {
    AsyncProducer::connect(&addr.to_string()).await.unwrap()
}

#[tokio::test]
async fn inserted_bodies_come_back_byte_exact() {
    bounded(async {
        let server = Beanstalkd::start().unwrap();
        let mut p = connect(server.addr()).await;
        p.use_tube("exact").await.unwrap();
        let mut binary: Vec<u8> = (0..=255u8).collect();
        binary.extend_from_slice(b"\r\n\0\r\n\r\nput 1 2 3 4\r\n\0");
        // Past the inline buffer: the line and the body go out in one vectored write.
        let max = vec![0xA5u8; 65535];
        let bodies: Vec<&[u8]> = vec![b"", &binary, &max, b"\r\n", b"\0", b"\0"];
        let mut ids = Vec::new();
        for b in &bodies {
            let writes = p.io_counts().unwrap().writes;
            ids.push(p.put(b, PutOptions::default()).await.unwrap().get());
            if b.len() < 1000 {
                assert_eq!(
                    p.io_counts().unwrap().writes,
                    writes + 1,
                    "one write per put"
                );
            }
        }
        let got = common::drain(server.addr(), "exact");
        assert_eq!(got.len(), bodies.len());
        for ((id, body), (want_id, want)) in got.iter().zip(ids.iter().zip(&bodies)) {
            assert_eq!(id, want_id);
            assert_eq!(&body[..], *want, "job {id}");
        }
    })
    .await
}

#[tokio::test]
async fn job_too_big_for_the_server_is_rejected_and_the_connection_goes_on() {
    bounded(async {
        let server = Beanstalkd::start_with(&["-z", "1024"]).unwrap();
        let mut p = connect(server.addr()).await;
        match p.put(&[1u8; 1025], PutOptions::default()).await {
            Err(Error::Rejected(Rejection::JobTooBig)) => {}
            other => panic!("expected JOB_TOO_BIG, got {other:?}"),
        }
        // A rejection leaves the stream in step: the same connection serves the next put.
        assert!(p.put(&[1u8; 1024], PutOptions::default()).await.is_ok());
        assert_eq!(p.connects(), 1);
    })
    .await
}

#[tokio::test]
async fn draining_server_rejects_with_draining() {
    bounded(async {
        let server = Beanstalkd::start().unwrap();
        let mut p = connect(server.addr()).await;
        p.put(b"before", PutOptions::default()).await.unwrap();
        server.drain().unwrap();
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            match p.put(b"during", PutOptions::default()).await {
                Err(Error::Rejected(Rejection::Draining)) => break,
                // The signal may take a moment to land.
                Ok(_) if Instant::now() < until => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                other => panic!("expected DRAINING, got {other:?}"),
            }
        }
        let e = p.put(b"again", PutOptions::default()).await.unwrap_err();
        assert!(!e.maybe_queued() && !e.outcome_unknown(), "{e:?}");
        assert_eq!(p.connects(), 1);
    })
    .await
}

#[tokio::test]
async fn too_big_bodies_bad_tubes_and_short_slices_are_invalid_and_send_nothing() {
    bounded(async {
        let server = Beanstalkd::start().unwrap();
        let mut p = Producer::builder()
            .max_job_size(100)
            .connect_async(&server.addr().to_string())
            .await
            .unwrap();
        let writes = p.io_counts().unwrap().writes;
        let e = p.put(&[0u8; 101], PutOptions::default()).await.unwrap_err();
        assert!(matches!(e, Error::Invalid(Invalid::Encode(_))), "{e:?}");
        assert!(e.not_sent() && !e.maybe_queued());
        let e = p.use_tube("-bad").await.unwrap_err();
        assert!(matches!(e, Error::Invalid(Invalid::Encode(_))), "{e:?}");
        let mut out = [PutOutcome::Unknown; 2];
        let e = p
            .put_batch(
                &[&b"ok"[..], &[0u8; 101][..]],
                PutOptions::default(),
                &mut out,
            )
            .await
            .unwrap_err();
        assert!(e.error.not_sent() && e.replied == 0, "{e}");
        assert_eq!(out, [PutOutcome::NotSent; 2]);
        let e = p
            .put_batch(&[b"a", b"b", b"c"], PutOptions::default(), &mut out)
            .await
            .unwrap_err();
        assert!(matches!(
            e.error,
            Error::Invalid(Invalid::OutcomesTooShort { jobs: 3, slots: 2 })
        ));
        assert_eq!(
            p.io_counts().unwrap().writes,
            writes,
            "nothing may be written"
        );
        // The connection is untouched and still serves.
        p.put(b"fine", PutOptions::default()).await.unwrap();
        assert_eq!(p.tube(), "default");
        // A bad tube in the settings is refused before connecting.
        let e = Producer::builder()
            .tube("bad name")
            .connect_async(&server.addr().to_string())
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Invalid(Invalid::Encode(_))), "{e:?}");
    })
    .await
}

#[tokio::test]
async fn server_not_listening_is_not_sent() {
    bounded(async {
        let port = free_port().unwrap();
        let e = Producer::builder()
            .connect_timeout(Duration::from_millis(500))
            .connect_async(&format!("127.0.0.1:{port}"))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::NotSent(_)), "{e:?}");
        assert!(e.not_sent() && !e.maybe_queued());
    })
    .await
}

#[tokio::test]
async fn server_killed_between_write_and_reply_is_outcome_unknown() {
    bounded(async {
        let mut server = Beanstalkd::start().unwrap();
        let mut p = Producer::builder()
            .io_timeout(Duration::from_secs(5))
            .connect_async(&server.addr().to_string())
            .await
            .unwrap();
        p.put(b"warm", PutOptions::default()).await.unwrap();
        // Stopped, the server reads nothing: the write lands in its socket
        // buffer and no reply comes; then it dies.
        server.signal("STOP").unwrap();
        let killer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            server.kill().unwrap();
        });
        let started = Instant::now();
        let e = p
            .put(b"in flight", PutOptions::default())
            .await
            .unwrap_err();
        killer.join().unwrap();
        assert!(matches!(e, Error::Unknown(_)), "{e:?}");
        assert!(e.outcome_unknown() && e.maybe_queued() && !e.not_sent());
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "must not wait out the timeout"
        );
        assert!(!p.is_connected());
        // The next call reconnects, finds nobody, and says not sent.
        let e = p.put(b"after", PutOptions::default()).await.unwrap_err();
        assert!(matches!(e, Error::NotSent(_)), "{e:?}");
    })
    .await
}

#[tokio::test]
async fn peer_that_reads_the_put_and_closes_gives_unknown_then_an_immediate_reconnect_restores_the_tube(
) {
    bounded(async {
        let peer = FakePeer::start(vec![Act::CloseAfterPut, Act::CloseAfterPut]);
        let mut p = Producer::builder()
            .tube("jobs")
            .backoff(Backoff {
                initial: Duration::from_millis(300),
                max: Duration::from_secs(1),
                jitter: taskq_producer::Jitter::Upper,
            })
            .connect_async(&peer.addr.to_string())
            .await
            .unwrap();
        let e = p.put(b"lost?", PutOptions::default()).await.unwrap_err();
        assert!(matches!(e, Error::Unknown(_)), "{e:?}");
        assert!(!p.is_connected());
        // The first reconnect after progress is immediate (and breaks again here) ...
        let t = Instant::now();
        let e = p
            .put(b"lost too?", PutOptions::default())
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Unknown(_)), "{e:?}");
        assert!(
            t.elapsed() < Duration::from_millis(250),
            "{:?}",
            t.elapsed()
        );
        // ... the next one, after a break with no progress between, backs off.
        let t = Instant::now();
        let id = p.put(b"third", PutOptions::default()).await.unwrap();
        assert!(
            t.elapsed() >= Duration::from_millis(300),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(id.get(), 3, "the fake numbers every put it read");
        assert_eq!(p.connects(), 3);
        for (conn, len) in [(0, 5), (1, 9), (2, 5)] {
            assert_eq!(
                peer.commands(conn),
                ["use jobs".to_string(), format!("put 1024 0 60 {len}")]
            );
        }
    })
    .await
}

#[tokio::test]
async fn a_silent_server_is_caught_within_the_io_timeout() {
    bounded(async {
        let io = Duration::from_millis(400);
        let peer = FakePeer::start(vec![Act::Silent]);
        let mut p = Producer::builder()
            .io_timeout(io)
            .connect_async(&peer.addr.to_string())
            .await
            .unwrap();
        let t = Instant::now();
        let e = p.put(b"anyone?", PutOptions::default()).await.unwrap_err();
        let waited = t.elapsed();
        eprintln!("silent server caught after {waited:?} (io_timeout {io:?})");
        assert!(
            matches!(
                e,
                Error::Unknown(taskq_proto::ConnectionError::Timeout { .. })
            ),
            "{e:?}"
        );
        assert!(
            waited >= io && waited < io + Duration::from_millis(500),
            "{waited:?}"
        );
        assert!(!p.is_connected());
    })
    .await
}

#[tokio::test]
async fn a_server_that_goes_silent_after_many_puts_is_caught_at_that_puts_deadline() {
    // The kept timer was armed at an earlier put's deadline and has fired and
    // been re-armed in between: the silent put must still get its own full
    // deadline, and no more than that.
    bounded(async {
        let io = Duration::from_millis(400);
        let server = Beanstalkd::start().unwrap();
        let mut p = Producer::builder()
            .io_timeout(io)
            .connect_async(&server.addr().to_string())
            .await
            .unwrap();
        let until = Instant::now() + Duration::from_millis(1000);
        while Instant::now() < until {
            p.put(b"busy", PutOptions::default()).await.unwrap();
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        server.signal("STOP").unwrap();
        let t = Instant::now();
        let e = p
            .put(b"unanswered", PutOptions::default())
            .await
            .unwrap_err();
        let waited = t.elapsed();
        server.signal("CONT").unwrap();
        eprintln!("server silent after busy puts caught after {waited:?} (io_timeout {io:?})");
        assert!(
            matches!(
                e,
                Error::Unknown(taskq_proto::ConnectionError::Timeout { .. })
            ),
            "{e:?}"
        );
        assert!(
            waited >= io && waited < io + Duration::from_millis(500),
            "{waited:?}"
        );
        // And the next put reconnects at once and lands.
        p.put(b"after", PutOptions::default()).await.unwrap();
        assert_eq!(p.connects(), 2);
    })
    .await
}

#[tokio::test]
async fn use_tube_then_put_lands_in_that_tube() {
    bounded(async {
        let server = Beanstalkd::start().unwrap();
        let mut p = connect(server.addr()).await;
        p.use_tube("elsewhere").await.unwrap();
        assert_eq!(p.tube(), "elsewhere");
        let id = p.put(b"here", PutOptions::default()).await.unwrap();
        assert_eq!(common::drain(server.addr(), "default"), []);
        assert_eq!(
            common::drain(server.addr(), "elsewhere"),
            [(id.get(), b"here".to_vec())]
        );
        p.use_tube("default").await.unwrap();
        let id = p.put(b"back", PutOptions::default()).await.unwrap();
        assert_eq!(
            common::drain(server.addr(), "default"),
            [(id.get(), b"back".to_vec())]
        );
    })
    .await
}

#[tokio::test]
async fn a_batch_of_64_goes_out_in_one_write_and_comes_back_in_order() {
    bounded(async {
        let server = Beanstalkd::start().unwrap();
        let mut p = connect(server.addr()).await;
        p.use_tube("batch").await.unwrap();
        let bodies: Vec<Vec<u8>> = (0..64)
            .map(|i| format!("job {i}\r\n\0").into_bytes())
            .collect();
        let mut out = [PutOutcome::NotSent; 64];
        let before = p.io_counts().unwrap().writes;
        let report = p
            .put_batch(&bodies, PutOptions::default(), &mut out)
            .await
            .unwrap();
        assert_eq!(p.io_counts().unwrap().writes, before + 1, "one write");
        assert_eq!((report.inserted, report.rejected), (64, 0));
        let ids: Vec<u64> = out.iter().map(|o| o.id().unwrap().get()).collect();
        assert!(ids.windows(2).all(|w| w[1] == w[0] + 1), "{ids:?}");
        let got = common::drain(server.addr(), "batch");
        assert_eq!(got.len(), 64);
        for ((id, body), (want_id, want)) in got.iter().zip(ids.iter().zip(&bodies)) {
            assert_eq!((id, body), (want_id, want));
        }
    })
    .await
}

#[tokio::test]
async fn a_rejection_inside_a_batch_is_reported_for_that_job_only() {
    bounded(async {
        let server = Beanstalkd::start_with(&["-z", "100"]).unwrap();
        let mut p = connect(server.addr()).await;
        let big = vec![7u8; 101];
        let bodies: [&[u8]; 3] = [b"a", &big, b"c"];
        let mut out = [PutOutcome::NotSent; 3];
        let report = p
            .put_batch(&bodies, PutOptions::default(), &mut out)
            .await
            .unwrap();
        assert_eq!((report.inserted, report.rejected), (2, 1));
        assert!(matches!(out[0], PutOutcome::Inserted(_)));
        assert_eq!(out[1], PutOutcome::Rejected(Rejection::JobTooBig));
        assert!(matches!(out[2], PutOutcome::Inserted(_)));
    })
    .await
}

#[tokio::test]
async fn a_batch_that_breaks_off_says_where() {
    bounded(async {
        let peer = FakePeer::start(vec![Act::AnswerThenClose { n: 5, answered: 2 }]);
        let mut p = connect(peer.addr).await;
        let bodies = [b"a", b"b", b"c", b"d", b"e"];
        let mut out = [PutOutcome::NotSent; 5];
        let e = p
            .put_batch(&bodies, PutOptions::default(), &mut out)
            .await
            .unwrap_err();
        assert_eq!(e.replied, 2);
        assert!(e.error.outcome_unknown(), "{e}");
        assert!(matches!(out[0], PutOutcome::Inserted(id) if id.get() == 1));
        assert!(matches!(out[1], PutOutcome::Inserted(id) if id.get() == 2));
        assert_eq!(out[2..], [PutOutcome::Unknown; 3]);
    })
    .await
}

/// Polls `f` once in the current task: true when it finished.
async fn poll_once<F: Future>(f: std::pin::Pin<&mut F>) -> bool {
    let mut f = Some(f);
    std::future::poll_fn(|cx| std::task::Poll::Ready(f.take().unwrap().poll(cx).is_ready())).await
}

/// A put and a batch whose futures are dropped after their writes, while
/// their replies are on the way (held back 200 ms by the proxy, so the
/// drop comes first by construction): their replies never become a later
/// call's. The next put and batch each get their own ids, by the server's
/// own record of which body each id holds.
#[tokio::test]
async fn a_put_or_batch_dropped_after_its_write_never_hands_its_reply_to_the_next_call() {
    bounded(async {
        let server = Beanstalkd::start().unwrap();
        let proxy = taskq_testkit::ChaosProxy::start(server.addr()).unwrap();
        let mut p = connect(proxy.addr()).await;
        p.use_tube("dropped").await.unwrap();
        let delay = taskq_testkit::Toxic::Latency {
            delay: Duration::from_millis(200),
            jitter: Duration::ZERO,
        };
        proxy.add(delay, taskq_testkit::Direction::Downstream, 1.0);
        {
            let put = std::pin::pin!(p.put(b"dropped put", PutOptions::default()));
            assert!(!poll_once(put).await, "written, its reply not come yet");
        }
        let a = p.put(b"a", PutOptions::default()).await.unwrap().get();
        {
            let bodies = [b"dropped 1".as_slice(), b"dropped 2"];
            let mut out = [PutOutcome::NotSent; 2];
            let batch = std::pin::pin!(p.put_batch(&bodies, PutOptions::default(), &mut out));
            assert!(!poll_once(batch).await, "written, its replies not come yet");
        }
        let bodies = [b"b".as_slice(), b"c"];
        let mut out = [PutOutcome::NotSent; 2];
        p.put_batch(&bodies, PutOptions::default(), &mut out)
            .await
            .unwrap();
        let d = p.put(b"d", PutOptions::default()).await.unwrap().get();
        proxy.clear();
        let jobs: std::collections::HashMap<u64, Vec<u8>> = common::drain(server.addr(), "dropped")
            .into_iter()
            .collect();
        let ids = [a, out[0].id().unwrap().get(), out[1].id().unwrap().get(), d];
        for (id, body) in ids.iter().zip([&b"a"[..], b"b", b"c", b"d"]) {
            assert_eq!(jobs[id], body, "job {id}: {jobs:?}");
        }
        assert!(p.connects() >= 3, "each drop cost its connection");
    })
    .await
}
