//! RFC 3339 times in UTC, as JetStream writes and reads them (a stored
//! message's `time`, a consumer's `pause_until`), without a date library.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `2026-05-01T12:00:00Z` (whole seconds, rounded up so a time never comes early).
pub fn format_rfc3339(t: SystemTime) -> String {
    let text = taskq_proto::nats::schedule::rfc3339_utc_at(t);
    String::from_utf8_lossy(&text).into_owned()
}

/// Reads `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)`; `None` for anything else
/// or a time before 1970.
pub fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let n = |r: std::ops::Range<usize>| -> Option<u32> {
        let part = s.get(r)?;
        part.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    let (y, mo, d) = (n(0..4)?, n(5..7)?, n(8..10)?);
    let (h, mi, se) = (n(11..13)?, n(14..16)?, n(17..19)?);
    if b[13] != b':' || b[16] != b':' || !(1..=12).contains(&mo) || !(1..=31).contains(&d) {
        return None;
    }
    if h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let mut rest = &s[19..];
    let mut nanos = 0u32;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let kept = &frac[..digits.min(9)];
        nanos = kept.parse::<u32>().ok()? * 10u32.pow(9 - kept.len() as u32);
        rest = &frac[digits..];
    }
    let offset: i64 = match rest {
        "Z" | "z" => 0,
        _ if rest.len() == 6 && rest.as_bytes()[3] == b':' => {
            let sign = match rest.as_bytes()[0] {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            sign * i64::from(n(19 + 1..19 + 3)? * 3600 + n(19 + 4..19 + 6)? * 60)
        }
        _ => return None,
    };
    let secs =
        days_from_civil(i64::from(y), mo, d) * 86_400 + i64::from(h * 3600 + mi * 60 + se) - offset;
    let secs = u64::try_from(secs).ok()?;
    Some(UNIX_EPOCH + Duration::new(secs, nanos))
}

/// Whole seconds from `then` to `now`, 0 when `then` is later.
pub fn secs_between(then: SystemTime, now: SystemTime) -> u64 {
    now.duration_since(then).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_known_dates() {
        let t = parse_rfc3339("2026-12-01T21:24:51.160973261Z").unwrap();
        let d = t.duration_since(UNIX_EPOCH).unwrap();
        assert_eq!(d.as_secs(), 1_796_160_291);
        assert_eq!(d.subsec_nanos(), 160_973_261);
        assert_eq!(format_rfc3339(t), "2026-12-01T21:24:52Z", "rounded up");
        let whole = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(format_rfc3339(whole), "2000-02-29T00:00:00Z");
        assert_eq!(parse_rfc3339("2000-02-29T00:00:00Z"), Some(whole));
        assert_eq!(
            parse_rfc3339("2000-02-29T02:30:00+02:30"),
            Some(whole),
            "an offset is taken off"
        );
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(UNIX_EPOCH));
        for bad in [
            "",
            "2000-02-29",
            "2000-13-01T00:00:00Z",
            "2000-02-29T00:00:00",
            "2000-02-29T00:00:00.Z",
            "0001-01-01T00:00:00Z",
            "2000-02-29T00:00:00+0200",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
        let later = whole + Duration::from_millis(2500);
        assert_eq!(secs_between(whole, later), 2);
        assert_eq!(secs_between(later, whole), 0);
    }
}
