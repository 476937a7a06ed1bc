//! NATS server operations fed in fuzzer-chosen pieces: the sequence of
//! operations (and the error that ends it) must equal what parsing the whole
//! input at once gives, and every decoded message, written back out in the
//! server's format, must decode to itself. PubAck and ack-subject readers
//! run on every payload and reply subject; a parsed ack subject, rebuilt
//! from its fields, must parse to the same fields.
#![no_main]

use libfuzzer_sys::fuzz_target;
use taskq_proto::nats::{parse_js_reply, parse_op, AckInfo, MsgOp, NatsLimits, ServerOp};
use taskq_proto::Status;

mod common;

const LIMITS: NatsLimits = NatsLimits {
    max_payload: 300,
    max_line: 200,
    max_info: 400,
};

/// The message written back as a server writes it.
fn reencode(m: &MsgOp<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    let hlen = m.headers.map_or(0, |h| h.as_bytes().len());
    let total = hlen + m.payload.len();
    out.extend_from_slice(if m.headers.is_some() {
        b"HMSG "
    } else {
        b"MSG "
    });
    out.extend_from_slice(m.subject);
    out.extend_from_slice(format!(" {} ", m.sid).as_bytes());
    if let Some(r) = m.reply {
        out.extend_from_slice(r);
        out.push(b' ');
    }
    if m.headers.is_some() {
        out.extend_from_slice(format!("{hlen} ").as_bytes());
    }
    out.extend_from_slice(format!("{total}\r\n").as_bytes());
    if let Some(h) = m.headers {
        out.extend_from_slice(h.as_bytes());
    }
    out.extend_from_slice(m.payload);
    out.extend_from_slice(b"\r\n");
    out
}

fuzz_target!(|data: &[u8]| {
    let [ncuts, rest @ ..] = data else {
        return;
    };
    let (input, ends) = common::pieces(*ncuts, rest);
    let read = |ends: &[usize]| common::read_pieces(input, ends, |b| parse_op(b, &LIMITS));
    let pieces = read(&ends);
    let whole = read(&[input.len()]);
    assert_eq!(pieces, whole);
    for op in whole.iter().filter_map(|r| r.as_ref().ok()) {
        if let (ServerOp::Msg(m), _) = op {
            let again = reencode(m);
            match parse_op(&again, &LIMITS) {
                Ok(Status::Complete(ServerOp::Msg(m2), n)) => {
                    assert_eq!(n, again.len());
                    assert_eq!(&m2, m);
                }
                other => panic!("re-encoded message did not decode: {other:?}"),
            }
            let _ = parse_js_reply(m.payload);
            if let Some(Ok(a)) = m.reply.map(AckInfo::parse) {
                let rebuilt = match a.domain {
                    None if m.reply.unwrap().split(|&b| b == b'.').count() == 9 => format!(
                        "$JS.ACK.{}.{}.{}.{}.{}.{}.{}",
                        String::from_utf8_lossy(a.stream),
                        String::from_utf8_lossy(a.consumer),
                        a.delivered,
                        a.stream_seq,
                        a.consumer_seq,
                        a.timestamp,
                        a.pending
                    ),
                    _ => continue,
                };
                // Only when the fields are text the rebuild is byte-exact.
                if let Ok(b) = AckInfo::parse(rebuilt.as_bytes()) {
                    if std::str::from_utf8(a.stream).is_ok()
                        && std::str::from_utf8(a.consumer).is_ok()
                    {
                        assert_eq!(b, a);
                    }
                }
            }
        }
    }
});
