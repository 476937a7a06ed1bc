//! Scripted server bytes for the session tests: no socket, no clock.

use taskq_proto::nats::{NatsError, NatsLimits, NatsSession};

/// The inbox the scripted sessions use.
pub const INBOX: &[u8] = b"_INBOX.t.";
/// The peer they name.
pub const PEER: &str = "127.0.0.1:4222";

/// A session with the scripted inbox.
pub fn session() -> NatsSession {
    NatsSession::with_inbox(NatsLimits::default(), PEER, INBOX)
}

/// Hands `bytes` to the session as reads as large as its room allows.
pub fn feed(s: &mut NatsSession, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        let room = s.recv_room().unwrap();
        let n = room.len().min(bytes.len());
        room[..n].copy_from_slice(&bytes[..n]);
        s.received(n);
        bytes = &bytes[n..];
    }
}

/// `MSG` (or, with `status`, `HMSG` with a status line) as a server writes it.
pub fn msg(subject: &str, reply: Option<&str>, status: Option<&str>, payload: &str) -> String {
    let reply = reply.map_or(" ".to_owned(), |r| format!(" {r} "));
    match status {
        None => format!("MSG {subject} 1{reply}{}\r\n{payload}\r\n", payload.len()),
        Some(st) => {
            let h = format!("NATS/1.0 {st}\r\n\r\n");
            let total = h.len() + payload.len();
            format!(
                "HMSG {subject} 1{reply}{} {total}\r\n{h}{payload}\r\n",
                h.len()
            )
        }
    }
}

/// Feeds `wire` cut at `cut` and polls with `poll` after each piece: the
/// first piece must leave it waiting (unless it is all of `wire`).
pub fn cut_and_poll<T: std::fmt::Debug>(
    s: &mut NatsSession,
    wire: &[u8],
    cut: usize,
    mut poll: impl FnMut(&mut NatsSession) -> Result<Option<T>, NatsError>,
) -> Result<T, NatsError> {
    let (a, b) = wire.split_at(cut);
    feed(s, a);
    match poll(s)? {
        Some(v) => {
            assert!(b.is_empty(), "answered at byte {cut} of {wire:?}: {v:?}");
            return Ok(v);
        }
        None => assert!(!b.is_empty(), "no answer from all of {wire:?}"),
    }
    feed(s, b);
    Ok(poll(s)?.expect("an answer once every byte is in"))
}
