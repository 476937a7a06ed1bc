//! The stats YAML readers on any bytes: never a panic, and every key, value and
//! item returned is a slice of the input (nothing invented, nothing copied).
#![no_main]

use libfuzzer_sys::fuzz_target;
use taskq_proto::yaml::{items, pairs};
use taskq_proto::{JobStats, ServerStats, TubeStats};

fn inside(input: &[u8], s: &str) {
    let outer = input.as_ptr_range();
    let r = s.as_bytes().as_ptr_range();
    assert!(s.is_empty() || (outer.start <= r.start && r.end <= outer.end));
}

fuzz_target!(|input: &[u8]| {
    if let Ok(it) = pairs(input) {
        for (k, v) in it.flatten() {
            assert!(!k.is_empty());
            inside(input, k);
            inside(input, v);
        }
    }
    if let Ok(it) = items(input) {
        for item in it.flatten() {
            inside(input, item);
        }
    }
    if let Ok(s) = ServerStats::parse(input) {
        for text in [s.version, s.id, s.hostname, s.os, s.platform] {
            inside(input, text);
        }
    }
    if let Ok(t) = TubeStats::parse(input) {
        inside(input, t.name);
    }
    if let Ok(j) = JobStats::parse(input) {
        inside(input, j.tube);
        inside(input, j.state);
    }
});
