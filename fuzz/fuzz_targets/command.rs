//! The server side of the codec: a stream of pipelined commands fed in
//! fuzzer-chosen pieces must give the same commands and errors as the whole
//! stream at once (handling each error the way a server does), and every
//! parsed command must survive a round trip through the client's encoder.
#![no_main]

use libfuzzer_sys::fuzz_target;

mod common;
use taskq_proto::server::{encode_reply, parse_command, skip_line, CommandError, Skip};
use taskq_proto::{parse_reply, Command, CommandKind, Limits, Reply, Status};

/// Small, so that the fuzzer reaches the size checks with short inputs.
const MAX_JOB: usize = 300;

enum Mode {
    Command,
    SkipLine,
    Discard(u64),
}

/// What a server makes of `input`, receiving it up to each of `ends` in turn.
fn read_stream<'a>(input: &'a [u8], ends: &[usize]) -> Vec<Result<Command<'a>, CommandError>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut mode = Mode::Command;
    for &end in ends {
        loop {
            match mode {
                Mode::Command => match parse_command(&input[start..end], MAX_JOB) {
                    Ok(Status::Complete(c, n)) => {
                        assert!(n > 0 && start + n <= end);
                        out.push(Ok(c));
                        start += n;
                    }
                    Ok(Status::Partial) => break,
                    Err(e) => {
                        assert!(e.consumed() > 0 && start + e.consumed() <= end);
                        out.push(Err(e));
                        start += e.consumed();
                        mode = match e {
                            CommandError::LineTooLong => Mode::SkipLine,
                            CommandError::JobTooBig { discard, .. } => Mode::Discard(discard),
                            _ => Mode::Command,
                        };
                    }
                },
                Mode::SkipLine => match skip_line(&input[start..end]) {
                    Skip::Done(n) => {
                        start += n;
                        mode = Mode::Command;
                    }
                    Skip::More(0) => break,
                    Skip::More(n) => start += n,
                },
                Mode::Discard(left) => {
                    let here = left.min((end - start) as u64);
                    start += here as usize;
                    if here == left {
                        mode = Mode::Command;
                    } else {
                        mode = Mode::Discard(left - here);
                        break;
                    }
                }
            }
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let [ncuts, rest @ ..] = data else {
        return;
    };
    let (input, ends) = common::pieces(*ncuts, rest);
    let whole = read_stream(input, &[input.len()]);
    let chunked = read_stream(input, &ends);
    assert_eq!(whole, chunked);

    let mut buf = vec![0u8; 1024];
    for cmd in whole.iter().filter_map(|r| r.as_ref().ok()) {
        // Round trip: the client's encoding of what the server parsed parses the same.
        let n = cmd
            .encode(&mut buf, MAX_JOB)
            .expect("a parsed command encodes");
        assert_eq!(
            parse_command(&buf[..n], MAX_JOB),
            Ok(Status::Complete(*cmd, n))
        );
        // And a put's body comes back in a FOUND reply as the client reads it.
        if let Command::Put { body, .. } = *cmd {
            let found = Reply::Found { id: 1, body };
            let n = encode_reply(&found, &mut buf).expect("a body within the limit fits");
            let limits = Limits {
                max_job_size: MAX_JOB,
                max_yaml_size: MAX_JOB,
            };
            assert_eq!(
                parse_reply(CommandKind::Peek, &buf[..n], &limits),
                Ok(Status::Complete(found, n))
            );
        }
    }
});
