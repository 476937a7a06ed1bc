//! The several-servers producer: round-robin and key hashing skip a server that
//! is down, and an outcome-unknown job is not re-sent unless asked.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use taskq_producer::{Builder, Error, MultiProducer, Producer, PutOptions};
use taskq_testkit::beanstalkd::free_port;
use taskq_testkit::Beanstalkd;

fn builder() -> Builder {
    Producer::builder()
        .connect_timeout(Duration::from_millis(300))
        .io_timeout(Duration::from_secs(5))
        .backoff(taskq_producer::Backoff {
            initial: Duration::from_secs(5),
            max: Duration::from_secs(5),
            jitter: taskq_producer::Jitter::Upper,
        })
}

#[test]
fn round_robin_and_keys_skip_the_server_that_is_down() {
    let a = Beanstalkd::start().unwrap();
    let b = Beanstalkd::start().unwrap();
    let down = ("127.0.0.1".to_string(), free_port().unwrap());
    let addrs = [
        a.addr().to_string(),
        format!("{}:{}", down.0, down.1),
        b.addr().to_string(),
    ];
    let mut m = MultiProducer::with_builder(&builder(), &addrs).unwrap();
    m.use_tube("spread").unwrap();
    let mut per_server = [0usize; 3];
    for i in 0..30 {
        let placed = m
            .put(format!("job {i}").as_bytes(), PutOptions::default())
            .unwrap();
        per_server[placed.server] += 1;
    }
    assert_eq!(
        per_server[1], 0,
        "nothing placed on the server that is down"
    );
    // Turns: a, (down → b), b, a, ... so a gets every third turn plus none of b's.
    assert_eq!(per_server[0] + per_server[2], 30);
    assert!(per_server[0] >= 10 && per_server[2] >= 10, "{per_server:?}");
    let on_a = common::drain(a.addr(), "spread");
    let on_b = common::drain(b.addr(), "spread");
    assert_eq!((on_a.len(), on_b.len()), (per_server[0], per_server[2]));

    // A key that hashes to the server that is down goes to the next one up; others stay put.
    let key_down = (0..1000u32)
        .map(|k| k.to_string())
        .find(|k| m.server_for(k.as_bytes()) == 1)
        .unwrap();
    let key_a = (0..1000u32)
        .map(|k| k.to_string())
        .find(|k| m.server_for(k.as_bytes()) == 0)
        .unwrap();
    for _ in 0..3 {
        assert_eq!(
            m.put_keyed(key_down.as_bytes(), b"k", PutOptions::default())
                .unwrap()
                .server,
            2
        );
        assert_eq!(
            m.put_keyed(key_a.as_bytes(), b"k", PutOptions::default())
                .unwrap()
                .server,
            0
        );
    }
}

#[test]
fn all_servers_down_is_not_sent() {
    let addrs = [
        format!("127.0.0.1:{}", free_port().unwrap()),
        format!("127.0.0.1:{}", free_port().unwrap()),
    ];
    let e = MultiProducer::with_builder(&builder(), &addrs).unwrap_err();
    assert!(matches!(e, Error::NotSent(_)), "{e:?}");
    let none: [&str; 0] = [];
    assert!(matches!(
        MultiProducer::connect(&none).unwrap_err(),
        Error::Invalid(taskq_producer::Invalid::NoServers)
    ));
}

/// Stops server 0 so the put lands in its socket unanswered, then kills it.
fn put_while_first_server_dies(
    resend: bool,
) -> (Result<taskq_producer::Placed, Error>, Beanstalkd) {
    let mut a = Beanstalkd::start().unwrap();
    let b = Beanstalkd::start().unwrap();
    let addrs = [a.addr(), b.addr()];
    let mut m = MultiProducer::with_builder(&builder(), &addrs)
        .unwrap()
        .resend_unknown(resend);
    a.signal("STOP").unwrap();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        a.kill().unwrap();
    });
    let r = m.put(b"in flight", PutOptions::default());
    killer.join().unwrap();
    (r, b)
}

#[test]
fn outcome_unknown_is_not_resent_elsewhere_unless_asked() {
    let (r, b) = put_while_first_server_dies(false);
    assert!(matches!(r, Err(Error::Unknown(_))), "{r:?}");
    assert!(common::drain(b.addr(), "default").is_empty());

    let (r, b) = put_while_first_server_dies(true);
    assert_eq!(r.unwrap().server, 1);
    assert_eq!(common::drain(b.addr(), "default").len(), 1);
}

/// Server 0 reads the put and closes (its outcome unknown: it may be
/// stored); server 1 is down. Asked to resend unknowns elsewhere, the
/// producer still ends unknown, never "not sent", which would promise a
/// re-send makes no second job.
#[test]
fn a_job_a_server_may_have_stored_stays_unknown_however_the_next_fails() {
    let peer = common::FakePeer::start(vec![common::Act::CloseAfterPut]);
    let down = format!("127.0.0.1:{}", free_port().unwrap());
    let addrs = [peer.addr.to_string(), down];
    let mut m = MultiProducer::with_builder(&builder(), &addrs)
        .unwrap()
        .resend_unknown(true);
    let r = m.put(b"in flight", PutOptions::default());
    assert!(
        matches!(&r, Err(e) if e.outcome_unknown() && !e.not_sent()),
        "{r:?}"
    );
    assert_eq!(
        peer.log.lock().unwrap()[0].len(),
        1,
        "one put reached server 0"
    );
    // No re-send to server 0 on a new connection either. The peer accepts
    // in order, one connection at a time: once a probe made after the
    // producer closed everything is answered, every connection before it
    // is counted.
    drop(m);
    let mut probe = TcpStream::connect(peer.addr).unwrap();
    probe
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    probe.write_all(b"probe\r\n").unwrap();
    let mut reply = String::new();
    BufReader::new(probe).read_line(&mut reply).unwrap();
    assert_eq!(reply, "UNKNOWN_COMMAND\r\n");
    assert_eq!(
        peer.connections(),
        2,
        "server 0 saw one connection, then the probe"
    );
}
