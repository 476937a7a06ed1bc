//! Commands: what a client can ask, how it is validated, how it is encoded.

use crate::error::{EncodeError, TubeNameError};
use crate::{MAX_LINE, MAX_TUBE_NAME};

/// A request to the server. Borrowed, `Copy`, and encoded without allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Command<'a> {
    /// `put <pri> <delay> <ttr> <bytes>` followed by the body.
    Put {
        /// Priority: 0 is most urgent.
        pri: u32,
        /// Seconds before the job becomes ready.
        delay: u32,
        /// Time to run: seconds a reserved job is held before it goes back.
        ttr: u32,
        /// The job body, any bytes.
        body: &'a [u8],
    },
    /// `use <tube>`: the tube later puts go to.
    Use {
        /// Tube name.
        tube: &'a str,
    },
    /// `reserve`: wait for a job without a server-side limit.
    Reserve,
    /// `reserve-with-timeout <seconds>`; 0 polls.
    ReserveWithTimeout {
        /// Seconds the server waits for a job.
        timeout: u32,
    },
    /// `reserve-job <id>`.
    ReserveJob {
        /// Job id.
        id: u64,
    },
    /// `delete <id>`.
    Delete {
        /// Job id.
        id: u64,
    },
    /// `release <id> <pri> <delay>`.
    Release {
        /// Job id.
        id: u64,
        /// New priority.
        pri: u32,
        /// Seconds before the job is ready again.
        delay: u32,
    },
    /// `bury <id> <pri>`.
    Bury {
        /// Job id.
        id: u64,
        /// New priority.
        pri: u32,
    },
    /// `touch <id>`: restart the job's TTR.
    Touch {
        /// Job id.
        id: u64,
    },
    /// `watch <tube>`.
    Watch {
        /// Tube name.
        tube: &'a str,
    },
    /// `ignore <tube>`.
    Ignore {
        /// Tube name.
        tube: &'a str,
    },
    /// `peek <id>`.
    Peek {
        /// Job id.
        id: u64,
    },
    /// `peek-ready`.
    PeekReady,
    /// `peek-delayed`.
    PeekDelayed,
    /// `peek-buried`.
    PeekBuried,
    /// `kick <bound>`.
    Kick {
        /// Most jobs to kick.
        bound: u32,
    },
    /// `kick-job <id>`.
    KickJob {
        /// Job id.
        id: u64,
    },
    /// `stats`.
    Stats,
    /// `stats-job <id>`.
    StatsJob {
        /// Job id.
        id: u64,
    },
    /// `stats-tube <tube>`.
    StatsTube {
        /// Tube name.
        tube: &'a str,
    },
    /// `list-tubes`.
    ListTubes,
    /// `list-tube-used`.
    ListTubeUsed,
    /// `list-tubes-watched`.
    ListTubesWatched,
    /// `pause-tube <tube> <seconds>`.
    PauseTube {
        /// Tube name.
        tube: &'a str,
        /// Seconds to pause.
        delay: u32,
    },
    /// `quit`: the server closes the connection.
    Quit,
}

/// Which command a reply answers: a reply is decoded knowing this.
///
/// `ReserveWithTimeout` keeps its timeout so the reader can add the server's wait
/// to the reply deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[allow(missing_docs)]
pub enum CommandKind {
    Put,
    Use,
    Reserve,
    ReserveWithTimeout { timeout: u32 },
    ReserveJob,
    Delete,
    Release,
    Bury,
    Touch,
    Watch,
    Ignore,
    Peek,
    PeekReady,
    PeekDelayed,
    PeekBuried,
    Kick,
    KickJob,
    Stats,
    StatsJob,
    StatsTube,
    ListTubes,
    ListTubeUsed,
    ListTubesWatched,
    PauseTube,
    Quit,
}

impl CommandKind {
    /// Every kind, once (`reserve-with-timeout` with a one-second wait), for
    /// tests and fuzzers that must cover the whole protocol.
    #[cfg(feature = "test-util")]
    pub const ALL: [CommandKind; 25] = [
        CommandKind::Put,
        CommandKind::Use,
        CommandKind::Reserve,
        CommandKind::ReserveWithTimeout { timeout: 1 },
        CommandKind::ReserveJob,
        CommandKind::Delete,
        CommandKind::Release,
        CommandKind::Bury,
        CommandKind::Touch,
        CommandKind::Watch,
        CommandKind::Ignore,
        CommandKind::Peek,
        CommandKind::PeekReady,
        CommandKind::PeekDelayed,
        CommandKind::PeekBuried,
        CommandKind::Kick,
        CommandKind::KickJob,
        CommandKind::Stats,
        CommandKind::StatsJob,
        CommandKind::StatsTube,
        CommandKind::ListTubes,
        CommandKind::ListTubeUsed,
        CommandKind::ListTubesWatched,
        CommandKind::PauseTube,
        CommandKind::Quit,
    ];

    /// Seconds the server may legitimately wait before it answers.
    pub fn server_wait_secs(self) -> u32 {
        match self {
            CommandKind::ReserveWithTimeout { timeout } => timeout,
            _ => 0,
        }
    }

    /// The command's name on the wire.
    pub fn name(self) -> &'static str {
        match self {
            CommandKind::Put => "put",
            CommandKind::Use => "use",
            CommandKind::Reserve => "reserve",
            CommandKind::ReserveWithTimeout { .. } => "reserve-with-timeout",
            CommandKind::ReserveJob => "reserve-job",
            CommandKind::Delete => "delete",
            CommandKind::Release => "release",
            CommandKind::Bury => "bury",
            CommandKind::Touch => "touch",
            CommandKind::Watch => "watch",
            CommandKind::Ignore => "ignore",
            CommandKind::Peek => "peek",
            CommandKind::PeekReady => "peek-ready",
            CommandKind::PeekDelayed => "peek-delayed",
            CommandKind::PeekBuried => "peek-buried",
            CommandKind::Kick => "kick",
            CommandKind::KickJob => "kick-job",
            CommandKind::Stats => "stats",
            CommandKind::StatsJob => "stats-job",
            CommandKind::StatsTube => "stats-tube",
            CommandKind::ListTubes => "list-tubes",
            CommandKind::ListTubeUsed => "list-tube-used",
            CommandKind::ListTubesWatched => "list-tubes-watched",
            CommandKind::PauseTube => "pause-tube",
            CommandKind::Quit => "quit",
        }
    }
}

/// The longest `reserve-with-timeout` beanstalkd reads as meant: it parses the
/// seconds as a signed 32-bit integer, so larger values wrap.
pub const MAX_RESERVE_TIMEOUT: u32 = i32::MAX as u32;

/// Checks a tube name: 1 to 200 bytes of `A-Z a-z 0-9 - + / ; . $ _ ( )`, not starting with `-`.
pub fn validate_tube(name: &str) -> Result<(), TubeNameError> {
    let bytes = name.as_bytes();
    if bytes.is_empty() {
        return Err(TubeNameError::Empty);
    }
    if bytes.len() > MAX_TUBE_NAME {
        return Err(TubeNameError::TooLong { len: bytes.len() });
    }
    if bytes[0] == b'-' {
        return Err(TubeNameError::LeadingDash);
    }
    match bytes.iter().position(|&b| !is_tube_byte(b)) {
        Some(at) => Err(TubeNameError::BadByte {
            byte: bytes[at],
            at,
        }),
        None => Ok(()),
    }
}

/// True for the bytes a tube name may hold.
#[inline]
pub fn is_tube_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'-' | b'+' | b'/' | b';' | b'.' | b'$' | b'_' | b'(' | b')'
        )
}

/// Writes into a caller-owned buffer, failing instead of panicking when it is full.
pub(crate) struct Cursor<'b> {
    buf: &'b mut [u8],
    len: usize,
}

impl<'b> Cursor<'b> {
    #[inline]
    pub(crate) fn new(buf: &'b mut [u8]) -> Self {
        Cursor { buf, len: 0 }
    }

    #[inline]
    pub(crate) fn bytes(&mut self, s: &[u8]) -> Result<(), EncodeError> {
        let end = self.len + s.len();
        match self.buf.get_mut(self.len..end) {
            Some(dst) => {
                dst.copy_from_slice(s);
                self.len = end;
                Ok(())
            }
            None => Err(EncodeError::BufferTooSmall { needed: end }),
        }
    }

    #[inline]
    pub(crate) fn num<I: itoa::Integer>(&mut self, n: I) -> Result<(), EncodeError> {
        let mut b = itoa::Buffer::new();
        self.bytes(b.format(n).as_bytes())
    }

    #[inline]
    pub(crate) fn sp_num<I: itoa::Integer>(&mut self, n: I) -> Result<(), EncodeError> {
        self.bytes(b" ")?;
        self.num(n)
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl<'a> Command<'a> {
    /// The kind of this command, which the reply parser needs.
    pub fn kind(&self) -> CommandKind {
        match *self {
            Command::Put { .. } => CommandKind::Put,
            Command::Use { .. } => CommandKind::Use,
            Command::Reserve => CommandKind::Reserve,
            Command::ReserveWithTimeout { timeout } => CommandKind::ReserveWithTimeout { timeout },
            Command::ReserveJob { .. } => CommandKind::ReserveJob,
            Command::Delete { .. } => CommandKind::Delete,
            Command::Release { .. } => CommandKind::Release,
            Command::Bury { .. } => CommandKind::Bury,
            Command::Touch { .. } => CommandKind::Touch,
            Command::Watch { .. } => CommandKind::Watch,
            Command::Ignore { .. } => CommandKind::Ignore,
            Command::Peek { .. } => CommandKind::Peek,
            Command::PeekReady => CommandKind::PeekReady,
            Command::PeekDelayed => CommandKind::PeekDelayed,
            Command::PeekBuried => CommandKind::PeekBuried,
            Command::Kick { .. } => CommandKind::Kick,
            Command::KickJob { .. } => CommandKind::KickJob,
            Command::Stats => CommandKind::Stats,
            Command::StatsJob { .. } => CommandKind::StatsJob,
            Command::StatsTube { .. } => CommandKind::StatsTube,
            Command::ListTubes => CommandKind::ListTubes,
            Command::ListTubeUsed => CommandKind::ListTubeUsed,
            Command::ListTubesWatched => CommandKind::ListTubesWatched,
            Command::PauseTube { .. } => CommandKind::PauseTube,
            Command::Quit => CommandKind::Quit,
        }
    }

    /// The body a `put` carries; empty for every other command.
    pub fn body(&self) -> &'a [u8] {
        match *self {
            Command::Put { body, .. } => body,
            _ => &[],
        }
    }

    /// Refuses what the server would reject or misread: bad tube names and
    /// bodies over `max_job_size`.
    pub fn validate(&self, max_job_size: usize) -> Result<(), EncodeError> {
        match *self {
            Command::ReserveWithTimeout { timeout } if timeout > MAX_RESERVE_TIMEOUT => {
                Err(EncodeError::OutOfRange {
                    what: "reserve-with-timeout seconds",
                    value: u64::from(timeout),
                    max: u64::from(MAX_RESERVE_TIMEOUT),
                })
            }
            Command::Put { body, .. } if body.len() > max_job_size => Err(EncodeError::JobTooBig {
                size: body.len(),
                max: max_job_size,
            }),
            Command::Use { tube }
            | Command::Watch { tube }
            | Command::Ignore { tube }
            | Command::StatsTube { tube }
            | Command::PauseTube { tube, .. } => {
                validate_tube(tube).map_err(EncodeError::BadTubeName)
            }
            _ => Ok(()),
        }
    }

    /// Validates, then writes the command line (CRLF included, a put's body not)
    /// into `buf`. Returns the line's length.
    pub fn encode_line(&self, buf: &mut [u8], max_job_size: usize) -> Result<usize, EncodeError> {
        self.validate(max_job_size)?;
        let mut c = Cursor::new(buf);
        let written = self.write_line(&mut c).and_then(|()| c.bytes(b"\r\n"));
        if let Err(e) = written {
            return Err(self.whole_need(e, false));
        }
        if c.len() > MAX_LINE {
            return Err(EncodeError::LineTooLong { len: c.len() });
        }
        Ok(c.len())
    }

    /// Reports a full buffer with the size the line (or the whole request) needs,
    /// not merely how far the cursor got before it ran out.
    fn whole_need(&self, e: EncodeError, whole: bool) -> EncodeError {
        match e {
            EncodeError::BufferTooSmall { .. } => {
                let total = self.encoded_len();
                let needed = match *self {
                    Command::Put { body, .. } if !whole => total - body.len() - 2,
                    _ => total,
                };
                EncodeError::BufferTooSmall { needed }
            }
            other => other,
        }
    }

    /// Validates, then writes the whole request (for a put: line, body and CRLF)
    /// into `buf`. Returns its length.
    pub fn encode(&self, buf: &mut [u8], max_job_size: usize) -> Result<usize, EncodeError> {
        let line = self
            .encode_line(buf, max_job_size)
            .map_err(|e| self.whole_need(e, true))?;
        if let Command::Put { body, .. } = *self {
            let mut c = Cursor { buf, len: line };
            c.bytes(body)
                .and_then(|()| c.bytes(b"\r\n"))
                .map_err(|e| self.whole_need(e, true))?;
            return Ok(c.len());
        }
        Ok(line)
    }

    /// The length of the whole encoded request; an upper bound that is exact for valid commands.
    pub fn encoded_len(&self) -> usize {
        let mut scratch = [0u8; MAX_LINE + 32];
        let mut c = Cursor::new(&mut scratch);
        let line = match self.write_line(&mut c) {
            Ok(()) => c.len() + 2,
            Err(_) => MAX_LINE + 32,
        };
        match *self {
            Command::Put { body, .. } => line + body.len() + 2,
            _ => line,
        }
    }

    fn write_line(&self, c: &mut Cursor<'_>) -> Result<(), EncodeError> {
        match *self {
            Command::Put {
                pri,
                delay,
                ttr,
                body,
            } => {
                c.bytes(b"put")?;
                c.sp_num(pri)?;
                c.sp_num(delay)?;
                c.sp_num(ttr)?;
                c.sp_num(body.len())
            }
            Command::Use { tube } => tube_cmd(c, b"use ", tube),
            Command::Reserve => c.bytes(b"reserve"),
            Command::ReserveWithTimeout { timeout } => {
                c.bytes(b"reserve-with-timeout")?;
                c.sp_num(timeout)
            }
            Command::ReserveJob { id } => id_cmd(c, b"reserve-job", id),
            Command::Delete { id } => id_cmd(c, b"delete", id),
            Command::Release { id, pri, delay } => {
                id_cmd(c, b"release", id)?;
                c.sp_num(pri)?;
                c.sp_num(delay)
            }
            Command::Bury { id, pri } => {
                id_cmd(c, b"bury", id)?;
                c.sp_num(pri)
            }
            Command::Touch { id } => id_cmd(c, b"touch", id),
            Command::Watch { tube } => tube_cmd(c, b"watch ", tube),
            Command::Ignore { tube } => tube_cmd(c, b"ignore ", tube),
            Command::Peek { id } => id_cmd(c, b"peek", id),
            Command::PeekReady => c.bytes(b"peek-ready"),
            Command::PeekDelayed => c.bytes(b"peek-delayed"),
            Command::PeekBuried => c.bytes(b"peek-buried"),
            Command::Kick { bound } => {
                c.bytes(b"kick")?;
                c.sp_num(bound)
            }
            Command::KickJob { id } => id_cmd(c, b"kick-job", id),
            Command::Stats => c.bytes(b"stats"),
            Command::StatsJob { id } => id_cmd(c, b"stats-job", id),
            Command::StatsTube { tube } => tube_cmd(c, b"stats-tube ", tube),
            Command::ListTubes => c.bytes(b"list-tubes"),
            Command::ListTubeUsed => c.bytes(b"list-tube-used"),
            Command::ListTubesWatched => c.bytes(b"list-tubes-watched"),
            Command::PauseTube { tube, delay } => {
                tube_cmd(c, b"pause-tube ", tube)?;
                c.sp_num(delay)
            }
            Command::Quit => c.bytes(b"quit"),
        }
    }
}

#[inline]
fn id_cmd(c: &mut Cursor<'_>, name: &[u8], id: u64) -> Result<(), EncodeError> {
    c.bytes(name)?;
    c.sp_num(id)
}

#[inline]
fn tube_cmd(c: &mut Cursor<'_>, name_sp: &[u8], tube: &str) -> Result<(), EncodeError> {
    c.bytes(name_sp)?;
    c.bytes(tube.as_bytes())
}

/// Whole seconds for a server-side timeout, rounded up so that 500 ms never becomes 0.
pub fn secs_ceil(d: std::time::Duration) -> u32 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    u32::try_from(secs).unwrap_or(u32::MAX)
}
