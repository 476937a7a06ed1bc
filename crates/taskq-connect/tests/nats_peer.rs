//! The NATS client against a scripted peer that misbehaves on purpose:
//! malformed lines, oversized counts, silence, `-ERR`, a server without
//! headers, and the good cases a real server rarely shows on demand (a PING
//! in the middle of a wait, stale replies, a later INFO with new addresses).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc::Receiver;
use std::thread::JoinHandle;
use std::time::Duration;

use taskq_connect::nats::{NatsConfig, NatsConnection};
use taskq_proto::nats::{NatsError, NatsProtoError};

const INFO: &str = "INFO {\"server_id\":\"FAKE\",\"max_payload\":1048576,\"headers\":true,\"connect_urls\":[\"127.0.0.1:1\"]}\r\n";

/// The peer's side of one connection.
struct Peer {
    s: TcpStream,
    seen: Vec<u8>,
}

impl Peer {
    /// Reads until `pat` has arrived; returns everything read so far.
    fn until(&mut self, pat: &str) -> String {
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&self.seen).contains(pat) {
            let n = self.s.read(&mut buf).expect("peer read");
            assert!(n > 0, "client closed before {pat:?}");
            self.seen.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&self.seen).into_owned()
    }

    fn send(&mut self, b: &str) {
        self.s.write_all(b.as_bytes()).unwrap();
    }

    /// The client's inbox prefix, from its SUB.
    fn inbox(&mut self) -> String {
        let seen = self.until("PING\r\n");
        let sub = seen.lines().find(|l| l.starts_with("SUB ")).unwrap();
        sub.split(' ')
            .nth(1)
            .unwrap()
            .trim_end_matches('*')
            .to_string()
    }
}

/// A peer on a free port that sends `info`, then runs `script`.
fn peer(
    info: &'static str,
    script: impl FnOnce(&mut Peer) + Send + 'static,
) -> (String, JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let h = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut p = Peer {
            s,
            seen: Vec::new(),
        };
        p.send(info);
        script(&mut p);
    });
    (addr, h)
}

fn cfg() -> NatsConfig {
    NatsConfig {
        io_timeout: Duration::from_millis(400),
        ..NatsConfig::default()
    }
}

/// A peer that completes the handshake and then answers the first publish with `reply`.
fn answering(reply: &'static str) -> (String, JoinHandle<()>) {
    peer(INFO, move |p| {
        p.inbox();
        p.send("PONG\r\n");
        p.until("HPUB");
        p.send(reply);
        // Keep the socket open until the client is done.
        let _ = p.s.read(&mut [0u8; 64]);
    })
}

fn broken_by(reply: &'static str) -> NatsError {
    let (addr, h) = answering(reply);
    let mut c = NatsConnection::connect(&[addr], cfg()).unwrap();
    let e = c.publish("taskq.T", b"i", b"x").unwrap_err();
    assert!(c.is_broken(), "{reply:?} broke the connection");
    assert!(matches!(
        c.publish("taskq.T", b"i", b"x"),
        Err(NatsError::Broken)
    ));
    drop(c);
    h.join().unwrap();
    e
}

#[test]
fn malformed_lines_are_typed_errors_that_break_the_connection() {
    #[rustfmt::skip]
    let table: &[(&str, NatsProtoError)] = &[
        ("MSG _INBOX.x 1 x\r\n", NatsProtoError::BadNumber),
        ("MSG a 1 99999999\r\n", NatsProtoError::PayloadTooLarge { len: 99_999_999, max: 1_402_712 }),
        ("HMSG a 1 9 3\r\n", NatsProtoError::HeaderLongerThanTotal),
        ("MSG a 1 2\r\nabcd\r\n", NatsProtoError::MissingPayloadCrlf),
        ("BOGUS\r\n", NatsProtoError::UnknownOp),
        ("PING\n", NatsProtoError::BadLineEnd),
    ];
    for (line, want) in table {
        match broken_by(line) {
            NatsError::Protocol(e) => assert_eq!(e, *want, "{line:?}"),
            e => panic!("{line:?}: {e:?}"),
        }
    }
    assert!(
        matches!(broken_by("-ERR 'Maximum Payload Violation'\r\n"), NatsError::Server(t) if t == "Maximum Payload Violation")
    );
}

#[test]
fn silence_past_the_deadline_is_a_timeout_and_breaks() {
    let (addr, h) = peer(INFO, |p| {
        p.inbox();
        p.send("PONG\r\n");
        p.until("HPUB");
        std::thread::sleep(Duration::from_millis(900));
    });
    let mut c = NatsConnection::connect(&[addr], cfg()).unwrap();
    let t = std::time::Instant::now();
    let e = c.publish("taskq.T", b"i", b"x").unwrap_err();
    assert!(e.is_timeout() && e.outcome_unknown(), "{e:?}");
    assert!(
        t.elapsed() < Duration::from_millis(800),
        "{:?}",
        t.elapsed()
    );
    assert!(c.is_broken());
    h.join().unwrap();
}

#[test]
fn a_ping_mid_wait_is_answered_and_stale_replies_are_skipped() {
    let (addr, h) = peer(INFO, |p| {
        let inbox = p.inbox();
        p.send("PONG\r\n");
        p.until("HPUB");
        // A PING, a stale reply to token 0, an INFO with new addresses,
        // (without the headers field: only the first INFO must offer them),
        // then the PubAck (two spaces where the empty reply field is).
        p.send("PING\r\n");
        p.send(&format!("MSG {inbox}0 1 2\r\n{{}}\r\n"));
        p.send(
            "INFO {\"server_id\":\"FAKE\",\"connect_urls\":[\"127.0.0.1:7\",\"127.0.0.1:8\"]}\r\n",
        );
        let ack = "{\"stream\":\"TASKQ\", \"seq\":5}";
        p.send(&format!("MSG {inbox}1 1  {}\r\n{ack}\r\n", ack.len()));
        p.until("PONG\r\n");
    });
    let mut c = NatsConnection::connect(&[addr], cfg()).unwrap();
    let a = c.publish("taskq.T", b"i", b"x").unwrap();
    assert_eq!((a.stream_seq, a.duplicate), (5, false));
    assert_eq!(c.pings_answered(), 1);
    assert!(
        c.servers().contains(&"127.0.0.1:7".to_string())
            && c.servers().contains(&"127.0.0.1:8".to_string())
    );
    assert_eq!(c.servers()[0], c.peer_addr().to_string());
    h.join().unwrap();
}

#[test]
fn handshake_failures_are_typed() {
    let (addr, h) = peer(INFO, |p| {
        p.inbox();
        p.send("-ERR 'Authorization Violation'\r\n");
    });
    match NatsConnection::connect(&[addr], cfg()) {
        Err(e @ NatsError::Refused(_)) => {
            assert!(e.is_auth_refused() && !e.outcome_unknown(), "{e}");
            let NatsError::Refused(r) = &e else {
                unreachable!()
            };
            assert_eq!(
                (r.reason.as_str(), r.auth.as_str()),
                ("Authorization Violation", "none")
            );
        }
        r => panic!("{r:?}"),
    }
    h.join().unwrap();
    let (addr, h) = peer("INFO {\"server_id\":\"OLD\",\"headers\":false}\r\n", |_| {});
    assert!(matches!(
        NatsConnection::connect(&[addr], cfg()),
        Err(NatsError::Unsupported(_))
    ));
    h.join().unwrap();
    // Bytes that are not NATS: the handshake failed, nothing was sent.
    let (addr, h) = peer("HELLO\r\n", |_| {});
    match NatsConnection::connect(&[addr], cfg()) {
        Err(e @ NatsError::Handshake { .. }) => {
            assert!(!e.outcome_unknown(), "{e}");
            let NatsError::Handshake { during, error } = &e else {
                unreachable!()
            };
            assert_eq!(*during, "waiting for INFO");
            assert!(matches!(**error, NatsError::Protocol(_)), "{error:?}");
            assert!(!e.to_string().contains("--tls-first"), "{e}");
        }
        r => panic!("{r:?}"),
    }
    h.join().unwrap();
    // No INFO at all: the connection closed (as a server waiting for the TLS
    // handshake first closes it after its own timeout), or silence until the
    // client's deadline. Either way the message points to --tls-first.
    let (addr, h) = peer("", |_| {});
    let closed = NatsConnection::connect(&[addr], cfg()).unwrap_err();
    h.join().unwrap();
    let (addr, h) = peer("", |p| {
        // Silent until the client gives up and closes.
        let _ = p.s.read(&mut [0u8; 1]);
    });
    let silent = NatsConnection::connect(&[addr], cfg()).unwrap_err();
    h.join().unwrap();
    for (e, want) in [
        (closed, "the server closed the connection"),
        (silent, "no reply within"),
    ] {
        let NatsError::Handshake { during, error } = &e else {
            panic!("{e:?}")
        };
        assert_eq!(*during, "waiting for INFO");
        assert!(!e.outcome_unknown() && !error.to_string().is_empty());
        let text = e.to_string();
        assert!(text.contains(want), "{text}");
        assert!(
            text.contains("(if the server wants the TLS handshake first, use --tls-first)"),
            "{text}"
        );
    }
    // Nothing listens: not sent.
    let free = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    assert!(matches!(
        NatsConnection::connect(&[free], cfg()),
        Err(NatsError::NotSent(_))
    ));
}

#[test]
fn stale_replies_trickling_in_do_not_stretch_the_deadline() {
    let (addr, h) = peer(INFO, |p| {
        let inbox = p.inbox();
        p.send("PONG\r\n");
        p.until("HPUB");
        for i in 0..12 {
            // Three PINGs back to back first, all there long before the
            // deadline; then one with each stale reply.
            let pings = if i == 0 { 3 } else { 1 };
            let ping = "PING\r\n".repeat(pings);
            if p.s
                .write_all(format!("MSG {inbox}0 1 2\r\n{{}}\r\n{ping}").as_bytes())
                .is_err()
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let mut c = NatsConnection::connect(&[addr], cfg()).unwrap();
    let t = std::time::Instant::now();
    let e = c.publish("taskq.T", b"i", b"x").unwrap_err();
    assert!(e.is_timeout(), "{e:?}");
    // The whole-reply deadline is 400 ms however many stale replies and PINGs come.
    assert!(
        t.elapsed() < Duration::from_millis(600),
        "{:?}",
        t.elapsed()
    );
    assert!(c.pings_answered() >= 3);
    drop(c);
    h.join().unwrap();
}

/// Waits for the `n`th (from 1) whole `PUB` to `subject`, payload included:
/// its reply subject and its payload.
fn nth_request(p: &mut Peer, subject: &str, n: usize) -> (String, Vec<u8>) {
    let head = format!("PUB {subject} ");
    let mut buf = [0u8; 4096];
    loop {
        let mut at = 0;
        let mut found = 0;
        // Each whole line from `at`: a PUB to `subject` is followed by its payload.
        while let Some(end) = p.seen[at..].windows(2).position(|w| w == b"\r\n") {
            let line = String::from_utf8_lossy(&p.seen[at..at + end]).into_owned();
            at += end + 2;
            if !line.starts_with(&head) {
                continue;
            }
            let fields: Vec<&str> = line.split(' ').collect();
            let len: usize = fields[3].parse().unwrap();
            if p.seen.len() < at + len + 2 {
                break; // payload not yet whole
            }
            found += 1;
            if found == n {
                return (fields[2].to_owned(), p.seen[at..at + len].to_vec());
            }
            at += len + 2;
        }
        let got = p.s.read(&mut buf).expect("peer read");
        assert!(got > 0, "client closed before request {n}");
        p.seen.extend_from_slice(&buf[..got]);
    }
}

/// A server that answers stream `TASKQ`'s info requests with `pages`, one
/// each in turn, and tells the offset each request asked for.
fn paging_peer(pages: Vec<&'static str>) -> (String, JoinHandle<()>, Receiver<Option<u64>>) {
    const API: &str = "$JS.API.STREAM.INFO.TASKQ";
    let (asked, offsets) = std::sync::mpsc::channel();
    let (addr, h) = peer(INFO, move |p| {
        p.inbox();
        p.send("PONG\r\n");
        for (n, page) in pages.into_iter().enumerate() {
            let (to, body) = nth_request(p, API, n + 1);
            let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
            asked.send(body["offset"].as_u64()).unwrap();
            p.send(&format!("MSG {to} 1 {}\r\n{page}\r\n", page.len()));
        }
        let _ = p.s.read(&mut [0u8; 64]);
    });
    (addr, h, offsets)
}

/// Folded a page at a time, each subject is given once, in order: one that
/// comes again at the head of the next page (a subject added before the
/// page boundary between two requests shifts it) is not counted twice, and
/// the next offset counts only the subjects taken.
#[test]
fn a_streams_subjects_are_folded_once_each_when_a_page_boundary_shifts() {
    let (addr, h, offsets) = paging_peer(vec![
        r#"{"state":{"subjects":{"taskq.a":1,"taskq.b":2}},"total":4}"#,
        // taskq.a0 was added meanwhile: taskq.b comes again.
        r#"{"state":{"subjects":{"taskq.b":2,"taskq.c":3}},"total":5}"#,
        r#"{"state":{"subjects":{"taskq.d":4}},"total":5}"#,
        // taskq.a0, before the boundary, was never on a page asked for:
        // the total is not reached, and the next page is empty.
        r#"{"state":{},"total":5}"#,
    ]);
    let mut c = NatsConnection::connect(&[addr], cfg()).unwrap();
    let mut got = Vec::new();
    c.fold_subject_counts("TASKQ", "taskq.>", |s, n| got.push((s.to_owned(), n)))
        .unwrap();
    assert_eq!(
        got,
        [
            ("taskq.a".to_owned(), 1),
            ("taskq.b".to_owned(), 2),
            ("taskq.c".to_owned(), 3),
            ("taskq.d".to_owned(), 4)
        ]
    );
    drop(c);
    h.join().unwrap();
    assert_eq!(
        offsets.try_iter().collect::<Vec<_>>(),
        [Some(0), Some(2), Some(3), Some(4)]
    );
}

/// A stream's subjects come in pages (nats-server gives at most 100,000 a
/// request): the client asks again from the offset it reached until it has
/// the total. A page that brings nothing new ends it (a server that ignores
/// the offset), so it cannot loop.
#[test]
fn a_streams_subjects_are_read_page_by_page_to_the_total() {
    let first =
        r#"{"state":{"subjects":{"taskq.a":1,"taskq.b":2}},"total":3,"offset":0,"limit":2}"#;
    let second = r#"{"state":{"subjects":{"taskq.c":5}},"total":3,"offset":2,"limit":2}"#;
    // Then a server that ignores the offset: the first page, twice, with a
    // total never reached.
    let stuck =
        r#"{"state":{"subjects":{"taskq.a":1,"taskq.b":2}},"total":9,"offset":0,"limit":2}"#;
    let (addr, h, offsets) = paging_peer(vec![first, second, stuck, stuck]);
    let mut c = NatsConnection::connect(&[addr], cfg()).unwrap();
    let all = c.subject_counts("TASKQ", "taskq.>").unwrap();
    assert_eq!(
        all.into_iter().collect::<Vec<_>>(),
        [
            ("taskq.a".to_owned(), 1),
            ("taskq.b".to_owned(), 2),
            ("taskq.c".to_owned(), 5)
        ]
    );
    let again = c.subject_counts("TASKQ", "taskq.>").unwrap();
    assert_eq!(again.len(), 2, "the repeated page ends it: {again:?}");
    drop(c);
    h.join().unwrap();
    // Each listing starts at offset 0, then asks from the offset it reached.
    assert_eq!(
        offsets.try_iter().collect::<Vec<_>>(),
        [Some(0), Some(2), Some(0), Some(2)]
    );
}
