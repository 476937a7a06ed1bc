//! The NATS handshake driven over fuzzer-chosen server bytes in
//! fuzzer-chosen pieces, as its drivers drive it, with a user and password:
//! what it asks the driver to do and how it ends must be what the same bytes
//! read whole give (unless it starts TLS: a server sends nothing between its
//! `INFO` and the TLS handshake, so there the pieces matter). Whatever the
//! bytes, no error shows the password or a control character.
#![no_main]

use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use taskq_proto::nats::session::{Credentials, Handshake, HandshakeStep};
use taskq_proto::nats::{NatsLimits, NatsSession};
use taskq_proto::Secret;

mod common;

const LIMITS: NatsLimits = NatsLimits {
    max_payload: 300,
    max_line: 200,
    max_info: 400,
};

const PASSWORD: &str = "pw-5ecret-not-shown";

/// The steps taken, and whether TLS was started on the way.
fn run(input: &[u8], ends: &[usize], tls_wanted: bool) -> (Vec<String>, bool) {
    let pass = Secret::new(PASSWORD);
    let creds = Credentials {
        user: Some(("bob", &pass)),
        describe: "user bob",
        ..Credentials::default()
    };
    let now = Instant::now();
    let mut s = NatsSession::with_inbox(LIMITS, "127.0.0.1:4222", b"_INBOX.f.");
    let mut h = Handshake::new(
        now,
        Duration::from_secs(5),
        false,
        tls_wanted,
        "127.0.0.1:4222",
    );
    let mut out = Vec::new();
    let mut tls = false;
    let mut start = 0;
    let mut ends = ends.iter();
    let mut pending: &[u8] = &[];
    loop {
        let step = match h.step(&mut s) {
            Ok(step) => step,
            Err(e) => {
                let (shown, debug) = (e.to_string(), format!("{e:?}"));
                for text in [&shown, &debug] {
                    assert!(!text.contains(PASSWORD), "{text}");
                }
                assert!(!shown.chars().any(char::is_control), "{shown:?}");
                out.push(debug);
                return (out, tls);
            }
        };
        out.push(format!("{step:?}"));
        match step {
            HandshakeStep::Read => {
                // One read, into the room the session gives, of what the
                // next piece has left; then the next step, as a driver does.
                if pending.is_empty() {
                    let Some(&end) = ends.next() else {
                        return (out, tls);
                    };
                    pending = &input[start..end];
                    start = end;
                }
                let room = match s.recv_room() {
                    Ok(room) => room,
                    Err(e) => {
                        out.push(format!("{e:?}"));
                        return (out, tls);
                    }
                };
                let n = common::read_into(room, &mut pending);
                s.received(n);
                // How the bytes were cut is not part of what is compared.
                out.pop();
            }
            HandshakeStep::StartTls => {
                tls = true;
                h.tls_started();
            }
            HandshakeStep::Connect { .. } => {
                if let Err(e) = h.connect(&mut s, "fuzz", &creds) {
                    out.push(format!("{e:?}"));
                    return (out, tls);
                }
            }
            HandshakeStep::Write => {
                let line = s.queued();
                let text = String::from_utf8_lossy(line);
                assert!(text.starts_with("CONNECT {") && text.contains(PASSWORD));
                s.wipe_queue();
                assert!(s.queued().is_empty());
                h.written();
            }
            HandshakeStep::Done => {
                assert!(h.handle_timeout(now + Duration::from_secs(60)).is_ok());
                return (out, tls);
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let [mode, ncuts, rest @ ..] = data else {
        return;
    };
    let tls_wanted = mode & 1 != 0;
    let (input, ends) = common::pieces(*ncuts, rest);
    let (whole, tls_whole) = run(input, &[input.len()], tls_wanted);
    let (pieces, tls_pieces) = run(input, &ends, tls_wanted);
    if !tls_whole && !tls_pieces {
        assert_eq!(whole, pieces);
    }
});
