//! Broken connections: outcome unknown is reported, the next call reconnects and
//! restores the tube, at-least-once mode re-sends, and batches say where they broke.

mod common;

use std::time::{Duration, Instant};

use common::{Act, FakePeer};
use taskq_producer::{Backoff, Error, Producer, PutOptions, PutOutcome};
use taskq_testkit::beanstalkd::free_port;

#[test]
fn peer_that_reads_the_put_and_closes_gives_unknown_then_reconnect_restores_the_tube() {
    let peer = FakePeer::start(vec![Act::CloseAfterPut]);
    let mut p = Producer::builder().tube("jobs").connect(peer.addr).unwrap();
    let e = p.put(b"lost?", PutOptions::default()).unwrap_err();
    assert!(matches!(e, Error::Unknown(_)), "{e:?}");
    assert!(!p.is_connected());
    let id = p.put(b"second", PutOptions::default()).unwrap();
    assert_eq!(id.get(), 2, "the fake numbers every put it read");
    assert_eq!(p.connects(), 2);
    assert_eq!(peer.commands(0), ["use jobs", "put 1024 0 60 5"]);
    assert_eq!(peer.commands(1), ["use jobs", "put 1024 0 60 6"]);
}

#[test]
fn at_least_once_mode_resends_an_unknown_put_once() {
    let peer = FakePeer::start(vec![Act::CloseAfterPut]);
    let mut p = Producer::builder()
        .at_least_once(3)
        .connect(peer.addr)
        .unwrap();
    let id = p.put(b"dup", PutOptions::default()).unwrap();
    assert_eq!(id.get(), 2);
    assert_eq!(peer.connections(), 2);
    assert_eq!(peer.commands(0), ["put 1024 0 60 3"]);
    assert_eq!(peer.commands(1), ["put 1024 0 60 3"]);
}

#[test]
fn batch_that_breaks_off_reports_where() {
    let peer = FakePeer::start(vec![Act::AnswerThenClose { n: 5, answered: 2 }]);
    let mut p = Producer::connect(peer.addr).unwrap();
    let bodies = [b"a", b"b", b"c", b"d", b"e"];
    let mut out = [PutOutcome::NotSent; 5];
    let e = p
        .put_batch(&bodies, PutOptions::default(), &mut out)
        .unwrap_err();
    assert_eq!(e.replied, 2);
    assert!(e.error.outcome_unknown(), "{e}");
    assert!(matches!(out[0], PutOutcome::Inserted(id) if id.get() == 1));
    assert!(matches!(out[1], PutOutcome::Inserted(id) if id.get() == 2));
    assert_eq!(out[2..], [PutOutcome::Unknown; 3]);
    // At least once: a fresh connection takes the jobs from the break on.
    let peer = FakePeer::start(vec![Act::AnswerThenClose { n: 5, answered: 2 }]);
    let mut p = Producer::builder()
        .at_least_once(1)
        .connect(peer.addr)
        .unwrap();
    let report = p
        .put_batch(&bodies, PutOptions::default(), &mut out)
        .unwrap();
    assert_eq!(report.inserted, 5);
    assert_eq!(peer.commands(1).len(), 3, "only c, d, e are sent again");
    let ids: Vec<u64> = out.iter().map(|o| o.id().unwrap().get()).collect();
    assert_eq!(ids, [1, 2, 6, 7, 8]);
}

#[test]
fn failed_reconnects_back_off_exponentially() {
    let port = free_port().unwrap();
    let peer = FakePeer::start(vec![Act::CloseAfterPut]);
    let mut p = Producer::builder()
        .backoff(Backoff {
            initial: Duration::from_millis(40),
            max: Duration::from_millis(160),
            jitter: taskq_producer::Jitter::Upper,
        })
        .build(("127.0.0.1", port))
        .unwrap();
    // Nobody listens: each call makes one attempt, after waiting out the previous wait.
    let started = Instant::now();
    for _ in 0..5 {
        assert!(matches!(
            p.put(b"x", PutOptions::default()),
            Err(Error::NotSent(_))
        ));
    }
    let spent = started.elapsed();
    // Waits before attempts 2..5: ceilings 40, 80, 160, 160 ms, each jittered into its upper half.
    assert!(spent >= Duration::from_millis(220), "{spent:?}");
    assert!(spent < Duration::from_millis(440 + 300), "{spent:?}");
    assert!(p.in_backoff());
    drop(peer);
}

#[test]
fn silent_server_times_out_as_unknown_within_the_io_timeout() {
    let peer = FakePeer::start(vec![Act::Silent]);
    let mut p = Producer::builder()
        .io_timeout(Duration::from_millis(300))
        .connect(peer.addr)
        .unwrap();
    let started = Instant::now();
    let e = p.put(b"x", PutOptions::default()).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Unknown(taskq_proto::ConnectionError::Timeout { .. })
        ),
        "{e:?}"
    );
    assert!(started.elapsed() < Duration::from_millis(800));
}
