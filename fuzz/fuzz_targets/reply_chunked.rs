//! A stream of pipelined replies fed in fuzzer-chosen pieces, as a connection
//! receives it: the sequence of replies (and the error that ends it, if any)
//! must equal what parsing the whole stream at once gives.
#![no_main]

use libfuzzer_sys::fuzz_target;
use taskq_proto::parse_reply;

mod common;

fuzz_target!(|data: &[u8]| {
    let [sel, ncuts, rest @ ..] = data else {
        return;
    };
    let (input, ends) = common::pieces(*ncuts, rest);
    let kind = common::kind(*sel);
    let read = |ends: &[usize]| {
        common::read_pieces(input, ends, |b| parse_reply(kind, b, &common::LIMITS))
    };
    let whole = read(&[input.len()]);
    let chunked = read(&ends);
    assert_eq!(whole, chunked);
});
