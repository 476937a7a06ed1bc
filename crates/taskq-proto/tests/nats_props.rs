//! Property tests of the NATS codec against naive references written here
//! with `String`s and `split_whitespace`: server operations fed whole or in
//! pieces, header blocks, ack subjects, and the encoders' round trips.

use proptest::prelude::*;
use taskq_proto::nats::{
    encode_hpub, parse_op, AckInfo, Headers, NatsLimits, PutEncoder, ServerOp,
};
use taskq_proto::Status;

/// An operation as the reference sees it, all owned.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ref {
    Ping,
    Pong,
    Ok,
    Err(String),
    Info(String),
    Msg {
        subject: String,
        sid: u64,
        reply: Option<String>,
        status: Option<u16>,
        headers: Vec<(String, String)>,
        payload: Vec<u8>,
    },
}

/// The naive reference: one operation from the front of `input`, and its length.
fn reference(input: &[u8]) -> Option<(Ref, usize)> {
    let text_end = input.windows(2).position(|w| w == b"\r\n")?;
    let line = String::from_utf8(input[..text_end].to_vec()).ok()?;
    let after = text_end + 2;
    let words: Vec<&str> = line.split_whitespace().collect();
    let op = words.first()?.to_uppercase();
    let rest = line[line.find(words[0])? + words[0].len()..]
        .trim()
        .to_string();
    let simple = |r: Ref| Some((r, after));
    match op.as_str() {
        "PING" => simple(Ref::Ping),
        "PONG" => simple(Ref::Pong),
        "+OK" => simple(Ref::Ok),
        "-ERR" => simple(Ref::Err(rest.trim_matches('\'').to_string())),
        "INFO" => simple(Ref::Info(rest)),
        "MSG" | "HMSG" => {
            let args = &words[1..];
            let hdr = op == "HMSG";
            let counts = if hdr { 2 } else { 1 };
            let total: usize = args.last()?.parse().ok()?;
            let hlen: usize = if hdr {
                args[args.len() - 2].parse().ok()?
            } else {
                0
            };
            let reply = (args.len() == 3 + counts).then(|| args[2].to_string());
            let body = input.get(after..after + total)?;
            let (mut status, mut headers) = (None, Vec::new());
            if hdr {
                let text = String::from_utf8(body[..hlen].to_vec()).ok()?;
                let mut lines = text.split("\r\n");
                let first: Vec<&str> = lines.next()?.split_whitespace().collect();
                status = first.get(1).map(|s| s.parse().unwrap());
                for l in lines.filter(|l| !l.is_empty()) {
                    let (k, v) = l.split_once(':')?;
                    headers.push((k.trim().to_string(), v.trim().to_string()));
                }
            }
            Some((
                Ref::Msg {
                    subject: args[0].to_string(),
                    sid: args[1].parse().ok()?,
                    reply,
                    status,
                    headers,
                    payload: body[hlen..].to_vec(),
                },
                after + total + 2,
            ))
        }
        _ => None,
    }
}

fn owned(op: ServerOp<'_>) -> Ref {
    let s = |b: &[u8]| String::from_utf8(b.to_vec()).unwrap();
    match op {
        ServerOp::Ping => Ref::Ping,
        ServerOp::Pong => Ref::Pong,
        ServerOp::Ok => Ref::Ok,
        ServerOp::Err(t) => Ref::Err(s(t)),
        ServerOp::Info(j) => Ref::Info(s(j)),
        ServerOp::Msg(m) => Ref::Msg {
            subject: s(m.subject),
            sid: m.sid,
            reply: m.reply.map(s),
            status: m.headers.and_then(|h| h.status()),
            headers: m
                .headers
                .map(|h| h.iter().map(|(k, v)| (s(k), s(v))).collect())
                .unwrap_or_default(),
            payload: m.payload.to_vec(),
        },
        _ => unreachable!("no other operation is generated"),
    }
}

fn token() -> impl Strategy<Value = String> {
    "[A-Za-z0-9_$>*-]{1,12}(\\.[A-Za-z0-9_*-]{1,8}){0,3}"
}

fn blanks() -> impl Strategy<Value = &'static str> {
    prop_oneof![Just(" "), Just("  "), Just("\t"), Just(" \t ")]
}

/// A server operation encoded as a server (or a sloppy one) might write it.
fn server_op() -> impl Strategy<Value = Vec<u8>> {
    let msg = (
        token(),
        any::<u32>(),
        proptest::option::of(token()),
        proptest::option::of((
            proptest::option::of(100u16..600),
            "[A-Za-z ]{0,12}",
            proptest::collection::vec(("[A-Za-z-]{1,10}", "[ -~]{0,10}"), 0..3),
        )),
        proptest::collection::vec(any::<u8>(), 0..64),
        blanks(),
    )
        .prop_map(|(subject, sid, reply, hdr, payload, sp)| {
            let mut h = String::new();
            if let Some((status, desc, pairs)) = &hdr {
                h.push_str("NATS/1.0");
                if let Some(st) = status {
                    h.push_str(&format!(" {st}"));
                    if !desc.trim().is_empty() {
                        h.push_str(&format!(" {}", desc.trim()));
                    }
                }
                h.push_str("\r\n");
                for (k, v) in pairs {
                    h.push_str(&format!("{k}: {}\r\n", v.trim()));
                }
                h.push_str("\r\n");
            }
            let reply = reply
                .map(|r| format!("{r}{sp}"))
                .unwrap_or_else(|| sp.to_string());
            let total = h.len() + payload.len();
            let line = if hdr.is_some() {
                format!("HMSG {subject} {sid} {reply}{}{sp}{total}\r\n", h.len())
            } else {
                format!("MSG {subject} {sid} {reply}{total}\r\n")
            };
            let mut out = line.into_bytes();
            out.extend_from_slice(h.as_bytes());
            out.extend_from_slice(&payload);
            out.extend_from_slice(b"\r\n");
            out
        });
    prop_oneof![
        1 => Just(b"PING\r\n".to_vec()),
        1 => Just(b"pong\r\n".to_vec()),
        1 => Just(b"+OK\r\n".to_vec()),
        1 => "[ -&(-~]{0,20}".prop_map(|t| format!("-ERR '{t}'\r\n").into_bytes()),
        1 => "\\{[ -~]{0,40}\\}".prop_map(|j| format!("INFO {j}\r\n").into_bytes()),
        3 => msg,
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// A stream of operations, fed in arbitrary pieces as a socket delivers
    /// them, decodes to what the reference makes of each operation.
    #[test]
    fn server_ops_match_the_reference(
        ops in proptest::collection::vec(server_op(), 1..8),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..6),
    ) {
        let stream: Vec<u8> = ops.concat();
        let mut want = Vec::new();
        let mut at = 0;
        while at < stream.len() {
            let (r, n) = reference(&stream[at..]).expect("the reference reads what was generated");
            want.push(r);
            at += n;
        }
        let mut ends: Vec<usize> = cuts.iter().map(|c| c.index(stream.len() + 1)).collect();
        ends.push(stream.len());
        ends.sort_unstable();
        let (mut got, mut start) = (Vec::new(), 0);
        let limits = NatsLimits::default();
        for end in ends {
            while let Status::Complete(op, n) = parse_op(&stream[start..end], &limits).unwrap() {
                prop_assert!(n > 0 && start + n <= end);
                got.push(owned(op));
                start += n;
            }
        }
        prop_assert_eq!(start, stream.len());
        prop_assert_eq!(got, want);
    }

    /// No input makes the parser panic or claim more bytes than it was given;
    /// a prefix of a complete operation is never an error.
    #[test]
    fn any_bytes_are_safe(data in proptest::collection::vec(any::<u8>(), 0..200), op in server_op()) {
        let l = NatsLimits { max_payload: 64, max_line: 128, max_info: 256 };
        if let Ok(Status::Complete(_, n)) = parse_op(&data, &l) {
            prop_assert!(n <= data.len());
        }
        for cut in 0..op.len() {
            prop_assert_eq!(parse_op(&op[..cut], &NatsLimits::default()), Ok(Status::Partial));
        }
    }

    /// An ack subject reads as the reference's split on dots.
    #[test]
    fn ack_subjects_match_split(
        names in ("[A-Za-z0-9_-]{1,10}", "[A-Za-z0-9_-]{1,10}"),
        nums in proptest::array::uniform5(any::<u64>()),
        long in proptest::option::of(("[a-z_]{1,5}", "[A-Z0-9]{4,20}", proptest::option::of("[a-z0-9]{1,8}"))),
    ) {
        let n = nums.map(|x| x.to_string()).join(".");
        let subject = match &long {
            None => format!("$JS.ACK.{}.{}.{n}", names.0, names.1),
            Some((d, acc, tok)) => {
                let tail = tok.as_ref().map(|t| format!(".{t}")).unwrap_or_default();
                format!("$JS.ACK.{d}.{acc}.{}.{}.{n}{tail}", names.0, names.1)
            }
        };
        let parts: Vec<&str> = subject.split('.').collect();
        let at = if long.is_some() { 4 } else { 2 };
        let a = AckInfo::parse(subject.as_bytes()).unwrap();
        prop_assert_eq!(a.stream, parts[at].as_bytes());
        prop_assert_eq!(a.consumer, parts[at + 1].as_bytes());
        let got = [a.delivered, a.stream_seq, a.consumer_seq, a.timestamp, a.pending];
        let want: Vec<u64> = parts[at + 2..at + 7].iter().map(|p| p.parse().unwrap()).collect();
        prop_assert_eq!(&got[..], &want[..]);
        let domain = long.as_ref().map(|l| l.0.as_str()).filter(|d| *d != "_");
        prop_assert_eq!(a.domain, domain.map(str::as_bytes));
    }

    /// What the put encoder writes, delivered back as the server would
    /// (HPUB turned into HMSG with a sid), decodes to the same subject,
    /// reply, headers and body; and it equals the general HPUB encoder.
    #[test]
    fn puts_round_trip(
        subject in token(),
        puts in proptest::collection::vec((any::<u64>(), "[!-~]{1,30}", proptest::collection::vec(any::<u8>(), 0..100)), 1..6),
    ) {
        let mut e = PutEncoder::new(b"_INBOX.p.");
        for (tok, id, body) in puts {
            let wire = e.encode(subject.as_bytes(), tok, id.as_bytes(), &[], &body, 1 << 20).unwrap().to_vec();
            let mut general = Vec::new();
            let reply = format!("_INBOX.p.{tok}");
            let h = Headers { msg_id: Some(id.as_bytes()), extra: &[] };
            encode_hpub(&mut general, subject.as_bytes(), Some(reply.as_bytes()), &h, &body, 1 << 20).unwrap();
            prop_assert_eq!(&wire, &general);
            let line_end = wire.iter().position(|&b| b == b'\n').unwrap();
            let line = std::str::from_utf8(&wire[..line_end - 1]).unwrap();
            let w: Vec<&str> = line.split(' ').collect();
            let echoed = format!("HMSG {} 9 {} {} {}\r\n", w[1], w[2], w[3], w[4]);
            let mut msg = echoed.into_bytes();
            msg.extend_from_slice(&wire[line_end + 1..]);
            let Status::Complete(ServerOp::Msg(m), n) = parse_op(&msg, &NatsLimits::default()).unwrap() else {
                panic!("a whole HMSG");
            };
            prop_assert_eq!(n, msg.len());
            prop_assert_eq!(m.subject, subject.as_bytes());
            prop_assert_eq!(m.reply, Some(reply.as_bytes()));
            prop_assert_eq!(m.headers.unwrap().get(b"Nats-Msg-Id"), Some(id.as_bytes()));
            prop_assert_eq!(m.payload, &body[..]);
        }
    }
}
