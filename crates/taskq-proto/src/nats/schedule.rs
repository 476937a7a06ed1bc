//! Delays held by the server: JetStream message schedules (nats-server
//! 2.12 and later).
//!
//! A stream with `allow_msg_schedules` takes a message published to one of
//! its subjects with `Nats-Schedule: @at <RFC 3339 time>` and
//! `Nats-Schedule-Target: <subject>`, keeps it, and at that time publishes
//! its body (and its other headers) to the target, in the same stream, then
//! removes it. The schedule is named by its subject: a newer schedule on the
//! same subject replaces the older one, so each delayed job gets a subject of
//! its own (see `Layout::delayed_subject` in `taskq-connect`).
//!
//! The time is written in whole seconds and rounded up, so that a job is
//! never made ready before its delay is over.

/// The header naming when a schedule fires: `@at <RFC 3339 time>`.
pub const SCHEDULE_HEADER: &[u8] = b"Nats-Schedule";
/// The header naming the subject a schedule publishes to when it fires.
pub const SCHEDULE_TARGET_HEADER: &[u8] = b"Nats-Schedule-Target";
/// The header the server puts on a message a schedule published: the
/// schedule's subject.
pub const SCHEDULER_HEADER: &[u8] = b"Nats-Scheduler";

/// The first nats-server release with message schedules, as (major, minor).
pub const SCHEDULES_SINCE: (u64, u64) = (2, 12);

/// True when a server of `version` (its `INFO`'s `version`, `2.12.0`,
/// `2.15.1`, `2.12.0-RC.1`) holds message schedules: 2.12 or later. An
/// unreadable version is taken for an older server.
pub fn holds_schedules(version: &str) -> bool {
    let mut parts = version.split('.');
    let mut number = || -> Option<u64> {
        let part = parts.next()?;
        let digits = part.bytes().take_while(u8::is_ascii_digit).count();
        part[..digits].parse().ok()
    };
    match (number(), number()) {
        (Some(major), Some(minor)) => (major, minor) >= SCHEDULES_SINCE,
        _ => false,
    }
}

/// The Unix second a job ready at `ready_ms` (Unix milliseconds) is
/// scheduled for: rounded up to the whole second, never before it.
pub fn schedule_secs(ready_ms: u64) -> u64 {
    ready_ms.div_ceil(1000)
}

/// The latest time written: 9999-12-31T23:59:59Z.
const LAST_SECOND: u64 = 253_402_300_799;

/// `YYYY-MM-DDTHH:MM:SSZ`, the RFC 3339 form of Unix second `secs` in UTC
/// (times past the year 9999 are written as its last second).
pub fn rfc3339_utc(secs: u64) -> [u8; 20] {
    let secs = secs.min(LAST_SECOND);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days);
    let mut out = *b"0000-00-00T00:00:00Z";
    let mut put = |at: usize, width: usize, mut n: u64| {
        for i in (at..at + width).rev() {
            out[i] = b'0' + (n % 10) as u8;
            n /= 10;
        }
    };
    put(0, 4, y);
    put(5, 2, m);
    put(8, 2, d);
    put(11, 2, rem / 3600);
    put(14, 2, rem % 3600 / 60);
    put(17, 2, rem % 60);
    out
}

/// [`rfc3339_utc`] of time `t`, in whole seconds rounded up: a time handed
/// to the server (a schedule, a consumer's `pause_until`) never comes early.
pub fn rfc3339_utc_at(t: std::time::SystemTime) -> [u8; 20] {
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    rfc3339_utc(d.as_secs() + u64::from(d.subsec_nanos() > 0))
}

/// The date (year, month, day) of a count of days since 1970-01-01, in the
/// proleptic Gregorian calendar.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + u64::from(m <= 2), m, d)
}

/// The `Nats-Schedule` value of a job ready at `ready_ms`, on the stack:
/// `@at ` and the time, rounded up to the whole second.
///
/// ```
/// use taskq_proto::nats::ScheduleAt;
/// // 2026-12-02T00:32:16.001Z is scheduled for the next whole second.
/// let at = ScheduleAt::new(1_796_171_536_001);
/// assert_eq!(at.as_bytes(), b"@at 2026-12-02T00:32:17Z");
/// assert_eq!(at.secs(), 1_796_171_537);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduleAt {
    text: [u8; 24],
    secs: u64,
}

impl ScheduleAt {
    /// The schedule of a job ready at `ready_ms` (Unix milliseconds).
    pub fn new(ready_ms: u64) -> ScheduleAt {
        let secs = schedule_secs(ready_ms);
        let mut text = *b"@at 0000-00-00T00:00:00Z";
        text[4..].copy_from_slice(&rfc3339_utc(secs));
        ScheduleAt { text, secs }
    }

    /// The header value: `@at YYYY-MM-DDTHH:MM:SSZ`.
    pub fn as_bytes(&self) -> &[u8] {
        &self.text
    }

    /// The Unix second it fires at.
    pub fn secs(&self) -> u64 {
        self.secs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_times_round_up_to_the_whole_second_never_down() {
        assert_eq!(schedule_secs(0), 0);
        assert_eq!(schedule_secs(1), 1);
        assert_eq!(schedule_secs(999), 1);
        assert_eq!(schedule_secs(1000), 1);
        assert_eq!(schedule_secs(1001), 2);
        assert_eq!(schedule_secs(1_796_171_536_360), 1_796_171_537);
        assert_eq!(schedule_secs(u64::MAX), u64::MAX / 1000 + 1);
        for ms in (0..5000).chain(1_796_171_530_000..1_796_171_533_000) {
            let s = schedule_secs(ms);
            assert!(s * 1000 >= ms, "{ms} ms scheduled early at {s} s");
            assert!(s * 1000 < ms + 1000, "{ms} ms scheduled a second late");
        }
    }

    #[test]
    fn times_are_written_in_rfc3339_utc() {
        let table: &[(u64, &[u8; 20])] = &[
            (0, b"1970-01-01T00:00:00Z"),
            (951_782_400, b"2000-02-29T00:00:00Z"),
            (1_796_171_537, b"2026-12-02T00:32:17Z"),
            (4_107_542_399, b"2100-02-28T23:59:59Z"),
            (4_107_542_400, b"2100-03-01T00:00:00Z"),
            (LAST_SECOND, b"9999-12-31T23:59:59Z"),
            (u64::MAX, b"9999-12-31T23:59:59Z"),
        ];
        for (secs, want) in table {
            assert_eq!(
                &rfc3339_utc(*secs),
                *want,
                "{secs}: {}",
                String::from_utf8_lossy(&rfc3339_utc(*secs))
            );
        }
    }

    #[test]
    fn the_schedule_header_value() {
        let at = ScheduleAt::new(1_796_171_536_360);
        assert_eq!(at.as_bytes(), b"@at 2026-12-02T00:32:17Z");
        assert_eq!(at.secs(), 1_796_171_537);
        // On the second itself: not rounded further.
        let at = ScheduleAt::new(1_796_171_537_000);
        assert_eq!(at.as_bytes(), b"@at 2026-12-02T00:32:17Z");
        let at = ScheduleAt::new(1_796_171_537_001);
        assert_eq!(at.as_bytes(), b"@at 2026-12-02T00:32:18Z");
    }

    #[test]
    fn servers_from_2_12_hold_schedules() {
        for v in [
            "2.12.0",
            "2.12.0-RC.1",
            "2.14.2",
            "2.15.1",
            "3.0.0",
            "2.100.0",
        ] {
            assert!(holds_schedules(v), "{v}");
        }
        for v in [
            "2.9.10", "2.10.29", "2.11.9", "1.4.1", "", "x", "2", "2.x", "v2.12.0",
        ] {
            assert!(!holds_schedules(v), "{v}");
        }
    }
}
