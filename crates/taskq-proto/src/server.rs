//! The server's side of the codec: parse a command (and a put's body) from a
//! receive buffer, encode a [`Reply`] into a send buffer.
//!
//! It follows what beanstalkd 1.12 does with bad input, so that a server built on
//! it answers as beanstalkd would:
//! - a line ends at the first `\r` if a `\n` follows it; a line end must lie within
//!   the first 224 bytes. A longer line, or a stray `\r` that poisons the line,
//!   makes the server discard 224 bytes, then everything through the next line
//!   end, and only then answer `BAD_FORMAT` (once);
//! - a NUL byte in a line, a bad number, a bad tube name or trailing bytes after
//!   the arguments give `BAD_FORMAT`; a line that names no command gives
//!   `UNKNOWN_COMMAND`;
//! - `reserve-with-timeout` reads its timeout with C's `strtol` into an `int`:
//!   bytes after the digits are ignored, no digits mean 0, values wrap at 32
//!   bits, and a negative one (so also 2^31 and above) waits forever, which
//!   parses as [`Command::Reserve`];
//! - `kick` reads its bound with `strtoul` into an `unsigned int`: trailing
//!   bytes are ignored, a sign is allowed, values wrap at 32 bits;
//! - anything starting with `quit` closes the connection;
//! - arguments may be separated by more than one space (not so the command word
//!   and its first argument for `use`, `watch`, `ignore` and `stats-tube`);
//! - a put whose byte count exceeds the maximum job size: the server discards that
//!   many bytes plus two, then answers `JOB_TOO_BIG`; a body not followed by CRLF
//!   gives `EXPECTED_CRLF` (and beanstalkd spends a job id on it).
//!
//! ```
//! use taskq_proto::server::{encode_reply, parse_command};
//! use taskq_proto::{Command, Reply, Status};
//!
//! let input = b"put 1 0 60 2\r\nhi\r\nreserve\r\n";
//! let Status::Complete(cmd, used) = parse_command(input, 65535).unwrap() else { panic!() };
//! assert_eq!(cmd, Command::Put { pri: 1, delay: 0, ttr: 60, body: b"hi" });
//! assert_eq!(parse_command(&input[used..], 65535).unwrap(), Status::Complete(Command::Reserve, 9));
//!
//! let mut out = [0u8; 64];
//! let n = encode_reply(&Reply::Reserved { id: 7, body: b"hi" }, &mut out).unwrap();
//! assert_eq!(&out[..n], b"RESERVED 7 2\r\nhi\r\n");
//! ```

use std::fmt;

use crate::command::{is_tube_byte, Command, CommandKind, Cursor};
use crate::error::EncodeError;
use crate::reply::{Reply, Status};
use crate::{MAX_LINE, MAX_TUBE_NAME};

/// A command the server cannot carry out, and what it must do about it.
///
/// Every variant says how many input bytes to drop and which reply to send
/// ([`CommandError::reply`]). The connection stays usable: beanstalkd keeps
/// reading after each of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CommandError {
    /// No line end within the first 224 bytes: drop 224 bytes, then drop
    /// through the next line end (see [`skip_line`]), then answer `BAD_FORMAT`.
    LineTooLong,
    /// Bad numbers, a bad tube name, a NUL byte or trailing bytes: answer `BAD_FORMAT`.
    BadFormat {
        /// Length of the line, CRLF included.
        consumed: usize,
    },
    /// A command beanstalkd recognises and counts in its `cmd-*` statistics
    /// before it refuses it with `BAD_FORMAT`: a put with bytes after its byte
    /// count, a pause-tube of a tube name that could not exist.
    CountedBadFormat {
        /// Length of the line, CRLF included.
        consumed: usize,
        /// The command it was counted as.
        kind: CommandKind,
    },
    /// The line names no command: answer `UNKNOWN_COMMAND`.
    UnknownCommand {
        /// Length of the line, CRLF included.
        consumed: usize,
    },
    /// A put whose body exceeds the maximum job size. Drop the line, then discard
    /// `discard` more bytes (the body and its CRLF, which may not have arrived
    /// yet), then answer `JOB_TOO_BIG`.
    JobTooBig {
        /// Length of the put line, CRLF included.
        consumed: usize,
        /// Bytes to discard after the line.
        discard: u64,
    },
    /// A put whose body is not followed by CRLF: drop line and body, answer `EXPECTED_CRLF`.
    ExpectedCrlf {
        /// Length of the line, body and the two bytes that should have been CRLF.
        consumed: usize,
    },
}

impl CommandError {
    /// The reply beanstalkd sends for this error.
    pub fn reply(&self) -> Reply<'static> {
        match self {
            CommandError::LineTooLong
            | CommandError::BadFormat { .. }
            | CommandError::CountedBadFormat { .. } => Reply::BadFormat,
            CommandError::UnknownCommand { .. } => Reply::UnknownCommand,
            CommandError::JobTooBig { .. } => Reply::JobTooBig,
            CommandError::ExpectedCrlf { .. } => Reply::ExpectedCrlf,
        }
    }

    /// Input bytes to drop now (for `JobTooBig`, more follow: see `discard`).
    pub fn consumed(&self) -> usize {
        match *self {
            CommandError::LineTooLong => MAX_LINE,
            CommandError::BadFormat { consumed }
            | CommandError::CountedBadFormat { consumed, .. }
            | CommandError::UnknownCommand { consumed }
            | CommandError::JobTooBig { consumed, .. }
            | CommandError::ExpectedCrlf { consumed } => consumed,
        }
    }

    /// The command beanstalkd counts this refused input as in its `cmd-*`
    /// statistics, if any (a put whose numbers were good, for one).
    pub fn counted_as(&self) -> Option<CommandKind> {
        match *self {
            CommandError::JobTooBig { .. } | CommandError::ExpectedCrlf { .. } => {
                Some(CommandKind::Put)
            }
            CommandError::CountedBadFormat { kind, .. } => Some(kind),
            _ => None,
        }
    }
}

impl fmt::Display for CommandError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CommandError::LineTooLong => f.write_str("command line longer than 224 bytes"),
            CommandError::BadFormat { .. } => f.write_str("malformed command"),
            CommandError::CountedBadFormat { kind, .. } => {
                write!(f, "malformed {} command", kind.name())
            }
            CommandError::UnknownCommand { .. } => f.write_str("unknown command"),
            CommandError::JobTooBig { discard, .. } => {
                write!(
                    f,
                    "job body of {} bytes exceeds the maximum",
                    discard.saturating_sub(2)
                )
            }
            CommandError::ExpectedCrlf { .. } => f.write_str("job body not followed by CRLF"),
        }
    }
}

impl std::error::Error for CommandError {}

/// Finds the end of the command line at the start of `input` as beanstalkd does:
/// the first `\r` within the first 223 bytes, if `\n` follows it. Returns the
/// line's length with its CRLF, `Ok(None)` when more input could still complete
/// it, or `LineTooLong`.
pub fn line_len(input: &[u8]) -> Result<Option<usize>, CommandError> {
    let window = &input[..input.len().min(MAX_LINE)];
    if let Some(last) = window.len().checked_sub(1) {
        if let Some(cr) = memchr::memchr(b'\r', &window[..last]) {
            if window[cr + 1] == b'\n' {
                return Ok(Some(cr + 2));
            }
            // A `\r` not followed by `\n` hides every later line end of this
            // buffer from beanstalkd's scan, until 224 bytes have arrived.
        }
    }
    if input.len() >= MAX_LINE {
        Err(CommandError::LineTooLong)
    } else {
        Ok(None)
    }
}

/// What to do with the rest of a line that was too long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// The line ended: drop this many bytes (its end included) and answer `BAD_FORMAT`.
    Done(usize),
    /// No line end yet: drop this many bytes (maybe 0) and read more.
    More(usize),
}

/// After [`CommandError::LineTooLong`] and its 224 bytes are dropped, finds how
/// much more to drop: beanstalkd scans for the line end in windows of 224
/// bytes, exactly as for a command line, dropping each window that has none.
pub fn skip_line(input: &[u8]) -> Skip {
    match line_len(input) {
        Ok(Some(n)) => Skip::Done(n),
        Ok(None) => Skip::More(0),
        Err(_) => Skip::More(MAX_LINE),
    }
}

/// Parses one command, and a put's body, from the start of `input`.
///
/// Returns `Complete(command, consumed)` or `Partial`. Never allocates, never
/// panics. A put waits (`Partial`) for its whole body only when the body is no
/// larger than `max_job_size`, so a caller's buffer never needs more than
/// `224 + max_job_size + 2` bytes.
pub fn parse_command(
    input: &[u8],
    max_job_size: usize,
) -> Result<Status<Command<'_>>, CommandError> {
    let n = match line_len(input)? {
        Some(n) => n,
        None => return Ok(Status::Partial),
    };
    let line = &input[..n - 2];
    let bad = CommandError::BadFormat { consumed: n };
    if memchr::memchr(0, line).is_some() {
        return Err(bad);
    }
    let cmd = match parse_line(line, n, max_job_size)? {
        Line::Done(cmd) => cmd,
        Line::Put {
            pri,
            delay,
            ttr,
            len,
        } => {
            let end = n + len;
            if input.len() < end + 2 {
                return Ok(Status::Partial);
            }
            if &input[end..end + 2] != b"\r\n" {
                return Err(CommandError::ExpectedCrlf { consumed: end + 2 });
            }
            return Ok(Status::Complete(
                Command::Put {
                    pri,
                    delay,
                    ttr,
                    body: &input[n..end],
                },
                end + 2,
            ));
        }
    };
    Ok(Status::Complete(cmd, n))
}

enum Line<'a> {
    Done(Command<'a>),
    Put {
        pri: u32,
        delay: u32,
        ttr: u32,
        len: usize,
    },
}

/// Parses a line without its CRLF; `n` is its length with the CRLF.
fn parse_line(line: &[u8], n: usize, max_job_size: usize) -> Result<Line<'_>, CommandError> {
    let bad = CommandError::BadFormat { consumed: n };
    // beanstalkd matches these prefixes in this order; the order matters
    // ("peek " before "peek-ready", "reserve-job " before "reserve").
    if let Some(rest) = line.strip_prefix(b"put ") {
        let mut a = Args(rest);
        let pri = a.u32().ok_or(bad)?;
        let delay = a.u32().ok_or(bad)?;
        let ttr = a.u32().ok_or(bad)?;
        let len = a.u32().ok_or(bad)?;
        if len as u64 > max_job_size as u64 {
            // Checked before trailing bytes, as beanstalkd does.
            return Err(CommandError::JobTooBig {
                consumed: n,
                discard: u64::from(len) + 2,
            });
        }
        a.end().ok_or(CommandError::CountedBadFormat {
            consumed: n,
            kind: CommandKind::Put,
        })?;
        return Ok(Line::Put {
            pri,
            delay,
            ttr,
            len: len as usize,
        });
    }
    let exact = |cmd: Command<'static>, word: &[u8]| {
        if line == word {
            Ok(Line::Done(cmd))
        } else {
            Err(bad)
        }
    };
    let id_only = |rest: &[u8]| {
        let mut a = Args(rest);
        let id = a.u64().ok_or(bad)?;
        a.end().ok_or(bad)?;
        Ok::<u64, CommandError>(id)
    };
    let cmd = if let Some(rest) = line.strip_prefix(b"peek ") {
        Command::Peek { id: id_only(rest)? }
    } else if line.starts_with(b"peek-ready") {
        return exact(Command::PeekReady, b"peek-ready");
    } else if line.starts_with(b"peek-delayed") {
        return exact(Command::PeekDelayed, b"peek-delayed");
    } else if line.starts_with(b"peek-buried") {
        return exact(Command::PeekBuried, b"peek-buried");
    } else if let Some(rest) = line.strip_prefix(b"reserve-with-timeout ") {
        // beanstalkd reads this one with strtol into an int: trailing bytes are
        // ignored, no digits mean 0, and a negative value waits forever.
        match strtol_i32(rest) {
            None => return Err(bad),
            Some(t) if t < 0 => Command::Reserve,
            Some(t) => Command::ReserveWithTimeout { timeout: t as u32 },
        }
    } else if let Some(rest) = line.strip_prefix(b"reserve-job ") {
        Command::ReserveJob { id: id_only(rest)? }
    } else if line.starts_with(b"reserve") {
        return exact(Command::Reserve, b"reserve");
    } else if let Some(rest) = line.strip_prefix(b"delete ") {
        Command::Delete { id: id_only(rest)? }
    } else if let Some(rest) = line.strip_prefix(b"release ") {
        let mut a = Args(rest);
        let id = a.u64().ok_or(bad)?;
        let pri = a.u32().ok_or(bad)?;
        let delay = a.u32().ok_or(bad)?;
        a.end().ok_or(bad)?;
        Command::Release { id, pri, delay }
    } else if let Some(rest) = line.strip_prefix(b"bury ") {
        let mut a = Args(rest);
        let id = a.u64().ok_or(bad)?;
        let pri = a.u32().ok_or(bad)?;
        a.end().ok_or(bad)?;
        Command::Bury { id, pri }
    } else if let Some(rest) = line.strip_prefix(b"kick ") {
        // beanstalkd reads the bound with strtoul into an unsigned int.
        Command::Kick {
            bound: strtoul_u32(rest).ok_or(bad)?,
        }
    } else if let Some(rest) = line.strip_prefix(b"kick-job ") {
        Command::KickJob { id: id_only(rest)? }
    } else if let Some(rest) = line.strip_prefix(b"touch ") {
        Command::Touch { id: id_only(rest)? }
    } else if let Some(rest) = line.strip_prefix(b"stats-job ") {
        Command::StatsJob { id: id_only(rest)? }
    } else if let Some(rest) = line.strip_prefix(b"stats-tube ") {
        Command::StatsTube {
            tube: tube_name(rest).ok_or(bad)?,
        }
    } else if line.starts_with(b"stats") {
        return exact(Command::Stats, b"stats");
    } else if let Some(rest) = line.strip_prefix(b"use ") {
        Command::Use {
            tube: tube_name(rest).ok_or(bad)?,
        }
    } else if let Some(rest) = line.strip_prefix(b"watch ") {
        Command::Watch {
            tube: tube_name(rest).ok_or(bad)?,
        }
    } else if let Some(rest) = line.strip_prefix(b"ignore ") {
        Command::Ignore {
            tube: tube_name(rest).ok_or(bad)?,
        }
    } else if line.starts_with(b"list-tubes-watched") {
        return exact(Command::ListTubesWatched, b"list-tubes-watched");
    } else if line.starts_with(b"list-tube-used") {
        return exact(Command::ListTubeUsed, b"list-tube-used");
    } else if line.starts_with(b"list-tubes") {
        return exact(Command::ListTubes, b"list-tubes");
    } else if line.starts_with(b"quit") {
        // beanstalkd closes on anything that starts with "quit".
        Command::Quit
    } else if let Some(rest) = line.strip_prefix(b"pause-tube") {
        // beanstalkd matches "pause-tube" with no space, then skips any spaces.
        let mut a = Args(rest);
        let tube = a.tube().ok_or(bad)?;
        let delay = a.u32().ok_or(bad)?;
        a.end().ok_or(bad)?;
        // Counted first, then the name checked: a name no tube can have is refused.
        if tube.len() > MAX_TUBE_NAME || tube.starts_with('-') {
            return Err(CommandError::CountedBadFormat {
                consumed: n,
                kind: CommandKind::PauseTube,
            });
        }
        Command::PauseTube { tube, delay }
    } else {
        return Err(CommandError::UnknownCommand { consumed: n });
    };
    Ok(Line::Done(cmd))
}

/// Where C's `strtol` and `strtoul` find the digits of `s`: past leading white
/// space and an optional sign. True when the sign is a minus.
fn c_number_start(s: &[u8]) -> (usize, bool) {
    let i = s
        .iter()
        .take_while(|&&b| matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r'))
        .count();
    match s.get(i) {
        Some(b'-') => (i + 1, true),
        Some(b'+') => (i + 1, false),
        _ => (i, false),
    }
}

/// C's `strtol` on `s`, then the conversion to a 32-bit `int` that beanstalkd
/// makes: leading white space, an optional sign, digits up to the first
/// non-digit (none gives 0). `None` when the value overflows 64 bits (`ERANGE`).
fn strtol_i32(s: &[u8]) -> Option<i32> {
    let (i, negative) = c_number_start(s);
    let mut n: i64 = 0;
    for &b in s[i..].iter().take_while(|b| b.is_ascii_digit()) {
        let d = i64::from(b - b'0');
        n = n.checked_mul(10).and_then(|n| {
            if negative {
                n.checked_sub(d)
            } else {
                n.checked_add(d)
            }
        })?;
    }
    // The C cast from long to int keeps the low 32 bits.
    Some(n as i32)
}

/// C's `strtoul` on `s`, then the conversion to a 32-bit `unsigned int`:
/// leading white space, an optional sign (a minus negates modulo 2^64), at
/// least one digit, anything after the digits ignored. `None` without digits or
/// when the value overflows 64 bits.
fn strtoul_u32(s: &[u8]) -> Option<u32> {
    let (i, negative) = c_number_start(s);
    let digits = &s[i..];
    let k = digits.iter().take_while(|b| b.is_ascii_digit()).count();
    if k == 0 {
        return None;
    }
    let mut n: u64 = 0;
    for &b in &digits[..k] {
        n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    let n = if negative { n.wrapping_neg() } else { n };
    Some(n as u32)
}

/// A whole-rest tube name as `use`, `watch`, `ignore` and `stats-tube` take it.
fn tube_name(s: &[u8]) -> Option<&str> {
    if s.is_empty()
        || s.len() > MAX_TUBE_NAME
        || s[0] == b'-'
        || !s.iter().all(|&b| is_tube_byte(b))
    {
        return None;
    }
    std::str::from_utf8(s).ok()
}

/// Space-separated arguments, read as beanstalkd's `read_u32`/`read_u64` do:
/// any number of spaces before each, digits only, no overflow.
struct Args<'a>(&'a [u8]);

impl<'a> Args<'a> {
    fn skip_spaces(&mut self) {
        let k = self.0.iter().take_while(|&&b| b == b' ').count();
        self.0 = &self.0[k..];
    }

    fn digits(&mut self) -> Option<&'a [u8]> {
        self.skip_spaces();
        let k = self.0.iter().take_while(|b| b.is_ascii_digit()).count();
        if k == 0 {
            return None;
        }
        let (d, rest) = self.0.split_at(k);
        self.0 = rest;
        Some(d)
    }

    fn u64(&mut self) -> Option<u64> {
        let d = self.digits()?;
        let mut n: u64 = 0;
        for &b in d {
            n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
        }
        Some(n)
    }

    fn u32(&mut self) -> Option<u32> {
        u32::try_from(self.u64()?).ok()
    }

    /// A tube name followed by more arguments (pause-tube).
    fn tube(&mut self) -> Option<&'a str> {
        self.skip_spaces();
        let k = self.0.iter().take_while(|&&b| is_tube_byte(b)).count();
        if k == 0 || k > MAX_TUBE_NAME {
            return None;
        }
        let (t, rest) = self.0.split_at(k);
        self.0 = rest;
        std::str::from_utf8(t).ok()
    }

    fn end(&self) -> Option<()> {
        self.0.is_empty().then_some(())
    }
}

/// Writes a whole reply (line, and for `RESERVED`, `FOUND` and `OK` the body
/// and its CRLF) into `buf`. Returns its length.
pub fn encode_reply(reply: &Reply<'_>, buf: &mut [u8]) -> Result<usize, EncodeError> {
    let head = encode_reply_head(reply, buf)?;
    let body = reply_body(reply);
    match body {
        Some(body) => {
            // `head` bytes were just written, so the slice is in bounds.
            let mut c = Cursor::new(&mut buf[head..]);
            c.bytes(body).and_then(|()| c.bytes(b"\r\n")).map_err(|_| {
                EncodeError::BufferTooSmall {
                    needed: head + body.len() + 2,
                }
            })?;
            Ok(head + c.len())
        }
        None => Ok(head),
    }
}

/// The body a reply carries after its line (`RESERVED`, `FOUND`, `OK`).
pub fn reply_body<'a>(reply: &Reply<'a>) -> Option<&'a [u8]> {
    match *reply {
        Reply::Reserved { body, .. } | Reply::Found { body, .. } => Some(body),
        Reply::Ok { yaml } => Some(yaml),
        _ => None,
    }
}

/// Writes only the reply line with its CRLF, for a server that sends a large
/// body from where it lies (then the body, then `\r\n`). Returns its length.
pub fn encode_reply_head(reply: &Reply<'_>, buf: &mut [u8]) -> Result<usize, EncodeError> {
    let mut c = Cursor::new(buf);
    c.bytes(reply.word().as_bytes())?;
    match *reply {
        Reply::Inserted { id } | Reply::InsertedBuried { id } => c.sp_num(id)?,
        Reply::Using { tube } => {
            c.bytes(b" ")?;
            c.bytes(tube.as_bytes())?;
        }
        Reply::Reserved { id, body } | Reply::Found { id, body } => {
            c.sp_num(id)?;
            c.sp_num(body.len())?;
        }
        Reply::Watching { count } | Reply::Kicked { count } => c.sp_num(count)?,
        Reply::Ok { yaml } => c.sp_num(yaml.len())?,
        _ => {}
    }
    c.bytes(b"\r\n")?;
    Ok(c.len())
}
