//! The NATS codec in tables, one line per case: server operations, header
//! blocks, PubAcks, ack subjects and the encoders.

use taskq_proto::nats::{
    encode_connect, encode_hpub, encode_pub, encode_sub, encode_unsub, parse_js_reply, parse_op,
    AckInfo, AckKind, ConnectOptions, HeaderBlock, Headers, JsReply, NatsEncodeError, NatsLimits,
    NatsProtoError as E, PutEncoder, ServerOp,
};
use taskq_proto::Status;

/// A header block's expected status and description, `None` when it is malformed.
type HeaderCase = (&'static [u8], Option<(Option<u16>, &'static str)>);
/// An ack subject's expected domain, stream, consumer and numbers.
type AckCase = (
    &'static str,
    Option<(Option<&'static str>, &'static str, &'static str, [u64; 5])>,
);
/// An encoder's output beside the expected one.
type EncodeCase = (
    Result<String, NatsEncodeError>,
    Result<&'static str, NatsEncodeError>,
);

/// A parse rendered as text, so that a table line states the whole outcome.
fn show(input: &[u8], limits: &NatsLimits) -> String {
    match parse_op(input, limits) {
        Ok(Status::Partial) => "partial".into(),
        Err(e) => format!("err {e:?}"),
        Ok(Status::Complete(op, n)) => {
            let s = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
            let body = match op {
                ServerOp::Info(j) => format!("info {}", s(j)),
                ServerOp::Ping => "ping".into(),
                ServerOp::Pong => "pong".into(),
                ServerOp::Ok => "ok".into(),
                ServerOp::Err(t) => format!("-err {}", s(t)),
                ServerOp::Msg(m) => {
                    let mut out = format!("msg {} {} ", s(m.subject), m.sid);
                    out += &m.reply.map(s).unwrap_or_else(|| "-".into());
                    if let Some(h) = m.headers {
                        let st = h.status().map_or("-".into(), |c| c.to_string());
                        out += &format!(" h[{st} {}]", s(h.description()));
                    }
                    out + &format!(" [{}]", s(m.payload))
                }
                _ => "other".into(),
            };
            format!("{body} /{n}")
        }
    }
}

#[test]
fn server_ops() {
    let l = NatsLimits::default();
    let small = NatsLimits {
        max_payload: 8,
        max_line: 32,
        max_info: 64,
    };
    #[rustfmt::skip]
    let table: &[(&[u8], &NatsLimits, &str)] = &[
        (b"PING\r\n", &l, "ping /6"),
        (b"ping\r\n", &l, "ping /6"),
        (b"PONG\r\nPING\r\n", &l, "pong /6"),
        (b"+OK\r\n", &l, "ok /5"),
        (b"-ERR 'Authorization Violation'\r\n", &l, "-err Authorization Violation /32"),
        (b"INFO {\"server_id\":\"x\"}\r\n", &l, "info {\"server_id\":\"x\"} /24"),
        (b"MSG a.b 1 3\r\nabc\r\n", &l, "msg a.b 1 - [abc] /18"),
        (b"MSG _INBOX.x.1 1  27\r\n{\"stream\":\"TASKQ\", \"seq\":1}\r\n", &l, "msg _INBOX.x.1 1 - [{\"stream\":\"TASKQ\", \"seq\":1}] /51"),
        (b"MSG taskq.T 1 $JS.ACK.S.C.1.1.1.1.0 2\r\nhi\r\n", &l, "msg taskq.T 1 $JS.ACK.S.C.1.1.1.1.0 [hi] /43"),
        (b"MSG a 1 0\r\n\r\n", &l, "msg a 1 - [] /13"),
        (b"HMSG _INBOX.x.2 1 16 16\r\nNATS/1.0 503\r\n\r\n\r\n", &l, "msg _INBOX.x.2 1 - h[503 ] [] /43"),
        (b"HMSG i 1 28 28\r\nNATS/1.0 404 No Messages\r\n\r\n\r\n", &l, "msg i 1 - h[404 No Messages] [] /46"),
        (b"HMSG t 1 r 12 14\r\nNATS/1.0\r\n\r\nhi\r\n", &l, "msg t 1 r h[- ] [hi] /34"),
        (b"HMSG t 1 r 12 14\r\nNATS/1.0\r\n\r\nh", &l, "partial"),
        (b"MSG a 1 3\r\nab", &l, "partial"),
        (b"MSG a 1", &l, "partial"),
        (b"", &l, "partial"),
        (b"INF", &l, "partial"),
        (b"MSG a 1 3\r\nabcd\r\n", &l, "err MissingPayloadCrlf"),
        // Accepted: up to a base64 copy of `max_payload` (8) in JSON, whose
        // subject fits a line (32): 4 * 3 + 32 + 512.
        (b"MSG a 1 556\r\n", &small, "partial"),
        (b"MSG a 1 557\r\n", &small, "err PayloadTooLarge { len: 557, max: 556 }"),
        (b"MSG a 1 99999999999999999999999\r\n", &l, "err BadNumber"),
        (b"MSG a 1 -3\r\n", &l, "err BadNumber"),
        (b"MSG a x 3\r\nabc\r\n", &l, "err BadNumber"),
        (b"MSG a 1\r\n", &l, "err Malformed { op: \"MSG\" }"),
        (b"MSG a 1 b c 3\r\n", &l, "err Malformed { op: \"MSG\" }"),
        (b"HMSG a 1 5 3\r\n", &l, "err HeaderLongerThanTotal"),
        (b"HMSG a 1 4 4\r\nNATS\r\n", &l, "err BadHeaders"),
        (b"HMSG a 1 3\r\n", &l, "err Malformed { op: \"HMSG\" }"),
        (b"PING x\r\n", &l, "err Malformed { op: \"PING\" }"),
        (b"INFO\r\n", &l, "err Malformed { op: \"INFO\" }"),
        (b"PING\n", &l, "err BadLineEnd"),
        (b"\n", &l, "err BadLineEnd"),
        (b"HELLO\r\n", &l, "err UnknownOp"),
        (b"MSG aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa 1 1\r\n", &small, "err LineTooLong { max: 32 }"),
        (b"INFO {\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\":1}\r\n", &small, "info {\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\":1} /47"),
    ];
    for (input, limits, want) in table {
        assert_eq!(
            show(input, limits),
            *want,
            "{:?}",
            String::from_utf8_lossy(input)
        );
    }
}

#[test]
fn header_blocks() {
    #[rustfmt::skip]
    let table: &[HeaderCase] = &[
        (b"NATS/1.0\r\n\r\n", Some((None, ""))),
        (b"NATS/1.0 100 Idle Heartbeat\r\n\r\n", Some((Some(100), "Idle Heartbeat"))),
        (b"NATS/1.0 409 Exceeded MaxWaiting\r\n\r\n", Some((Some(409), "Exceeded MaxWaiting"))),
        (b"NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: 1\r\nNats-Pending-Bytes: 0\r\n\r\n", Some((Some(408), "Request Timeout"))),
        (b"NATS/1.0 503\r\n\r\n", Some((Some(503), ""))),
        (b"NATS/1.0\r\nA: b\r\n\r\n", Some((None, ""))),
        (b"NATS/1.0 50\r\n\r\n", None),
        (b"NATS/1.0 5030\r\n\r\n", None),
        (b"NATS/1.0x\r\n\r\n", None),
        (b"NATS/1.0\r\nno colon\r\n\r\n", None),
        (b"NATS/1.0\r\n:v\r\n\r\n", None),
        (b"NATS/1.0\r\nA: b\r\n", None),
        (b"NATS/1.0\r\nA: b\nc\r\n\r\n", None),
        (b"NATS/1.1\r\n\r\n", None),
        (b"", None),
    ];
    for (raw, want) in table {
        let got = HeaderBlock::parse(raw).ok().map(|h| {
            (
                h.status(),
                String::from_utf8(h.description().to_vec()).unwrap(),
            )
        });
        let want = want.map(|(s, d)| (s, d.to_string()));
        assert_eq!(got, want, "{:?}", String::from_utf8_lossy(raw));
    }
    let h = HeaderBlock::parse(b"NATS/1.0\r\nNats-Msg-Id: a1\r\nTaskq-Pri:  7 \r\n\r\n").unwrap();
    assert_eq!(h.get(b"nats-msg-id"), Some(&b"a1"[..]));
    assert_eq!(h.get(b"TASKQ-PRI"), Some(&b"7"[..]));
    assert_eq!(h.get(b"missing"), None);
    assert_eq!(h.iter().count(), 2);
}

#[test]
fn js_replies() {
    #[rustfmt::skip]
    let table: &[(&str, &str)] = &[
        (r#"{"stream":"TASKQ", "seq":1}"#, "ack TASKQ 1 false"),
        (r#"{"stream":"TASKQ","seq":1,"duplicate": true}"#, "ack TASKQ 1 true"),
        (r#" { "seq" : 9 , "stream" : "S" , "domain":"d" } "#, "ack S 9 false"),
        (r#"{"stream":"S","seq":2,"x":{"a":[1,2.5,-3e4,null,{"b":"\""}]}}"#, "ack S 2 false"),
        (r#"{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"},"stream":"S","seq":0}"#, "error 503 10077 maximum messages exceeded"),
        (r#"{"error":{"description":"no \"leader\"","code":503}}"#, r#"error 503 0 no \"leader\""#),
        (r#"{"stream":"S"}"#, "err MissingField { field: \"seq\" }"),
        (r#"{"seq":1}"#, "err MissingField { field: \"stream\" }"),
        (r#"{"error":{"err_code":1}}"#, "err MissingField { field: \"code\" }"),
        (r#"{"stream":"S","seq":1.5}"#, "err BadJson { at: 21 }"),
        (r#"{"stream":"S","seq":-1}"#, "err BadJson { at: 20 }"),
        (r#"{"stream":"S","seq":1} x"#, "err BadJson { at: 23 }"),
        (r#"{"stream":"S","seq":1"#, "err BadJson { at: 21 }"),
        (r#"{"stream":"S"#, "err BadJson { at: 12 }"),
        (r#"{"stream":"S","duplicate":1,"seq":1}"#, "err BadJson { at: 26 }"),
        ("", "err BadJson { at: 0 }"),
        ("[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[", "err BadJson { at: 0 }"),
    ];
    for (json, want) in table {
        let got = match parse_js_reply(json.as_bytes()) {
            Ok(JsReply::Ack(a)) => format!(
                "ack {} {} {}",
                String::from_utf8_lossy(a.stream),
                a.seq,
                a.duplicate
            ),
            Ok(JsReply::Error(e)) => format!(
                "error {} {} {}",
                e.code,
                e.err_code,
                String::from_utf8_lossy(e.description)
            ),
            Err(e) => format!("err {e:?}"),
        };
        assert_eq!(got, *want, "{json}");
    }
    let deep = format!(
        "{{\"x\":{}1{}, \"stream\":\"S\",\"seq\":1}}",
        "[".repeat(40),
        "]".repeat(40)
    );
    assert!(
        parse_js_reply(deep.as_bytes()).is_err(),
        "nesting is bounded"
    );
}

#[test]
fn ack_subjects() {
    #[rustfmt::skip]
    let table: &[AckCase] = &[
        ("$JS.ACK.TASKQ.w.1.5.3.1700000000000000000.0", Some((None, "TASKQ", "w", [1, 5, 3, 1700000000000000000, 0]))),
        ("$JS.ACK._.ACCHASH.TASKQ.w.2.6.4.17.9.abc", Some((None, "TASKQ", "w", [2, 6, 4, 17, 9]))),
        ("$JS.ACK.hub.ACCHASH.S.c.3.7.5.18.1.tok", Some((Some("hub"), "S", "c", [3, 7, 5, 18, 1]))),
        ("$JS.ACK.hub.ACCHASH.S.c.3.7.5.18.1", Some((Some("hub"), "S", "c", [3, 7, 5, 18, 1]))),
        ("$JS.ACK.S.c.1.2.3.4", None),
        ("$JS.ACK.S.c.1.2.3.4.5.6", None),
        ("$JS.ACK.S.c.x.2.3.4.5", None),
        ("$JS.ACK.S..1.2.3.4.5", None),
        ("$JS.NAK.S.c.1.2.3.4.5", None),
        ("$JS.ACK.a.b.S.c.1.2.3.4.5.6.7", None),
        ("", None),
    ];
    for (subj, want) in table {
        let got = AckInfo::parse(subj.as_bytes()).ok();
        let got = got.map(|a| {
            let s = |b: &[u8]| String::from_utf8(b.to_vec()).unwrap();
            (
                a.domain.map(s),
                s(a.stream),
                s(a.consumer),
                [
                    a.delivered,
                    a.stream_seq,
                    a.consumer_seq,
                    a.timestamp,
                    a.pending,
                ],
            )
        });
        let want = want.map(|(d, s, c, n)| (d.map(String::from), s.to_string(), c.to_string(), n));
        assert_eq!(got, want, "{subj}");
    }
}

#[test]
fn encoders() {
    let enc = |f: &dyn Fn(&mut Vec<u8>) -> Result<(), NatsEncodeError>| {
        let mut v = Vec::new();
        f(&mut v).map(|()| String::from_utf8(v).unwrap())
    };
    let m = 1 << 20;
    let h = Headers {
        msg_id: Some(b"id1"),
        extra: &[(b"Taskq-Pri", b"5")],
    };
    #[rustfmt::skip]
    let table: Vec<EncodeCase> = vec![
        (enc(&|o| encode_pub(o, b"a.b", None, b"hi", m)), Ok("PUB a.b 2\r\nhi\r\n")),
        (enc(&|o| encode_pub(o, b"a.b", Some(b"_INBOX.x.1"), b"", m)), Ok("PUB a.b _INBOX.x.1 0\r\n\r\n")),
        (enc(&|o| encode_pub(o, b"a b", None, b"", m)), Err(NatsEncodeError::BadSubject)),
        (enc(&|o| encode_pub(o, b"", None, b"", m)), Err(NatsEncodeError::BadSubject)),
        (enc(&|o| encode_pub(o, b"a", Some(b"r\r\n"), b"", m)), Err(NatsEncodeError::BadSubject)),
        (enc(&|o| encode_pub(o, b"a", None, b"abc", 2)), Err(NatsEncodeError::PayloadTooLarge { size: 3, max: 2 })),
        (enc(&|o| encode_hpub(o, b"t", Some(b"r.1"), &h, b"xy", m)), Ok("HPUB t r.1 44 46\r\nNATS/1.0\r\nNats-Msg-Id: id1\r\nTaskq-Pri: 5\r\n\r\nxy\r\n")),
        (enc(&|o| encode_hpub(o, b"t", None, &Headers::default(), b"", m)), Ok("HPUB t 12 12\r\nNATS/1.0\r\n\r\n\r\n")),
        (enc(&|o| encode_hpub(o, b"t", None, &Headers { msg_id: Some(b"a\r\nb"), extra: &[] }, b"", m)), Err(NatsEncodeError::BadHeader)),
        (enc(&|o| encode_hpub(o, b"t", None, &Headers { msg_id: None, extra: &[(b"A:B", b"")] }, b"", m)), Err(NatsEncodeError::BadHeader)),
        (enc(&|o| encode_hpub(o, b"t", None, &h, b"", 43)), Err(NatsEncodeError::PayloadTooLarge { size: 44, max: 43 })),
        (enc(&|o| encode_sub(o, b"_INBOX.x.*", 1)), Ok("SUB _INBOX.x.* 1\r\n")),
        (enc(&|o| { encode_unsub(o, 1, Some(5)); Ok(()) }), Ok("UNSUB 1 5\r\n")),
        (enc(&|o| { encode_unsub(o, 2, None); Ok(()) }), Ok("UNSUB 2\r\n")),
        (enc(&|o| { AckKind::Ack.encode_body(o); Ok(()) }), Ok("+ACK")),
        (enc(&|o| { AckKind::Nak { delay: None }.encode_body(o); Ok(()) }), Ok("-NAK")),
        (enc(&|o| { AckKind::Nak { delay: Some(std::time::Duration::from_millis(1500)) }.encode_body(o); Ok(()) }), Ok("-NAK {\"delay\":1500000000}")),
        (enc(&|o| { AckKind::InProgress.encode_body(o); Ok(()) }), Ok("+WPI")),
        (enc(&|o| { AckKind::Term.encode_body(o); Ok(()) }), Ok("+TERM")),
    ];
    for (i, (got, want)) in table.into_iter().enumerate() {
        assert_eq!(got, want.map(String::from), "case {i}");
    }
    let mut c = Vec::new();
    let opts = ConnectOptions {
        name: "w\"1\n",
        version: "0.1",
        ..ConnectOptions::default()
    };
    encode_connect(&mut c, &opts);
    let c = String::from_utf8(c).unwrap();
    assert!(c.starts_with("CONNECT {") && c.ends_with("}\r\n"), "{c}");
    for part in [
        "\"verbose\":false",
        "\"pedantic\":false",
        "\"tls_required\":false",
        "\"headers\":true",
        "\"no_responders\":true",
        "\"lang\":\"rust\"",
        "\"protocol\":1",
        r#""name":"w\"1\u000a""#,
    ] {
        assert!(c.contains(part), "{part} in {c}");
    }
    for key in ["user", "pass", "auth_token", "jwt", "nkey", "sig"] {
        assert!(!c.contains(&format!("\"{key}\"")), "no {key} in {c}");
    }
    // Each credential goes in its own field, escaped; the JSON stays valid.
    let mut c = Vec::new();
    let with_secrets = ConnectOptions {
        user_pass: Some(("al\"ice", "p\\w")),
        token: Some("tok"),
        jwt: Some("eyJ.x.y"),
        nkey: Some("UABC"),
        sig: Some("c2ln"),
        tls_required: true,
        ..ConnectOptions::default()
    };
    encode_connect(&mut c, &with_secrets);
    // Its Debug names the user and which credentials it carries, never one.
    let shown = format!("{with_secrets:?}");
    assert!(
        shown.contains("al\\\"ice") && shown.contains("***"),
        "{shown}"
    );
    for secret in ["p\\", "\"tok\"", "eyJ", "c2ln"] {
        assert!(!shown.contains(secret), "{secret} in {shown}");
    }
    let json: serde_json::Value = serde_json::from_slice(&c[8..c.len() - 2]).unwrap();
    assert_eq!(json["user"], "al\"ice");
    assert_eq!(json["pass"], "p\\w");
    assert_eq!(json["auth_token"], "tok");
    assert_eq!(json["jwt"], "eyJ.x.y");
    assert_eq!(json["nkey"], "UABC");
    assert_eq!(json["sig"], "c2ln");
    assert_eq!(json["tls_required"], true);
}

#[test]
fn the_put_encoder_matches_hpub_and_reuses_its_prefix() {
    let mut e = PutEncoder::new(b"_INBOX.k.");
    let m = 1 << 20;
    for (subj, token, id, body) in [
        (&b"taskq.a"[..], 1, &b"m1"[..], &b"x"[..]),
        (b"taskq.a", 22, b"m22", b""),
        (b"taskq.bb", 333, b"m333", b"yyyy"),
        (b"taskq.a", u64::MAX, b"m", b"z"),
    ] {
        let extra: &[(&[u8], &[u8])] = &[(b"Taskq-Ttr", b"60")];
        let got = e.encode(subj, token, id, extra, body, m).unwrap().to_vec();
        let reply = format!("_INBOX.k.{token}");
        let mut want = Vec::new();
        let h = Headers {
            msg_id: Some(id),
            extra,
        };
        encode_hpub(&mut want, subj, Some(reply.as_bytes()), &h, body, m).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&want)
        );
        let head = e.head(subj, token, id, extra, body.len(), m).unwrap();
        assert_eq!(head, &want[..want.len() - body.len() - 2]);
    }
    assert_eq!(
        e.encode(b"bad subject", 1, b"i", &[], b"", m),
        Err(NatsEncodeError::BadSubject)
    );
    assert_eq!(
        e.encode(b"t", 1, b"i\n", &[], b"", m),
        Err(NatsEncodeError::BadHeader)
    );
    assert!(matches!(
        e.encode(b"t", 1, b"i", &[], &[0; 100], 50),
        Err(NatsEncodeError::PayloadTooLarge { .. })
    ));
}

#[test]
fn proto_errors_display_their_cause() {
    for (e, s) in [
        (
            E::PayloadTooLarge { len: 9, max: 8 },
            "server announces a payload of 9 bytes, more than the maximum 8",
        ),
        (E::Malformed { op: "MSG" }, "malformed MSG line"),
        (E::BadAckSubject, "not a JetStream ack subject"),
    ] {
        assert_eq!(e.to_string(), s);
    }
}
