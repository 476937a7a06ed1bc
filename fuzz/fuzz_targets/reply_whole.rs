//! Any bytes, parsed whole as a reply to each command kind. Invariants: never a
//! panic; `consumed <= len`; a complete reply re-parses from exactly its
//! consumed prefix to the same reply; borrowed parts lie inside that prefix;
//! the prefix one byte short is `Partial`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use taskq_proto::{parse_reply, Reply, Status};

mod common;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, input)) = data.split_first() else {
        return;
    };
    let kind = common::kind(sel);
    let whole = parse_reply(kind, input, &common::LIMITS);
    let Ok(Status::Complete(reply, used)) = whole else {
        return;
    };
    assert!(used > 0 && used <= input.len());
    assert_eq!(parse_reply(kind, &input[..used], &common::LIMITS), whole);
    assert_eq!(
        parse_reply(kind, &input[..used - 1], &common::LIMITS),
        Ok(Status::Partial)
    );
    let part: Option<&[u8]> = match reply {
        Reply::Reserved { body, .. } | Reply::Found { body, .. } => Some(body),
        Reply::Ok { yaml } => Some(yaml),
        Reply::Using { tube } => Some(tube.as_bytes()),
        _ => None,
    };
    if let Some(p) = part {
        let inside = input[..used].as_ptr_range();
        let r = p.as_ptr_range();
        assert!(inside.start <= r.start && r.end <= inside.end);
    }
});
