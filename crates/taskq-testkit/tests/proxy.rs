//! The chaos proxy in front of a real beanstalkd: each toxic and the symptom a
//! client sees, run-time switching, probabilities, and connection counts.

use std::time::{Duration, Instant};

use taskq_proto::{Command, Connection, ConnectionConfig, ConnectionError, Reply};
use taskq_testkit::{Beanstalkd, ChaosProxy, Direction, Toxic};

const PUT: Command<'static> = Command::Put {
    pri: 0,
    delay: 0,
    ttr: 60,
    body: b"job",
};

fn connect(proxy: &ChaosProxy, io_timeout: Duration) -> Connection {
    let cfg = ConnectionConfig {
        io_timeout,
        ..ConnectionConfig::default()
    };
    Connection::connect(proxy.addr(), cfg).unwrap()
}

fn ok_put(c: &mut Connection) -> u64 {
    match c.request(&PUT) {
        Ok(Reply::Inserted { id }) => id,
        r => panic!("{r:?}"),
    }
}

fn wait_for(what: &str, f: impl Fn() -> bool) {
    let until = Instant::now() + Duration::from_secs(3);
    while !f() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn passes_traffic_and_counts_connections() {
    let b = Beanstalkd::start().unwrap();
    let proxy = ChaosProxy::start(b.addr()).unwrap();
    let mut c = connect(&proxy, Duration::from_secs(1));
    let id = ok_put(&mut c);
    let big = vec![7u8; 60_000];
    ok_put(&mut c);
    match c
        .request(&Command::Put {
            pri: 0,
            delay: 0,
            ttr: 60,
            body: &big,
        })
        .unwrap()
    {
        Reply::Inserted { .. } => {}
        r => panic!("{r:?}"),
    }
    assert!(matches!(
        c.request(&Command::Peek { id }).unwrap(),
        Reply::Found { .. }
    ));
    let mut d = connect(&proxy, Duration::from_secs(1));
    ok_put(&mut d);
    assert_eq!(proxy.opened(), 2);
    c.quit();
    drop(d);
    wait_for("both connections closed", || proxy.closed() == 2);
}

#[test]
fn latency_with_jitter() {
    let b = Beanstalkd::start().unwrap();
    let proxy = ChaosProxy::start(b.addr()).unwrap();
    let mut c = connect(&proxy, Duration::from_secs(2));
    proxy.add(
        Toxic::Latency {
            delay: Duration::from_millis(400),
            jitter: Duration::from_millis(50),
        },
        Direction::Downstream,
        1.0,
    );
    let started = Instant::now();
    ok_put(&mut c);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_millis(1500),
        "{took:?}"
    );
    // Beyond the client's deadline it is a timeout.
    let mut hasty = connect(&proxy, Duration::from_millis(200));
    assert!(hasty.request(&PUT).unwrap_err().is_timeout());
    proxy.clear();
    let started = Instant::now();
    ok_put(&mut c);
    assert!(started.elapsed() < Duration::from_millis(350));
}

#[test]
fn reset_breaks_the_connection() {
    let b = Beanstalkd::start().unwrap();
    let proxy = ChaosProxy::start(b.addr()).unwrap();
    let mut c = connect(&proxy, Duration::from_secs(1));
    ok_put(&mut c);
    proxy.add(
        Toxic::Reset {
            after: Duration::ZERO,
        },
        Direction::Both,
        1.0,
    );
    wait_for("the reset", || proxy.closed() == 1);
    let e = c.request(&PUT).unwrap_err();
    // A real RST, not a clean close: the write fails (not sent) or the read
    // sees the reset (outcome unknown), with ECONNRESET either way.
    match &e {
        ConnectionError::NotSent(io) | ConnectionError::Io(io) => {
            assert_eq!(io.kind(), std::io::ErrorKind::ConnectionReset, "{e:?}")
        }
        other => panic!("expected a reset, got {other:?}"),
    }
    assert!(e.breaks_connection());
    // A reset by timer: the connection works until then.
    proxy.clear();
    let mut c = connect(&proxy, Duration::from_secs(1));
    proxy.add(
        Toxic::Reset {
            after: Duration::from_millis(200),
        },
        Direction::Upstream,
        1.0,
    );
    ok_put(&mut c);
    wait_for("the timed reset", || proxy.closed() == 2);
    assert!(c.request(&PUT).is_err());
}

#[test]
fn silence_keeps_the_socket_open_and_answers_nothing() {
    let b = Beanstalkd::start().unwrap();
    let proxy = ChaosProxy::start(b.addr()).unwrap();
    let mut c = connect(&proxy, Duration::from_millis(300));
    ok_put(&mut c);
    proxy.add(Toxic::Silence, Direction::Downstream, 1.0);
    let started = Instant::now();
    let e = c.request(&PUT).unwrap_err();
    assert!(e.is_timeout(), "{e:?}");
    assert!(started.elapsed() < Duration::from_millis(800));
    assert_eq!(proxy.closed(), 0, "silence must not close");
    // The reply the client never heard is what the silence dropped.
    wait_for("the dropped reply", || {
        proxy
            .silenced(Direction::Downstream)
            .starts_with(b"INSERTED 2\r\n")
    });
    assert_eq!(proxy.silenced(Direction::Upstream), b"");
    assert!(proxy
        .silenced(Direction::Both)
        .starts_with(b"INSERTED 2\r\n"));
    // The put went upstream: beanstalkd has it although the client never heard.
    proxy.clear();
    let mut c = connect(&proxy, Duration::from_secs(1));
    match c.request(&Command::Stats).unwrap() {
        Reply::Ok { yaml } => {
            let s = taskq_proto::ServerStats::parse(yaml).unwrap();
            assert_eq!(s.cmd_put, 2);
        }
        r => panic!("{r:?}"),
    }
}

#[test]
fn limit_data_cuts_a_reply() {
    let b = Beanstalkd::start().unwrap();
    let proxy = ChaosProxy::start(b.addr()).unwrap();
    let mut c = connect(&proxy, Duration::from_secs(1));
    proxy.add(Toxic::LimitData { bytes: 5 }, Direction::Downstream, 1.0);
    let e = c.request(&PUT).unwrap_err();
    assert!(matches!(e, ConnectionError::Closed), "{e:?}");
    assert!(e.outcome_unknown());
    wait_for("the close", || proxy.closed() == 1);
    // Upstream: a request cut part way never reaches beanstalkd whole.
    proxy.clear();
    proxy.add(Toxic::LimitData { bytes: 4 }, Direction::Upstream, 1.0);
    let mut c = connect(&proxy, Duration::from_secs(1));
    assert!(c.request(&PUT).unwrap_err().breaks_connection());
    proxy.clear();
    let mut c = connect(&proxy, Duration::from_secs(1));
    match c.request(&Command::Stats).unwrap() {
        Reply::Ok { yaml } => {
            assert_eq!(taskq_proto::ServerStats::parse(yaml).unwrap().cmd_put, 1)
        }
        r => panic!("{r:?}"),
    }
}

#[test]
fn nothing_crosses_after_an_upstream_limit_not_even_the_answer_to_its_last_bytes() {
    // A peer that answers every byte at once: without the seal, its answer
    // to the last bytes let through could race the close back to the client.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let peer = listener.local_addr().unwrap();
    let got = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let got2 = got.clone();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { return };
            let mut buf = [0u8; 64];
            while let Ok(n @ 1..) = std::io::Read::read(&mut s, &mut buf) {
                got2.fetch_add(n, std::sync::atomic::Ordering::SeqCst);
                if std::io::Write::write_all(&mut s, &buf[..n]).is_err() {
                    break;
                }
            }
        }
    });
    let proxy = ChaosProxy::start(peer).unwrap();
    proxy.add(Toxic::LimitData { bytes: 4 }, Direction::Upstream, 1.0);
    for round in 0..20 {
        let before = got.load(std::sync::atomic::Ordering::SeqCst);
        let mut c = std::net::TcpStream::connect(proxy.addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        std::io::Write::write_all(&mut c, b"ping pong").unwrap();
        let mut back = Vec::new();
        // The close ends the read (or a reset does): either way nothing came back.
        let _ = std::io::Read::read_to_end(&mut c, &mut back);
        assert!(
            back.is_empty(),
            "round {round}: {back:?} crossed after the limit"
        );
        wait_for("the peer to read the 4 bytes", || {
            got.load(std::sync::atomic::Ordering::SeqCst) == before + 4
        });
    }
}

#[test]
fn reset_after_data_resets_at_that_byte_however_fast_the_client_goes() {
    let b = Beanstalkd::start().unwrap();
    let proxy = ChaosProxy::start(b.addr()).unwrap();
    // A put is 20 bytes (`put 0 0 60 3\r\njob\r\n`): two go through whole,
    // the third is cut 10 bytes in, with a reset.
    proxy.add(
        Toxic::ResetAfterData { bytes: 50 },
        Direction::Upstream,
        1.0,
    );
    let mut c = connect(&proxy, Duration::from_secs(1));
    ok_put(&mut c);
    ok_put(&mut c);
    let e = c.request(&PUT).unwrap_err();
    match &e {
        ConnectionError::NotSent(io) | ConnectionError::Io(io) => {
            assert_eq!(io.kind(), std::io::ErrorKind::ConnectionReset, "{e:?}")
        }
        other => panic!("expected a reset, got {other:?}"),
    }
    wait_for("the reset", || proxy.closed() == 1);
    proxy.clear();
    let mut c = connect(&proxy, Duration::from_secs(1));
    match c.request(&Command::Stats).unwrap() {
        Reply::Ok { yaml } => {
            assert_eq!(taskq_proto::ServerStats::parse(yaml).unwrap().cmd_put, 2)
        }
        r => panic!("{r:?}"),
    }
}

#[test]
fn slicer_delivers_tiny_segments_that_still_parse() {
    let b = Beanstalkd::start().unwrap();
    let proxy = ChaosProxy::start(b.addr()).unwrap();
    let mut c = connect(&proxy, Duration::from_secs(5));
    let body = vec![b'z'; 300];
    match c
        .request(&Command::Put {
            pri: 0,
            delay: 0,
            ttr: 60,
            body: &body,
        })
        .unwrap()
    {
        Reply::Inserted { .. } => {}
        r => panic!("{r:?}"),
    }
    proxy.add(
        Toxic::Slicer {
            max_segment: 1,
            delay: Duration::from_millis(1),
        },
        Direction::Both,
        1.0,
    );
    let before = c.io_counts().reads;
    match c
        .request(&Command::ReserveWithTimeout { timeout: 0 })
        .unwrap()
    {
        Reply::Reserved { body: got, .. } => assert_eq!(got, &body[..]),
        r => panic!("{r:?}"),
    }
    // The reply came in many pieces.
    assert!(c.io_counts().reads - before > 20, "{:?}", c.io_counts());
}

#[test]
fn probability_decides_per_connection_from_the_seed() {
    let b = Beanstalkd::start().unwrap();
    let count_silenced = |seed: u64| {
        let proxy = ChaosProxy::start_seeded(b.addr(), seed).unwrap();
        proxy.add(Toxic::Silence, Direction::Downstream, 0.5);
        let mut silenced = Vec::new();
        for _ in 0..16 {
            let mut c = connect(&proxy, Duration::from_millis(150));
            silenced.push(c.request(&Command::ListTubeUsed).is_err());
        }
        silenced
    };
    let a = count_silenced(42);
    let n = a.iter().filter(|&&s| s).count();
    assert!(n > 0 && n < 16, "{a:?}");
    assert_eq!(a, count_silenced(42), "the seed must replay");
    // Probability 0 never applies.
    let proxy = ChaosProxy::start(b.addr()).unwrap();
    proxy.add(Toxic::Silence, Direction::Both, 0.0);
    let mut c = connect(&proxy, Duration::from_millis(500));
    ok_put(&mut c);
}

/// A toxic drawn on a connection stays as drawn when others are added: a
/// byte limit counts from where it started, not from the later add.
#[test]
fn a_toxic_added_later_leaves_an_earlier_limit_where_it_was_anchored() {
    let b = Beanstalkd::start().unwrap();
    let proxy = ChaosProxy::start(b.addr()).unwrap();
    let mut c = connect(&proxy, Duration::from_millis(500));
    // Each `USING default\r\n` is 15 bytes: the limit falls in the 7th.
    proxy.add(Toxic::LimitData { bytes: 100 }, Direction::Downstream, 1.0);
    for _ in 0..4 {
        assert!(c.request(&Command::ListTubeUsed).is_ok());
    }
    proxy.add(
        Toxic::Latency {
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
        },
        Direction::Both,
        1.0,
    );
    for k in 5..=6 {
        assert!(c.request(&Command::ListTubeUsed).is_ok(), "reply {k}");
    }
    assert!(
        c.request(&Command::ListTubeUsed).is_err(),
        "the 7th reply crosses the 100 bytes counted from the start"
    );
}
