//! The put hot path of the blocking connection (one read parsed as a whole
//! `INSERTED`) against a scripted loopback peer: every reply that is not one
//! whole `INSERTED` in one segment must fall back to the general reader with
//! the same whole-reply deadline and the same outcomes.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use common::{peer, read_line};
use taskq_proto::{Command, Connection, ConnectionConfig, ConnectionError, Reply, ReplyError};

const IO: Duration = Duration::from_millis(500);
const GRACE: Duration = Duration::from_millis(500);

/// Reads one whole put request (line, body, CRLF) and returns its body.
fn read_put(s: &mut TcpStream) -> Vec<u8> {
    let line = read_line(s);
    if !line.ends_with(b"\r\n") {
        return Vec::new();
    }
    let text = String::from_utf8(line).unwrap();
    assert!(text.starts_with("put "), "{text:?}");
    let len: usize = text.trim_end().rsplit(' ').next().unwrap().parse().unwrap();
    let mut body = vec![0u8; len + 2];
    s.read_exact(&mut body).unwrap();
    assert!(body.ends_with(b"\r\n"));
    body.truncate(len);
    body
}

/// Waits until the client closes (or 10 s pass).
fn drain(s: &mut TcpStream) {
    let mut b = [0u8; 256];
    while matches!(s.read(&mut b), Ok(n) if n > 0) {}
}

fn connect(addr: SocketAddr) -> Connection {
    let cfg = ConnectionConfig {
        io_timeout: IO,
        ..ConnectionConfig::default()
    };
    Connection::connect(addr, cfg).unwrap()
}

fn put(body: &[u8]) -> Command<'_> {
    Command::Put {
        pri: 1024,
        delay: 0,
        ttr: 60,
        body,
    }
}

#[test]
fn whole_inserted_in_one_read_then_the_same_line_again() {
    let (addr, peer) = peer(|mut s| {
        for id in [7u64, 12_345_678_901, 9_999_999_999_999_999_999, u64::MAX] {
            assert_eq!(read_put(&mut s), b"job\r\n\0");
            s.write_all(format!("INSERTED {id}\r\n").as_bytes())
                .unwrap();
        }
        drain(&mut s);
    });
    let mut c = connect(addr);
    // The same numbers each time: the cached line; u64::MAX (20 digits) is
    // left to the general parser.
    for id in [7u64, 12_345_678_901, 9_999_999_999_999_999_999, u64::MAX] {
        assert_eq!(
            c.request(&put(b"job\r\n\0")).unwrap(),
            Reply::Inserted { id }
        );
    }
    assert_eq!(c.io_counts().writes, 4);
    drop(c);
    peer.join().unwrap();
}

#[test]
fn every_other_put_reply_goes_through_the_general_reader() {
    let replies: [(&[u8], Reply<'static>); 6] = [
        (b"BURIED 9\r\n", Reply::InsertedBuried { id: 9 }),
        (b"JOB_TOO_BIG\r\n", Reply::JobTooBig),
        (b"DRAINING\r\n", Reply::Draining),
        (b"EXPECTED_CRLF\r\n", Reply::ExpectedCrlf),
        (b"OUT_OF_MEMORY\r\n", Reply::OutOfMemory),
        (b"INSERTED 00042\r\n", Reply::Inserted { id: 42 }),
    ];
    let (addr, peer) = peer(move |mut s| {
        for (wire, _) in replies {
            read_put(&mut s);
            s.write_all(wire).unwrap();
        }
        drain(&mut s);
    });
    let mut c = connect(addr);
    for (_, want) in replies {
        assert_eq!(c.request(&put(b"x")).unwrap(), want);
        assert!(!c.is_broken());
    }
    drop(c);
    peer.join().unwrap();
}

#[test]
fn two_replies_in_one_segment_are_read_in_order() {
    let (addr, peer) = peer(|mut s| {
        read_put(&mut s);
        read_put(&mut s);
        s.write_all(b"INSERTED 1\r\nINSERTED 2\r\n").unwrap();
        drain(&mut s);
    });
    let mut c = connect(addr);
    c.send(&put(b"a")).unwrap();
    c.send(&put(b"b")).unwrap();
    assert_eq!(c.recv().unwrap(), Reply::Inserted { id: 1 });
    let reads = c.io_counts().reads;
    assert_eq!(c.recv().unwrap(), Reply::Inserted { id: 2 });
    assert_eq!(c.io_counts().reads, reads, "the second reply was buffered");
    drop(c);
    peer.join().unwrap();
}

#[test]
fn trickled_inserted_within_the_deadline_succeeds() {
    let (addr, peer) = peer(|mut s| {
        read_put(&mut s);
        for b in b"INSERTED 123456789\r\n" {
            s.write_all(&[*b]).unwrap();
            thread::sleep(Duration::from_millis(5));
        }
        drain(&mut s);
    });
    let mut c = connect(addr);
    assert_eq!(
        c.request(&put(b"x")).unwrap(),
        Reply::Inserted { id: 123_456_789 }
    );
    assert!(c.io_counts().reads > 2, "{:?}", c.io_counts());
    drop(c);
    peer.join().unwrap();
}

#[test]
fn trickled_inserted_times_out_on_the_whole_reply_deadline() {
    let (addr, peer) = peer(|mut s| {
        read_put(&mut s);
        // 20 bytes, 60 ms apart: each read succeeds well within the socket
        // timeout, but the whole reply would take 1.2 s.
        for b in b"INSERTED 123456789\r\n" {
            if s.write_all(&[*b]).is_err() {
                return;
            }
            thread::sleep(Duration::from_millis(60));
        }
    });
    let mut c = connect(addr);
    let t = Instant::now();
    let e = c.request(&put(b"x")).unwrap_err();
    let took = t.elapsed();
    assert!(matches!(e, ConnectionError::Timeout { .. }), "{e:?}");
    assert!(e.outcome_unknown() && c.is_broken());
    assert!(
        took >= IO - Duration::from_millis(50),
        "gave up early: {took:?}"
    );
    assert!(took <= IO + GRACE, "deadline overrun: {took:?}");
    drop(c);
    peer.join().unwrap();
}

#[test]
fn silent_peer_after_a_put_times_out() {
    let (addr, peer) = peer(|mut s| {
        read_put(&mut s);
        drain(&mut s);
    });
    let mut c = connect(addr);
    let t = Instant::now();
    let e = c.request(&put(b"x")).unwrap_err();
    let took = t.elapsed();
    assert!(matches!(e, ConnectionError::Timeout { .. }), "{e:?}");
    assert!(
        took >= IO - Duration::from_millis(50),
        "gave up early: {took:?}"
    );
    assert!(took <= IO + GRACE, "deadline overrun: {took:?}");
    assert!(c.is_broken());
    drop(c);
    peer.join().unwrap();
}

#[test]
fn a_late_reply_shortens_the_socket_timeout_only_for_itself() {
    let (addr, peer) = peer(|mut s| {
        // The reply comes in three pieces spread over most of the deadline, so
        // the client lowers its socket timeout to what is left for the last...
        read_put(&mut s);
        s.write_all(b"INSERTED 1").unwrap();
        thread::sleep(Duration::from_millis(200));
        s.write_all(b"2").unwrap();
        thread::sleep(Duration::from_millis(150));
        s.write_all(b"\r\n").unwrap();
        // ...and the next put, to a silent peer, must wait with the whole I/O
        // timeout again: one read that times out, not several short ones.
        read_put(&mut s);
        drain(&mut s);
    });
    let mut c = connect(addr);
    assert_eq!(c.request(&put(b"x")).unwrap(), Reply::Inserted { id: 12 });
    let reads = c.io_counts().reads;
    assert!(reads >= 3, "the reply came in pieces: {reads}");
    let t = Instant::now();
    let e = c.request(&put(b"x")).unwrap_err();
    let took = t.elapsed();
    assert!(matches!(e, ConnectionError::Timeout { .. }), "{e:?}");
    assert!(
        took >= IO - Duration::from_millis(50),
        "gave up early: {took:?}"
    );
    assert!(took <= IO + GRACE, "deadline overrun: {took:?}");
    assert_eq!(c.io_counts().reads - reads, 1, "socket timeout restored");
    drop(c);
    peer.join().unwrap();
}

#[test]
fn peer_closing_mid_inserted_is_closed() {
    let (addr, peer) = peer(|mut s| {
        read_put(&mut s);
        s.write_all(b"INSERTED 12").unwrap();
    });
    let mut c = connect(addr);
    let e = c.request(&put(b"x")).unwrap_err();
    assert!(matches!(e, ConnectionError::Closed), "{e:?}");
    assert!(e.outcome_unknown() && c.is_broken());
    peer.join().unwrap();
}

#[test]
fn malformed_inserted_breaks_the_connection() {
    for wire in [
        &b"INSERTED 12x\r\n"[..],
        b"INSERTED \r\n",
        b"INSERTED 99999999999999999999\r\n",
        b"INSERTED 1\n",
        b"RESERVED 1 1\r\nx\r\n",
    ] {
        let (addr, peer) = peer(move |mut s| {
            read_put(&mut s);
            s.write_all(wire).unwrap();
            drain(&mut s);
        });
        let mut c = connect(addr);
        let e = c.request(&put(b"x")).unwrap_err();
        let shown = String::from_utf8_lossy(wire);
        assert!(
            matches!(
                e,
                ConnectionError::Protocol(
                    ReplyError::BadNumber
                        | ReplyError::Malformed { .. }
                        | ReplyError::BadLineEnd
                        | ReplyError::UnexpectedReply { .. }
                )
            ),
            "{shown:?}: {e:?}"
        );
        assert!(c.is_broken(), "{shown:?}");
        drop(c);
        peer.join().unwrap();
    }
}
