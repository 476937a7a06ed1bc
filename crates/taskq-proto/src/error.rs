//! Error types: one enum per operation, each variant says what happened.

use std::fmt;
use std::io;
use std::time::Duration;

/// Why a command could not be encoded. Nothing was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum EncodeError {
    /// A tube name the server would reject or misread.
    BadTubeName(TubeNameError),
    /// A job body larger than the configured maximum job size.
    JobTooBig {
        /// The body's length in bytes.
        size: usize,
        /// The configured maximum.
        max: usize,
    },
    /// The command line would exceed 224 bytes, which the server answers with `BAD_FORMAT`.
    LineTooLong {
        /// The length the line would have, CRLF included.
        len: usize,
    },
    /// A number the server would misread: beanstalkd reads the
    /// `reserve-with-timeout` seconds as a signed 32-bit integer.
    OutOfRange {
        /// The argument.
        what: &'static str,
        /// The value given.
        value: u64,
        /// The largest value the server reads as meant.
        max: u64,
    },
    /// The caller's buffer cannot hold the request.
    BufferTooSmall {
        /// Bytes the buffer needs: the whole request for `encode`, the line for `encode_line`.
        needed: usize,
    },
}

/// What is wrong with a tube name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TubeNameError {
    /// The name is empty.
    Empty,
    /// The name is longer than 200 bytes.
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The name starts with `-`.
    LeadingDash,
    /// The name holds a byte outside `A-Z a-z 0-9 - + / ; . $ _ ( )`.
    BadByte {
        /// The offending byte.
        byte: u8,
        /// Where it is.
        at: usize,
    },
    /// On JetStream, where a tube is a subject token and a consumer's name:
    /// the name holds a byte outside `A-Z a-z 0-9 - _`.
    BadSubjectByte {
        /// The offending byte.
        byte: u8,
        /// Where it is.
        at: usize,
    },
}

/// Why a reply could not be decoded. The connection that received it is out of step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReplyError {
    /// No line end within the 224 bytes a reply line may have.
    LineTooLong,
    /// A line ended with `\n` that was not preceded by `\r`.
    BadLineEnd,
    /// The reply word is not one the protocol defines.
    UnknownReply,
    /// The reply word exists but cannot answer the command it was read for.
    UnexpectedReply {
        /// The word that arrived.
        word: &'static str,
    },
    /// The word is right but its arguments are missing, extra or badly spaced.
    Malformed {
        /// The reply word.
        word: &'static str,
    },
    /// A number that is not unsigned decimal or does not fit its type.
    BadNumber,
    /// A body or YAML byte count beyond the configured maximum.
    BodyTooLarge {
        /// The count the server announced.
        len: u64,
        /// The configured maximum.
        max: usize,
    },
    /// The body was not followed by `\r\n`.
    MissingBodyCrlf,
}

/// Why a YAML document from `stats*` or `list-tubes*` could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum YamlError {
    /// The document does not start with a `---` line.
    MissingHeader,
    /// A line is neither `key: value` nor `- item` as the document requires.
    BadLine {
        /// The 1-based line number.
        line: usize,
    },
    /// A field that must be a number is not one.
    BadNumber {
        /// The field's key.
        key: &'static str,
    },
    /// The document is not UTF-8 where text is required.
    NotUtf8,
}

/// Why a request on a [`Connection`](crate::Connection) failed.
///
/// The variants answer the question a caller has to decide on: was the request
/// not sent (safe to send elsewhere), or sent with its outcome unknown (it may
/// have taken effect), and is the connection still usable.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConnectionError {
    /// The arguments were refused before anything was sent. The connection is still usable.
    Invalid(EncodeError),
    /// Connecting failed, or the write failed before any byte of the request left. Not sent.
    NotSent(io::Error),
    /// The connection was already broken; nothing was sent. Open a new one.
    Broken,
    /// The request was sent (at least in part) and no complete reply came before the
    /// whole-reply deadline. Outcome unknown; the connection is now broken.
    Timeout {
        /// How long the reply was waited for.
        waited: Duration,
    },
    /// The server closed the connection before a complete reply. Outcome unknown; broken.
    Closed,
    /// An I/O error after the request was at least partly sent. Outcome unknown; broken.
    Io(io::Error),
    /// The reply could not be decoded. Outcome unknown; broken.
    Protocol(ReplyError),
    /// A reply was asked for while no request awaits one. Nothing was read; the
    /// connection is still usable.
    NothingOwed,
}

impl ConnectionError {
    /// True when the request may have reached the server and taken effect.
    pub fn outcome_unknown(&self) -> bool {
        matches!(
            self,
            ConnectionError::Timeout { .. }
                | ConnectionError::Closed
                | ConnectionError::Io(_)
                | ConnectionError::Protocol(_)
        )
    }

    /// True when nothing of the request reached the server.
    pub fn not_sent(&self) -> bool {
        matches!(
            self,
            ConnectionError::Invalid(_)
                | ConnectionError::NotSent(_)
                | ConnectionError::Broken
                | ConnectionError::NothingOwed
        )
    }

    /// True when the connection must be closed and replaced.
    pub fn breaks_connection(&self) -> bool {
        !matches!(
            self,
            ConnectionError::Invalid(_) | ConnectionError::NothingOwed
        )
    }

    /// True when the error is a missed reply deadline.
    pub fn is_timeout(&self) -> bool {
        matches!(self, ConnectionError::Timeout { .. })
    }
}

impl From<EncodeError> for ConnectionError {
    fn from(e: EncodeError) -> Self {
        ConnectionError::Invalid(e)
    }
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EncodeError::BadTubeName(e) => write!(f, "bad tube name: {e}"),
            EncodeError::JobTooBig { size, max } => {
                write!(f, "job body of {size} bytes exceeds the maximum of {max}")
            }
            EncodeError::LineTooLong { len } => {
                write!(f, "command line of {len} bytes exceeds 224")
            }
            EncodeError::OutOfRange { what, value, max } => {
                write!(
                    f,
                    "{what} of {value} is more than the server reads as meant ({max})"
                )
            }
            EncodeError::BufferTooSmall { needed } => {
                write!(f, "buffer too small: the request needs {needed} bytes")
            }
        }
    }
}

impl fmt::Display for TubeNameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TubeNameError::Empty => f.write_str("tube name is empty"),
            TubeNameError::TooLong { len } => {
                write!(f, "tube name is {len} bytes, more than 200")
            }
            TubeNameError::LeadingDash => f.write_str("tube name starts with '-'"),
            TubeNameError::BadByte { byte, at } => write!(
                f,
                "tube name has byte 0x{byte:02x} at {at}; allowed: A-Z a-z 0-9 - + / ; . $ _ ( )"
            ),
            TubeNameError::BadSubjectByte { byte, at } => write!(
                f,
                "tube name has byte 0x{byte:02x} at {at}; on JetStream allowed: A-Z a-z 0-9 - _"
            ),
        }
    }
}

impl fmt::Display for ReplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplyError::LineTooLong => f.write_str("reply line longer than 224 bytes"),
            ReplyError::BadLineEnd => f.write_str("reply line ends in LF without CR"),
            ReplyError::UnknownReply => f.write_str("unknown reply word"),
            ReplyError::UnexpectedReply { word } => {
                write!(f, "reply {word} cannot answer the command sent")
            }
            ReplyError::Malformed { word } => write!(f, "malformed {word} reply"),
            ReplyError::BadNumber => f.write_str("bad number in reply"),
            ReplyError::BodyTooLarge { len, max } => {
                write!(
                    f,
                    "reply announces {len} bytes, more than the maximum {max}"
                )
            }
            ReplyError::MissingBodyCrlf => f.write_str("reply body not followed by CRLF"),
        }
    }
}

impl fmt::Display for YamlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            YamlError::MissingHeader => f.write_str("YAML document lacks its '---' line"),
            YamlError::BadLine { line } => write!(f, "YAML line {line} is malformed"),
            YamlError::BadNumber { key } => write!(f, "YAML field {key} is not a number"),
            YamlError::NotUtf8 => f.write_str("YAML text is not UTF-8"),
        }
    }
}

impl fmt::Display for ConnectionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectionError::Invalid(e) => write!(f, "invalid request, not sent: {e}"),
            ConnectionError::NotSent(e) => write!(f, "not sent: {e}"),
            ConnectionError::Broken => f.write_str("connection is broken; not sent"),
            ConnectionError::Timeout { waited } => {
                write!(f, "no complete reply within {waited:?}; outcome unknown")
            }
            ConnectionError::Closed => f.write_str("server closed the connection; outcome unknown"),
            ConnectionError::Io(e) => write!(f, "I/O error after sending; outcome unknown: {e}"),
            ConnectionError::Protocol(e) => write!(f, "bad reply; outcome unknown: {e}"),
            ConnectionError::NothingOwed => f.write_str("no request awaits a reply"),
        }
    }
}

impl std::error::Error for EncodeError {}
impl std::error::Error for TubeNameError {}
impl std::error::Error for ReplyError {}
impl std::error::Error for YamlError {}
/// `Display` already names the inner error, so `source` does not repeat it:
/// a report that walks the chain prints each cause once.
impl std::error::Error for ConnectionError {}
