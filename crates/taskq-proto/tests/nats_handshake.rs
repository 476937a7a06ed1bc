//! The handshake's order of steps (`Handshake`), driven through scripted
//! server bytes with no socket and no clock: what a driver is told to do at
//! each point, TLS first or on the server's word, the credentials in
//! `CONNECT`, refusals, and the deadline the handshake owns.

mod nats_common;

use std::time::{Duration, Instant};

use nats_common::script::{feed, session, PEER};
use taskq_proto::nats::session::{Credentials, Handshake, HandshakeStep};
use taskq_proto::nats::{NatsError, NatsSession, TlsFailure};
use taskq_proto::Secret;

const WAIT: Duration = Duration::from_secs(2);

fn info(extra: &str) -> String {
    format!("INFO {{\"server_id\":\"S1\",\"version\":\"2.9.10\",\"headers\":true,\"max_payload\":1048576,\"nonce\":\"abc\"{extra}}}\r\n")
}

/// Steps `hs` until it asks for something other than a read, feeding
/// `wire` in two pieces cut at `cut` (the first read, then the rest).
fn step_through(hs: &mut Handshake, s: &mut NatsSession, wire: &[u8], cut: usize) -> String {
    let (a, b) = wire.split_at(cut);
    let mut pieces = [a, b].into_iter();
    loop {
        match hs.step(s).unwrap() {
            HandshakeStep::Read => feed(s, pieces.next().expect("a step short of bytes")),
            other => return format!("{other:?}"),
        }
    }
}

#[test]
fn a_plain_handshake_reads_info_cut_anywhere_then_connects_in_one_write_and_ends_on_pong() {
    let wire = info("");
    for cut in 0..=wire.len() {
        let t0 = Instant::now();
        let mut hs = Handshake::new(t0, WAIT, false, false, PEER);
        let mut s = session();
        assert_eq!(hs.during(), "waiting for INFO");
        let step = step_through(&mut hs, &mut s, wire.as_bytes(), cut);
        assert_eq!(step, "Connect { nonce: \"abc\" }", "cut at {cut}");
        assert!(
            s.queued().is_empty(),
            "nothing queued before the credentials"
        );
        hs.connect(&mut s, "me", &Credentials::default()).unwrap();
        assert_eq!(hs.step(&mut s).unwrap(), HandshakeStep::Write);
        let sent = String::from_utf8(s.queued().to_vec()).unwrap();
        assert!(sent.starts_with("CONNECT {"), "{sent}");
        assert!(sent.contains("\"tls_required\":false"), "{sent}");
        assert!(sent.ends_with("\r\nSUB _INBOX.t.* 1\r\nPING\r\n"), "{sent}");
        s.wipe_queue();
        assert_eq!(
            hs.during(),
            "sending CONNECT",
            "until the write is said done"
        );
        hs.written();
        assert_eq!(hs.during(), "waiting for PONG");
        assert_eq!(hs.step(&mut s).unwrap(), HandshakeStep::Read);
        feed(&mut s, b"+OK\r\nPONG\r\n");
        assert_eq!(hs.step(&mut s).unwrap(), HandshakeStep::Done);
        assert_eq!((hs.during(), hs.is_tls()), ("", false));
    }
}

#[test]
fn tls_comes_when_the_server_requires_it_or_the_client_wants_it_and_never_twice() {
    // The server requires it.
    let mut hs = Handshake::new(Instant::now(), WAIT, false, false, PEER);
    let mut s = session();
    let required = info(",\"tls_required\":true");
    assert_eq!(
        step_through(&mut hs, &mut s, required.as_bytes(), 0),
        "StartTls"
    );
    assert_eq!(hs.during(), "in the TLS handshake");
    hs.tls_started();
    assert_eq!(
        format!("{:?}", hs.step(&mut s).unwrap()),
        "Connect { nonce: \"abc\" }"
    );
    hs.connect(&mut s, "me", &Credentials::default()).unwrap();
    let sent = String::from_utf8(s.queued().to_vec()).unwrap();
    assert!(sent.contains("\"tls_required\":true"), "{sent}");

    // The client wants it and the server offers it.
    let mut hs = Handshake::new(Instant::now(), WAIT, false, true, PEER);
    let mut s = session();
    let offered = info(",\"tls_available\":true");
    assert_eq!(
        step_through(&mut hs, &mut s, offered.as_bytes(), 3),
        "StartTls"
    );

    // TLS first (a server that wants the TLS handshake before INFO): TLS,
    // then INFO read through it, then CONNECT: no second TLS.
    let mut hs = Handshake::new(Instant::now(), WAIT, true, false, PEER);
    let mut s = session();
    assert_eq!(hs.step(&mut s).unwrap(), HandshakeStep::StartTls);
    assert_eq!(hs.during(), "in the TLS handshake");
    hs.tls_started();
    assert_eq!(
        step_through(&mut hs, &mut s, required.as_bytes(), 10),
        "Connect { nonce: \"abc\" }"
    );
    assert!(hs.is_tls());
}

#[test]
fn a_client_that_wants_tls_from_a_server_without_it_is_told_which_server() {
    let mut hs = Handshake::new(Instant::now(), WAIT, false, true, PEER);
    let mut s = session();
    feed(&mut s, info("").as_bytes());
    match hs.step(&mut s) {
        Err(NatsError::Tls(t)) => {
            assert_eq!(t.failure, TlsFailure::ServerWithoutTls);
            assert!(t.detail.contains(PEER), "{}", t.detail);
        }
        r => panic!("{r:?}"),
    }
}

#[test]
fn credentials_go_in_connect_and_a_refusal_names_them_without_the_secret() {
    let mut hs = Handshake::new(Instant::now(), WAIT, false, false, PEER);
    let mut s = session();
    // CONNECT before INFO is out of order: refused, nothing queued.
    assert!(hs.connect(&mut s, "me", &Credentials::default()).is_err());
    assert!(s.queued().is_empty());
    feed(&mut s, info("").as_bytes());
    assert!(matches!(
        hs.step(&mut s).unwrap(),
        HandshakeStep::Connect { nonce: "abc" }
    ));
    let pass = Secret::new("hunter2");
    let creds = Credentials {
        user: Some(("alice", &pass)),
        describe: "user alice",
        ..Credentials::default()
    };
    hs.connect(&mut s, "me", &creds).unwrap();
    let sent = String::from_utf8(s.queued().to_vec()).unwrap();
    assert!(
        sent.contains("\"user\":\"alice\",\"pass\":\"hunter2\""),
        "{sent}"
    );
    assert_eq!(hs.step(&mut s).unwrap(), HandshakeStep::Write);
    s.wipe_queue();
    hs.written();
    feed(&mut s, b"-ERR 'Authorization Violation'\r\n");
    match hs.step(&mut s) {
        Err(e @ NatsError::Refused(_)) => {
            let text = e.to_string();
            assert!(
                text.contains("user alice") && !text.contains("hunter2"),
                "{text}"
            );
        }
        r => panic!("{r:?}"),
    }
}

/// A server that echoes what `CONNECT` carried in its refusal (found by the
/// `nats_handshake` fuzz target): the secret is masked, the rest is shown.
#[test]
fn a_refusal_that_echoes_a_secret_shows_it_masked() {
    let pass = Secret::new("hunter2");
    let token = Secret::new("tok\u{1b}en");
    for (creds, echoed) in [
        (
            Credentials {
                user: Some(("alice", &pass)),
                describe: "user alice",
                ..Credentials::default()
            },
            "hunter2",
        ),
        (
            Credentials {
                token: Some(&token),
                describe: "token",
                ..Credentials::default()
            },
            "tok\u{1b}en",
        ),
    ] {
        let mut hs = Handshake::new(Instant::now(), WAIT, false, false, PEER);
        let mut s = session();
        feed(&mut s, info("").as_bytes());
        hs.step(&mut s).unwrap();
        hs.connect(&mut s, "me", &creds).unwrap();
        hs.step(&mut s).unwrap();
        s.wipe_queue();
        hs.written();
        feed(
            &mut s,
            format!("-ERR 'Authorization Violation for {echoed} ({echoed})'\r\n").as_bytes(),
        );
        let Err(e @ NatsError::Refused(_)) = hs.step(&mut s) else {
            panic!("refused");
        };
        let (shown, debug) = (e.to_string(), format!("{e:?}"));
        assert!(
            shown.contains("Authorization Violation for *** (***)"),
            "{shown}"
        );
        for text in [&shown, &debug] {
            for secret in ["hunter2", "tok\u{1b}en", "tok\\u{1b}en"] {
                assert!(!text.contains(secret), "{text}");
            }
        }
    }
}

/// The refusal's text, after `CONNECT` with `creds`, when the server
/// answers `err` (an `-ERR` line's text).
fn refused_with(creds: &Credentials<'_>, err: &str) -> String {
    let mut hs = Handshake::new(Instant::now(), WAIT, false, false, PEER);
    let mut s = session();
    feed(&mut s, info("").as_bytes());
    hs.step(&mut s).unwrap();
    hs.connect(&mut s, "me", creds).unwrap();
    hs.step(&mut s).unwrap();
    s.wipe_queue();
    hs.written();
    feed(&mut s, format!("-ERR '{err}'\r\n").as_bytes());
    match hs.step(&mut s) {
        Err(e @ NatsError::Refused(_)) => format!("{e} / {e:?}"),
        r => panic!("{r:?}"),
    }
}

/// A secret echoed as `CONNECT` escaped it is masked too; a long one cut
/// by the length a server's text is kept to (a piece of it left) has the
/// whole text withheld.
#[test]
fn a_refusal_echoing_an_escaped_or_cut_secret_shows_none_of_it() {
    let pass = Secret::new("pa\"ss\\word");
    let creds = Credentials {
        user: Some(("alice", &pass)),
        describe: "user alice",
        ..Credentials::default()
    };
    let shown = refused_with(
        &creds,
        r#"bad CONNECT {"user":"alice","pass":"pa\"ss\\word"}"#,
    );
    assert!(shown.contains(r#""pass":"***""#), "{shown}");
    assert!(!shown.contains("word"), "{shown}");

    let long: String = (0..700)
        .map(|i| char::from(b'a' + (i * 7 % 26) as u8))
        .collect();
    let token = Secret::new(long.clone());
    let creds = Credentials {
        token: Some(&token),
        describe: "token",
        ..Credentials::default()
    };
    let shown = refused_with(&creds, &format!("Authorization Violation: {long}"));
    assert!(shown.contains("withheld"), "{shown}");
    assert!(
        !shown.contains(&long[..12]) && !shown.contains(&long[300..312]),
        "{shown}"
    );
}

#[test]
fn the_handshake_owns_its_deadline_and_a_done_one_has_none() {
    let t0 = Instant::now();
    let mut hs = Handshake::new(t0, WAIT, false, false, PEER);
    assert_eq!((hs.poll_timeout(), hs.wait()), (t0 + WAIT, WAIT));
    hs.handle_timeout(t0 + WAIT - Duration::from_millis(1))
        .unwrap();
    match hs.handle_timeout(t0 + WAIT) {
        Err(NatsError::Timeout { waited }) => assert_eq!(waited, WAIT),
        r => panic!("{r:?}"),
    }
    let mut s = session();
    feed(&mut s, info("").as_bytes());
    hs.step(&mut s).unwrap();
    hs.connect(&mut s, "me", &Credentials::default()).unwrap();
    hs.step(&mut s).unwrap();
    s.wipe_queue();
    hs.written();
    feed(&mut s, b"PONG\r\n");
    assert_eq!(hs.step(&mut s).unwrap(), HandshakeStep::Done);
    hs.handle_timeout(t0 + 10 * WAIT).unwrap();
}

/// What comes in the clear before the TLS handshake is anyone's on the
/// path. Bytes after `INFO` (a forged `PONG` that would end the handshake
/// early, a job that would be run as if it came over TLS) are refused; the
/// cluster addresses that `INFO` named are not trusted, only the peer's own.
#[test]
fn before_tls_bytes_after_info_are_refused_and_its_addresses_not_trusted() {
    let required = info(",\"tls_required\":true,\"connect_urls\":[\"evil.example.com:4222\"]");
    let forged = format!("{required}PONG\r\nMSG taskq.T 1 $JS.ACK.TASKQ.w.1.1.1.0.0 4\r\nevil\r\n");
    let mut hs = Handshake::new(Instant::now(), WAIT, false, false, PEER);
    let mut s = session();
    feed(&mut s, forged.as_bytes());
    match hs.step(&mut s) {
        Err(NatsError::Tls(e)) => {
            assert_eq!(e.failure, TlsFailure::Other);
            assert!(e.to_string().contains("in the clear"), "{e}");
        }
        other => panic!("bytes after INFO before TLS: {other:?}"),
    }

    let mut hs = Handshake::new(Instant::now(), WAIT, false, false, PEER);
    let mut s = session();
    assert_eq!(
        step_through(&mut hs, &mut s, required.as_bytes(), 0),
        "StartTls"
    );
    assert_eq!(
        s.servers(),
        [PEER],
        "the clear INFO's addresses are not kept"
    );
}

/// A huge wait (`Duration::MAX`, "wait forever") is no panic: the deadline
/// stands far off.
#[test]
fn a_handshake_with_no_deadline_to_speak_of_does_not_overflow() {
    let t0 = Instant::now();
    let hs = Handshake::new(t0, Duration::MAX, false, false, PEER);
    assert!(hs.poll_timeout() > t0 + Duration::from_secs(365 * 24 * 3600));
}
