//! The `NATS/1.0` header block of an `HMSG`: an optional status line and
//! `Key: value` lines, read in place.

use memchr::{memchr, memchr2};

use super::error::NatsProtoError;
use super::span::Span;

const VERSION: &[u8] = b"NATS/1.0";

/// Where the first `\r\n` in `s` starts (as `memmem::find(s, b"\r\n")`,
/// by the vectorized search for `\n`: every delivery's headers are read
/// through here).
fn crlf(s: &[u8]) -> Option<usize> {
    let mut from = 0;
    loop {
        let k = from + memchr(b'\n', &s[from..])?;
        if k > 0 && s[k - 1] == b'\r' {
            return Some(k - 1);
        }
        from = k + 1;
    }
}

/// A validated header block borrowing its bytes.
///
/// ```
/// use taskq_proto::nats::HeaderBlock;
/// let h = HeaderBlock::parse(b"NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: 1\r\n\r\n").unwrap();
/// assert_eq!(h.status(), Some(408));
/// assert_eq!(h.description(), b"Request Timeout");
/// assert_eq!(h.get(b"nats-pending-messages"), Some(&b"1"[..]));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderBlock<'a> {
    raw: &'a [u8],
    status: u16,
    desc: Span,
}

impl<'a> HeaderBlock<'a> {
    /// Validates a whole header block, final empty line included.
    pub fn parse(raw: &'a [u8]) -> Result<HeaderBlock<'a>, NatsProtoError> {
        let (status, desc) = HeaderBlock::scan(raw)?;
        Ok(HeaderBlock { raw, status, desc })
    }

    /// A block [`scan`](Self::scan) accepted, from what it found.
    pub(crate) fn from_parts(raw: &'a [u8], status: u16, desc: Span) -> HeaderBlock<'a> {
        HeaderBlock { raw, status, desc }
    }

    /// Validates `raw`; gives its status (0 for none) and where the status
    /// description is in it.
    pub(crate) fn scan(raw: &[u8]) -> Result<(u16, Span), NatsProtoError> {
        let bad = NatsProtoError::BadHeaders;
        if !raw.starts_with(VERSION) || !raw.ends_with(b"\r\n\r\n") {
            return Err(bad);
        }
        let first = crlf(raw).ok_or(bad)?;
        let mut i = VERSION.len();
        let mut status = 0u16;
        let mut desc = Span {
            start: first,
            end: first,
        };
        if i < first {
            if raw[i] != b' ' {
                return Err(bad);
            }
            while i < first && raw[i] == b' ' {
                i += 1;
            }
            let digits = &raw[i..first.min(i + 3)];
            if digits.len() != 3 || !digits.iter().all(u8::is_ascii_digit) {
                return Err(bad);
            }
            status = digits
                .iter()
                .fold(0u16, |n, &d| n * 10 + u16::from(d - b'0'));
            i += 3;
            if i < first && raw[i] != b' ' {
                return Err(bad);
            }
            while i < first && raw[i] == b' ' {
                i += 1;
            }
            let mut end = first;
            while end > i && raw[end - 1] == b' ' {
                end -= 1;
            }
            desc = Span { start: i, end };
        }
        if memchr2(b'\r', b'\n', &raw[..first]).is_some() {
            return Err(bad);
        }
        // The header lines, up to the final empty one.
        let mut at = first + 2;
        let last = raw.len() - 2;
        while at < last {
            let len = crlf(&raw[at..]).ok_or(bad)?;
            let line = &raw[at..at + len];
            let colon = memchr(b':', line).ok_or(bad)?;
            if colon == 0 || memchr2(b'\r', b'\n', line).is_some() {
                return Err(bad);
            }
            at += len + 2;
        }
        if at != last {
            return Err(bad);
        }
        Ok((status, desc))
    }

    /// The status code of the first line (`NATS/1.0 503`), if it has one.
    pub fn status(&self) -> Option<u16> {
        (self.status != 0).then_some(self.status)
    }

    /// The status description (`No Messages`); empty when there is none.
    pub fn description(&self) -> &'a [u8] {
        self.desc.of(self.raw)
    }

    /// The first value of header `name`, compared case-insensitively, without
    /// the blanks around it.
    pub fn get(&self, name: &[u8]) -> Option<&'a [u8]> {
        self.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    }

    /// Every `(name, value)` pair, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + 'a {
        let raw = self.raw;
        let first = crlf(raw).unwrap_or(raw.len());
        let mut rest = &raw[(first + 2).min(raw.len())..];
        // Each line up to its `\n` (found vectorized), as `Key: value`.
        std::iter::from_fn(move || loop {
            if rest.is_empty() {
                return None;
            }
            let (l, next) = match memchr(b'\n', rest) {
                Some(k) => (&rest[..k], &rest[k + 1..]),
                None => (rest, &rest[rest.len()..]),
            };
            rest = next;
            let Some(l) = l.strip_suffix(b"\r") else {
                continue;
            };
            let Some(colon) = memchr(b':', l) else {
                continue;
            };
            return Some((trim(&l[..colon]), trim(&l[colon + 1..])));
        })
    }

    /// The whole block as it came.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.raw
    }
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `crlf` finds what a substring search for `\r\n` finds, on every
    /// string of up to six bytes over `\r`, `\n` and `a`.
    #[test]
    fn crlf_finds_the_first_cr_lf_as_a_substring_search_does() {
        let alphabet = [b'\r', b'\n', b'a'];
        for len in 0..=6u32 {
            for mut n in 0..3usize.pow(len) {
                let mut s = Vec::new();
                for _ in 0..len {
                    s.push(alphabet[n % 3]);
                    n /= 3;
                }
                assert_eq!(crlf(&s), memchr::memmem::find(&s, b"\r\n"), "{s:?}");
            }
        }
    }

    /// The header lines read as before: a line without `\r` or `:` is
    /// skipped, names and values trimmed, the status line not a header.
    #[test]
    fn header_lines_are_read_in_order_skipping_what_is_no_header() {
        let raw = b"NATS/1.0 100 Idle\r\nA: 1\r\nB:2 \r\n  C :  x y \r\n\r\n";
        let h = HeaderBlock::parse(raw).unwrap();
        let all: Vec<_> = h.iter().collect();
        assert_eq!(all, [(&b"A"[..], &b"1"[..]), (b"B", b"2"), (b"C", b"x y")]);
        assert_eq!(h.get(b"c"), Some(&b"x y"[..]));
        let odd = HeaderBlock::from_parts(
            b"NATS/1.0\r\nno colon\r\nD: 4\nE: 5\r\n",
            0,
            Span::default(),
        );
        assert_eq!(odd.iter().collect::<Vec<_>>(), [(&b"E"[..], &b"5"[..])]);
    }
}
