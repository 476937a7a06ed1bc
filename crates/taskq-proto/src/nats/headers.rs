//! The `NATS/1.0` header block of an `HMSG`: an optional status line and
//! `Key: value` lines, read in place.

use memchr::memmem;

use super::error::NatsProtoError;
use super::span::Span;

const VERSION: &[u8] = b"NATS/1.0";

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
        let first = memmem::find(raw, b"\r\n").ok_or(bad)?;
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
        if raw[..first].iter().any(|&b| b == b'\r' || b == b'\n') {
            return Err(bad);
        }
        // The header lines, up to the final empty one.
        let mut at = first + 2;
        let last = raw.len() - 2;
        while at < last {
            let len = memmem::find(&raw[at..], b"\r\n").ok_or(bad)?;
            let line = &raw[at..at + len];
            let colon = memchr::memchr(b':', line).ok_or(bad)?;
            if colon == 0 || line.iter().any(|&b| b == b'\r' || b == b'\n') {
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
        let first = memmem::find(raw, b"\r\n").unwrap_or(raw.len());
        raw[(first + 2).min(raw.len())..]
            .split(|&b| b == b'\n')
            .filter_map(|l| {
                let l = l.strip_suffix(b"\r")?;
                let colon = memchr::memchr(b':', l)?;
                Some((trim(&l[..colon]), trim(&l[colon + 1..])))
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
