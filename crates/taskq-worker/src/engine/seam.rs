//! The seam's types: what the machines ask of a server ([`Req`], [`Ask`]),
//! what comes back ([`Took`], [`SettleReply`], [`Fault`]), how a job is
//! settled ([`Settle`]) and the settles carried across connections
//! ([`Carry`]), with the reused buffers ([`Pool`]); and what a running
//! job's handler may ask of its server ([`JobLink`]).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use taskq_proto::ConnectionError;

use crate::fair::Schedule;
use crate::job_info::JobInfo;

/// The room a body buffer is made with: most job bodies fit, so a window's
/// buffers are made once, with the connection, and grow only for larger
/// bodies (each once, to the largest seen), whatever order the jobs come in.
pub(crate) const BODY_ROOM: usize = 1024;

/// Byte buffers (job bodies, subjects) reused from one job to the next,
/// handed out in turn (oldest first). A buffer smaller than the largest copy
/// seen so far grows to it when next handed out: buffers reused for one
/// thing and then another soon all fit anything, every one of them (a
/// last-in first-out pool would hand the same few out again and again, and
/// grow the rest only at a peak), and a warm worker allocates nothing per job.
#[derive(Debug, Default)]
pub(crate) struct Pool {
    spare: VecDeque<Vec<u8>>,
    widest: usize,
}

impl Pool {
    /// `n` buffers of `cap` bytes, made at once.
    pub(crate) fn made(n: usize, cap: usize) -> Pool {
        Pool {
            spare: (0..n).map(|_| Vec::with_capacity(cap)).collect(),
            widest: cap,
        }
    }

    /// A buffer holding a copy of `bytes`.
    pub(crate) fn copy(&mut self, bytes: &[u8]) -> Vec<u8> {
        let mut b = self.spare.pop_front().unwrap_or_default();
        self.copy_into(&mut b, bytes);
        b
    }

    /// Copies `bytes` into `buf`, which grows to the largest copy seen when
    /// it is smaller, whether or not this copy needs it: a buffer made
    /// before the largest copies came grows at its next use, not at the
    /// first of them it happens to get.
    pub(crate) fn copy_into(&mut self, buf: &mut Vec<u8>, bytes: &[u8]) {
        self.widest = self.widest.max(bytes.len());
        buf.clear();
        if buf.capacity() < self.widest {
            buf.reserve(self.widest);
        }
        buf.extend_from_slice(bytes);
    }

    /// Takes a buffer back for reuse.
    pub(crate) fn give(&mut self, b: Vec<u8>) {
        self.spare.push_back(b);
    }
}

/// Why a request on a link failed.
#[derive(Debug)]
pub(crate) enum Fault {
    /// The connection failed: timeout, close, I/O error, or a reply that
    /// could not be decoded. The link is broken.
    Conn(ConnectionError),
    /// A reply that decodes but cannot answer the request: the stream is out
    /// of step, and the loop marks the link broken.
    Unexpected(&'static str),
}

/// What the reserve in flight came to.
#[derive(Debug)]
pub(crate) enum Took<'a> {
    /// A job, now held by this link; the body is borrowed from the link until
    /// its next request.
    Job {
        /// The job's id on its server.
        id: u64,
        /// Its body.
        body: &'a [u8],
    },
    /// A job larger than the worker's limit (`Config::limits`'s
    /// `max_job_size`), now held by this link, whose body was never kept
    /// (beanstalkd: dropped as it arrived). The loop settles it without
    /// running it, as [`Outcome::Bury`](crate::Outcome::Bury): buried on
    /// beanstalkd, terminated (`+TERM`) on JetStream.
    TooBig {
        /// The job's id on its server.
        id: u64,
        /// The body's size, as the server gave it.
        len: u64,
    },
    /// A reserve that does not wait (the weighted schedule's turn) found its
    /// tube empty.
    TurnEmpty,
    /// No job within the reserve timeout.
    TimedOut,
    /// The server refused to hand out a job because one this link holds is
    /// about to run out of its lease.
    DeadlineSoon,
}

/// The job a reserve brought: its id, and the size of one too big to keep.
pub(crate) struct Taken {
    pub(crate) id: u64,
    pub(crate) too_big: Option<u64>,
}

impl Took<'_> {
    /// The job a reserve brought, if it brought one.
    pub(crate) fn job(&self) -> Option<Taken> {
        match *self {
            Took::Job { id, .. } => Some(Taken { id, too_big: None }),
            Took::TooBig { id, len } => Some(Taken {
                id,
                too_big: Some(len),
            }),
            _ => None,
        }
    }
}

/// How a job is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settle {
    /// Done: remove it.
    Delete,
    /// Give it back, ready again after `delay` seconds, with this priority.
    Release {
        /// Priority to keep.
        pri: u32,
        /// Seconds before it is ready.
        delay: u32,
    },
    /// Keep it aside until someone kicks it.
    Bury {
        /// Priority to keep.
        pri: u32,
    },
}

impl Settle {
    /// The word for logs.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Settle::Delete => "delete",
            Settle::Release { .. } => "release",
            Settle::Bury { .. } => "bury",
        }
    }

    /// The answer the server gives when it carries this settle out.
    pub(crate) fn reply(self) -> SettleReply {
        match self {
            Settle::Delete => SettleReply::Deleted,
            Settle::Release { .. } => SettleReply::Released,
            Settle::Bury { .. } => SettleReply::Buried,
        }
    }
}

/// A settle sent without an answer on a connection that failed, to be sent
/// again on the next one (see [`Carry`]).
#[derive(Debug)]
pub(crate) struct Unconfirmed {
    /// The job.
    pub(crate) id: u64,
    /// What was sent.
    pub(crate) settle: Settle,
    /// Where it goes (JetStream: the delivery's ack subject).
    pub(crate) to: Vec<u8>,
    /// When the job's lease may end, at the earliest. Past it the server may
    /// have handed the job to another worker, whose delivery a settle sent
    /// now would settle (JetStream acks by the stream sequence): it is given up.
    pub(crate) due: Instant,
}

/// The settles a worker's connections to one server sent and could not get
/// confirmed before they failed, kept across connections to that server
/// (`JsMachine`'s `carry`). The next connection sends each again until the
/// server confirms it or the job's lease ends; the machine counts each once
/// resolved. JetStream acks are
/// idempotent, so one applied twice costs nothing; beanstalkd's settles are
/// never carried (a closed connection's jobs go back at once).
#[derive(Debug, Default)]
pub(crate) struct Carry {
    /// Not resolved yet.
    pub(crate) open: Vec<Unconfirmed>,
    /// Resolved since the machine last counted: the job, its settle, and whether
    /// the server confirmed it (else its lease ended first).
    pub(crate) resolved: Vec<(u64, Settle, bool)>,
}

impl Carry {
    /// A settle is given up this long before its job's lease may end: the
    /// time one may take to reach the server.
    pub(crate) const MARGIN: Duration = Duration::from_millis(100);

    /// Gives up the settles whose jobs' leases may end within
    /// [`MARGIN`](Self::MARGIN) of `now`.
    pub(crate) fn expire(&mut self, now: Instant) {
        let mut k = 0;
        while k < self.open.len() {
            if self.open[k].due.saturating_duration_since(now) <= Self::MARGIN {
                let u = self.open.swap_remove(k);
                self.resolved.push((u.id, u.settle, false));
            } else {
                k += 1;
            }
        }
    }

    /// Gives up every open settle (the worker is ending).
    pub(crate) fn give_up(&mut self) {
        let open = self.open.drain(..).map(|u| (u.id, u.settle, false));
        self.resolved.extend(open);
    }
}

/// The server's answer to a settle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SettleReply {
    /// Deleted: the job is done.
    Deleted,
    /// Released.
    Released,
    /// Buried.
    Buried,
    /// The server no longer counts the job as this link's: its lease ran out.
    NotFound,
}

impl SettleReply {
    /// The word for logs.
    pub(crate) fn word(self) -> &'static str {
        match self {
            SettleReply::Deleted => "DELETED",
            SettleReply::Released => "RELEASED",
            SettleReply::Buried => "BURIED",
            SettleReply::NotFound => "NOT_FOUND",
        }
    }
}

/// The next reserve, as the loop wants it.
pub(crate) struct Ask<'a> {
    /// The weighted schedule, when tubes are weighted: the engine asks it which
    /// tube's turn it is and tells it what it switched to.
    pub(crate) sched: Option<&'a mut Schedule>,
    /// The configured tubes, in the schedule's order.
    pub(crate) tubes: &'a [String],
    /// Seconds a reserve may wait on the server.
    pub(crate) slice: u32,
}

/// A request a link queues for its next write. A window of prefetched jobs
/// is asked for with several [`Req::Ask`] in one write (on beanstalkd, as many
/// `reserve-with-timeout`; an engine that pulls in batches may read them as
/// one pull of that many).
pub(crate) enum Req<'a> {
    /// Settle job `id`.
    Settle(u64, Settle),
    /// Restart job `id`'s lease.
    Touch(u64),
    /// One more job. An ask whose `slice` is 0 does not wait: it comes back
    /// [`Took::TurnEmpty`] when nothing is ready.
    Ask(Ask<'a>),
}

/// The part of a link a running job's handler may use, through
/// [`Job`](crate::Job): touch the job, look it up.
pub(crate) trait JobLink {
    /// The server's resolved address.
    fn addr(&self) -> SocketAddr;
    /// Gives the link up: the stream is out of step, or the loop gave up on it.
    fn mark_broken(&mut self);
    /// Restarts the job's lease. `Ok(false)`: the lease was already lost.
    fn touch(&mut self, id: u64) -> Result<bool, Fault>;
    /// The job's numbers (and its tube's name into `tube`, when asked), or
    /// `None` when the server no longer counts the job as this link's.
    fn info(&mut self, id: u64, tube: Option<&mut String>) -> Result<Option<JobInfo>, Fault>;
}
