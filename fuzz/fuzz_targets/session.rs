//! The beanstalkd session fed fuzzer-chosen server bytes in fuzzer-chosen
//! pieces, as its drivers feed it: a put owed alone on the hot path (read
//! straight into the whole buffer and taken when it is exactly `INSERTED`),
//! or behind it replies owed to fuzzer-chosen commands, with jobs over the
//! limit skipped. The replies it yields, and the error that breaks it, must
//! be what the same bytes read whole give; what is left past the last reply
//! owed must be counted the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use taskq_proto::{Command, Reply, Request, Session};

mod common;

const PUT: Command<'static> = Command::Put {
    pri: 1,
    delay: 0,
    ttr: 60,
    body: b"job",
};

/// A session whose second put (the hot path's, its line kept from the first)
/// is owed, with replies to `kinds` owed behind it; jobs over the limit are
/// skipped when `skip`.
fn session(kinds: &[u8], skip: bool) -> Session {
    let mut s = Session::new(common::LIMITS);
    if skip {
        s.skip_large_jobs();
    }
    for id in [1, 2] {
        let Ok(Request::Whole(bytes)) = s.encode(&PUT) else {
            panic!("a small put is encoded whole");
        };
        assert_eq!(bytes, b"put 1 0 60 3\r\njob\r\n");
        if id == 2 {
            break;
        }
        assert!(s.awaits_lone_put());
        let room = s.put_read_room();
        room[..12].copy_from_slice(b"INSERTED 1\r\n");
        assert_eq!(s.take_inserted(12), Some(1));
    }
    for &k in kinds {
        s.expect_reply(common::kind(k));
    }
    s
}

/// What the session yields when it receives `input` up to each of `ends`.
fn run(kinds: &[u8], skip: bool, input: &[u8], ends: &[usize]) -> Vec<String> {
    let mut s = session(kinds, skip);
    let mut out = Vec::new();
    for (mut piece, end) in common::each_piece(input, ends) {
        loop {
            if s.owed() == 0 {
                // What came past the last reply owed: a driver reconnects.
                let rest = s.buffered() + piece.len() + (input.len() - end);
                out.push(format!("left {rest}"));
                return out;
            }
            if piece.is_empty() {
                break;
            }
            if s.awaits_lone_put() {
                let room = s.put_read_room();
                let n = common::read_into(room, &mut piece);
                if let Some(id) = s.take_inserted(n) {
                    out.push(format!("{:?}", Reply::Inserted { id }));
                    continue;
                }
            } else if let Err(e) = common::receive(&mut s, &mut piece) {
                out.push(e);
                return out;
            }
            while s.owed() > 0 {
                match s.poll_reply() {
                    Ok(Some(r)) => {
                        if let Reply::Reserved { body, .. } = r {
                            assert!(body.len() <= common::LIMITS.max_job_size);
                        }
                        out.push(format!("{r:?}"));
                    }
                    Ok(None) => break,
                    Err(e) => {
                        out.push(format!("{e:?}"));
                        return out;
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
    // Up to 3 commands owed behind the put, and whether to skip large jobs.
    let nkinds = usize::from(mode % 4).min(rest.len());
    let (kinds, rest) = rest.split_at(nkinds);
    let skip = mode & 4 != 0;
    let (input, ends) = common::pieces(*ncuts, rest);
    assert_eq!(
        run(kinds, skip, input, &ends),
        run(kinds, skip, input, &[input.len()])
    );
});
