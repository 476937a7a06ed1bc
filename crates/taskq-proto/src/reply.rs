//! Replies: incremental, zero-copy decoding of what the server answers.

use crate::command::{is_tube_byte, CommandKind};
use crate::error::ReplyError;
use crate::MAX_LINE;

/// The result of feeding bytes to a parser: a complete value and how many bytes
/// it used, or a request for more input. `Partial` is a normal answer, not an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status<T> {
    /// A whole value, and the number of input bytes it consumed.
    Complete(T, usize),
    /// The input ends before the value does; call again with more bytes.
    Partial,
}

/// Limits a parser enforces so that a peer cannot make it wait for, or make its
/// caller allocate, more than this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest job body accepted in `RESERVED` and `FOUND` (and sent in `put`).
    pub max_job_size: usize,
    /// Largest YAML document accepted in an `OK` reply.
    pub max_yaml_size: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_job_size: crate::DEFAULT_MAX_JOB_SIZE,
            max_yaml_size: crate::DEFAULT_MAX_YAML_SIZE,
        }
    }
}

/// A decoded reply. Bodies, YAML and tube names borrow the input buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reply<'a> {
    /// `INSERTED <id>` (put).
    Inserted {
        /// The new job's id.
        id: u64,
    },
    /// `BURIED <id>` answering a put: the job was inserted, but buried (server short of memory).
    InsertedBuried {
        /// The new job's id.
        id: u64,
    },
    /// `EXPECTED_CRLF` (put): the body was not followed by CRLF. Nothing queued.
    ExpectedCrlf,
    /// `JOB_TOO_BIG` (put): the body exceeds the server's maximum. Nothing queued.
    JobTooBig,
    /// `DRAINING` (put): the server takes no new jobs. Nothing queued.
    Draining,
    /// `USING <tube>` (use, list-tube-used).
    Using {
        /// The tube in use.
        tube: &'a str,
    },
    /// `RESERVED <id> <bytes>` and the body (reserve, reserve-with-timeout, reserve-job).
    Reserved {
        /// Job id.
        id: u64,
        /// Job body.
        body: &'a [u8],
    },
    /// `RESERVED <id> <bytes>` whose body is larger than
    /// [`Limits::max_job_size`], on a session told to skip such bodies
    /// ([`Session::skip_large_jobs`](crate::Session::skip_large_jobs)): the
    /// job is reserved by this connection, and its body is dropped as it
    /// arrives, never held. [`parse_reply`] never gives it (it answers
    /// [`ReplyError::BodyTooLarge`]).
    ReservedTooBig {
        /// Job id.
        id: u64,
        /// The body's size in bytes, as the server announced it.
        len: u64,
    },
    /// `DEADLINE_SOON` (reserve): a job this connection holds is within a second of its TTR.
    DeadlineSoon,
    /// `TIMED_OUT` (reserve-with-timeout): no job in time.
    TimedOut,
    /// `DELETED` (delete).
    Deleted,
    /// `NOT_FOUND`.
    NotFound,
    /// `RELEASED` (release).
    Released,
    /// Bare `BURIED` (bury, or release when the server is short of memory).
    Buried,
    /// `TOUCHED` (touch).
    Touched,
    /// `WATCHING <count>` (watch, ignore).
    Watching {
        /// How many tubes the connection watches now.
        count: u64,
    },
    /// `NOT_IGNORED` (ignore of the last watched tube).
    NotIgnored,
    /// `FOUND <id> <bytes>` and the body (peek*).
    Found {
        /// Job id.
        id: u64,
        /// Job body.
        body: &'a [u8],
    },
    /// `KICKED <count>` (kick).
    Kicked {
        /// How many jobs were kicked.
        count: u64,
    },
    /// Bare `KICKED` (kick-job).
    KickedJob,
    /// `OK <bytes>` and a YAML document (stats*, list-tubes*).
    Ok {
        /// The YAML document.
        yaml: &'a [u8],
    },
    /// `PAUSED` (pause-tube).
    Paused,
    /// `OUT_OF_MEMORY`.
    OutOfMemory,
    /// `INTERNAL_ERROR`.
    InternalError,
    /// `BAD_FORMAT`.
    BadFormat,
    /// `UNKNOWN_COMMAND`.
    UnknownCommand,
}

impl Reply<'_> {
    /// The reply's word on the wire.
    pub fn word(&self) -> &'static str {
        match self {
            Reply::Inserted { .. } => "INSERTED",
            Reply::InsertedBuried { .. } | Reply::Buried => "BURIED",
            Reply::ExpectedCrlf => "EXPECTED_CRLF",
            Reply::JobTooBig => "JOB_TOO_BIG",
            Reply::Draining => "DRAINING",
            Reply::Using { .. } => "USING",
            Reply::Reserved { .. } | Reply::ReservedTooBig { .. } => "RESERVED",
            Reply::DeadlineSoon => "DEADLINE_SOON",
            Reply::TimedOut => "TIMED_OUT",
            Reply::Deleted => "DELETED",
            Reply::NotFound => "NOT_FOUND",
            Reply::Released => "RELEASED",
            Reply::Touched => "TOUCHED",
            Reply::Watching { .. } => "WATCHING",
            Reply::NotIgnored => "NOT_IGNORED",
            Reply::Found { .. } => "FOUND",
            Reply::Kicked { .. } | Reply::KickedJob => "KICKED",
            Reply::Ok { .. } => "OK",
            Reply::Paused => "PAUSED",
            Reply::OutOfMemory => "OUT_OF_MEMORY",
            Reply::InternalError => "INTERNAL_ERROR",
            Reply::BadFormat => "BAD_FORMAT",
            Reply::UnknownCommand => "UNKNOWN_COMMAND",
        }
    }

    /// True for the four replies any command may get when the server fails it.
    pub fn is_server_error(&self) -> bool {
        matches!(
            self,
            Reply::OutOfMemory | Reply::InternalError | Reply::BadFormat | Reply::UnknownCommand
        )
    }
}

/// Where a borrowed part of a reply lies in the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Span {
    pub(crate) start: usize,
    pub(crate) end: usize,
}

/// Decodes one reply to a command of `kind` from the start of `input`.
///
/// Returns `Complete(reply, consumed)` or `Partial`; never allocates and never
/// panics. Malformed input is a [`ReplyError`], after which the stream is out of step.
///
/// ```
/// use taskq_proto::{parse_reply, CommandKind, Limits, Reply, Status};
/// let input = b"RESERVED 7 5\r\nhello\r\n";
/// let parsed = parse_reply(CommandKind::Reserve, input, &Limits::default()).unwrap();
/// assert_eq!(parsed, Status::Complete(Reply::Reserved { id: 7, body: b"hello" }, input.len()));
/// ```
pub fn parse_reply<'a>(
    kind: CommandKind,
    input: &'a [u8],
    limits: &Limits,
) -> Result<Status<Reply<'a>>, ReplyError> {
    Ok(match parse_frame(kind, input, limits)? {
        Status::Complete((reply, span), n) => Status::Complete(attach(reply, span, input), n),
        Status::Partial => Status::Partial,
    })
}

/// Gives a framed reply its borrowed parts back.
#[inline]
pub(crate) fn attach<'a>(reply: Reply<'static>, span: Span, input: &'a [u8]) -> Reply<'a> {
    let part = &input[span.start..span.end];
    match reply {
        Reply::Reserved { id, .. } => Reply::Reserved { id, body: part },
        Reply::Found { id, .. } => Reply::Found { id, body: part },
        Reply::Ok { .. } => Reply::Ok { yaml: part },
        // The tube was checked to be ASCII when it was framed.
        Reply::Using { .. } => Reply::Using {
            tube: std::str::from_utf8(part).unwrap_or(""),
        },
        other => other,
    }
}

/// Frames one reply: the reply with its borrowed parts left empty, plus the span
/// they occupy. Lets a connection decide completeness without holding a borrow.
pub(crate) fn parse_frame(
    kind: CommandKind,
    input: &[u8],
    limits: &Limits,
) -> Result<Status<(Reply<'static>, Span)>, ReplyError> {
    if kind == CommandKind::Put {
        if let Some(done) = inserted_fast(input) {
            return Ok(done);
        }
    }
    let window = &input[..input.len().min(MAX_LINE)];
    let nl = match memchr::memchr(b'\n', window) {
        Some(i) => i,
        None if input.len() >= MAX_LINE => return Err(ReplyError::LineTooLong),
        None => return Ok(Status::Partial),
    };
    if nl == 0 || input[nl - 1] != b'\r' {
        return Err(ReplyError::BadLineEnd);
    }
    let line = &input[..nl - 1];
    let line_len = nl + 1;
    let (word, args) = match memchr::memchr(b' ', line) {
        Some(i) => (&line[..i], Some(&line[i + 1..])),
        None => (line, None),
    };
    let none = Span::default();
    let done = |r: Reply<'static>| Ok(Status::Complete((r, none), line_len));

    // Replies with no arguments.
    let bare = match word {
        b"DELETED" => Some((Reply::Deleted, "DELETED")),
        b"NOT_FOUND" => Some((Reply::NotFound, "NOT_FOUND")),
        b"TIMED_OUT" => Some((Reply::TimedOut, "TIMED_OUT")),
        b"DEADLINE_SOON" => Some((Reply::DeadlineSoon, "DEADLINE_SOON")),
        b"RELEASED" => Some((Reply::Released, "RELEASED")),
        b"TOUCHED" => Some((Reply::Touched, "TOUCHED")),
        b"NOT_IGNORED" => Some((Reply::NotIgnored, "NOT_IGNORED")),
        b"PAUSED" => Some((Reply::Paused, "PAUSED")),
        b"EXPECTED_CRLF" => Some((Reply::ExpectedCrlf, "EXPECTED_CRLF")),
        b"JOB_TOO_BIG" => Some((Reply::JobTooBig, "JOB_TOO_BIG")),
        b"DRAINING" => Some((Reply::Draining, "DRAINING")),
        b"OUT_OF_MEMORY" => Some((Reply::OutOfMemory, "OUT_OF_MEMORY")),
        b"INTERNAL_ERROR" => Some((Reply::InternalError, "INTERNAL_ERROR")),
        b"BAD_FORMAT" => Some((Reply::BadFormat, "BAD_FORMAT")),
        b"UNKNOWN_COMMAND" => Some((Reply::UnknownCommand, "UNKNOWN_COMMAND")),
        _ => None,
    };
    if let Some((reply, w)) = bare {
        check_allowed(kind, &reply, w)?;
        if args.is_some() {
            return Err(ReplyError::Malformed { word: w });
        }
        return done(reply);
    }

    match word {
        b"INSERTED" => {
            expect(kind, CommandKind::Put, "INSERTED")?;
            let id = one_number(args, "INSERTED")?;
            done(Reply::Inserted { id })
        }
        b"BURIED" => match kind {
            CommandKind::Put => done(Reply::InsertedBuried {
                id: one_number(args, "BURIED")?,
            }),
            CommandKind::Release | CommandKind::Bury => {
                no_args(args, "BURIED")?;
                done(Reply::Buried)
            }
            _ => Err(ReplyError::UnexpectedReply { word: "BURIED" }),
        },
        b"KICKED" => match kind {
            CommandKind::Kick => done(Reply::Kicked {
                count: one_number(args, "KICKED")?,
            }),
            CommandKind::KickJob => {
                no_args(args, "KICKED")?;
                done(Reply::KickedJob)
            }
            _ => Err(ReplyError::UnexpectedReply { word: "KICKED" }),
        },
        b"WATCHING" => {
            if !matches!(kind, CommandKind::Watch | CommandKind::Ignore) {
                return Err(ReplyError::UnexpectedReply { word: "WATCHING" });
            }
            let count = one_number(args, "WATCHING")?;
            done(Reply::Watching { count })
        }
        b"USING" => {
            if !matches!(kind, CommandKind::Use | CommandKind::ListTubeUsed) {
                return Err(ReplyError::UnexpectedReply { word: "USING" });
            }
            let tube = args.ok_or(ReplyError::Malformed { word: "USING" })?;
            if tube.is_empty()
                || tube.len() > crate::MAX_TUBE_NAME
                || !tube.iter().all(|&b| is_tube_byte(b))
            {
                return Err(ReplyError::Malformed { word: "USING" });
            }
            let start = word.len() + 1;
            Ok(Status::Complete(
                (
                    Reply::Using { tube: "" },
                    Span {
                        start,
                        end: start + tube.len(),
                    },
                ),
                line_len,
            ))
        }
        b"RESERVED" => {
            if !matches!(
                kind,
                CommandKind::Reserve
                    | CommandKind::ReserveWithTimeout { .. }
                    | CommandKind::ReserveJob
            ) {
                return Err(ReplyError::UnexpectedReply { word: "RESERVED" });
            }
            let (id, len) = two_numbers(args, "RESERVED")?;
            with_body(
                input,
                line_len,
                len,
                limits.max_job_size,
                Reply::Reserved { id, body: &[] },
            )
        }
        b"FOUND" => {
            if !matches!(
                kind,
                CommandKind::Peek
                    | CommandKind::PeekReady
                    | CommandKind::PeekDelayed
                    | CommandKind::PeekBuried
            ) {
                return Err(ReplyError::UnexpectedReply { word: "FOUND" });
            }
            let (id, len) = two_numbers(args, "FOUND")?;
            with_body(
                input,
                line_len,
                len,
                limits.max_job_size,
                Reply::Found { id, body: &[] },
            )
        }
        b"OK" => {
            if !matches!(
                kind,
                CommandKind::Stats
                    | CommandKind::StatsJob
                    | CommandKind::StatsTube
                    | CommandKind::ListTubes
                    | CommandKind::ListTubesWatched
            ) {
                return Err(ReplyError::UnexpectedReply { word: "OK" });
            }
            let len = one_number(args, "OK")?;
            with_body(
                input,
                line_len,
                len,
                limits.max_yaml_size,
                Reply::Ok { yaml: &[] },
            )
        }
        _ => Err(ReplyError::UnknownReply),
    }
}

/// The id, byte count and line length of the `RESERVED <id> <bytes>` line
/// at the start of `input`, for a reply [`parse_frame`] refused as
/// [`ReplyError::BodyTooLarge`] (so the line is whole and well formed).
pub(crate) fn reserved_line(input: &[u8]) -> Option<(u64, u64, usize)> {
    let nl = memchr::memchr(b'\n', &input[..input.len().min(MAX_LINE)])?;
    let args = input[..nl.checked_sub(1)?].strip_prefix(b"RESERVED ")?;
    let (id, len) = two_numbers(Some(args), "RESERVED").ok()?;
    Some((id, len, nl + 1))
}

fn expect(kind: CommandKind, want: CommandKind, word: &'static str) -> Result<(), ReplyError> {
    if kind == want {
        Ok(())
    } else {
        Err(ReplyError::UnexpectedReply { word })
    }
}

/// Which bare replies can answer which commands.
fn check_allowed(
    kind: CommandKind,
    reply: &Reply<'_>,
    word: &'static str,
) -> Result<(), ReplyError> {
    use CommandKind as K;
    let ok = match reply {
        Reply::OutOfMemory | Reply::InternalError | Reply::BadFormat | Reply::UnknownCommand => {
            true
        }
        Reply::Deleted => kind == K::Delete,
        Reply::NotFound => matches!(
            kind,
            K::ReserveJob
                | K::Delete
                | K::Release
                | K::Bury
                | K::Touch
                | K::Peek
                | K::PeekReady
                | K::PeekDelayed
                | K::PeekBuried
                | K::KickJob
                | K::StatsJob
                | K::StatsTube
                | K::PauseTube
        ),
        Reply::TimedOut => matches!(kind, K::ReserveWithTimeout { .. }),
        Reply::DeadlineSoon => matches!(kind, K::Reserve | K::ReserveWithTimeout { .. }),
        Reply::Released => kind == K::Release,
        Reply::Touched => kind == K::Touch,
        Reply::NotIgnored => kind == K::Ignore,
        Reply::Paused => kind == K::PauseTube,
        Reply::ExpectedCrlf | Reply::JobTooBig | Reply::Draining => kind == K::Put,
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(ReplyError::UnexpectedReply { word })
    }
}

fn no_args(args: Option<&[u8]>, word: &'static str) -> Result<(), ReplyError> {
    match args {
        None => Ok(()),
        Some(_) => Err(ReplyError::Malformed { word }),
    }
}

fn one_number(args: Option<&[u8]>, word: &'static str) -> Result<u64, ReplyError> {
    let a = args.ok_or(ReplyError::Malformed { word })?;
    if memchr::memchr(b' ', a).is_some() {
        return Err(ReplyError::Malformed { word });
    }
    parse_u64(a)
}

fn two_numbers(args: Option<&[u8]>, word: &'static str) -> Result<(u64, u64), ReplyError> {
    let a = args.ok_or(ReplyError::Malformed { word })?;
    let sp = memchr::memchr(b' ', a).ok_or(ReplyError::Malformed { word })?;
    let second = &a[sp + 1..];
    if memchr::memchr(b' ', second).is_some() {
        return Err(ReplyError::Malformed { word });
    }
    Ok((parse_u64(&a[..sp])?, parse_u64(second)?))
}

fn with_body(
    input: &[u8],
    line_len: usize,
    len: u64,
    max: usize,
    reply: Reply<'static>,
) -> Result<Status<(Reply<'static>, Span)>, ReplyError> {
    if len > max as u64 {
        return Err(ReplyError::BodyTooLarge { len, max });
    }
    // `len <= max` fits a usize; saturate so that an absurd configured maximum
    // can only make the frame unreachable, never overflow.
    let end = line_len.saturating_add(len as usize);
    if input.len() < end.saturating_add(2) {
        // Check the CRLF as soon as it could be there, so a bad frame fails early.
        if input.len() > end && input[end] != b'\r' {
            return Err(ReplyError::MissingBodyCrlf);
        }
        return Ok(Status::Partial);
    }
    if &input[end..end + 2] != b"\r\n" {
        return Err(ReplyError::MissingBodyCrlf);
    }
    Ok(Status::Complete(
        (
            reply,
            Span {
                start: line_len,
                end,
            },
        ),
        end + 2,
    ))
}

/// The reply on the enqueue hot path, `INSERTED <id>\r\n`, read without the
/// general dispatch. Accepts exactly what the general parser accepts for it
/// (1 to 20 digits, no overflow); anything else, partial input included, is
/// left to the general parser.
#[inline]
fn inserted_fast(input: &[u8]) -> Option<Status<(Reply<'static>, Span)>> {
    const WORD: &[u8] = b"INSERTED ";
    let digits = input.strip_prefix(WORD)?;
    // 19 digits cannot overflow a u64; a longer id takes the general path.
    let mut id: u64 = 0;
    let mut i = 0;
    while i < digits.len() && i < 19 {
        let d = digits[i].wrapping_sub(b'0');
        if d > 9 {
            break;
        }
        id = id * 10 + u64::from(d);
        i += 1;
    }
    if i == 0 || digits.get(i..i + 2) != Some(b"\r\n") {
        return None;
    }
    let done = (Reply::Inserted { id }, Span::default());
    Some(Status::Complete(done, WORD.len() + i + 2))
}

/// `buf[..n]` is exactly one `INSERTED <id>\r\n` with 1 to 19 digits (which
/// cannot overflow): its id. The general parser accepts every such input with
/// the same id; anything else (20 digits included) is left to it.
#[inline]
pub(crate) fn inserted_exact(buf: &[u8], n: usize) -> Option<u64> {
    // The length first, so that the slice below needs only one bounds check.
    if !(12..=30).contains(&n) {
        return None;
    }
    let input = buf.get(..n)?;
    if !input.starts_with(b"INSERTED ") || !input.ends_with(b"\r\n") {
        return None;
    }
    // The id's digits are input[9..n - 2]; the eight bytes before the CRLF are
    // always in the input, since the line is at least 12 bytes.
    let digits = n - 11;
    let last8 = eight(input, n - 10);
    if digits <= 8 {
        return digits8(last8, digits);
    }
    if digits <= 16 {
        let high = digits8(eight(input, n - 18), digits - 8)?;
        return Some(high * 100_000_000 + digits8(last8, 8)?);
    }
    let mut id: u64 = 0;
    for &b in &input[9..n - 2] {
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        id = id * 10 + u64::from(d);
    }
    Some(id)
}

/// The eight bytes of `input` from `at`, as a little-endian word.
#[inline]
fn eight(input: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&input[at..at + 8]);
    u64::from_le_bytes(w)
}

/// The value of the last `len` (1 to 8) bytes of `word` (little-endian, so
/// they are its high bytes, the first digit lowest) when all are ASCII digits:
/// the eight digits are checked and combined in parallel, in three multiplies.
#[inline]
fn digits8(word: u64, len: usize) -> Option<u64> {
    // The bytes before the digits become zeros, which read as leading zeros.
    let x = (word ^ 0x3030_3030_3030_3030) & (u64::MAX << (8 * (8 - len)));
    // A digit is now 0..=9 in its byte; anything else has bit 7 set in the
    // byte itself or after adding 0x76 (a carry out of a byte only comes
    // from one that already has bit 7 set).
    if (x | x.wrapping_add(0x7676_7676_7676_7676)) & 0x8080_8080_8080_8080 != 0 {
        return None;
    }
    let x = (x.wrapping_mul(10) + (x >> 8)) & 0x00FF_00FF_00FF_00FF;
    let x = (x.wrapping_mul(100) + (x >> 16)) & 0x0000_FFFF_0000_FFFF;
    Some((x.wrapping_mul(10_000) + (x >> 32)) & 0xFFFF_FFFF)
}

/// Parses unsigned decimal: digits only, no sign, no overflow.
#[inline]
pub fn parse_u64(s: &[u8]) -> Result<u64, ReplyError> {
    if s.is_empty() || s.len() > 20 {
        return Err(ReplyError::BadNumber);
    }
    let mut n: u64 = 0;
    for &b in s {
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            return Err(ReplyError::BadNumber);
        }
        n = n
            .checked_mul(10)
            .and_then(|n| n.checked_add(u64::from(d)))
            .ok_or(ReplyError::BadNumber)?;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hot-path reader against the general parser: every id length, the
    /// digit boundaries, every byte in every position, and broken frames.
    #[test]
    fn inserted_exact_agrees_with_the_general_parser() {
        let limits = Limits::default();
        let general = |input: &[u8]| match parse_reply(CommandKind::Put, input, &limits) {
            Ok(Status::Complete(Reply::Inserted { id }, n)) if n == input.len() => Some(id),
            _ => None,
        };
        let mut inputs: Vec<Vec<u8>> = Vec::new();
        let mut ids = vec![0u64, 1, 9, 10, 99, 100, 12_345_678, 99_999_999, 100_000_000];
        ids.extend([u64::MAX / 10, 9_999_999_999_999_999_999, u64::MAX]);
        let mut p = 1u64;
        while let Some(q) = p.checked_mul(10) {
            ids.extend([p - 1, p, p + 1, q - 1, p * 7 + 3]);
            p = q;
        }
        for id in ids {
            inputs.push(format!("INSERTED {id}\r\n").into_bytes());
        }
        for len in 1..=21 {
            let digits: Vec<u8> = (0..len).map(|i| b'0' + ((i * 7 + 3) % 10) as u8).collect();
            for at in 0..len {
                for byte in 0..=255u8 {
                    let mut input = b"INSERTED ".to_vec();
                    input.extend_from_slice(&digits);
                    input[9 + at] = byte;
                    input.extend_from_slice(b"\r\n");
                    inputs.push(input);
                }
            }
            // Leading zeros, as the general parser allows them.
            inputs.push(format!("INSERTED {}\r\n", "0".repeat(len)).into_bytes());
        }
        for bad in [
            &b"INSERTED \r\n"[..],
            b"INSERTED 12\r",
            b"INSERTED 12\n\n",
            b"INSERTED 12\r\nX",
            b"INSERTED  12\r\n",
            b"INSERTED 12 \r\n",
            b"INSERTEDX12\r\n",
            b"inserted 12\r\n",
            b"BURIED 12\r\n",
            b"",
        ] {
            inputs.push(bad.to_vec());
        }
        for input in &inputs {
            let fast = inserted_exact(input, input.len());
            // Bytes after the first `n` (an older reply's) are never looked at.
            let mut longer = input.clone();
            longer.extend_from_slice(b"99\r\nINSERTED 1\r\n");
            assert_eq!(inserted_exact(&longer, input.len()), fast);
            if fast.is_some() {
                assert_eq!(fast, general(input), "{:?}", String::from_utf8_lossy(input));
            } else {
                // Only the 20-digit ids are left to the general parser on purpose.
                let digits = input.len().saturating_sub(11);
                assert!(
                    general(input).is_none() || digits == 20,
                    "{:?}",
                    String::from_utf8_lossy(input)
                );
            }
        }
    }
}
