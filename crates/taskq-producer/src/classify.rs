//! What a reply (or its absence) means for a put, a `use` or a batch: shared by
//! the blocking [`Producer`](crate::Producer) and the async producer, so that
//! both drivers sort every outcome the same way.

use crate::NotSent;

use taskq_proto::{validate_tube, EncodeError, Reply, ReplyError};

use crate::error::{Error, Invalid, Rejection};
use crate::producer::{BatchError, BatchReport, PutOutcome, MAX_PIPELINE_BYTES, MAX_PIPELINE_JOBS};
use crate::JobId;

/// Refuses a tube name the server would reject or misread, before sending.
pub(crate) fn check_tube(tube: &str) -> Result<(), Error> {
    validate_tube(tube).map_err(|e| Error::from(EncodeError::BadTubeName(e)))
}

/// A body over the producer's maximum, refused before sending.
pub(crate) fn too_big(size: usize, max: usize) -> Error {
    Error::from(EncodeError::JobTooBig { size, max })
}

/// The error for a put whose reply was not `INSERTED` (the caller marks the
/// connection broken when it is [`Error::Unknown`]).
#[cold]
pub(crate) fn not_inserted(r: Result<Reply<'_>, taskq_proto::ConnectionError>) -> Error {
    match r {
        Ok(reply) => unexpected(&reply),
        Err(e) => Error::from_conn(e),
    }
}

/// A non-`INSERTED` reply: a rejection, or (never expected, since the parser
/// admits only the replies a command can get) a reply that puts the stream out of step.
#[cold]
pub(crate) fn unexpected(reply: &Reply<'_>) -> Error {
    match Rejection::from_reply(reply) {
        Some(r) => Error::Rejected(r),
        None => Error::Unknown(taskq_proto::ConnectionError::Protocol(
            ReplyError::UnexpectedReply { word: reply.word() },
        )),
    }
}

/// The answer to `use <tube>`: `USING <tube>` or an error (the caller marks
/// the connection broken when it is [`Error::Unknown`]).
pub(crate) fn using(
    r: Result<Reply<'_>, taskq_proto::ConnectionError>,
    tube: &str,
) -> Result<(), Error> {
    match r {
        Ok(Reply::Using { tube: t }) if t == tube => Ok(()),
        Ok(other) => Err(unexpected(&other)),
        Err(e) => Err(Error::from_conn(e)),
    }
}

/// A fresh connection whose `use` failed: nothing of the caller's request left yet.
#[cold]
pub(crate) fn use_failed_on_reconnect(tube: &str, e: Error) -> Error {
    Error::NotSent(NotSent::UseFailed {
        tube: tube.to_owned(),
        cause: Box::new(e),
    })
}

/// The not-sent error of a server still in its reconnect backoff.
#[cold]
pub(crate) fn in_backoff(left: std::time::Duration) -> Error {
    Error::NotSent(NotSent::Backoff { left })
}

/// Checks a batch before anything is sent: `out` long enough, no body over
/// `max`. Returns the part of `out` the batch fills, every slot `NotSent`.
pub(crate) fn start_batch<'o, B: AsRef<[u8]>>(
    bodies: &[B],
    out: &'o mut [PutOutcome],
    max: usize,
) -> Result<&'o mut [PutOutcome], BatchError> {
    if out.len() < bodies.len() {
        return Err(BatchError {
            replied: 0,
            error: Error::Invalid(Invalid::OutcomesTooShort {
                jobs: bodies.len(),
                slots: out.len(),
            }),
        });
    }
    let out = &mut out[..bodies.len()];
    out.fill(PutOutcome::NotSent);
    if let Some(b) = bodies.iter().find(|b| b.as_ref().len() > max) {
        return Err(BatchError {
            replied: 0,
            error: too_big(b.as_ref().len(), max),
        });
    }
    Ok(out)
}

/// Where the write that starts at job `from` ends: at most
/// [`MAX_PIPELINE_JOBS`] jobs and [`MAX_PIPELINE_BYTES`] bytes (but always at
/// least one job).
pub(crate) fn chunk_end<B: AsRef<[u8]>>(bodies: &[B], from: usize) -> usize {
    let mut end = from;
    let mut bytes = 0usize;
    while end < bodies.len() && end - from < MAX_PIPELINE_JOBS {
        let len = bodies[end].as_ref().len();
        if end > from && bytes + len > MAX_PIPELINE_BYTES {
            break;
        }
        bytes += len + 32;
        end += 1;
    }
    end
}

/// Records job `i`'s reply in `out` and `report`; an error that is neither
/// an id nor a rejection is handed back (the batch breaks off there).
#[inline]
pub(crate) fn record(
    r: Result<JobId, Error>,
    out: &mut PutOutcome,
    report: &mut BatchReport,
) -> Result<(), Error> {
    match r {
        Ok(id) => {
            *out = PutOutcome::Inserted(id);
            report.inserted += 1;
        }
        Err(Error::Rejected(r)) => {
            *out = PutOutcome::Rejected(r);
            report.rejected += 1;
        }
        Err(e) => return Err(e),
    }
    Ok(())
}
