//! The NATS session with scripted bytes and no socket: a put's replies cut
//! at every byte (with a `PING` before them), stale replies and other noise
//! between, `-ERR`, garbage and oversized counts, the handshake, and the
//! bookkeeping of what is owed. Pulls are in `nats_session_pull.rs`.

mod nats_common;

use std::time::Duration;

use taskq_proto::nats::session::{Credentials, Event, Signed};
use taskq_proto::nats::{AckKind, NatsError, NatsProtoError as P, NatsSession, PubAck};
use taskq_proto::Secret;

use nats_common::script::{cut_and_poll, feed, msg, session, PEER};

/// A session with one put written (token 1), its PubAck owed.
fn put_sent() -> (NatsSession, u64) {
    let mut s = session();
    let token = s
        .start_put_whole(b"taskq.T", b"id-1", &[], b"job")
        .unwrap()
        .token;
    s.queue_sent();
    (s, token)
}

#[test]
fn a_puts_reply_cut_at_every_byte_is_its_outcome_once_whole() {
    let ack = r#"{"stream":"TASKQ", "seq":41}"#;
    let dup = r#"{"stream":"TASKQ", "seq":41,"duplicate": true}"#;
    let api =
        r#"{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"}}"#;
    let r = Some("_INBOX.t.1");
    let table: Vec<(String, Result<PubAck, &str>)> = vec![
        (
            msg("_INBOX.t.1", None, None, ack),
            Ok(PubAck {
                stream_seq: 41,
                duplicate: false,
            }),
        ),
        (
            msg("_INBOX.t.1", None, None, dup),
            Ok(PubAck {
                stream_seq: 41,
                duplicate: true,
            }),
        ),
        (msg("_INBOX.t.1", None, None, api), Err("api 503 10077")),
        (
            msg("_INBOX.t.1", None, Some("503"), ""),
            Err("no responders"),
        ),
        // Noise before the PubAck: a stale reply, another subscription, +OK, a delivery.
        (
            format!(
                "{}{}+OK\r\n{}{}",
                msg("_INBOX.t.0", None, None, "{}"),
                msg("other", None, None, "x").replace(" 1 ", " 9 "),
                msg("taskq.T", r, None, "late"),
                msg("_INBOX.t.1", None, None, ack)
            ),
            Ok(PubAck {
                stream_seq: 41,
                duplicate: false,
            }),
        ),
    ];
    let mut cases = 0;
    for (reply, want) in &table {
        let wire = format!("PING\r\n{reply}");
        for cut in 0..=wire.len() {
            let (mut s, token) = put_sent();
            let got = cut_and_poll(&mut s, wire.as_bytes(), cut, |s| s.poll_reply(token))
                .and_then(|m| s.puback(m));
            let got = got.map_err(|e| match e {
                NatsError::Api(a) => format!("api {} {}", a.code, a.err_code),
                NatsError::NoResponders => "no responders".into(),
                e => format!("{e:?}"),
            });
            assert_eq!(got, want.map_err(str::to_owned), "{wire:?} cut at {cut}");
            assert_eq!(s.pong(), Some(&b"PONG\r\n"[..]), "the PING is owed a PONG");
            assert_eq!((s.pong(), s.pings_answered()), (None, 1));
            assert!(!s.is_broken() && s.buffered() == 0);
            cases += 1;
        }
    }
    assert!(cases > 400, "{cases} cuts");
}

#[test]
fn one_byte_at_a_time_every_poll_waits_until_the_last() {
    let (mut s, token) = put_sent();
    let wire = format!(
        "PING\r\nINFO {{\"server_id\":\"N2\",\"connect_urls\":[\"10.0.0.2:4222\"]}}\r\n{}",
        msg("_INBOX.t.1", None, None, r#"{"stream":"TASKQ","seq":9}"#)
    );
    let (last, rest) = wire.as_bytes().split_last().unwrap();
    for b in rest {
        feed(&mut s, &[*b]);
        assert_eq!(s.poll_reply(token).unwrap(), None);
    }
    feed(&mut s, &[*last]);
    let m = s.poll_reply(token).unwrap().unwrap();
    assert_eq!(s.puback(m).unwrap().stream_seq, 9);
    assert_eq!(s.server_id(), "N2");
    assert_eq!(s.servers(), [PEER, "10.0.0.2:4222"]);
    assert_eq!(s.pongs_owed(), 1);
}

#[test]
fn a_servers_words_reach_an_error_with_their_control_characters_escaped() {
    // A hostile server's -ERR: an OSC 52 clipboard write, a screen clear and
    // a forged log line.
    let (mut s, token) = put_sent();
    feed(
        &mut s,
        b"-ERR 'Maximum Payload\x1b]52;c;aGk=\x07\x1b[2J\x0blevel=INFO forged'\r\n",
    );
    let e = s.poll_reply(token).unwrap_err();
    let shown = e.to_string();
    assert!(shown.contains("Maximum Payload\\u{1b}]52"), "{shown:?}");
    for shown in [shown, format!("{e:?}")] {
        assert!(!shown.chars().any(char::is_control), "{shown:?}");
    }
    // An API error's description in a PubAck, raw control bytes and all.
    let (mut s, token) = put_sent();
    let api = "{\"error\":{\"code\":503,\"err_code\":10077,\"description\":\"full\x1b[31m\rok\"}}";
    feed(&mut s, msg("_INBOX.t.1", None, None, api).as_bytes());
    let m = s.poll_reply(token).unwrap().expect("a whole reply");
    match s.puback(m) {
        Err(e @ NatsError::Api(_)) => {
            let shown = e.to_string();
            assert!(!shown.chars().any(char::is_control), "{shown:?}");
            assert!(shown.contains("full\\u{1b}[31m\\rok"), "{shown:?}");
        }
        r => panic!("{r:?}"),
    }
}

#[test]
fn err_garbage_and_oversized_counts_break_the_session_at_once() {
    #[rustfmt::skip]
    let table: &[(&str, &str)] = &[
        ("-ERR 'Maximum Payload Violation'\r\n", "server Maximum Payload Violation"),
        ("-ERR 'Permissions Violation for Publish to \"taskq.T\"'\r\n", "permission"),
        ("MSG _INBOX.t.1 1 x\r\n", "Protocol(BadNumber)"),
        // Refused as soon as the line is in, before any payload byte.
        ("MSG _INBOX.t.1 1 99999999\r\n", "Protocol(PayloadTooLarge { len: 99999999, max: 1402712 })"),
        ("HMSG _INBOX.t.1 1 99999999 99999999\r\n", "Protocol(PayloadTooLarge { len: 99999999, max: 1402712 })"),
        ("HMSG _INBOX.t.1 1 9 3\r\n", "Protocol(HeaderLongerThanTotal)"),
        ("MSG _INBOX.t.1 1 2\r\nabcd\r\n", "Protocol(MissingPayloadCrlf)"),
        ("HMSG _INBOX.t.1 1 6 6\r\nHTTP/1\r\n", "Protocol(BadHeaders)"),
        ("BOGUS\r\n", "Protocol(UnknownOp)"),
        ("PING\n", "Protocol(BadLineEnd)"),
        ("PING x\r\n", "Protocol(Malformed { op: \"PING\" })"),
        ("MSG a\r\n", "Protocol(Malformed { op: \"MSG\" })"),
        ("INFO {\"max_payload\":\"x\"}\r\n", "Protocol"),
        ("MSG _INBOX.t.1 1  5\r\nnot j\r\n", "Protocol"),
    ];
    for (wire, want) in table {
        for noise in ["", "PING\r\n", "+OK\r\n"] {
            let (mut s, token) = put_sent();
            feed(&mut s, format!("{noise}{wire}").as_bytes());
            let e = s
                .poll_reply(token)
                .and_then(|m| s.puback(m.expect("a whole reply")))
                .unwrap_err();
            let got = match &e {
                NatsError::Server(t) => format!("server {t}"),
                NatsError::Permission(_) => "permission".into(),
                e => format!("{e:?}"),
            };
            assert!(got.starts_with(want), "{wire:?}: {got}");
            assert!(e.breaks_connection() && s.is_broken(), "{wire:?}");
            // Broken for good: nothing more is read, encoded or answered.
            assert!(matches!(s.poll_reply(token), Err(NatsError::Broken)));
            assert!(matches!(s.recv_room(), Err(NatsError::Broken)));
            assert!(matches!(
                s.start_put(b"taskq.T", b"i", &[], 1),
                Err(NatsError::Broken)
            ));
            assert!(matches!(s.to_flush(), Err(NatsError::Broken)));
            assert_eq!(s.pong(), None);
        }
    }
    // A line that never ends is refused at its limit, not buffered forever.
    let (mut s, token) = put_sent();
    feed(&mut s, &[b'M'; 4096]);
    assert!(matches!(
        s.poll_reply(token),
        Err(NatsError::Protocol(P::LineTooLong { max: 4096 }))
    ));
    let (mut s, token) = put_sent();
    let mut info = b"INFO {".to_vec();
    info.resize(64 * 1024, b' ');
    feed(&mut s, &info);
    assert!(matches!(
        s.poll_reply(token),
        Err(NatsError::Protocol(P::LineTooLong { max: 65536 }))
    ));
}

#[test]
fn a_later_info_lowers_the_payload_limit_and_updates_the_servers() {
    let (mut s, token) = put_sent();
    feed(
        &mut s,
        b"INFO {\"server_id\":\"N3\",\"version\":\"2.15.1\",\"max_payload\":64,\"connect_urls\":[\"127.0.0.1:4222\",\"127.0.0.1:4223\"]}\r\n",
    );
    assert_eq!(s.poll_reply(token).unwrap(), None);
    assert_eq!((s.limits().max_payload, s.server_version()), (64, "2.15.1"));
    assert_eq!(s.servers(), [PEER, "127.0.0.1:4223"]);
    // What the server would refuse is refused before sending.
    feed(
        &mut s,
        msg("_INBOX.t.1", None, None, r#"{"stream":"S","seq":1}"#).as_bytes(),
    );
    let m = s.poll_reply(token).unwrap().unwrap();
    s.puback(m).unwrap();
    assert!(matches!(
        s.start_put(b"taskq.T", b"id", &[], 65),
        Err(NatsError::Invalid(_))
    ));
    assert!(!s.is_broken());
}

#[test]
fn queued_publishes_owe_pubacks_in_order_and_block_what_would_skip_them() {
    let mut s = session();
    for i in 0..3u8 {
        s.queue_publish(b"taskq.T", &[b'a' + i], &[], b"x").unwrap();
    }
    assert_eq!(s.pubacks_owed(), 3);
    assert!(s.queued().starts_with(b"HPUB taskq.T _INBOX.t.1 "));
    assert!(matches!(
        s.start_put(b"taskq.T", b"z", &[], 1),
        Err(NatsError::Busy)
    ));
    assert!(matches!(
        s.queue_pull("S", "c", 1, None, None),
        Err(NatsError::Busy)
    ));
    assert!(matches!(
        s.queue_request(b"$JS.API.INFO", b""),
        Err(NatsError::Busy)
    ));
    assert_eq!(
        s.to_flush().unwrap().map(<[u8]>::len),
        Some(s.queued().len())
    );
    s.queue_sent();
    // Answered out of order: each waits for its own token.
    let wire: String = [3, 1, 2]
        .iter()
        .map(|t| {
            msg(
                &format!("_INBOX.t.{t}"),
                None,
                None,
                &format!("{{\"stream\":\"S\",\"seq\":{t}}}"),
            )
        })
        .collect();
    let (a, b) = wire.split_at(wire.len() / 2);
    feed(&mut s, a.as_bytes());
    feed(&mut s, b.as_bytes());
    // The reply to 3 came first and is skipped while 1 is awaited: it is gone.
    assert_eq!(s.poll_puback().unwrap().map(|a| a.stream_seq), Some(1));
    assert_eq!(s.poll_puback().unwrap().map(|a| a.stream_seq), Some(2));
    assert_eq!(s.poll_puback().unwrap(), None);
    assert_eq!(s.pubacks_owed(), 1);
    s.mark_broken();
    assert!(matches!(s.poll_puback(), Err(NatsError::Broken)));
    let s = session();
    assert!(matches!(s.next_puback(), Err(NatsError::NothingOwed)));
}

#[test]
fn a_cleared_queue_owes_no_pull_and_requests_come_back_by_token() {
    let mut s = session();
    s.queue_pull(
        "S",
        "c",
        1,
        Some(Duration::from_millis(1500)),
        Some(Duration::from_millis(500)),
    )
    .unwrap();
    assert!(s
        .queued()
        .ends_with(b"{\"batch\":1,\"expires\":1500000000,\"idle_heartbeat\":500000000}\r\n"));
    s.clear_queue();
    assert!(!s.pulling() && s.queued().is_empty());
    let t = s.queue_request(b"$JS.API.STREAM.INFO.S", b"").unwrap();
    assert_eq!(t, 2, "the dropped pull's token is not reused");
    assert_eq!(
        s.queued(),
        b"PUB $JS.API.STREAM.INFO.S _INBOX.t.2 0\r\n\r\n"
    );
    s.queue_sent();
    feed(
        &mut s,
        msg("_INBOX.t.2", None, None, "{\"ok\":1}").as_bytes(),
    );
    let m = s.poll_reply(t).unwrap().unwrap();
    assert_eq!(s.reply_payload(m).unwrap(), b"{\"ok\":1}");
    // An unconfirmed ack is queued without a reply subject and owes nothing.
    assert_eq!(
        s.queue_ack(b"$JS.ACK.x", AckKind::Term, false).unwrap(),
        None
    );
    assert_eq!(s.queued(), b"PUB $JS.ACK.x 5\r\n+TERM\r\n");
    assert!(matches!(s.poll_delivery(), Err(NatsError::NothingOwed)));
    // An ack awaited alone: its confirmation, or 503.
    let t = s
        .queue_ack(b"$JS.ACK.x", AckKind::Ack, true)
        .unwrap()
        .unwrap();
    s.queue_sent();
    feed(
        &mut s,
        msg(&format!("_INBOX.t.{t}"), None, Some("503"), "").as_bytes(),
    );
    let m = s.poll_reply(t).unwrap().unwrap();
    assert!(matches!(s.ack_confirmed(m), Err(NatsError::NoResponders)));
    assert_eq!(s.confirms_owed(), 0);
}

#[test]
fn the_handshake_reads_info_cut_anywhere_and_connects_with_the_credentials_given() {
    let info = "INFO {\"server_id\":\"S1\",\"version\":\"2.9.10\",\"headers\":true,\"max_payload\":1048576,\"nonce\":\"abc\",\"tls_available\":true}\r\n";
    for cut in 0..=info.len() {
        let mut s = session();
        let hello = cut_and_poll(&mut s, info.as_bytes(), cut, NatsSession::poll_info).unwrap();
        assert_eq!(
            (
                hello.nonce.as_str(),
                hello.tls_required,
                hello.tls_available
            ),
            ("abc", false, true)
        );
        assert_eq!((s.server_id(), s.server_version()), ("S1", "2.9.10"));
    }
    let pass = Secret::new("pw\"1");
    let signed = Signed {
        jwt: Some(Secret::new("eyJ.jwt")),
        nkey: None,
        sig: "c2ln".into(),
    };
    assert!(
        !format!("{signed:?}").contains("c2ln"),
        "no signature in Debug"
    );
    let mut s = session();
    feed(&mut s, info.as_bytes());
    s.poll_info().unwrap().unwrap();
    let creds = Credentials {
        user: Some(("alice", &pass)),
        signed: Some(&signed),
        describe: "user alice",
        ..Credentials::default()
    };
    assert!(!format!("{creds:?}").contains("pw"), "no password in Debug");
    s.queue_connect("me", &creds, true).unwrap();
    let sent = String::from_utf8(s.queued().to_vec()).unwrap();
    for part in [
        "CONNECT {\"verbose\":false,\"pedantic\":false,\"tls_required\":true,",
        "\"name\":\"me\",\"user\":\"alice\",\"pass\":\"pw\\\"1\",\"jwt\":\"eyJ.jwt\",\"sig\":\"c2ln\"}\r\n",
        "\r\nSUB _INBOX.t.* 1\r\nPING\r\n",
    ] {
        assert!(sent.contains(part), "{sent}");
    }
    s.wipe_queue();
    assert!(s.queued().is_empty());
    // Anything before PONG is skipped (a PING is owed its answer); PONG connects.
    let wire = b"+OK\r\nPING\r\nPONG\r\n";
    for cut in 0..=wire.len() {
        let mut c = session();
        c.queue_connect("me", &Credentials::default(), false)
            .unwrap();
        c.wipe_queue();
        cut_and_poll(&mut c, wire, cut, |c| Ok(c.poll_connected()?.then_some(()))).unwrap();
        assert_eq!(c.pongs_owed(), 1);
    }
    // -ERR before PONG: refused, naming what authenticated and no secret.
    let creds = Credentials {
        signed: None,
        ..creds
    };
    s.queue_connect("me", &creds, false).unwrap();
    feed(&mut s, b"-ERR 'Authorization Violation'\r\n");
    match s.poll_connected() {
        Err(e @ NatsError::Refused(_)) => {
            assert!(e.is_auth_refused() && s.is_broken());
            assert!(
                e.to_string().contains("user alice") && !e.to_string().contains("pw"),
                "{e}"
            );
        }
        r => panic!("{r:?}"),
    }
}

#[test]
fn the_first_operation_must_be_an_info_with_headers() {
    let cases: &[(&[u8], &str)] = &[
        (b"PING\r\n", "Protocol(Malformed { op: \"INFO\" })"),
        (b"HELLO\r\n", "Protocol(UnknownOp)"),
        (
            b"INFO {\"server_id\":\"OLD\",\"headers\":false}\r\n",
            "Unsupported(\"message headers\")",
        ),
    ];
    for (wire, want) in cases {
        let mut s = session();
        feed(&mut s, wire);
        assert_eq!(format!("{:?}", s.poll_info().unwrap_err()), *want);
    }
}

#[test]
fn events_say_what_came_and_tokens_that_are_no_number_are_not_replies() {
    let mut s = session();
    let wire = format!(
        "{}{}PONG\r\n{}",
        msg("_INBOX.t.x1", None, None, "a"),
        msg("_INBOX.t.5", None, None, "b"),
        msg("taskq.T", Some("$JS.ACK.S.c.1.1.1.1.0"), None, "c")
    );
    feed(&mut s, wire.as_bytes());
    let mut got = Vec::new();
    while let Some(e) = s.poll_event().unwrap() {
        got.push(match e {
            Event::Reply { token, m } => format!(
                "reply {token} {:?}",
                String::from_utf8_lossy(m.payload.of(s.event_bytes()))
            ),
            Event::Delivery(m) => format!(
                "delivery {:?}",
                String::from_utf8_lossy(m.payload.of(s.event_bytes()))
            ),
            Event::Pong => "pong".into(),
        });
    }
    assert_eq!(got, ["reply 5 \"b\"", "pong", "delivery \"c\""]);
    assert_eq!(s.buffered(), 0);
}
