//! The NATS session fed fuzzer-chosen server bytes in fuzzer-chosen pieces,
//! with a put, a pull and an ack confirmation owed: what it yields (replies,
//! deliveries, statuses, `PONG`s, the error that breaks it) and the `PING`s
//! it owes must be what the same bytes read whole give, and nothing it
//! yields may lie outside the bytes received.
#![no_main]

use libfuzzer_sys::fuzz_target;
use taskq_proto::nats::session::Event;
use taskq_proto::nats::{AckKind, NatsLimits, NatsSession};

mod common;

const LIMITS: NatsLimits = NatsLimits {
    max_payload: 300,
    max_line: 200,
    max_info: 400,
};

/// A session with PubAck token 1, a pull (token 2) and a confirmation (token 3) owed.
fn session() -> NatsSession {
    let mut s = NatsSession::with_inbox(LIMITS, "127.0.0.1:4222", b"_INBOX.f.");
    s.start_put_whole(b"taskq.T", b"id", &[], b"x").unwrap();
    s.queue_sent();
    s.queue_pull("S", "c", 3, None, None).unwrap();
    s.queue_ack(b"$JS.ACK.S.c.1.1.1.1.0", AckKind::Ack, true)
        .unwrap();
    s.queue_sent();
    s
}

/// Everything the session yields, as text, when it receives `input` up to
/// each of `ends` in turn: as a driver does, each receipt is read into the
/// room the session gives and polled until it needs more.
fn run(input: &[u8], ends: &[usize]) -> (Vec<String>, u32) {
    let mut s = session();
    let mut out = Vec::new();
    for (mut piece, _) in common::each_piece(input, ends) {
        while !piece.is_empty() {
            if let Err(e) = common::receive(&mut s, &mut piece) {
                out.push(e);
                return (out, s.pongs_owed());
            }
            loop {
                match s.poll_event() {
                    Ok(Some(e)) => {
                        let bytes = s.event_bytes();
                        out.push(match e {
                            Event::Reply { token, m } => {
                                format!("reply {token} {:?}", m.attach(bytes))
                            }
                            Event::Delivery(m) => format!("delivery {:?}", m.attach(bytes)),
                            Event::Pong => "pong".into(),
                        });
                    }
                    Ok(None) => break,
                    Err(e) => {
                        out.push(format!("{e:?}"));
                        return (out, s.pongs_owed());
                    }
                }
            }
        }
    }
    (out, s.pongs_owed())
}

fuzz_target!(|data: &[u8]| {
    let [ncuts, rest @ ..] = data else {
        return;
    };
    let (input, ends) = common::pieces(*ncuts, rest);
    assert_eq!(run(input, &ends), run(input, &[input.len()]));
});
