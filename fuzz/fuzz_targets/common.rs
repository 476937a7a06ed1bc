//! Shared by the reply targets: which command a reply answers, and the limits.

use taskq_proto::{CommandKind as K, Limits};

/// Every command kind; the first input byte picks one.
pub const KINDS: &[K] = &K::ALL;

/// Small limits, so that the fuzzer reaches the size checks with short inputs.
pub const LIMITS: Limits = Limits {
    max_job_size: 300,
    max_yaml_size: 500,
};

/// The command kind for a selector byte.
pub fn kind(b: u8) -> K {
    KINDS[usize::from(b) % KINDS.len()]
}
