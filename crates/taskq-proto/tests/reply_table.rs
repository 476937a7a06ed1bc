//! Every reply of every command, fed whole and cut at every byte boundary.
//!
//! A connection re-parses its buffer each time bytes arrive, so a reply cut at
//! byte `i` is exactly the prefix `input[..i]`. Each prefix must answer
//! `Partial`, or, for a bad reply, the same error once the prefix proves it.

use taskq_proto::{parse_reply, CommandKind as K, Limits, Reply, ReplyError as E, Status};

/// What a whole input must give.
#[derive(Debug)]
enum Want {
    /// A complete reply that consumed this many bytes.
    Ok(Reply<'static>, usize),
    /// A decoding error.
    Err(E),
}
use Want::Err as Bad;

const RWT: K = K::ReserveWithTimeout { timeout: 1 };

fn small() -> Limits {
    Limits {
        max_job_size: 10,
        max_yaml_size: 20,
    }
}

/// Feeds `input` whole and as every shorter prefix, checking the answers.
fn check(kind: K, input: &[u8], limits: &Limits, want: &Want) {
    let shown = String::from_utf8_lossy(input);
    let whole = parse_reply(kind, input, limits);
    match want {
        Want::Ok(reply, used) => {
            assert_eq!(
                whole,
                Ok(Status::Complete(*reply, *used)),
                "{kind:?} {shown:?}"
            );
            for cut in 0..*used {
                assert_eq!(
                    parse_reply(kind, &input[..cut], limits),
                    Ok(Status::Partial),
                    "{kind:?} {shown:?} cut at {cut}"
                );
            }
        }
        Want::Err(e) => {
            assert_eq!(whole, Err(*e), "{kind:?} {shown:?}");
            for cut in 0..input.len() {
                let got = parse_reply(kind, &input[..cut], limits);
                assert!(
                    got == Ok(Status::Partial) || got == Err(*e),
                    "{kind:?} {shown:?} cut at {cut}: {got:?}"
                );
            }
        }
    }
}

fn ok(r: Reply<'static>, input: &[u8]) -> Want {
    Want::Ok(r, input.len())
}

#[test]
fn every_reply_of_every_command() {
    let d = Limits::default();
    #[rustfmt::skip]
    let cases: &[(K, &[u8], Want)] = &[
        (K::Put, b"INSERTED 42\r\n", ok(Reply::Inserted { id: 42 }, b"INSERTED 42\r\n")),
        (K::Put, b"INSERTED 0\r\n", ok(Reply::Inserted { id: 0 }, b"INSERTED 0\r\n")),
        (K::Put, b"INSERTED 18446744073709551615\r\n", ok(Reply::Inserted { id: u64::MAX }, b"INSERTED 18446744073709551615\r\n")),
        (K::Put, b"BURIED 42\r\n", ok(Reply::InsertedBuried { id: 42 }, b"BURIED 42\r\n")),
        (K::Put, b"EXPECTED_CRLF\r\n", ok(Reply::ExpectedCrlf, b"EXPECTED_CRLF\r\n")),
        (K::Put, b"JOB_TOO_BIG\r\n", ok(Reply::JobTooBig, b"JOB_TOO_BIG\r\n")),
        (K::Put, b"DRAINING\r\n", ok(Reply::Draining, b"DRAINING\r\n")),
        (K::Use, b"USING default\r\n", ok(Reply::Using { tube: "default" }, b"USING default\r\n")),
        (K::Use, b"USING a-b+c/d;e.f$g_h(i)0\r\n", ok(Reply::Using { tube: "a-b+c/d;e.f$g_h(i)0" }, b"USING a-b+c/d;e.f$g_h(i)0\r\n")),
        (K::ListTubeUsed, b"USING x\r\n", ok(Reply::Using { tube: "x" }, b"USING x\r\n")),
        (K::Reserve, b"RESERVED 7 5\r\nhello\r\n", ok(Reply::Reserved { id: 7, body: b"hello" }, b"RESERVED 7 5\r\nhello\r\n")),
        (K::Reserve, b"RESERVED 7 0\r\n\r\n", ok(Reply::Reserved { id: 7, body: b"" }, b"RESERVED 7 0\r\n\r\n")),
        (K::Reserve, b"RESERVED 1 6\r\n\r\n\0\r\n\n\r\n", ok(Reply::Reserved { id: 1, body: b"\r\n\0\r\n\n" }, b"RESERVED 1 6\r\n\r\n\0\r\n\n\r\n")),
        (K::Reserve, b"DEADLINE_SOON\r\n", ok(Reply::DeadlineSoon, b"DEADLINE_SOON\r\n")),
        (RWT, b"RESERVED 9 2\r\nhi\r\n", ok(Reply::Reserved { id: 9, body: b"hi" }, b"RESERVED 9 2\r\nhi\r\n")),
        (RWT, b"DEADLINE_SOON\r\n", ok(Reply::DeadlineSoon, b"DEADLINE_SOON\r\n")),
        (RWT, b"TIMED_OUT\r\n", ok(Reply::TimedOut, b"TIMED_OUT\r\n")),
        (K::ReserveJob, b"RESERVED 3 1\r\nx\r\n", ok(Reply::Reserved { id: 3, body: b"x" }, b"RESERVED 3 1\r\nx\r\n")),
        (K::ReserveJob, b"NOT_FOUND\r\n", ok(Reply::NotFound, b"NOT_FOUND\r\n")),
        (K::Delete, b"DELETED\r\n", ok(Reply::Deleted, b"DELETED\r\n")),
        (K::Delete, b"NOT_FOUND\r\n", ok(Reply::NotFound, b"NOT_FOUND\r\n")),
        (K::Release, b"RELEASED\r\n", ok(Reply::Released, b"RELEASED\r\n")),
        (K::Release, b"BURIED\r\n", ok(Reply::Buried, b"BURIED\r\n")),
        (K::Release, b"NOT_FOUND\r\n", ok(Reply::NotFound, b"NOT_FOUND\r\n")),
        (K::Bury, b"BURIED\r\n", ok(Reply::Buried, b"BURIED\r\n")),
        (K::Bury, b"NOT_FOUND\r\n", ok(Reply::NotFound, b"NOT_FOUND\r\n")),
        (K::Touch, b"TOUCHED\r\n", ok(Reply::Touched, b"TOUCHED\r\n")),
        (K::Touch, b"NOT_FOUND\r\n", ok(Reply::NotFound, b"NOT_FOUND\r\n")),
        (K::Watch, b"WATCHING 2\r\n", ok(Reply::Watching { count: 2 }, b"WATCHING 2\r\n")),
        (K::Ignore, b"WATCHING 1\r\n", ok(Reply::Watching { count: 1 }, b"WATCHING 1\r\n")),
        (K::Ignore, b"NOT_IGNORED\r\n", ok(Reply::NotIgnored, b"NOT_IGNORED\r\n")),
        (K::Peek, b"FOUND 5 3\r\nabc\r\n", ok(Reply::Found { id: 5, body: b"abc" }, b"FOUND 5 3\r\nabc\r\n")),
        (K::Peek, b"NOT_FOUND\r\n", ok(Reply::NotFound, b"NOT_FOUND\r\n")),
        (K::PeekReady, b"FOUND 5 2\r\n\r\n\r\n", ok(Reply::Found { id: 5, body: b"\r\n" }, b"FOUND 5 2\r\n\r\n\r\n")),
        (K::PeekReady, b"NOT_FOUND\r\n", ok(Reply::NotFound, b"NOT_FOUND\r\n")),
        (K::PeekDelayed, b"FOUND 6 1\r\n\0\r\n", ok(Reply::Found { id: 6, body: b"\0" }, b"FOUND 6 1\r\n\0\r\n")),
        (K::PeekDelayed, b"NOT_FOUND\r\n", ok(Reply::NotFound, b"NOT_FOUND\r\n")),
        (K::PeekBuried, b"FOUND 7 0\r\n\r\n", ok(Reply::Found { id: 7, body: b"" }, b"FOUND 7 0\r\n\r\n")),
        (K::PeekBuried, b"NOT_FOUND\r\n", ok(Reply::NotFound, b"NOT_FOUND\r\n")),
        (K::Kick, b"KICKED 3\r\n", ok(Reply::Kicked { count: 3 }, b"KICKED 3\r\n")),
        (K::Kick, b"KICKED 0\r\n", ok(Reply::Kicked { count: 0 }, b"KICKED 0\r\n")),
        (K::KickJob, b"KICKED\r\n", ok(Reply::KickedJob, b"KICKED\r\n")),
        (K::KickJob, b"NOT_FOUND\r\n", ok(Reply::NotFound, b"NOT_FOUND\r\n")),
        (K::Stats, b"OK 9\r\n---\na: 1\n\r\n", ok(Reply::Ok { yaml: b"---\na: 1\n" }, b"OK 9\r\n---\na: 1\n\r\n")),
        (K::StatsJob, b"OK 4\r\n---\n\r\n", ok(Reply::Ok { yaml: b"---\n" }, b"OK 4\r\n---\n\r\n")),
        (K::StatsJob, b"NOT_FOUND\r\n", ok(Reply::NotFound, b"NOT_FOUND\r\n")),
        (K::StatsTube, b"OK 4\r\n---\n\r\n", ok(Reply::Ok { yaml: b"---\n" }, b"OK 4\r\n---\n\r\n")),
        (K::StatsTube, b"NOT_FOUND\r\n", ok(Reply::NotFound, b"NOT_FOUND\r\n")),
        (K::ListTubes, b"OK 14\r\n---\n- default\n\r\n", ok(Reply::Ok { yaml: b"---\n- default\n" }, b"OK 14\r\n---\n- default\n\r\n")),
        (K::ListTubesWatched, b"OK 8\r\n---\n- a\n\r\n", ok(Reply::Ok { yaml: b"---\n- a\n" }, b"OK 8\r\n---\n- a\n\r\n")),
        (K::PauseTube, b"PAUSED\r\n", ok(Reply::Paused, b"PAUSED\r\n")),
        (K::PauseTube, b"NOT_FOUND\r\n", ok(Reply::NotFound, b"NOT_FOUND\r\n")),
        // Pipelined: only the first reply is consumed.
        (K::Delete, b"DELETED\r\nINSERTED 1\r\n", Want::Ok(Reply::Deleted, 9)),
        (K::Reserve, b"RESERVED 1 1\r\nx\r\nRESERVED", Want::Ok(Reply::Reserved { id: 1, body: b"x" }, 17)),
    ];
    for (kind, input, want) in cases {
        check(*kind, input, &d, want);
    }
}

const ALL_KINDS: &[K] = &K::ALL;

#[test]
fn server_errors_answer_any_command() {
    #[rustfmt::skip]
    let cases: &[(&[u8], Reply<'static>)] = &[
        (b"OUT_OF_MEMORY\r\n", Reply::OutOfMemory),
        (b"INTERNAL_ERROR\r\n", Reply::InternalError),
        (b"BAD_FORMAT\r\n", Reply::BadFormat),
        (b"UNKNOWN_COMMAND\r\n", Reply::UnknownCommand),
    ];
    for kind in ALL_KINDS {
        for (input, reply) in cases {
            check(*kind, input, &Limits::default(), &ok(*reply, input));
            assert!(reply.is_server_error());
        }
    }
}

#[test]
fn replies_refused_for_the_wrong_command() {
    // Each word is tried against every command; it must decode for exactly the
    // commands docs/protocol.md lists and be UnexpectedReply (or, for the words whose
    // arguments depend on the command, Malformed) for every other.
    #[rustfmt::skip]
    let words: &[(&[u8], &[K])] = &[
        (b"INSERTED 1\r\n", &[K::Put]),
        (b"BURIED 1\r\n", &[K::Put]),
        (b"BURIED\r\n", &[K::Release, K::Bury]),
        (b"EXPECTED_CRLF\r\n", &[K::Put]),
        (b"JOB_TOO_BIG\r\n", &[K::Put]),
        (b"DRAINING\r\n", &[K::Put]),
        (b"USING t\r\n", &[K::Use, K::ListTubeUsed]),
        (b"RESERVED 1 1\r\nx\r\n", &[K::Reserve, RWT, K::ReserveJob]),
        (b"DEADLINE_SOON\r\n", &[K::Reserve, RWT]),
        (b"TIMED_OUT\r\n", &[RWT]),
        (b"DELETED\r\n", &[K::Delete]),
        (b"NOT_FOUND\r\n", &[K::ReserveJob, K::Delete, K::Release, K::Bury, K::Touch, K::Peek, K::PeekReady, K::PeekDelayed, K::PeekBuried, K::KickJob, K::StatsJob, K::StatsTube, K::PauseTube]),
        (b"RELEASED\r\n", &[K::Release]),
        (b"TOUCHED\r\n", &[K::Touch]),
        (b"WATCHING 1\r\n", &[K::Watch, K::Ignore]),
        (b"NOT_IGNORED\r\n", &[K::Ignore]),
        (b"FOUND 1 1\r\nx\r\n", &[K::Peek, K::PeekReady, K::PeekDelayed, K::PeekBuried]),
        (b"KICKED 1\r\n", &[K::Kick]),
        (b"KICKED\r\n", &[K::KickJob]),
        (b"OK 4\r\n---\n\r\n", &[K::Stats, K::StatsJob, K::StatsTube, K::ListTubes, K::ListTubesWatched]),
        (b"PAUSED\r\n", &[K::PauseTube]),
    ];
    let d = Limits::default();
    for (input, allowed) in words {
        for kind in ALL_KINDS {
            let got = parse_reply(*kind, input, &d);
            let shown = String::from_utf8_lossy(input);
            if allowed.contains(kind) {
                assert!(
                    matches!(got, Ok(Status::Complete(_, n)) if n == input.len()),
                    "{kind:?} {shown:?}: {got:?}"
                );
            } else {
                assert!(
                    matches!(
                        got,
                        Err(E::UnexpectedReply { .. }) | Err(E::Malformed { .. })
                    ),
                    "{kind:?} {shown:?} must be refused: {got:?}"
                );
            }
        }
    }
}

#[test]
fn every_reply_error() {
    let d = Limits::default();
    let long_unended = [b'A'; 224];
    let mut long_line = vec![b'A'; 223];
    long_line.extend_from_slice(b"\r\n"); // 225 bytes: one over
    let mut max_line = b"INSERTED ".to_vec();
    max_line.extend_from_slice(&[b'0'; 213]);
    max_line.extend_from_slice(b"\r\n"); // exactly 224: framed, then refused as a number
    assert_eq!(max_line.len(), 224);
    let mut long_tube = b"USING ".to_vec();
    long_tube.extend_from_slice(&[b'a'; 201]);
    long_tube.extend_from_slice(b"\r\n");
    #[rustfmt::skip]
    let cases: &[(K, &[u8], Limits, Want)] = &[
        // Line framing.
        (K::Put, &long_unended, d, Bad(E::LineTooLong)),
        (K::Put, &long_line, d, Bad(E::LineTooLong)),
        (K::Put, &max_line, d, Bad(E::BadNumber)),
        (K::Put, b"INSERTED 1\n", d, Bad(E::BadLineEnd)),
        (K::Put, b"\n", d, Bad(E::BadLineEnd)),
        (K::Delete, b"DELETED\n\r\n", d, Bad(E::BadLineEnd)),
        // Unknown words.
        (K::Put, b"HELLO\r\n", d, Bad(E::UnknownReply)),
        (K::Put, b"inserted 1\r\n", d, Bad(E::UnknownReply)),
        (K::Delete, b"\r\n", d, Bad(E::UnknownReply)),
        (K::Delete, b" DELETED\r\n", d, Bad(E::UnknownReply)),
        (K::Delete, b"DELETED\r\r\n", d, Bad(E::UnknownReply)),
        // A word that cannot answer this command.
        (K::Delete, b"BURIED\r\n", d, Bad(E::UnexpectedReply { word: "BURIED" })),
        (K::Delete, b"KICKED\r\n", d, Bad(E::UnexpectedReply { word: "KICKED" })),
        (K::Delete, b"INSERTED 1\r\n", d, Bad(E::UnexpectedReply { word: "INSERTED" })),
        (K::Put, b"TIMED_OUT\r\n", d, Bad(E::UnexpectedReply { word: "TIMED_OUT" })),
        (K::Reserve, b"TIMED_OUT\r\n", d, Bad(E::UnexpectedReply { word: "TIMED_OUT" })),
        (K::ReserveJob, b"DEADLINE_SOON\r\n", d, Bad(E::UnexpectedReply { word: "DEADLINE_SOON" })),
        (K::Reserve, b"FOUND 1 1\r\nx\r\n", d, Bad(E::UnexpectedReply { word: "FOUND" })),
        (K::Peek, b"RESERVED 1 1\r\nx\r\n", d, Bad(E::UnexpectedReply { word: "RESERVED" })),
        (K::Use, b"WATCHING 1\r\n", d, Bad(E::UnexpectedReply { word: "WATCHING" })),
        (K::Watch, b"USING a\r\n", d, Bad(E::UnexpectedReply { word: "USING" })),
        (K::Stats, b"NOT_FOUND\r\n", d, Bad(E::UnexpectedReply { word: "NOT_FOUND" })),
        (K::Use, b"OK 1\r\nx\r\n", d, Bad(E::UnexpectedReply { word: "OK" })),
        (K::Quit, b"DELETED\r\n", d, Bad(E::UnexpectedReply { word: "DELETED" })),
        // BURIED <id> vs BURIED, KICKED <n> vs KICKED.
        (K::Put, b"BURIED\r\n", d, Bad(E::Malformed { word: "BURIED" })),
        (K::Bury, b"BURIED 5\r\n", d, Bad(E::Malformed { word: "BURIED" })),
        (K::Release, b"BURIED 5\r\n", d, Bad(E::Malformed { word: "BURIED" })),
        (K::Kick, b"KICKED\r\n", d, Bad(E::Malformed { word: "KICKED" })),
        (K::KickJob, b"KICKED 3\r\n", d, Bad(E::Malformed { word: "KICKED" })),
        // Missing, extra or badly spaced arguments.
        (K::Put, b"INSERTED\r\n", d, Bad(E::Malformed { word: "INSERTED" })),
        (K::Put, b"INSERTED 1 2\r\n", d, Bad(E::Malformed { word: "INSERTED" })),
        (K::Put, b"INSERTED 1 \r\n", d, Bad(E::Malformed { word: "INSERTED" })),
        (K::Delete, b"DELETED 1\r\n", d, Bad(E::Malformed { word: "DELETED" })),
        (K::Delete, b"DELETED \r\n", d, Bad(E::Malformed { word: "DELETED" })),
        (K::Reserve, b"RESERVED 1\r\n", d, Bad(E::Malformed { word: "RESERVED" })),
        (K::Reserve, b"RESERVED 1 2 3\r\n", d, Bad(E::Malformed { word: "RESERVED" })),
        (K::Reserve, b"RESERVED 1  2\r\n", d, Bad(E::Malformed { word: "RESERVED" })),
        (K::Peek, b"FOUND\r\n", d, Bad(E::Malformed { word: "FOUND" })),
        (K::Stats, b"OK\r\n", d, Bad(E::Malformed { word: "OK" })),
        (K::Stats, b"OK 1 2\r\n", d, Bad(E::Malformed { word: "OK" })),
        (K::Watch, b"WATCHING\r\n", d, Bad(E::Malformed { word: "WATCHING" })),
        (K::Use, b"USING\r\n", d, Bad(E::Malformed { word: "USING" })),
        (K::Use, b"USING \r\n", d, Bad(E::Malformed { word: "USING" })),
        (K::Use, b"USING a b\r\n", d, Bad(E::Malformed { word: "USING" })),
        (K::Use, b"USING caf\xc3\xa9\r\n", d, Bad(E::Malformed { word: "USING" })),
        (K::Use, &long_tube, d, Bad(E::Malformed { word: "USING" })),
        // Numbers: unsigned decimal that fits.
        (K::Put, b"INSERTED \r\n", d, Bad(E::BadNumber)),
        (K::Put, b"INSERTED -1\r\n", d, Bad(E::BadNumber)),
        (K::Put, b"INSERTED +1\r\n", d, Bad(E::BadNumber)),
        (K::Put, b"INSERTED 1a\r\n", d, Bad(E::BadNumber)),
        (K::Put, b"INSERTED 0x10\r\n", d, Bad(E::BadNumber)),
        (K::Put, b"INSERTED 18446744073709551616\r\n", d, Bad(E::BadNumber)),
        (K::Put, b"BURIED 99999999999999999999\r\n", d, Bad(E::BadNumber)),
        (K::Watch, b"WATCHING 123456789012345678901\r\n", d, Bad(E::BadNumber)),
        (K::Kick, b"KICKED x\r\n", d, Bad(E::BadNumber)),
        (K::Reserve, b"RESERVED x 1\r\n", d, Bad(E::BadNumber)),
        (K::Reserve, b"RESERVED 1 -1\r\n", d, Bad(E::BadNumber)),
        (K::Peek, b"FOUND 1 18446744073709551616\r\n", d, Bad(E::BadNumber)),
        (K::Stats, b"OK 1.5\r\n", d, Bad(E::BadNumber)),
        // Byte counts beyond the configured maximum.
        (K::Reserve, b"RESERVED 1 11\r\n", small(), Bad(E::BodyTooLarge { len: 11, max: 10 })),
        (K::Peek, b"FOUND 1 18446744073709551615\r\n", small(), Bad(E::BodyTooLarge { len: u64::MAX, max: 10 })),
        (K::Stats, b"OK 21\r\n", small(), Bad(E::BodyTooLarge { len: 21, max: 20 })),
        (K::Reserve, b"RESERVED 1 65536\r\n", d, Bad(E::BodyTooLarge { len: 65536, max: 65535 })),
        // The body must be followed by CRLF.
        (K::Reserve, b"RESERVED 1 2\r\nabXY", d, Bad(E::MissingBodyCrlf)),
        (K::Reserve, b"RESERVED 1 2\r\nab\rX", d, Bad(E::MissingBodyCrlf)),
        (K::Reserve, b"RESERVED 1 2\r\nab\n\r", d, Bad(E::MissingBodyCrlf)),
        (K::Peek, b"FOUND 1 1\r\nxy\r\n", d, Bad(E::MissingBodyCrlf)),
        (K::Stats, b"OK 3\r\n---\n\r\n", d, Bad(E::MissingBodyCrlf)),
    ];
    for (kind, input, limits, want) in cases {
        check(*kind, input, limits, want);
    }
}

#[test]
fn bodies_at_the_limit_are_accepted() {
    let lim = small();
    #[rustfmt::skip]
    let cases: &[(K, &[u8], Want)] = &[
        (K::Reserve, b"RESERVED 1 10\r\n0123456789\r\n", ok(Reply::Reserved { id: 1, body: b"0123456789" }, b"RESERVED 1 10\r\n0123456789\r\n")),
        (K::Peek, b"FOUND 2 10\r\n\r\n\r\n\r\n\r\n\r\n\r\n", ok(Reply::Found { id: 2, body: b"\r\n\r\n\r\n\r\n\r\n" }, b"FOUND 2 10\r\n\r\n\r\n\r\n\r\n\r\n\r\n")),
        (K::Stats, b"OK 20\r\n---\nabcdefghijklmnop\r\n", ok(Reply::Ok { yaml: b"---\nabcdefghijklmnop" }, b"OK 20\r\n---\nabcdefghijklmnop\r\n")),
    ];
    for (kind, input, want) in cases {
        check(*kind, input, &lim, want);
    }
}

#[test]
fn absurd_limits_do_not_overflow() {
    let lim = Limits {
        max_job_size: usize::MAX,
        max_yaml_size: usize::MAX,
    };
    let input = b"RESERVED 1 18446744073709551615\r\nab";
    for cut in 0..=input.len() {
        assert_eq!(
            parse_reply(K::Reserve, &input[..cut], &lim),
            Ok(Status::Partial)
        );
    }
}
