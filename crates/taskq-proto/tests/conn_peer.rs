//! The blocking connection against a scripted loopback peer: deadlines for the
//! whole reply, trickled and silent peers, closes, garbage, partial writes.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use common::{peer, read_line};
use taskq_proto::{
    Command, CommandKind, Connection, ConnectionConfig, ConnectionError, Limits, Reply, ReplyError,
};

/// Waits until the client closes (or 10 s pass).
fn drain(s: &mut TcpStream) {
    let mut b = [0u8; 256];
    while matches!(s.read(&mut b), Ok(n) if n > 0) {}
}

fn cfg(io: Duration) -> ConnectionConfig {
    ConnectionConfig {
        io_timeout: io,
        ..ConnectionConfig::default()
    }
}

const IO: Duration = Duration::from_millis(500);

/// A put of `body` (priority 1, TTR 5).
fn put_of(body: &[u8]) -> Command<'_> {
    Command::Put {
        pri: 1,
        delay: 0,
        ttr: 5,
        body,
    }
}

/// A connection to `addr` that puts bodies of up to `len` bytes, at I/O
/// timeout `io`.
fn big_puts(addr: std::net::SocketAddr, len: usize, io: Duration) -> Connection {
    let limits = Limits {
        max_job_size: len,
        ..Limits::default()
    };
    Connection::connect(addr, ConnectionConfig { limits, ..cfg(io) }).unwrap()
}
const GRACE: Duration = Duration::from_millis(500);

fn assert_broken_for_good(c: &mut Connection) {
    assert!(c.is_broken());
    let again = c.request(&Command::Stats);
    assert!(matches!(again, Err(ConnectionError::Broken)), "{again:?}");
    assert!(again.unwrap_err().not_sent());
    assert!(matches!(
        c.send(&Command::Reserve),
        Err(ConnectionError::Broken)
    ));
    assert!(matches!(
        c.send_raw(b"stats\r\n", CommandKind::Stats),
        Err(ConnectionError::Broken)
    ));
    assert!(matches!(
        c.queue(&Command::Stats),
        Err(ConnectionError::Broken)
    ));
    assert!(matches!(c.flush(), Err(ConnectionError::Broken)));
    assert!(matches!(c.recv(), Err(ConnectionError::Broken)));
}

#[test]
fn trickled_reply_times_out_on_the_whole_reply_deadline() {
    let (addr, peer) = peer(|mut s| {
        read_line(&mut s);
        // One byte every 50 ms: each read succeeds well within the socket
        // timeout, so only a deadline on the whole reply can stop it.
        let reply = b"RESERVED 1 100\r\n";
        for &b in reply.iter().chain([b'x'; 100].iter()) {
            if s.write_all(&[b]).is_err() {
                return;
            }
            thread::sleep(Duration::from_millis(50));
        }
    });
    let mut c = Connection::connect(addr, cfg(IO)).unwrap();
    let t = Instant::now();
    let r = c.request(&Command::Reserve);
    let took = t.elapsed();
    let e = r.unwrap_err();
    assert!(matches!(e, ConnectionError::Timeout { .. }), "{e:?}");
    assert!(e.outcome_unknown() && e.breaks_connection() && !e.not_sent());
    assert!(
        took >= IO - Duration::from_millis(50),
        "gave up early: {took:?}"
    );
    assert!(took <= IO + GRACE, "deadline overrun: {took:?}");
    assert!(c.io_counts().reads > 3, "the reply was read in pieces");
    assert_broken_for_good(&mut c);
    drop(c);
    peer.join().unwrap();
}

#[test]
fn silent_peer_times_out() {
    let (addr, peer) = peer(|mut s| {
        read_line(&mut s);
        drain(&mut s);
    });
    let mut c = Connection::connect(addr, cfg(IO)).unwrap();
    let t = Instant::now();
    let e = c.request(&Command::Delete { id: 1 }).unwrap_err();
    let took = t.elapsed();
    assert!(
        matches!(e, ConnectionError::Timeout { waited } if waited <= took),
        "{e:?}"
    );
    assert!(
        took >= IO - Duration::from_millis(50),
        "gave up early: {took:?}"
    );
    assert!(took <= IO + GRACE, "deadline overrun: {took:?}");
    assert_broken_for_good(&mut c);
    drop(c);
    peer.join().unwrap();
}

#[test]
fn tiny_segments_within_the_deadline_succeed() {
    let (addr, peer) = peer(|mut s| {
        read_line(&mut s);
        let reply = b"RESERVED 5 10\r\n0\r\n3456789\r\n";
        for chunk in reply.chunks(2) {
            s.write_all(chunk).unwrap();
            thread::sleep(Duration::from_millis(5));
        }
        drain(&mut s);
    });
    let mut c = Connection::connect(addr, cfg(IO)).unwrap();
    match c.request(&Command::Reserve).unwrap() {
        Reply::Reserved { id, body } => assert_eq!((id, body), (5, &b"0\r\n3456789"[..])),
        r => panic!("{r:?}"),
    }
    assert!(c.io_counts().reads > 2, "{:?}", c.io_counts());
    assert!(!c.is_broken());
    drop(c);
    peer.join().unwrap();
}

#[test]
fn peer_closing_mid_reply_is_closed_with_outcome_unknown() {
    let (addr, peer) = peer(|mut s| {
        read_line(&mut s);
        s.write_all(b"RESERVED 5 10\r\n01234").unwrap();
    });
    let mut c = Connection::connect(addr, cfg(IO)).unwrap();
    let e = c.request(&Command::Reserve).unwrap_err();
    assert!(matches!(e, ConnectionError::Closed), "{e:?}");
    assert!(e.outcome_unknown());
    assert_broken_for_good(&mut c);
    peer.join().unwrap();
}

#[test]
fn garbage_breaks_the_connection_for_good() {
    #[rustfmt::skip]
    let cases: &[(&[u8], ReplyError)] = &[
        (b"HELLO THERE\r\n", ReplyError::UnknownReply),
        (b"INSERTED 1\n", ReplyError::BadLineEnd),
        (b"INSERTED 99999999999999999999999\r\n", ReplyError::BadNumber),
        (b"BURIED\r\n", ReplyError::Malformed { word: "BURIED" }),
        (&[b'Z'; 300], ReplyError::LineTooLong),
    ];
    for (garbage, want) in cases {
        let garbage = garbage.to_vec();
        let (addr, peer) = peer(move |mut s| {
            read_line(&mut s);
            s.write_all(&garbage).unwrap();
            drain(&mut s);
        });
        let mut c = Connection::connect(addr, cfg(IO)).unwrap();
        let put = Command::Put {
            pri: 1,
            delay: 0,
            ttr: 1,
            body: b"x",
        };
        let e = c.request(&put).unwrap_err();
        assert!(
            matches!(e, ConnectionError::Protocol(got) if got == *want),
            "{e:?}"
        );
        assert!(e.outcome_unknown());
        assert_broken_for_good(&mut c);
        drop(c);
        peer.join().unwrap();
    }
}

#[test]
fn reserve_with_timeout_deadline_includes_the_server_wait() {
    // The server may hold the reply for the whole timeout; the client must wait
    // that long plus its I/O timeout, and no longer.
    let io = Duration::from_millis(300);
    let (addr, peer) = peer(|mut s| {
        read_line(&mut s);
        thread::sleep(Duration::from_millis(1000));
        s.write_all(b"TIMED_OUT\r\n").unwrap();
        read_line(&mut s);
        drain(&mut s);
    });
    let mut c = Connection::connect(addr, cfg(io)).unwrap();
    let t = Instant::now();
    let r = c.request(&Command::ReserveWithTimeout { timeout: 1 });
    assert_eq!(r.unwrap(), Reply::TimedOut);
    assert!(t.elapsed() >= Duration::from_millis(950));

    // The next one is never answered: it fails at 1 s + the I/O timeout.
    let t = Instant::now();
    let e = c
        .request(&Command::ReserveWithTimeout { timeout: 1 })
        .unwrap_err();
    let took = t.elapsed();
    assert!(e.is_timeout(), "{e:?}");
    assert!(
        took >= Duration::from_millis(1250),
        "gave up early: {took:?}"
    );
    assert!(
        took <= Duration::from_millis(1300) + GRACE,
        "deadline overrun: {took:?}"
    );
    drop(c);
    peer.join().unwrap();
}

#[test]
fn pipelined_replies_are_read_in_order_from_one_write() {
    let (addr, peer) = peer(|mut s| {
        for _ in 0..3 {
            read_line(&mut s);
        }
        // All three replies in one segment, then a fourth split over two
        // (once its request came: a server answers only what it is asked).
        s.write_all(b"USING a\r\nWATCHING 2\r\nRESERVED 9 3\r\nabc\r\n")
            .unwrap();
        read_line(&mut s);
        s.write_all(b"DELE").unwrap();
        thread::sleep(Duration::from_millis(20));
        s.write_all(b"TED\r\n").unwrap();
        drain(&mut s);
    });
    let mut c = Connection::connect(addr, cfg(IO)).unwrap();
    c.queue(&Command::Use { tube: "a" }).unwrap();
    c.queue(&Command::Watch { tube: "a" }).unwrap();
    c.queue(&Command::Reserve).unwrap();
    let before = c.io_counts().writes;
    c.flush().unwrap();
    assert_eq!(c.io_counts().writes - before, 1);
    assert_eq!(c.queued_len(), 0);
    assert_eq!(c.recv().unwrap(), Reply::Using { tube: "a" });
    assert_eq!(c.recv().unwrap(), Reply::Watching { count: 2 });
    assert_eq!(
        c.recv().unwrap(),
        Reply::Reserved {
            id: 9,
            body: b"abc"
        }
    );
    assert_eq!(
        c.request(&Command::Delete { id: 9 }).unwrap(),
        Reply::Deleted
    );
    drop(c);
    peer.join().unwrap();
}

#[test]
fn receive_buffer_grows_to_the_limit_and_no_further() {
    let limits = Limits {
        max_job_size: 100_000,
        max_yaml_size: 10,
    };
    let (addr, peer) = peer(|mut s| {
        read_line(&mut s);
        let mut reply = b"RESERVED 1 100000\r\n".to_vec();
        reply.extend((0..100_000u32).map(|i| (i % 251) as u8));
        reply.extend_from_slice(b"\r\n");
        s.write_all(&reply).unwrap();
        read_line(&mut s);
        // One byte over the limit: refused from the line alone, before any body.
        s.write_all(b"RESERVED 2 100001\r\n").unwrap();
        drain(&mut s);
    });
    let mut c = Connection::connect(
        addr,
        ConnectionConfig {
            limits,
            ..cfg(Duration::from_secs(2))
        },
    )
    .unwrap();
    match c.request(&Command::Reserve).unwrap() {
        Reply::Reserved { id: 1, body } => {
            assert_eq!(body.len(), 100_000);
            assert!(body.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        }
        r => panic!("{r:?}"),
    }
    let e = c.request(&Command::Reserve).unwrap_err();
    assert!(
        matches!(
            e,
            ConnectionError::Protocol(ReplyError::BodyTooLarge {
                len: 100_001,
                max: 100_000
            })
        ),
        "{e:?}"
    );
    drop(c);
    peer.join().unwrap();
}

#[test]
fn partial_writes_continue_where_they_stopped() {
    // 16 MiB is more than loopback buffers hold while the peer is not reading,
    // so the first send returns short when its timeout expires and the loop
    // must send the rest, byte-exact. The rest must go within the I/O
    // timeout of that short send (the write's own deadline): the peer reads
    // 200 ms after it, and a second of timeout leaves the copy room on a
    // busy machine.
    const LEN: usize = 16 << 20;
    let body: Vec<u8> = (0..LEN).map(|i| (i % 253) as u8).collect();
    let expect_len = format!("put 1 0 5 {LEN}\r\n").len() + LEN + 2;
    let (addr, peer) = peer(move |mut s| {
        thread::sleep(Duration::from_millis(1200));
        let mut got = vec![0u8; expect_len];
        s.read_exact(&mut got).unwrap();
        // Answer first: checking 16 MiB takes a debug build longer than the
        // client's reply deadline.
        s.write_all(b"INSERTED 1\r\n").unwrap();
        let line_len = got.windows(2).position(|w| w == b"\r\n").unwrap() + 2;
        assert_eq!(&got[..line_len], format!("put 1 0 5 {LEN}\r\n").as_bytes());
        assert!(got[line_len..line_len + LEN]
            .iter()
            .enumerate()
            .all(|(i, &b)| b == (i % 253) as u8));
        assert_eq!(&got[line_len + LEN..], b"\r\n");
        drain(&mut s);
    });
    let mut c = big_puts(addr, LEN, Duration::from_millis(1000));
    let put = Command::Put {
        pri: 1,
        delay: 0,
        ttr: 5,
        body: &body,
    };
    match c.send(&put) {
        Ok(()) => {}
        Err(e) => panic!("{e}"),
    }
    assert!(
        c.io_counts().writes >= 2,
        "expected a short write, got {:?}",
        c.io_counts()
    );
    assert_eq!(c.recv().unwrap(), Reply::Inserted { id: 1 });
    drop(c);
    peer.join().unwrap();
}

#[test]
fn a_peer_that_stops_reading_mid_request_is_outcome_unknown() {
    const LEN: usize = 16 << 20;
    let body = vec![1u8; LEN];
    let (addr, peer) = peer(|mut s| {
        // Never read; wait for the client to give up.
        thread::sleep(Duration::from_millis(1500));
        drain(&mut s);
    });
    let mut c = big_puts(addr, LEN, Duration::from_millis(200));
    let e = c.send(&put_of(&body)).unwrap_err();
    assert!(
        matches!(e, ConnectionError::Io(_)),
        "part was sent, so not NotSent: {e:?}"
    );
    assert!(e.outcome_unknown());
    assert_broken_for_good(&mut c);
    drop(c);
    peer.join().unwrap();
}

#[test]
fn invalid_requests_leave_the_connection_usable() {
    let (addr, peer) = peer(|mut s| {
        assert_eq!(read_line(&mut s), b"use ok\r\n");
        s.write_all(b"USING ok\r\n").unwrap();
        drain(&mut s);
    });
    let mut c = Connection::connect(
        addr,
        ConnectionConfig {
            limits: Limits {
                max_job_size: 4,
                ..Limits::default()
            },
            ..cfg(IO)
        },
    )
    .unwrap();
    let e = c.request(&Command::Use { tube: "-bad" }).unwrap_err();
    assert!(matches!(e, ConnectionError::Invalid(_)) && e.not_sent() && !e.breaks_connection());
    let e = c
        .request(&Command::Put {
            pri: 0,
            delay: 0,
            ttr: 1,
            body: b"12345",
        })
        .unwrap_err();
    assert!(matches!(e, ConnectionError::Invalid(_)), "{e:?}");
    assert!(matches!(
        c.queue(&Command::Watch { tube: "" }),
        Err(ConnectionError::Invalid(_))
    ));
    assert_eq!(c.queued_len(), 0);
    assert!(!c.is_broken());
    assert_eq!(c.io_counts().writes, 0, "nothing was sent");
    assert_eq!(
        c.request(&Command::Use { tube: "ok" }).unwrap(),
        Reply::Using { tube: "ok" }
    );
    drop(c);
    peer.join().unwrap();
}

#[test]
fn connect_failure_is_not_sent() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let e = Connection::connect(("127.0.0.1", port), cfg(IO)).unwrap_err();
    assert!(
        matches!(e, ConnectionError::NotSent(_)) && e.not_sent(),
        "{e:?}"
    );
}

/// A peer that takes a few bytes just before each send would time out
/// keeps every send short of its timeout: only a deadline on the write as a
/// whole ends it, within the I/O timeout of the first short send (plus the
/// send in progress then).
#[test]
fn a_peer_that_reads_a_trickle_cannot_stretch_a_write_past_its_deadline() {
    const LEN: usize = 16 << 20;
    let body = vec![7u8; LEN];
    let (addr, peer) = peer(|mut s| {
        let mut b = vec![0u8; 256 << 10];
        let until = Instant::now() + Duration::from_secs(20);
        // Up to 256 KiB every 300 ms, until the client gives up (or 20 s
        // pass): each read wakes the client's send, which then returns
        // short at its 400 ms timeout, never failing on its own.
        while Instant::now() < until {
            thread::sleep(Duration::from_millis(300));
            match s.read(&mut b) {
                Ok(n) if n > 0 => {}
                _ => return,
            }
        }
    });
    let mut c = big_puts(addr, LEN, Duration::from_millis(400));
    let t = Instant::now();
    let e = c.send(&put_of(&body)).unwrap_err();
    // The first send's timeout, the deadline after it, and one more send.
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert!(e.outcome_unknown(), "{e:?}");
    assert_broken_for_good(&mut c);
    drop(c);
    peer.join().unwrap();
}
