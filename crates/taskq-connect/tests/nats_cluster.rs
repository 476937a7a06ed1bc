//! The client on a 3-node JetStream cluster: the servers it learns from
//! INFO, a replicated work-queue stream, and publishing through the loss of
//! the stream's leader, where every failure is a typed error and a broken
//! connection is replaced by one to an address the cluster announced.

mod nats_common;

use std::time::{Duration, Instant};

use nats_common::{consumer_spec, stream_spec, CONSUMER, STREAM, SUBJECT};
use taskq_connect::nats::{NatsConfig, NatsConnection, StreamSpec};
use taskq_proto::nats::{AckKind, Delivery, NatsError};
use taskq_testkit::NatsCluster;

/// Runs a setup call (idempotent: a stream or consumer made or found) until
/// it answers. Making a replicated one waits on the cluster's groups, which
/// on a busy machine can take longer than one I/O timeout: a timeout breaks
/// the connection, and the call is made again on a new one, within 30 s.
fn set_up<T>(
    conn: &mut NatsConnection,
    seed: &str,
    mut call: impl FnMut(&mut NatsConnection) -> Result<T, NatsError>,
) -> T {
    let t = Instant::now();
    loop {
        match call(conn) {
            Ok(v) => return v,
            Err(e @ NatsError::Timeout { .. }) if t.elapsed() < Duration::from_secs(30) => {
                eprintln!("setup: {e}; again on a new connection");
                *conn = NatsConnection::connect(&[seed], NatsConfig::default()).unwrap();
            }
            Err(e) => panic!("setup: {e:?}"),
        }
    }
}

#[test]
fn a_replicated_stream_survives_its_leader_and_the_client_learns_the_cluster() {
    let mut c = NatsCluster::start(3).expect("cluster");
    let mut conn =
        NatsConnection::connect(&[c.addr(0).to_string()], NatsConfig::default()).unwrap();
    let spec = StreamSpec {
        replicas: 3,
        ..stream_spec()
    };
    let seed = c.addr(0).to_string();
    let info = set_up(&mut conn, &seed, |conn| conn.ensure_stream(&spec));
    assert_eq!(info.replicas, 3);
    set_up(&mut conn, &seed, |conn| {
        conn.ensure_consumer(STREAM, CONSUMER, &consumer_spec(Duration::from_secs(30)))
    });
    // The cluster's other client addresses arrive in INFO (now or in a later one).
    let t = Instant::now();
    while conn.servers().len() < 3 && t.elapsed() < Duration::from_secs(5) {
        conn.publish(SUBJECT, b"warm", b"x").unwrap();
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut servers = conn.servers().to_vec();
    servers.sort();
    let mut want: Vec<String> = (0..3).map(|i| c.addr(i).to_string()).collect();
    want.sort();
    assert_eq!(servers, want);

    // Lose the stream leader; talk to the cluster through a node that stays.
    let t = Instant::now();
    let leader = loop {
        if let Some(l) = c.stream_leader(STREAM) {
            break l;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "no stream leader");
        std::thread::sleep(Duration::from_millis(100));
    };
    let survivor = (leader + 1) % 3;
    let mut conn =
        NatsConnection::connect(&[c.addr(survivor).to_string()], NatsConfig::default()).unwrap();
    let before = conn.stream_info(STREAM).unwrap().last_seq;
    c.kill(leader).unwrap();
    let t = Instant::now();
    let mut kinds = Vec::new();
    let seq = loop {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "no publish after failover: {kinds:?}"
        );
        match conn.publish(SUBJECT, b"after-failover", b"y") {
            Ok(a) => {
                // A duplicate answers a re-send of an attempt that failed
                // here but was stored: stored once all the same, which the
                // sequence below checks.
                assert!(!a.duplicate || !kinds.is_empty(), "a duplicate of nothing");
                break a.stream_seq;
            }
            Err(e) => {
                kinds.push(format!("{e}"));
                assert!(
                    matches!(
                        e,
                        NatsError::NoResponders | NatsError::Api(_) | NatsError::Timeout { .. }
                    ),
                    "{e:?}"
                );
                if e.breaks_connection() {
                    let seeds = conn.servers().to_vec();
                    conn = NatsConnection::connect(&seeds, NatsConfig::default()).unwrap();
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    };
    assert_eq!(
        seq,
        before + 1,
        "stored once, after what was there ({kinds:?})"
    );
    // The message is there to pull from the new leader. The consumer may be
    // electing a leader of its own meanwhile: no responders, a 409, or a
    // pull the server never took (ended unanswered by a probe, with the
    // connection kept).
    let mut got = false;
    while !got {
        assert!(
            t.elapsed() < Duration::from_secs(40),
            "message not delivered: {kinds:?}"
        );
        if conn.is_broken() {
            let seeds = conn.servers().to_vec();
            conn = NatsConnection::connect(&seeds, NatsConfig::default()).unwrap();
        }
        conn.pull(STREAM, CONSUMER, 10, Duration::from_secs(2), None)
            .unwrap();
        loop {
            match conn.next_delivery() {
                Ok(Delivery::Msg { body, reply, .. }) => {
                    got |= body == b"y";
                    let r = reply.to_vec();
                    if !conn.pulling() {
                        assert!(conn.ack(&r, AckKind::Ack, true).unwrap());
                        break;
                    }
                    conn.queue_ack(&r, AckKind::Ack, false).unwrap();
                }
                Ok(Delivery::Timeout | Delivery::NoMessages) => break,
                Ok(Delivery::Unanswered) => {
                    kinds.push("unanswered".into());
                    break;
                }
                Ok(Delivery::Conflict(why)) => {
                    kinds.push(String::from_utf8_lossy(why).into_owned());
                    break;
                }
                Ok(d) => panic!("{d:?}"),
                Err(e) => {
                    assert!(
                        matches!(e, NatsError::NoResponders | NatsError::Timeout { .. }),
                        "{e:?}"
                    );
                    kinds.push(format!("{e}"));
                    std::thread::sleep(Duration::from_millis(200));
                    break;
                }
            }
        }
    }
}
