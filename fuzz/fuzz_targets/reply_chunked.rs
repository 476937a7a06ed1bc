//! A stream of pipelined replies fed in fuzzer-chosen pieces, as a connection
//! receives it: the sequence of replies (and the error that ends it, if any)
//! must equal what parsing the whole stream at once gives.
#![no_main]

use libfuzzer_sys::fuzz_target;
use taskq_proto::{parse_reply, CommandKind, Reply, ReplyError, Status};

mod common;

/// What a reader makes of `input`, receiving it up to each of `ends` in turn.
fn read_stream<'a>(
    kind: CommandKind,
    input: &'a [u8],
    ends: &[usize],
) -> Vec<Result<(Reply<'a>, usize), ReplyError>> {
    let mut out = Vec::new();
    let mut start = 0;
    for &end in ends {
        loop {
            match parse_reply(kind, &input[start..end], &common::LIMITS) {
                Ok(Status::Complete(r, n)) => {
                    assert!(n > 0 && start + n <= end);
                    out.push(Ok((r, n)));
                    start += n;
                }
                Ok(Status::Partial) => break,
                Err(e) => {
                    out.push(Err(e));
                    return out;
                }
            }
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let [sel, ncuts, rest @ ..] = data else {
        return;
    };
    let ncuts = usize::from(*ncuts % 16).min(rest.len());
    let (cuts, input) = rest.split_at(ncuts);
    let kind = common::kind(*sel);
    let mut ends: Vec<usize> = cuts
        .iter()
        .map(|&c| usize::from(c) * input.len() / 255)
        .collect();
    ends.push(input.len());
    ends.sort_unstable();
    let whole = read_stream(kind, input, &[input.len()]);
    let chunked = read_stream(kind, input, &ends);
    assert_eq!(whole, chunked);
});
