//! What a reply (or its absence) means for a put, a `use` or a batch: shared by
//! the blocking [`Producer`](crate::Producer) and the async producer, so that
//! both drivers sort every outcome the same way.

use std::time::{Duration, Instant};

use taskq_proto::{validate_tube, Command, ConnectionError, EncodeError, Reply, ReplyError};

use crate::error::{Error, Invalid, NotSent, Rejection};
use crate::outcome::{BatchError, BatchReport, PutOutcome, MAX_PIPELINE_BYTES, MAX_PIPELINE_JOBS};
use crate::{JobId, PutOptions};

/// Refuses a tube name the server would reject or misread, before sending:
/// beanstalkd's rule, or on JetStream a single subject token.
pub(crate) fn check_tube(tube: &str, jetstream: bool) -> Result<(), Error> {
    let check = if jetstream {
        taskq_connect::validate_subject_tube
    } else {
        validate_tube
    };
    check(tube).map_err(|e| Error::from(EncodeError::BadTubeName(e)))
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

/// One write's worth of a batch: `bodies[from..end]`, put with `opts`; on
/// JetStream job `i` carries the message id of counter `first + i`, so that
/// a chunk sent again is stored once.
#[derive(Debug)]
pub(crate) struct Chunk<'b, B> {
    pub(crate) bodies: &'b [B],
    pub(crate) from: usize,
    pub(crate) end: usize,
    pub(crate) first: u64,
    pub(crate) opts: PutOptions,
}

impl<B> Clone for Chunk<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B> Copy for Chunk<'_, B> {}

impl<B: AsRef<[u8]>> Chunk<'_, B> {
    /// Queues the chunk's puts on beanstalkd (`queue` takes one command);
    /// a failure leaves nothing of the chunk written, and the batch breaks
    /// off at its start.
    pub(crate) fn queue_puts(
        &self,
        mut queue: impl FnMut(&Command<'_>) -> Result<(), ConnectionError>,
    ) -> Result<(), BatchError> {
        for body in &self.bodies[self.from..self.end] {
            if let Err(e) = queue(&self.opts.command(body.as_ref())) {
                return Err(self.not_sent(Error::from_conn(e)));
            }
        }
        Ok(())
    }

    /// The chunk broke off at its start with `error`, nothing of it
    /// written.
    pub(crate) fn not_sent(&self, error: Error) -> BatchError {
        BatchError {
            replied: self.from,
            error,
        }
    }

    /// The span of the batch the chunk covers.
    pub(crate) fn span(&self) -> (usize, usize) {
        (self.from, self.end)
    }
}

/// One batch from its check to its report, for every producer (blocking
/// and async, on both engines), with no I/O: which chunk goes next (one
/// write's worth: [`chunk_end`]), and after a chunk broke off, where the
/// batch goes on and after what pause ([`BatchRetry`]), or the error it ends
/// with. A driver sends each chunk and reads its replies into `report`.
#[derive(Debug)]
pub(crate) struct Batch {
    /// The first job not yet answered.
    from: usize,
    len: usize,
    retry: BatchRetry,
    /// What the replies came to so far.
    pub(crate) report: BatchReport,
}

impl Batch {
    /// Checks the batch ([`start_batch`]) and starts it, to go on after a
    /// break as `retry` says. Returns the part of `out` it fills.
    pub(crate) fn start<'o, B: AsRef<[u8]>>(
        bodies: &[B],
        out: &'o mut [PutOutcome],
        max: usize,
        retry: BatchRetry,
    ) -> Result<(Batch, &'o mut [PutOutcome]), BatchError> {
        let out = start_batch(bodies, out, max)?;
        let batch = Batch {
            from: 0,
            len: bodies.len(),
            retry,
            report: BatchReport::default(),
        };
        Ok((batch, out))
    }

    /// The chunk to send next, of `bodies` put with `opts` (on JetStream
    /// job `i` with the message id of counter `first + i`); `None` once
    /// every job was answered.
    pub(crate) fn next_chunk<'b, B: AsRef<[u8]>>(
        &self,
        bodies: &'b [B],
        first: u64,
        opts: PutOptions,
    ) -> Option<Chunk<'b, B>> {
        (self.from < self.len).then(|| Chunk {
            bodies,
            from: self.from,
            end: chunk_end(bodies, self.from),
            first,
            opts,
        })
    }

    /// After the chunk sent last came to `r` (where the next one starts, or
    /// where it broke off): `Ok(None)` to go on at once, `Ok(Some(pause))`
    /// to go on after `pause`, or the error the batch ends with (`out`
    /// updated). The clock is read only after a break.
    pub(crate) fn after(
        &mut self,
        r: Result<usize, BatchError>,
        out: &mut [PutOutcome],
        now: impl FnOnce() -> Instant,
    ) -> Result<Option<Duration>, BatchError> {
        match r {
            Ok(next) => {
                self.from = next;
                Ok(None)
            }
            Err(e) => {
                let (next, again) = self.retry.after(e, out, now())?;
                self.from = next;
                Ok(again.pause())
            }
        }
    }
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
        // Sent before with no reply, and refused now: the earlier send
        // may have queued it, so it stays unknown (not counted either way).
        Err(Error::Rejected(r)) if *out == PutOutcome::Unknown && !r.queued() => {}
        Err(Error::Rejected(r)) => {
            *out = PutOutcome::Rejected(r);
            report.rejected += 1;
        }
        Err(e) => return Err(e),
    }
    Ok(())
}

/// A chunk whose write failed: every job of it is `Unknown` in `out` when
/// some of the write may have left (else they stay `NotSent`).
#[cold]
pub(crate) fn chunk_write_failed(
    e: Error,
    out: &mut [PutOutcome],
    (from, end): (usize, usize),
) -> BatchError {
    if e.outcome_unknown() {
        out[from..end].fill(PutOutcome::Unknown);
    }
    BatchError {
        replied: from,
        error: e,
    }
}

/// A written chunk's replies, taken one at a time in the order written
/// into `out[from..end]` and the batch's report: the one rule of what each
/// comes to, for the blocking and the async drivers alike. At the first
/// reply that is neither an id nor a rejection, the rest of the chunk is
/// `Unknown` and the batch breaks off there.
#[derive(Debug)]
pub(crate) struct Replies<'a> {
    out: &'a mut [PutOutcome],
    report: &'a mut BatchReport,
    at: usize,
    end: usize,
}

impl<'a> Replies<'a> {
    /// The replies owed for `out[from..end]`.
    pub(crate) fn new(
        out: &'a mut [PutOutcome],
        report: &'a mut BatchReport,
        (from, end): (usize, usize),
    ) -> Replies<'a> {
        Replies {
            out,
            report,
            at: from,
            end,
        }
    }

    /// Whether a reply is still owed.
    #[inline]
    pub(crate) fn owed(&self) -> bool {
        self.at < self.end
    }

    /// Takes the next reply.
    #[inline]
    pub(crate) fn take(&mut self, r: Result<JobId, Error>) -> Result<(), BatchError> {
        let i = self.at;
        if let Err(e) = record(r, &mut self.out[i], self.report) {
            // These puts were written: whatever ended the reading (a
            // session found out of step by an earlier reply says "broken"),
            // each may be queued.
            let e = if e.not_sent() {
                Error::Unknown(taskq_proto::ConnectionError::Broken)
            } else {
                e
            };
            self.out[i..self.end].fill(PutOutcome::Unknown);
            self.at = self.end;
            return Err(BatchError {
                replied: i,
                error: e,
            });
        }
        self.at += 1;
        Ok(())
    }
}

/// Reads a written chunk's replies in order (`next` reads one), as
/// [`Replies`] takes them.
#[inline]
pub(crate) fn read_chunk(
    out: &mut [PutOutcome],
    report: &mut BatchReport,
    span: (usize, usize),
    mut next: impl FnMut() -> Result<JobId, Error>,
) -> Result<(), BatchError> {
    let mut replies = Replies::new(out, report, span);
    while replies.owed() {
        replies.take(next())?;
    }
    Ok(())
}

/// JetStream: where a batch that broke off at `e` starts again (with the
/// same message ids). A job sent once stays unknown in `out` (it may be
/// stored) until its re-send is answered; the rest are not sent yet.
fn resend_from(e: &BatchError, out: &mut [PutOutcome]) -> usize {
    for o in &mut out[e.replied..] {
        if !matches!(o, PutOutcome::Unknown) {
            *o = PutOutcome::NotSent;
        }
    }
    e.replied
}

/// The wait before a put or chunk goes again after the stream answered at
/// once that it has no leader (an election is under way): not a tight loop.
const RESOLVE_PAUSE: Duration = Duration::from_millis(100);

/// What to do before sending again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SendAgain {
    /// Send again at once.
    Now,
    /// Wait [`RESOLVE_PAUSE`], then send again.
    AfterPause,
}

impl SendAgain {
    /// The wait before sending again, if any.
    pub(crate) fn pause(self) -> Option<Duration> {
        match self {
            SendAgain::Now => None,
            SendAgain::AfterPause => Some(RESOLVE_PAUSE),
        }
    }

    fn after(e: &Error) -> SendAgain {
        if matches!(e, Error::NotSent(NotSent::Unavailable)) {
            SendAgain::AfterPause
        } else {
            SendAgain::Now
        }
    }
}

/// The one rule for a batch that broke off, for the blocking and the async
/// producer on both engines: in at-least-once mode the jobs from the break
/// on are sent again (`retries` times; an invalid batch never); on
/// JetStream, until `resolve_until`, a chunk whose outcome is unknown or
/// that was not sent goes again with its message ids, stored once.
#[derive(Debug)]
pub(crate) struct BatchRetry {
    retries: u32,
    resolve_until: Option<Instant>,
}

impl BatchRetry {
    pub(crate) fn new(retries: u32, resolve_until: Option<Instant>) -> BatchRetry {
        BatchRetry {
            retries,
            resolve_until,
        }
    }

    /// Where the batch goes on after `e` (with `out` updated), and whether
    /// to pause first; or `e` when the batch ends with it.
    pub(crate) fn after(
        &mut self,
        e: BatchError,
        out: &mut [PutOutcome],
        now: Instant,
    ) -> Result<(usize, SendAgain), BatchError> {
        if self.retries > 0 && !matches!(e.error, Error::Invalid(_)) {
            self.retries -= 1;
            // A job written with no reply stays unknown until a re-send
            // answers for it: if none does, it may be stored, and is never
            // reported as not sent.
            return Ok((resend_from(&e, out), SendAgain::Now));
        }
        let resolving = self.resolve_until.is_some_and(|until| now < until);
        if resolving && matches!(e.error, Error::Unknown(_) | Error::NotSent(_)) {
            return Ok((resend_from(&e, out), SendAgain::after(&e.error)));
        }
        Err(e)
    }
}

/// Which engine's rule applies to a put whose outcome is unknown or that
/// could not be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rule {
    /// beanstalkd: sent again this many times (at-least-once mode).
    Retries(u32),
    /// JetStream: sent again with its message id until this long after its
    /// first failure.
    Resolve(Duration),
}

/// The one rule for a single put after an attempt, for every producer
/// (blocking, async, shared) on both engines, with no I/O: whether it goes
/// again, after what pause, and what its outcome is when it does not. The
/// drivers only send, wait and reconnect as it says.
#[derive(Debug)]
pub(crate) struct Attempts {
    rule: Rule,
    /// Retries left (beanstalkd).
    retries: u32,
    /// JetStream: the resolution under way, from the first failure on.
    resolve: Option<Resolve>,
    /// An attempt may have reached the server (its outcome was unknown):
    /// however the later ones fail, the put is never "not sent".
    maybe_stored: bool,
}

impl Attempts {
    /// A put's attempts under `rule`, none failed yet.
    pub(crate) fn new(rule: Rule) -> Attempts {
        Attempts {
            rule,
            retries: match rule {
                Rule::Retries(n) => n,
                Rule::Resolve(_) => 0,
            },
            resolve: None,
            maybe_stored: false,
        }
    }

    /// After attempt `r` at `now`: `Some` to send again (and how), `None`
    /// when `r` is the last word (answered, refused, invalid, or no tries
    /// or time left).
    pub(crate) fn again(&mut self, r: &Result<JobId, Error>, now: Instant) -> Option<SendAgain> {
        self.maybe_stored |= matches!(r, Err(Error::Unknown(_)));
        match self.rule {
            Rule::Retries(_) => {
                if self.retries > 0 && matches!(r, Err(Error::Unknown(_) | Error::NotSent(_))) {
                    self.retries -= 1;
                    return Some(SendAgain::Now);
                }
                None
            }
            Rule::Resolve(d) => self
                .resolve
                .get_or_insert_with(|| Resolve::new(now + d))
                .again(r, now),
        }
    }

    /// The put's outcome, given the last attempt's `r`: once an attempt
    /// may have reached the server, a later one not sent, or refused
    /// without queuing, leaves it unknown: never "not sent" or "rejected",
    /// which promise that nothing was queued and a re-put is safe.
    pub(crate) fn outcome(self, r: Result<JobId, Error>) -> Result<JobId, Error> {
        let later = match &r {
            Err(Error::NotSent(e)) => format!("no later send reached the server ({e})"),
            Err(Error::Rejected(j)) if !j.queued() => {
                format!("a later send was refused ({})", j.word())
            }
            _ => return r,
        };
        if !self.maybe_stored {
            return r;
        }
        Err(Error::Unknown(taskq_proto::ConnectionError::Io(
            std::io::Error::other(format!("sent earlier with no reply, and {later}")),
        )))
    }
}

/// JetStream's resolution of one put whose outcome is unknown or that was
/// not sent: it goes again with its message id until the stream answers or
/// time runs out, for the blocking and the async producer alike.
#[derive(Debug)]
struct Resolve {
    until: Instant,
}

impl Resolve {
    fn new(until: Instant) -> Resolve {
        Resolve { until }
    }

    /// After attempt `r`: `Some` to send again (and how), `None` when `r`
    /// is the last word (answered, refused, or out of time).
    fn again(&mut self, r: &Result<JobId, Error>, now: Instant) -> Option<SendAgain> {
        match r {
            Err(e @ (Error::Unknown(_) | Error::NotSent(_))) => {
                (now < self.until).then(|| SendAgain::after(e))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    //! The producer's outcome rules, through the protocol session with
    //! scripted bytes: no socket, no clock, no sleep.

    use taskq_proto::{Command, ConnectionError, Limits, Session};

    use super::*;

    /// What a put comes to when the server sends `bytes` and then closes.
    fn put_answered(bytes: &[u8]) -> Result<JobId, Error> {
        let mut s = Session::new(Limits::default());
        let put = Command::Put {
            pri: 1,
            delay: 0,
            ttr: 5,
            body: b"job",
        };
        s.encode(&put).unwrap();
        if !bytes.is_empty() {
            let room = s.recv_room().unwrap();
            room[..bytes.len()].copy_from_slice(bytes);
            s.received(bytes.len());
        }
        match s.poll_reply() {
            Ok(Some(Reply::Inserted { id })) => Ok(JobId::new(id)),
            Ok(Some(r)) => Err(not_inserted(Ok(r))),
            // No whole reply before the close.
            Ok(None) => Err(not_inserted(Err(ConnectionError::Closed))),
            Err(e) => Err(not_inserted(Err(e))),
        }
    }

    fn unknown() -> Error {
        Error::Unknown(ConnectionError::Io(std::io::Error::other("no reply")))
    }

    fn broke(replied: usize, error: Error) -> BatchError {
        BatchError { replied, error }
    }

    #[test]
    fn a_batch_goes_out_a_write_at_a_time_and_on_from_where_it_broke_off() {
        let body = [b'x'; 10];
        let bodies = vec![&body[..]; MAX_PIPELINE_JOBS + 10];
        let mut out = vec![PutOutcome::Unknown; bodies.len()];
        // Checked first: nothing sent for an outcome slice too short.
        let short = Batch::start(&bodies, &mut out[..3], 100, BatchRetry::new(0, None));
        assert!(matches!(
            short.map(|_| ()).unwrap_err().error,
            Error::Invalid(Invalid::OutcomesTooShort { .. })
        ));
        let (mut batch, out) =
            Batch::start(&bodies, &mut out, 100, BatchRetry::new(1, None)).unwrap();
        assert!(out.iter().all(|o| *o == PutOutcome::NotSent));
        let chunk = batch.next_chunk(&bodies, 9, PutOptions::default()).unwrap();
        assert_eq!(chunk.first, 9, "the batch's first message id counter");
        let first = span(Some(chunk)).unwrap();
        assert_eq!(first, (0, MAX_PIPELINE_JOBS));
        // The clock is not read while chunks come back whole.
        let whole = batch.after(Ok(first.1), out, || unreachable!("no clock"));
        assert_eq!(whole.unwrap(), None);
        let second = span(batch.next_chunk(&bodies, 9, PutOptions::default())).unwrap();
        assert_eq!(second, (MAX_PIPELINE_JOBS, bodies.len()));
        // Broken off 3 jobs in: at-least-once mode goes on from there.
        let broken = Err(broke(MAX_PIPELINE_JOBS + 3, unknown()));
        assert_eq!(batch.after(broken, out, Instant::now).unwrap(), None);
        assert_eq!(
            span(batch.next_chunk(&bodies, 9, PutOptions::default())),
            Some((MAX_PIPELINE_JOBS + 3, bodies.len()))
        );
        // No retry left: the batch ends with the error.
        let broken = Err(broke(MAX_PIPELINE_JOBS + 5, unknown()));
        assert_eq!(
            batch.after(broken, out, Instant::now).unwrap_err().replied,
            MAX_PIPELINE_JOBS + 5
        );
        // Done once every job was answered.
        let (mut batch, out) =
            Batch::start(&bodies[..2], out, 100, BatchRetry::new(0, None)).unwrap();
        assert_eq!(
            span(batch.next_chunk(&bodies[..2], 9, PutOptions::default())),
            Some((0, 2))
        );
        batch.after(Ok(2), out, Instant::now).unwrap();
        assert_eq!(
            span(batch.next_chunk(&bodies[..2], 9, PutOptions::default())),
            None
        );
    }

    /// A chunk's jobs, `(from, end)`.
    fn span<B>(c: Option<Chunk<'_, B>>) -> Option<(usize, usize)> {
        c.map(|c| (c.from, c.end))
    }

    #[test]
    fn a_broken_batch_goes_again_from_its_break_until_retries_and_time_run_out() {
        let t0 = Instant::now();
        let until = t0 + Duration::from_secs(1);
        let late = until + Duration::from_millis(1);
        let mut out = [PutOutcome::Unknown; 4];

        // At-least-once mode first: the jobs from the break on go again.
        // Job 2 was written with no reply: unknown until a re-send answers
        // for it (if none does, it may be stored: never "not sent"); job 3
        // was not written.
        let mut retry = BatchRetry::new(1, Some(until));
        out[1] = PutOutcome::Inserted(JobId::new(7));
        out[3] = PutOutcome::NotSent;
        let r = retry.after(broke(2, unknown()), &mut out, t0);
        assert_eq!(r.map_err(|e| e.replied).unwrap(), (2, SendAgain::Now));
        assert!(matches!(
            out[2..],
            [PutOutcome::Unknown, PutOutcome::NotSent]
        ));
        // Then JetStream's resolution: a job sent once stays unknown.
        out[2] = PutOutcome::Unknown;
        let r = retry.after(broke(2, Error::NotSent(NotSent::Unavailable)), &mut out, t0);
        assert_eq!(
            r.map_err(|e| e.replied).unwrap(),
            (2, SendAgain::AfterPause)
        );
        assert_eq!(SendAgain::AfterPause.pause(), Some(RESOLVE_PAUSE));
        assert!(matches!(
            out[2..],
            [PutOutcome::Unknown, PutOutcome::NotSent]
        ));
        // Out of time, the batch ends with its error.
        let e = retry
            .after(broke(3, unknown()), &mut out, late)
            .unwrap_err();
        assert!(e.error.outcome_unknown() && e.replied == 3);

        // Never again for an invalid batch, nor on beanstalkd past the retries.
        let invalid = Error::Invalid(Invalid::OutcomesTooShort { jobs: 2, slots: 1 });
        let mut retry = BatchRetry::new(3, Some(until));
        assert!(retry.after(broke(0, invalid), &mut out, t0).is_err());
        let mut retry = BatchRetry::new(0, None);
        assert!(retry.after(broke(0, unknown()), &mut out, t0).is_err());
        // A refusal is final on JetStream too.
        let mut retry = BatchRetry::new(0, Some(until));
        let refused = Error::Rejected(Rejection::Draining);
        assert!(retry.after(broke(0, refused), &mut out, t0).is_err());
    }

    #[test]
    fn a_put_resolves_until_answered_and_stays_unknown_once_it_may_be_stored() {
        let t0 = Instant::now();
        let rule = Rule::Resolve(Duration::from_secs(1));
        // The window runs from the first failure.
        let late = t0 + Duration::from_secs(1) + Duration::from_millis(1);

        let mut r = Attempts::new(rule);
        assert_eq!(
            r.again(&Err(Error::NotSent(NotSent::Broken)), t0),
            Some(SendAgain::Now)
        );
        assert_eq!(
            r.again(&Err(Error::NotSent(NotSent::Unavailable)), t0),
            Some(SendAgain::AfterPause)
        );
        assert_eq!(r.again(&Ok(JobId::new(3)), t0), None);
        assert_eq!(r.outcome(Ok(JobId::new(3))).unwrap().get(), 3);

        // Never sent at all: not sent, out of time.
        let mut r = Attempts::new(rule);
        let last = Err(Error::NotSent(NotSent::Broken));
        assert_eq!(r.again(&last, t0), Some(SendAgain::Now));
        assert_eq!(r.again(&last, late), None);
        assert!(r.outcome(last).unwrap_err().not_sent());

        // Sent once with no reply, then no re-send got through: unknown.
        let mut r = Attempts::new(rule);
        assert_eq!(r.again(&Err(unknown()), t0), Some(SendAgain::Now));
        let last = Err(Error::NotSent(NotSent::Broken));
        assert_eq!(r.again(&last, late), None);
        let e = r.outcome(last).unwrap_err();
        assert!(e.outcome_unknown() && !e.not_sent(), "{e}");

        // A rejection ends it at once.
        let mut r = Attempts::new(rule);
        assert_eq!(
            r.again(&Err(Error::Rejected(Rejection::Draining)), t0),
            None
        );
    }

    #[test]
    fn a_put_goes_again_as_many_times_as_retries_allow_and_never_after_an_answer() {
        let t0 = Instant::now();
        let mut a = Attempts::new(Rule::Retries(2));
        assert_eq!(a.again(&Err(unknown()), t0), Some(SendAgain::Now));
        assert_eq!(
            a.again(&Err(Error::NotSent(NotSent::Broken)), t0),
            Some(SendAgain::Now)
        );
        let last = Err(unknown());
        assert_eq!(a.again(&last, t0), None);
        assert!(a.outcome(last).unwrap_err().outcome_unknown());
        // Not at-least-once: the first failure is the outcome.
        let mut a = Attempts::new(Rule::Retries(0));
        assert_eq!(a.again(&Err(unknown()), t0), None);
        // An answer, or a refusal, is never sent again.
        let mut a = Attempts::new(Rule::Retries(5));
        assert_eq!(
            a.again(&Err(Error::Rejected(Rejection::Draining)), t0),
            None
        );
        assert_eq!(a.again(&Ok(JobId::new(1)), t0), None);
        let invalid = Err(Error::Invalid(crate::Invalid::NoServers));
        assert_eq!(a.again(&invalid, t0), None);
        // Written once with no reply, then the retry could not be sent (the
        // server down): unknown, never "not sent", which would promise that
        // sending it again makes no second job.
        let mut a = Attempts::new(Rule::Retries(1));
        assert_eq!(a.again(&Err(unknown()), t0), Some(SendAgain::Now));
        let last = Err(Error::NotSent(NotSent::Broken));
        assert_eq!(a.again(&last, t0), None);
        let e = a.outcome(last).unwrap_err();
        assert!(e.outcome_unknown() && !e.not_sent(), "{e}");
        // Never sent at all: not sent.
        let mut a = Attempts::new(Rule::Retries(1));
        let last = Err(Error::NotSent(NotSent::Broken));
        assert_eq!(a.again(&last, t0), Some(SendAgain::Now));
        assert_eq!(a.again(&last, t0), None);
        assert!(a.outcome(last).unwrap_err().not_sent());
    }

    #[test]
    fn a_refusal_after_a_send_with_no_reply_leaves_the_put_unknown() {
        let t0 = Instant::now();
        // Written with no reply (perhaps queued), then the retry refused:
        // the refusal is the retry's, not the put's.
        for rule in [Rule::Retries(1), Rule::Resolve(Duration::from_secs(5))] {
            let mut a = Attempts::new(rule);
            assert_eq!(a.again(&Err(unknown()), t0), Some(SendAgain::Now));
            let last = Err(Error::Rejected(Rejection::OutOfMemory));
            assert_eq!(a.again(&last, t0), None);
            let e = a.outcome(last).unwrap_err();
            assert!(e.outcome_unknown() && e.maybe_queued(), "{rule:?}: {e}");
            assert!(e.to_string().contains("OUT_OF_MEMORY"), "{e}");
        }
        // A refusal that queued it (BURIED <id>) says so, as it is.
        let mut a = Attempts::new(Rule::Retries(1));
        assert_eq!(a.again(&Err(unknown()), t0), Some(SendAgain::Now));
        let buried = Rejection::InsertedBuried { id: JobId::new(9) };
        let last = Err(Error::Rejected(buried));
        assert_eq!(a.again(&last, t0), None);
        assert!(matches!(a.outcome(last), Err(Error::Rejected(r)) if r == buried));
        // Refused at the first send: rejected.
        let mut a = Attempts::new(Rule::Retries(1));
        let last = Err(Error::Rejected(Rejection::Draining));
        assert_eq!(a.again(&last, t0), None);
        assert!(matches!(
            a.outcome(last),
            Err(Error::Rejected(Rejection::Draining))
        ));
        // A batch: a job sent with no reply (unknown) and refused on its
        // re-send stays unknown; one refused at its first send is rejected.
        let mut out = [PutOutcome::Unknown, PutOutcome::NotSent];
        let mut report = BatchReport::default();
        let mut replies = Replies::new(&mut out, &mut report, (0, 2));
        replies
            .take(Err(Error::Rejected(Rejection::Draining)))
            .unwrap();
        replies
            .take(Err(Error::Rejected(Rejection::Draining)))
            .unwrap();
        assert_eq!(
            out,
            [
                PutOutcome::Unknown,
                PutOutcome::Rejected(Rejection::Draining)
            ]
        );
        assert_eq!((report.inserted, report.rejected), (0, 1));
    }

    #[test]
    fn every_put_reply_whole_is_its_outcome_and_cut_at_any_byte_is_unknown() {
        let cases: [(&[u8], Result<u64, Rejection>); 9] = [
            (b"INSERTED 7\r\n", Ok(7)),
            (
                b"BURIED 7\r\n",
                Err(Rejection::InsertedBuried { id: JobId::new(7) }),
            ),
            (b"EXPECTED_CRLF\r\n", Err(Rejection::ExpectedCrlf)),
            (b"JOB_TOO_BIG\r\n", Err(Rejection::JobTooBig)),
            (b"DRAINING\r\n", Err(Rejection::Draining)),
            (b"OUT_OF_MEMORY\r\n", Err(Rejection::OutOfMemory)),
            (b"INTERNAL_ERROR\r\n", Err(Rejection::InternalError)),
            (b"BAD_FORMAT\r\n", Err(Rejection::BadFormat)),
            (b"UNKNOWN_COMMAND\r\n", Err(Rejection::UnknownCommand)),
        ];
        let mut checked = 0;
        for (bytes, want) in cases {
            for cut in 0..bytes.len() {
                let got = put_answered(&bytes[..cut]);
                assert!(
                    matches!(got, Err(Error::Unknown(ConnectionError::Closed))),
                    "{bytes:?} cut at {cut}: {got:?}"
                );
                assert!(got.unwrap_err().outcome_unknown());
                checked += 1;
            }
            match (put_answered(bytes), want) {
                (Ok(id), Ok(want)) => assert_eq!(id.get(), want),
                (Err(Error::Rejected(r)), Err(want)) => {
                    assert_eq!(r, want, "{bytes:?}");
                    // Only BURIED <id> means the job is queued after all.
                    assert_eq!(
                        r.queued(),
                        matches!(r, Rejection::InsertedBuried { .. }),
                        "{r:?}"
                    );
                }
                (got, want) => panic!("{bytes:?}: got {got:?}, want {want:?}"),
            }
            checked += 1;
        }
        // Nine replies of 10 to 17 bytes (120 in all), each cut at every byte, and whole.
        assert_eq!(checked, 120 + 9);
    }

    #[test]
    fn garbage_and_replies_no_put_gets_are_unknown_never_inserted_or_rejected() {
        let cases: [&[u8]; 10] = [
            b"DELETED\r\n",
            b"USING default\r\n",
            b"RESERVED 1 1\r\nx\r\n",
            b"INSERTED\r\n",
            b"INSERTED 7 8\r\n",
            b"INSERTED 99999999999999999999\r\n",
            b"INSERTED 7\n",
            b"\r\n",
            b"HELLO\r\n",
            &[b'A'; 300],
        ];
        for bytes in cases {
            let got = put_answered(bytes);
            assert!(
                matches!(got, Err(Error::Unknown(ConnectionError::Protocol(_)))),
                "{:?}: {got:?}",
                String::from_utf8_lossy(bytes)
            );
        }
    }

    #[test]
    fn use_is_in_step_only_when_using_names_the_tube() {
        let answer = |bytes: &[u8]| {
            let mut s = Session::new(Limits::default());
            s.encode(&Command::Use { tube: "emails" }).unwrap();
            let room = s.recv_room().unwrap();
            room[..bytes.len()].copy_from_slice(bytes);
            s.received(bytes.len());
            match s.poll_reply() {
                Ok(Some(r)) => using(Ok(r), "emails"),
                Ok(None) => using(Err(ConnectionError::Closed), "emails"),
                Err(e) => using(Err(e), "emails"),
            }
        };
        assert!(answer(b"USING emails\r\n").is_ok());
        for bytes in [
            &b"USING other\r\n"[..],
            b"USING emai",
            b"OUT_OF_MEMORY\r\n",
            b"x\r\n",
        ] {
            let got = answer(bytes);
            assert!(got.is_err(), "{bytes:?}: {got:?}");
        }
    }
}
