//! The NATS session's pulls with scripted bytes and no socket: deliveries,
//! statuses and ack confirmations cut at every byte (with a `PING` before
//! them), the end of a batch, and a property test of reading in pieces
//! against the script read whole.

mod nats_common;

use std::time::Duration;

use taskq_proto::nats::session::Event;
use taskq_proto::nats::{AckKind, Delivery, NatsError, NatsProtoError as P, NatsSession};

use nats_common::script::{cut_and_poll, feed, msg, session};

#[test]
fn pull_deliveries_statuses_and_confirmations_cut_at_every_byte() {
    let ack_subject = "$JS.ACK.TASKQ.taskq-T.2.5.6.1700000000000000000.3";
    let table: Vec<(String, &str)> = vec![
        (
            msg("taskq.T", Some(ack_subject), None, "body"),
            "msg taskq.T body delivered 2 seq 5",
        ),
        (
            msg("_INBOX.t.1", None, Some("404 No Messages"), ""),
            "no messages",
        ),
        (
            msg("_INBOX.t.1", None, Some("408 Request Timeout"), ""),
            "timeout",
        ),
        (
            msg("_INBOX.t.1", None, Some("100 Idle Heartbeat"), ""),
            "heartbeat",
        ),
        (
            msg("_INBOX.t.1", None, Some("409 Leadership Change"), ""),
            "conflict Leadership Change",
        ),
        (
            msg("_INBOX.t.1", None, Some("400 Bad Request"), ""),
            "status 400 Bad Request",
        ),
        (msg("_INBOX.t.2", None, None, ""), "confirmed 2"),
        // A reply to nobody first.
        (
            format!(
                "{}{}",
                msg("_INBOX.t.77", None, None, "{}"),
                msg("taskq.T", Some(ack_subject), None, "b2")
            ),
            "msg taskq.T b2 delivered 2 seq 5",
        ),
    ];
    let show = |d: Delivery<'_>| -> String {
        let s = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        match d {
            Delivery::Msg {
                subject,
                body,
                info,
                reply,
                ..
            } => {
                assert_eq!(reply, ack_subject.as_bytes());
                format!(
                    "msg {} {} delivered {} seq {}",
                    s(subject),
                    s(body),
                    info.delivered,
                    info.stream_seq
                )
            }
            Delivery::NoMessages => "no messages".into(),
            Delivery::Timeout => "timeout".into(),
            Delivery::Heartbeat => "heartbeat".into(),
            Delivery::Conflict(why) => format!("conflict {}", s(why)),
            Delivery::Status { code, description } => {
                format!("status {code} {}", s(description))
            }
            Delivery::Confirmed(t) => format!("confirmed {t}"),
            d => format!("{d:?}"),
        }
    };
    let mut cases = 0;
    for (wire, want) in &table {
        let wire = format!("PING\r\n{wire}");
        for cut in 0..=wire.len() {
            let mut s = session();
            s.queue_pull("TASKQ", "taskq-T", 2, Some(Duration::from_secs(1)), None)
                .unwrap();
            // An ack with confirmation rides in the same write (token 2).
            let confirm = s
                .queue_ack(ack_subject.as_bytes(), AckKind::Ack, true)
                .unwrap();
            assert_eq!(confirm, Some(2));
            assert!(!s.pulling(), "not under way before it is written");
            s.queue_sent();
            assert!(s.pulling() && s.confirms_owed() == 1);
            let f = cut_and_poll(&mut s, wire.as_bytes(), cut, NatsSession::poll_delivery).unwrap();
            let got = show(s.take_delivery(f).unwrap());
            assert_eq!(got, *want, "{wire:?} cut at {cut}");
            // A heartbeat or one message of two keeps the pull going.
            let going =
                want.starts_with("msg") || *want == "heartbeat" || want.starts_with("confirmed");
            assert_eq!(s.pulling(), going, "{want}");
            let confirmed = want.starts_with("confirmed");
            assert_eq!(s.confirms_owed(), usize::from(!confirmed));
            assert_eq!(s.pongs_owed(), 1);
            cases += 1;
        }
    }
    assert!(cases > 500, "{cases} cuts");
}

#[test]
fn a_pull_ends_after_its_batch_and_a_later_delivery_comes_with_no_pull() {
    let mut s = session();
    s.queue_pull("TASKQ", "c", 2, None, None).unwrap();
    assert_eq!(
        s.queued(),
        &b"PUB $JS.API.CONSUMER.MSG.NEXT.TASKQ.c _INBOX.t.1 26\r\n{\"batch\":2,\"no_wait\":true}\r\n"[..]
    );
    s.queue_sent();
    let a = "$JS.ACK.TASKQ.c.1.1.1.1.0";
    let three: String = (0..3).map(|_| msg("taskq.T", Some(a), None, "x")).collect();
    feed(&mut s, three.as_bytes());
    for _ in 0..2 {
        let f = s.poll_delivery().unwrap().unwrap();
        assert!(matches!(s.take_delivery(f).unwrap(), Delivery::Msg { .. }));
    }
    assert!(!s.pulling());
    // The third answers no pull under way: passed on with none (for the
    // driver to run or give back, never dropped); then nothing is owed.
    let f = s.poll_delivery().unwrap().unwrap();
    assert_eq!(f.pull(), None);
    assert!(matches!(s.take_delivery(f).unwrap(), Delivery::Msg { .. }));
    assert!(matches!(s.poll_delivery(), Err(NatsError::NothingOwed)));
    // A message whose reply is no ack subject breaks the session.
    let mut s = session();
    s.queue_pull("TASKQ", "c", 1, None, None).unwrap();
    s.queue_sent();
    feed(&mut s, msg("taskq.T", Some("nope"), None, "x").as_bytes());
    let f = s.poll_delivery().unwrap().unwrap();
    assert!(matches!(s.take_delivery(f), Err(NatsError::Protocol(_))));
    assert!(s.is_broken());
    // A pull status without a header block is malformed.
    let mut s = session();
    s.queue_pull("TASKQ", "c", 1, None, None).unwrap();
    s.queue_sent();
    feed(&mut s, msg("_INBOX.t.1", None, None, "").as_bytes());
    assert!(matches!(
        s.poll_delivery(),
        Err(NatsError::Protocol(P::Malformed { op: "HMSG" }))
    ));
    assert!(s.is_broken());
    // A pull's 503 is no responders, and ends it.
    let mut s = session();
    s.queue_pull("TASKQ", "c", 1, None, None).unwrap();
    s.queue_sent();
    feed(&mut s, msg("_INBOX.t.1", None, Some("503"), "").as_bytes());
    let f = s.poll_delivery().unwrap().unwrap();
    assert!(matches!(s.take_delivery(f), Err(NatsError::NoResponders)));
    assert!(!s.pulling() && !s.is_broken());
}

#[test]
fn pulls_in_a_row_are_answered_oldest_first_and_each_status_ends_its_own() {
    let mut s = session();
    let wait = Some(Duration::from_secs(1));
    // Two waiting pulls of one consumer in one write; `queue_pull` alone
    // refuses a second.
    let first = s.queue_pull_behind("TASKQ", "c", 2, wait, None).unwrap();
    let second = s.queue_pull_behind("TASKQ", "c", 3, wait, None).unwrap();
    assert_eq!((first, second), (1, 2));
    assert!(matches!(
        s.queue_pull("TASKQ", "c", 1, wait, None),
        Err(NatsError::Busy)
    ));
    s.queue_sent();
    assert_eq!(s.pulls_under_way(), 2);
    let a = "$JS.ACK.TASKQ.c.1.1.1.1.0";
    // Three messages: two answer the first pull (over then), the third the
    // second.
    let three: String = (0..3).map(|_| msg("taskq.T", Some(a), None, "x")).collect();
    feed(&mut s, three.as_bytes());
    let mut pulls = Vec::new();
    for _ in 0..3 {
        let f = s.poll_delivery().unwrap().unwrap();
        pulls.push(f.pull());
        assert!(matches!(s.take_delivery(f).unwrap(), Delivery::Msg { .. }));
    }
    assert_eq!(pulls, [Some(first), Some(first), Some(second)]);
    assert_eq!(s.pulls_under_way(), 1);
    // A third behind the second; the second's expiry ends it alone, and
    // what comes next answers the third.
    let third = s.queue_pull_behind("TASKQ", "c", 1, wait, None).unwrap();
    s.queue_sent();
    let wire = format!(
        "{}{}",
        msg(
            &format!("_INBOX.t.{second}"),
            None,
            Some("408 Request Timeout"),
            ""
        ),
        msg("taskq.T", Some(a), None, "y")
    );
    feed(&mut s, wire.as_bytes());
    let f = s.poll_delivery().unwrap().unwrap();
    assert_eq!(f.pull(), Some(second));
    assert_eq!(s.take_delivery(f).unwrap(), Delivery::Timeout);
    let f = s.poll_delivery().unwrap().unwrap();
    assert_eq!(f.pull(), Some(third));
    assert!(matches!(s.take_delivery(f).unwrap(), Delivery::Msg { .. }));
    assert!(!s.pulling());
    // A confirmation answers no pull.
    let token = s
        .queue_ack(a.as_bytes(), AckKind::Ack, true)
        .unwrap()
        .unwrap();
    s.queue_sent();
    feed(
        &mut s,
        msg(&format!("_INBOX.t.{token}"), None, None, "").as_bytes(),
    );
    let f = s.poll_delivery().unwrap().unwrap();
    assert_eq!(f.pull(), None);
    assert_eq!(s.take_delivery(f).unwrap(), Delivery::Confirmed(token));
}

/// A probe about the pulls under way up to a token: its `PONG` ends those
/// still under way as never answered, one report each, and leaves a younger
/// pull and one a status already ended alone; a probe not yet written (or
/// dropped with its write) is owed nothing. A message that comes later with
/// no pull under way is passed on, not dropped.
#[test]
fn a_probes_pong_ends_the_pulls_it_asked_about_that_nothing_answered() {
    let mut s = session();
    let wait = Some(Duration::from_secs(1));
    let first = s.queue_pull_behind("TASKQ", "c", 4, wait, None).unwrap();
    let second = s.queue_pull_behind("TASKQ", "c", 4, wait, None).unwrap();
    s.queue_sent();
    let third = s.queue_pull_behind("TASKQ", "c", 4, wait, None).unwrap();
    s.queue_sent();
    // Dropped with its write: no PING went, none is owed.
    s.queue_probe(second).unwrap();
    assert!(s.probing());
    s.clear_queue();
    assert!(!s.probing());
    s.queue_probe(second).unwrap();
    assert!(s.queued().ends_with(b"PING\r\n"));
    s.queue_sent();
    assert!(s.probing());
    // The second pull's expiry came; then the PONG.
    let wire = format!(
        "{}PONG\r\n",
        msg(
            &format!("_INBOX.t.{second}"),
            None,
            Some("408 Request Timeout"),
            ""
        )
    );
    feed(&mut s, wire.as_bytes());
    let f = s.poll_delivery().unwrap().unwrap();
    assert_eq!(f.pull(), Some(second));
    assert_eq!(s.take_delivery(f).unwrap(), Delivery::Timeout);
    let f = s.poll_delivery().unwrap().unwrap();
    assert_eq!(f.pull(), Some(first), "the first was never answered");
    assert_eq!(s.take_delivery(f).unwrap(), Delivery::Unanswered);
    assert!(!s.probing());
    assert_eq!(s.pulls_under_way(), 1, "the third goes on");
    assert_eq!(s.newest_pull(), Some(third));
    assert_eq!(s.poll_delivery().unwrap(), None);
    // A PONG no probe asked for ends nothing.
    feed(&mut s, b"PONG\r\n");
    assert_eq!(s.poll_delivery().unwrap(), None);
    assert_eq!(s.pulls_under_way(), 1);
    assert!(!s.is_broken());
    // The first may still be held by the server: no request may wait past
    // a message of it.
    assert!(s.strays_possible());
    assert!(matches!(
        s.queue_request(b"$JS.API.INFO", b""),
        Err(NatsError::Busy)
    ));
    // A message for it (the server had it after all) is counted against
    // the pull under way; a 404 of a younger pull does not show it over.
    let a = "$JS.ACK.TASKQ.c.1.9.9.1700000000000000000.0";
    feed(&mut s, msg("taskq.T", Some(a), None, "late").as_bytes());
    let f = s.poll_delivery().unwrap().unwrap();
    assert_eq!(f.pull(), Some(third));
    assert!(matches!(
        s.take_delivery(f).unwrap(),
        Delivery::Msg { body: b"late", .. }
    ));
    let fourth = s.queue_pull_behind("TASKQ", "c", 1, None, None).unwrap();
    s.queue_sent();
    let wire = msg(
        &format!("_INBOX.t.{fourth}"),
        None,
        Some("404 No Messages"),
        "",
    );
    feed(&mut s, wire.as_bytes());
    let f = s.poll_delivery().unwrap().unwrap();
    assert_eq!(s.take_delivery(f).unwrap(), Delivery::NoMessages);
    assert!(s.strays_possible());
    // Its own late 408 shows it over.
    let wire = msg(
        &format!("_INBOX.t.{first}"),
        None,
        Some("408 Request Timeout"),
        "",
    );
    feed(&mut s, wire.as_bytes());
    assert_eq!(s.poll_delivery().unwrap(), None);
    assert!(!s.strays_possible());
    // The third ends; a message after it comes with no pull under way:
    // passed on with none, not dropped, even with nothing owed.
    let b = "$JS.ACK.TASKQ.c.1.10.10.1700000000000000000.0";
    let wire = format!(
        "{}{}",
        msg(
            &format!("_INBOX.t.{third}"),
            None,
            Some("408 Request Timeout"),
            ""
        ),
        msg("taskq.T", Some(b), None, "later")
    );
    feed(&mut s, wire.as_bytes());
    let f = s.poll_delivery().unwrap().unwrap();
    assert_eq!(s.take_delivery(f).unwrap(), Delivery::Timeout);
    assert!(!s.pulling());
    let f = s.poll_delivery().unwrap().unwrap();
    assert_eq!(f.pull(), None);
    assert!(matches!(
        s.take_delivery(f).unwrap(),
        Delivery::Msg { body: b"later", .. }
    ));
    assert!(matches!(s.poll_delivery(), Err(NatsError::NothingOwed)));
    assert!(s.queue_request(b"$JS.API.INFO", b"").is_ok());
}

/// A later waiting pull's `408` shows a pull its probe ended over: its
/// expiry came after the older one's.
#[test]
fn a_later_waiting_pulls_408_shows_a_probed_pull_over() {
    let mut s = session();
    let wait = Some(Duration::from_secs(1));
    let first = s.queue_pull_behind("TASKQ", "c", 1, wait, None).unwrap();
    s.queue_sent();
    s.queue_probe(first).unwrap();
    s.queue_sent();
    let second = s.queue_pull_behind("TASKQ", "c", 1, wait, None).unwrap();
    s.queue_sent();
    feed(&mut s, b"PONG\r\n");
    let f = s.poll_delivery().unwrap().unwrap();
    assert_eq!(s.take_delivery(f).unwrap(), Delivery::Unanswered);
    assert!(s.strays_possible());
    let wire = msg(
        &format!("_INBOX.t.{second}"),
        None,
        Some("408 Request Timeout"),
        "",
    );
    feed(&mut s, wire.as_bytes());
    let f = s.poll_delivery().unwrap().unwrap();
    assert_eq!(f.pull(), Some(second));
    assert_eq!(s.take_delivery(f).unwrap(), Delivery::Timeout);
    assert!(!s.strays_possible());
    assert!(s.queue_request(b"$JS.API.INFO", b"").is_ok());
}

mod props {
    use proptest::prelude::*;

    use super::*;

    /// One server operation, and what the session must make of it (`None`: nothing).
    fn op(kind: u8, n: u64) -> (String, Option<String>) {
        let body = format!("p{n}");
        match kind % 6 {
            0 => ("PING\r\n".into(), None),
            1 => ("+OK\r\n".into(), None),
            2 => (
                msg(&format!("_INBOX.t.{n}"), None, None, &body),
                Some(format!("reply {n} {body}")),
            ),
            3 => (
                msg("taskq.T", Some("$JS.ACK.S.c.1.1.1.1.0"), None, &body),
                Some(format!("delivery {body}")),
            ),
            4 => (
                msg("elsewhere", None, None, &body).replace(" 1 ", " 7 "),
                None,
            ),
            _ => ("PONG\r\n".into(), Some("pong".into())),
        }
    }

    proptest! {
        /// However a script of operations is cut into reads, the events and
        /// the PINGs owed are those of the script read whole.
        #[test]
        fn events_do_not_depend_on_how_the_bytes_arrive(
            ops in prop::collection::vec((any::<u8>(), 0..1000u64), 1..24),
            cuts in prop::collection::vec(1..40usize, 1..64),
        ) {
            let (wire, want): (String, Vec<Option<String>>) =
                ops.iter().map(|&(k, n)| op(k, n)).unzip();
            let want: Vec<String> = want.into_iter().flatten().collect();
            let pings = ops.iter().filter(|(k, _)| k % 6 == 0).count() as u32;
            let mut s = session();
            let mut got = Vec::new();
            let mut rest = wire.as_bytes();
            let mut i = 0;
            while !rest.is_empty() {
                let n = cuts[i % cuts.len()].min(rest.len());
                i += 1;
                feed(&mut s, &rest[..n]);
                rest = &rest[n..];
                while let Some(e) = s.poll_event().unwrap() {
                    let text = |m: taskq_proto::nats::MsgFrame| {
                        String::from_utf8_lossy(m.payload.of(s.event_bytes())).into_owned()
                    };
                    got.push(match e {
                        Event::Reply { token, m } => format!("reply {token} {}", text(m)),
                        Event::Delivery(m) => format!("delivery {}", text(m)),
                        Event::Pong => "pong".into(),
                    });
                }
            }
            prop_assert_eq!(got, want);
            prop_assert_eq!(s.pongs_owed(), pings);
            prop_assert_eq!(s.buffered(), 0);
        }
    }
}

/// A session at an I/O timeout of `io_ms`, and the instants `ms(n)`, `n`
/// milliseconds after a start.
fn clocked(io_ms: u64) -> (NatsSession, impl Fn(u64) -> std::time::Instant) {
    let mut s = session();
    s.set_io_timeout(Duration::from_millis(io_ms));
    let t0 = std::time::Instant::now();
    (s, move |n| t0 + Duration::from_millis(n))
}

/// The session keeps the deadlines on the instants it is given: a waiting
/// pull is probed at its expiry plus the grace (half the I/O timeout here)
/// and is due at its expiry plus the I/O timeout; a `no_wait` pull's expiry
/// is its write; an ack's confirmation and a queued publish's PubAck are
/// due the I/O timeout after their write, each counted from its own write
/// (a wait already begun keeps its start); a reply overdue breaks the
/// session.
#[test]
fn the_session_probes_a_pull_past_its_expiry_and_breaks_on_a_reply_overdue() {
    let (mut s, ms) = clocked(1_000);
    assert_eq!(s.poll_timeout(), None, "nothing owed");
    let pull = s
        .queue_pull_behind("TASKQ", "c", 4, Some(Duration::from_secs(2)), None)
        .unwrap();
    assert_eq!(s.poll_timeout(), None, "not written");
    s.queue_sent();
    s.start_wait(ms(100));
    s.start_wait(ms(400));
    // Probe at 100 + 2,000 + 500; due at 100 + 2,000 + 1,000.
    assert_eq!(s.poll_timeout(), Some(ms(2_600)));
    s.handle_timeout(ms(2_599)).unwrap();
    assert!(!s.probing() && s.queued().is_empty());
    s.handle_timeout(ms(2_600)).unwrap();
    assert!(s.probing());
    assert_eq!(s.queued(), b"PING\r\n");
    s.queue_sent();
    s.handle_timeout(ms(2_700)).unwrap();
    assert_eq!(s.queued(), b"", "probed once");
    assert_eq!(s.poll_timeout(), Some(ms(3_100)));
    // The PONG: the pull is over, nothing is due.
    feed(&mut s, b"PONG\r\n");
    let f = s.poll_delivery().unwrap().unwrap();
    assert_eq!(
        (f.pull(), s.take_delivery(f).unwrap()),
        (Some(pull), Delivery::Unanswered)
    );
    assert_eq!(s.poll_timeout(), None);
    // Confirmations, each from its own write.
    let a = "$JS.ACK.TASKQ.c.1.9.9.1700000000000000000.0";
    let first = s
        .queue_ack(a.as_bytes(), AckKind::Ack, true)
        .unwrap()
        .unwrap();
    s.queue_sent();
    s.start_wait(ms(5_000));
    s.queue_ack(a.as_bytes(), AckKind::Ack, true).unwrap();
    s.queue_sent();
    s.start_wait(ms(5_300));
    assert_eq!(s.waiting_since(), Some(ms(5_000)));
    assert_eq!(s.poll_timeout(), Some(ms(6_000)));
    feed(
        &mut s,
        msg(&format!("_INBOX.t.{first}"), None, None, "").as_bytes(),
    );
    let f = s.poll_delivery().unwrap().unwrap();
    assert_eq!(s.take_delivery(f).unwrap(), Delivery::Confirmed(first));
    assert_eq!(s.poll_timeout(), Some(ms(6_300)), "the second's own write");
    // A no_wait pull is due the I/O timeout after its write, and probed
    // half-way.
    s.queue_pull_behind("TASKQ", "c", 1, None, None).unwrap();
    s.queue_sent();
    s.start_wait(ms(5_500));
    assert_eq!(s.poll_timeout(), Some(ms(6_000)));
    s.handle_timeout(ms(5_999)).unwrap();
    assert!(!s.probing());
    s.handle_timeout(ms(6_000)).unwrap();
    assert!(s.probing(), "the no_wait pull is probed at 6,000");
    s.queue_sent();
    // The confirmation (6,300) is due before the pull (6,500).
    assert_eq!(s.poll_timeout(), Some(ms(6_300)));
    s.handle_timeout(ms(6_299)).unwrap();
    let e = s.handle_timeout(ms(6_300)).unwrap_err();
    assert!(matches!(e, NatsError::Timeout { .. }), "{e}");
    assert!(s.is_broken());
    assert_eq!(s.poll_timeout(), None, "a broken session waits for nothing");
}

/// Queued publishes' PubAcks are due the I/O timeout after their write,
/// the oldest first, whatever order they come in.
#[test]
fn queued_pubacks_are_due_from_their_own_write_oldest_first() {
    let (mut s, ms) = clocked(500);
    let a = s.queue_publish(b"taskq.T", b"a", &[], b"x").unwrap();
    s.queue_sent();
    s.start_wait(ms(0));
    let b = s.queue_publish(b"taskq.T", b"b", &[], b"y").unwrap();
    s.queue_sent();
    s.start_wait(ms(200));
    assert_eq!(s.poll_timeout(), Some(ms(500)));
    let ack = |seq: u64| format!(r#"{{"stream":"TASKQ","seq":{seq}}}"#);
    // The younger one's comes first: the older one is still due at 500.
    feed(
        &mut s,
        msg(&format!("_INBOX.t.{b}"), None, None, &ack(2)).as_bytes(),
    );
    let Some(Event::Reply { token, m }) = s.poll_event().unwrap() else {
        panic!("a reply");
    };
    assert_eq!(s.take_puback_of(token, m).unwrap().unwrap().stream_seq, 2);
    assert_eq!(s.poll_timeout(), Some(ms(500)));
    feed(
        &mut s,
        msg(&format!("_INBOX.t.{a}"), None, None, &ack(1)).as_bytes(),
    );
    assert_eq!(s.poll_puback().unwrap().unwrap().stream_seq, 1);
    assert_eq!(s.poll_timeout(), None);
    s.handle_timeout(ms(10_000)).unwrap();
}

/// A confirmation or PubAck still in the send buffer is not waited for: its
/// wait begins at the first wait after its write (a driver that holds acks
/// back to write them with a pull does not start their clock early).
#[test]
fn what_is_still_in_the_send_buffer_is_waited_for_only_after_its_write() {
    let (mut s, ms) = clocked(1_000);
    let a = "$JS.ACK.TASKQ.c.1.9.9.1700000000000000000.0";
    s.queue_ack(a.as_bytes(), AckKind::Ack, true).unwrap();
    s.queue_sent();
    s.queue_ack(a.as_bytes(), AckKind::Ack, true).unwrap();
    s.start_wait(ms(0));
    assert_eq!(s.poll_timeout(), Some(ms(1_000)), "the written one alone");
    s.handle_timeout(ms(999)).unwrap();
    // The first is confirmed; the second, still unwritten, is not due.
    feed(&mut s, msg("_INBOX.t.1", None, None, "").as_bytes());
    let f = s.poll_delivery().unwrap().unwrap();
    assert_eq!(s.take_delivery(f).unwrap(), Delivery::Confirmed(1));
    s.start_wait(ms(5_000));
    assert_eq!(s.poll_timeout(), None, "nothing written is owed");
    s.queue_sent();
    s.start_wait(ms(6_000));
    assert_eq!(s.poll_timeout(), Some(ms(7_000)));
    // A queue dropped unwritten: still owed, and waited for from the next
    // wait on, so the session breaks rather than wait forever.
    let (mut s, ms) = clocked(1_000);
    s.queue_ack(a.as_bytes(), AckKind::Ack, true).unwrap();
    s.clear_queue();
    s.start_wait(ms(0));
    assert_eq!(s.poll_timeout(), Some(ms(1_000)));
}

/// The reply awaited alone, a lone put's PubAck or a request's reply, is
/// the session's to time as well: due its allowance (the I/O timeout, or
/// the request's own) after the first wait after its write, overdue it
/// breaks the session naming that allowance, and once it came (read by
/// whoever reads it) nothing is due.
#[test]
fn a_lone_puts_and_a_requests_reply_are_due_their_allowance_after_their_write() {
    let (mut s, ms) = clocked(300);
    let put = s
        .start_put_whole(b"taskq.T", b"id-1", &[], b"x")
        .unwrap()
        .token;
    s.start_wait(ms(0));
    assert_eq!(s.poll_timeout(), None, "not written yet");
    s.queue_sent();
    s.start_wait(ms(100));
    s.start_wait(ms(200));
    assert_eq!(
        s.poll_timeout(),
        Some(ms(400)),
        "from the first wait after the write"
    );
    let ack = r#"{"stream":"TASKQ","seq":7}"#;
    feed(
        &mut s,
        msg(&format!("_INBOX.t.{put}"), None, None, ack).as_bytes(),
    );
    let m = s.poll_reply(put).unwrap().expect("the PubAck");
    assert_eq!(s.puback(m).unwrap().stream_seq, 7);
    assert_eq!(s.poll_timeout(), None, "answered");
    s.handle_timeout(ms(10_000)).unwrap();

    // A request with its own patience: due 5 s after its wait began.
    let req = s
        .queue_request_within(b"$JS.API.INFO", b"", Duration::from_secs(5))
        .unwrap();
    s.queue_sent();
    s.start_wait(ms(20_000));
    assert_eq!(s.poll_timeout(), Some(ms(25_000)));
    s.handle_timeout(ms(24_999)).unwrap();
    // Read past by a reader that waits for something else: still no
    // longer owed.
    feed(
        &mut s,
        msg(&format!("_INBOX.t.{req}"), None, None, "{}").as_bytes(),
    );
    assert!(matches!(
        s.poll_event().unwrap(),
        Some(Event::Reply { token, .. }) if token == req
    ));
    assert_eq!(s.poll_timeout(), None);

    // Never answered: overdue, the session breaks with the allowance.
    s.queue_request_within(b"$JS.API.INFO", b"", Duration::from_secs(5))
        .unwrap();
    s.queue_sent();
    s.start_wait(ms(30_000));
    match s.handle_timeout(ms(35_000)) {
        Err(NatsError::Timeout { waited }) => assert_eq!(waited, Duration::from_secs(5)),
        other => panic!("a timeout, not {other:?}"),
    }
    assert!(s.is_broken());
}
