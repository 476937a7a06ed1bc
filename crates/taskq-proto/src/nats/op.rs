//! Server operations parsed in place: a [`Frame`] of offsets first (what a
//! driver keeps while it consumes the bytes), then [`ServerOp`] values that
//! borrow the buffer.

use memchr::{memchr, memchr2};

use super::error::NatsProtoError;
use super::headers::HeaderBlock;
use super::span::Span;
use super::NatsLimits;
use crate::reply::Status;

/// One decoded server operation, as offsets into the buffer it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame {
    /// `INFO {json}`: the JSON.
    Info(Span),
    /// `MSG` or `HMSG`.
    Msg(MsgFrame),
    /// `PING`.
    Ping,
    /// `PONG`.
    Pong,
    /// `+OK`.
    Ok,
    /// `-ERR 'text'`: the text without its quotes.
    Err(Span),
}

/// A `MSG` or `HMSG` as offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsgFrame {
    /// The subject the message was published to.
    pub subject: Span,
    /// The subscription it was delivered on.
    pub sid: u64,
    /// The reply subject, when there is one.
    pub reply: Option<Span>,
    /// The header block (`HMSG` only), its status (0 for none) and the status's
    /// description (a span of the header block, not of the buffer).
    pub headers: Option<(Span, u16, Span)>,
    /// The payload after the headers.
    pub payload: Span,
}

impl Frame {
    /// The borrowed operation this frame describes in `buf`.
    pub fn attach(self, buf: &[u8]) -> ServerOp<'_> {
        match self {
            Frame::Info(s) => ServerOp::Info(s.of(buf)),
            Frame::Msg(m) => ServerOp::Msg(m.attach(buf)),
            Frame::Ping => ServerOp::Ping,
            Frame::Pong => ServerOp::Pong,
            Frame::Ok => ServerOp::Ok,
            Frame::Err(s) => ServerOp::Err(s.of(buf)),
        }
    }
}

impl MsgFrame {
    /// The borrowed message this frame describes in `buf`.
    pub fn attach(self, buf: &[u8]) -> MsgOp<'_> {
        MsgOp {
            subject: self.subject.of(buf),
            sid: self.sid,
            reply: self.reply.map(|r| r.of(buf)),
            headers: self
                .headers
                .map(|(raw, status, desc)| HeaderBlock::from_parts(raw.of(buf), status, desc)),
            payload: self.payload.of(buf),
        }
    }
}

/// A server operation borrowing the buffer it was parsed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerOp<'a> {
    /// `INFO`: the JSON object describing the server.
    Info(&'a [u8]),
    /// `MSG` or `HMSG`: a message on a subscription.
    Msg(MsgOp<'a>),
    /// `PING`: answer with `PONG`.
    Ping,
    /// `PONG`: the answer to our `PING`.
    Pong,
    /// `+OK` (verbose mode only).
    Ok,
    /// `-ERR`: the server's error text, without its quotes.
    Err(&'a [u8]),
}

/// A message delivered on a subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsgOp<'a> {
    /// The subject it was published to.
    pub subject: &'a [u8],
    /// The subscription id.
    pub sid: u64,
    /// The reply subject, if any.
    pub reply: Option<&'a [u8]>,
    /// The header block of an `HMSG`.
    pub headers: Option<HeaderBlock<'a>>,
    /// The payload (after the headers).
    pub payload: &'a [u8],
}

/// Parses one server operation from the start of `buf`.
///
/// `Complete(op, consumed)` when a whole operation is there, `Partial` when
/// more bytes are needed. A byte count beyond `limits.max_incoming()`, or a line
/// longer than its limit, is an error as soon as it is seen.
pub fn parse_op<'a>(
    buf: &'a [u8],
    limits: &NatsLimits,
) -> Result<Status<ServerOp<'a>>, NatsProtoError> {
    Ok(match parse_frame(buf, limits)? {
        Status::Complete(f, n) => Status::Complete(f.attach(buf), n),
        Status::Partial => Status::Partial,
    })
}

/// [`parse_op`] as offsets: what a driver keeps while it consumes the bytes.
pub fn parse_frame(buf: &[u8], limits: &NatsLimits) -> Result<Status<Frame>, NatsProtoError> {
    let limit = if buf.len() >= 4 && buf[..4].eq_ignore_ascii_case(b"INFO") {
        limits.max_info
    } else {
        limits.max_line
    };
    let window = &buf[..buf.len().min(limit)];
    let Some(nl) = memchr(b'\n', window) else {
        if buf.len() >= limit {
            return Err(NatsProtoError::LineTooLong { max: limit });
        }
        return Ok(Status::Partial);
    };
    if nl == 0 || buf[nl - 1] != b'\r' {
        return Err(NatsProtoError::BadLineEnd);
    }
    let line = &buf[..nl - 1];
    let after = nl + 1;
    let word_end = line
        .iter()
        .position(|&b| b == b' ' || b == b'\t')
        .unwrap_or(line.len());
    let word = &line[..word_end];
    let rest = word_end;
    if word.eq_ignore_ascii_case(b"MSG") {
        return msg(buf, line, rest, after, false, limits);
    }
    if word.eq_ignore_ascii_case(b"HMSG") {
        return msg(buf, line, rest, after, true, limits);
    }
    let frame = if word.eq_ignore_ascii_case(b"PING") {
        bare(line, rest, "PING", Frame::Ping)?
    } else if word.eq_ignore_ascii_case(b"PONG") {
        bare(line, rest, "PONG", Frame::Pong)?
    } else if word.eq_ignore_ascii_case(b"+OK") {
        bare(line, rest, "+OK", Frame::Ok)?
    } else if word.eq_ignore_ascii_case(b"INFO") {
        let s = trim(line, rest, line.len());
        if s.start == s.end {
            return Err(NatsProtoError::Malformed { op: "INFO" });
        }
        Frame::Info(s)
    } else if word.eq_ignore_ascii_case(b"-ERR") {
        let mut s = trim(line, rest, line.len());
        if s.end - s.start >= 2 && line[s.start] == b'\'' && line[s.end - 1] == b'\'' {
            s.start += 1;
            s.end -= 1;
        }
        Frame::Err(s)
    } else {
        return Err(NatsProtoError::UnknownOp);
    };
    Ok(Status::Complete(frame, after))
}

/// An operation without arguments: nothing but blanks may follow its name.
fn bare(line: &[u8], rest: usize, op: &'static str, f: Frame) -> Result<Frame, NatsProtoError> {
    if line[rest..].iter().all(|&b| b == b' ' || b == b'\t') {
        Ok(f)
    } else {
        Err(NatsProtoError::Malformed { op })
    }
}

/// `line[from..to]` without leading or trailing blanks.
fn trim(line: &[u8], mut from: usize, mut to: usize) -> Span {
    while from < to && matches!(line[from], b' ' | b'\t') {
        from += 1;
    }
    while to > from && matches!(line[to - 1], b' ' | b'\t') {
        to -= 1;
    }
    Span {
        start: from,
        end: to,
    }
}

/// Up to five blank-separated arguments of `line` from `from`; any number of
/// blanks separate them (a server writes two where an empty reply field is).
fn args(line: &[u8], from: usize, op: &'static str) -> Result<([Span; 5], usize), NatsProtoError> {
    let mut out = [Span::default(); 5];
    let mut n = 0;
    let mut i = from;
    while i < line.len() {
        if matches!(line[i], b' ' | b'\t') {
            i += 1;
            continue;
        }
        let start = i;
        // The argument runs to the next separator (memchr: a delivery's
        // line is mostly its ack subject, long enough for it to pay).
        i = memchr2(b' ', b'\t', &line[i..]).map_or(line.len(), |k| i + k);
        if n == out.len() {
            return Err(NatsProtoError::Malformed { op });
        }
        out[n] = Span { start, end: i };
        n += 1;
    }
    Ok((out, n))
}

fn number(s: &[u8]) -> Result<u64, NatsProtoError> {
    crate::reply::parse_u64(s).map_err(|_| NatsProtoError::BadNumber)
}

/// A byte count, refused beyond the payload limit before anything waits for it.
fn size(s: &[u8], limits: &NatsLimits) -> Result<usize, NatsProtoError> {
    let n = number(s)?;
    let max = limits.max_incoming();
    if n > max as u64 {
        return Err(NatsProtoError::PayloadTooLarge { len: n, max });
    }
    Ok(n as usize)
}

/// `MSG <subject> <sid> [reply] <#bytes>` or
/// `HMSG <subject> <sid> [reply] <#header bytes> <#total bytes>`, and the payload.
fn msg(
    buf: &[u8],
    line: &[u8],
    rest: usize,
    after: usize,
    with_headers: bool,
    limits: &NatsLimits,
) -> Result<Status<Frame>, NatsProtoError> {
    let op = if with_headers { "HMSG" } else { "MSG" };
    let (a, n) = args(line, rest, op)?;
    let counts = if with_headers { 2 } else { 1 };
    if n != 2 + counts && n != 3 + counts {
        return Err(NatsProtoError::Malformed { op });
    }
    let reply = (n == 3 + counts).then_some(a[2]);
    let total = size(a[n - 1].of(line), limits)?;
    let hlen = if with_headers {
        let h = size(a[n - 2].of(line), limits)?;
        if h > total {
            return Err(NatsProtoError::HeaderLongerThanTotal);
        }
        h
    } else {
        0
    };
    let sid = number(a[1].of(line))?;
    let end = after + total;
    if buf.len() < end + 2 {
        return Ok(Status::Partial);
    }
    if &buf[end..end + 2] != b"\r\n" {
        return Err(NatsProtoError::MissingPayloadCrlf);
    }
    let headers = if with_headers {
        let raw = Span {
            start: after,
            end: after + hlen,
        };
        let (status, desc) = HeaderBlock::scan(raw.of(buf))?;
        Some((raw, status, desc))
    } else {
        None
    };
    Ok(Status::Complete(
        Frame::Msg(MsgFrame {
            subject: a[0],
            sid,
            reply,
            headers,
            payload: Span {
                start: after + hlen,
                end,
            },
        }),
        end + 2,
    ))
}
