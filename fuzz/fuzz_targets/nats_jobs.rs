//! The NATS session's job paths fed fuzzer-chosen server bytes in
//! fuzzer-chosen pieces, as the workers and producers read them: a pull
//! with an ack confirmation owed, read with `poll_delivery` and
//! `take_delivery` (messages, their ack subjects, statuses); or two
//! publishes owed, read with `poll_puback` (PubAcks, API errors, no
//! responders). What it yields must be what the same bytes read whole give;
//! no body exceeds the limit, and no server text reaches an error with a
//! control character in it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use taskq_proto::nats::session::Delivery;
use taskq_proto::nats::{AckKind, NatsError, NatsLimits, NatsSession};

mod common;

const LIMITS: NatsLimits = NatsLimits {
    max_payload: 300,
    max_line: 200,
    max_info: 400,
};

/// A session owing a pull of 3 and an ack's confirmation, or two PubAcks.
fn session(puts: bool) -> NatsSession {
    let mut s = NatsSession::with_inbox(LIMITS, "127.0.0.1:4222", b"_INBOX.f.");
    if puts {
        for id in [&b"id-1"[..], b"id-2"] {
            s.queue_publish(b"taskq.T", id, &[], b"x").unwrap();
        }
    } else {
        s.queue_pull("S", "c", 3, None, None).unwrap();
        s.queue_ack(b"$JS.ACK.S.c.1.1.1.1.0", AckKind::Ack, true)
            .unwrap();
    }
    s.queue_sent();
    s
}

/// An error as it is recorded; the run ends on it unless it was one put's
/// own answer and the session goes on.
fn error(s: &NatsSession, e: NatsError, out: &mut Vec<String>) -> bool {
    let shown = e.to_string();
    assert!(!shown.chars().any(char::is_control), "{shown:?}");
    let ends = s.usable().is_err();
    out.push(format!("{e:?}"));
    ends
}

fn run(puts: bool, input: &[u8], ends: &[usize]) -> Vec<String> {
    let mut s = session(puts);
    let mut out = Vec::new();
    for (mut piece, end) in common::each_piece(input, ends) {
        while !piece.is_empty() {
            if let Err(e) = common::receive(&mut s, &mut piece) {
                out.push(e);
                return out;
            }
            loop {
                let owed = if puts {
                    s.pubacks_owed()
                } else {
                    s.pulls_under_way() + s.confirms_owed()
                };
                if owed == 0 {
                    // What came past the last answer owed is a driver's to judge.
                    let left = s.buffered() + piece.len() + (input.len() - end);
                    out.push(format!("left {left}"));
                    return out;
                }
                let polled = if puts {
                    s.poll_puback().map(|a| a.map(|a| format!("{a:?}")))
                } else {
                    match s.poll_delivery() {
                        Ok(Some(f)) => s.take_delivery(f).map(|d| {
                            if let Delivery::Msg { body, .. } = &d {
                                assert!(body.len() <= LIMITS.max_incoming());
                            }
                            Some(format!("{d:?}"))
                        }),
                        Ok(None) => Ok(None),
                        Err(e) => Err(e),
                    }
                };
                match polled {
                    Ok(Some(what)) => out.push(what),
                    Ok(None) => break,
                    Err(e) => {
                        if error(&s, e, &mut out) {
                            return out;
                        }
                    }
                }
            }
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let [mode, ncuts, rest @ ..] = data else {
        return;
    };
    let puts = mode & 1 != 0;
    let (input, ends) = common::pieces(*ncuts, rest);
    assert_eq!(run(puts, input, &ends), run(puts, input, &[input.len()]));
});
