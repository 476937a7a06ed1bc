//! What a handler sees of a reserved job.

use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use taskq_proto::{Command, Connection, JobStats, Reply};

use crate::counters::Counters;
use crate::worker::Shared;

/// A reserved job, lent to the handler for as long as it runs.
///
/// The body is borrowed from the worker thread's reused buffer. The handler may
/// [`touch`](Job::touch) the job to restart its TTR and look up its
/// [`stats`](Job::stats); both use the connection the job was reserved on.
pub struct Job<'a> {
    pub(crate) id: u64,
    pub(crate) body: &'a [u8],
    pub(crate) conn: &'a mut Connection,
    pub(crate) server: &'a str,
    pub(crate) shared: &'a Shared,
}

impl fmt::Debug for Job<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Job")
            .field("id", &self.id)
            .field("len", &self.body.len())
            .field("server", &self.server)
            .finish()
    }
}

/// Numbers from `stats-job`, copied out of the reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct JobInfo {
    /// Priority.
    pub pri: u32,
    /// Time to run, seconds.
    pub ttr: u64,
    /// Seconds left of the lease.
    pub time_left: u64,
    /// Times reserved, this time included.
    pub reserves: u64,
    /// Times its lease ran out.
    pub timeouts: u64,
    /// Times released.
    pub releases: u64,
    /// Times buried.
    pub buries: u64,
}

/// Why a touch or a stats lookup failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum JobError {
    /// The server no longer counts this job as ours (`NOT_FOUND`): the lease ran out.
    LeaseLost,
    /// The connection failed; the server will put the job back by itself.
    Connection(taskq_proto::Error),
    /// A reply that cannot answer the request; the connection is no longer used.
    Unexpected {
        /// The reply word.
        word: &'static str,
    },
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JobError::LeaseLost => f.write_str("lease lost: the server answered NOT_FOUND"),
            JobError::Connection(e) => write!(f, "connection failed: {e}"),
            JobError::Unexpected { word } => write!(f, "unexpected reply {word}"),
        }
    }
}

impl std::error::Error for JobError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            JobError::Connection(e) => Some(e),
            _ => None,
        }
    }
}

impl<'a> Job<'a> {
    /// The job's id on its server.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The job body, exactly as put.
    pub fn body(&self) -> &'a [u8] {
        self.body
    }

    /// The server the job came from, as configured (`HOST:PORT`).
    pub fn server(&self) -> &str {
        self.server
    }

    /// The server's resolved address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.conn.peer_addr()
    }

    /// True once the worker was told to stop taking jobs (first signal).
    pub fn stopping(&self) -> bool {
        self.shared.stop.load(Ordering::Relaxed)
    }

    /// True once the worker was told to give running jobs back at once
    /// (second signal): a long handler should return soon, and any outcome but
    /// [`Outcome::Done`](crate::Outcome::Done) becomes an immediate release.
    pub fn aborting(&self) -> bool {
        self.shared.abort.load(Ordering::Relaxed)
    }

    /// Restarts the job's TTR.
    pub fn touch(&mut self) -> Result<(), JobError> {
        let broken = |e: taskq_proto::Error, s: &Shared| {
            if e.is_timeout() {
                Counters::add(&s.counters.io_timeouts);
            }
            JobError::Connection(e)
        };
        match self.conn.request(&Command::Touch { id: self.id }) {
            Ok(Reply::Touched) => {
                Counters::add(&self.shared.counters.touched);
                Ok(())
            }
            Ok(Reply::NotFound) => Err(JobError::LeaseLost),
            Ok(r) => {
                let word = r.word();
                Err(self.unexpected(word))
            }
            Err(e) => Err(broken(e, self.shared)),
        }
    }

    /// Looks the job up with `stats-job`.
    pub fn stats(&mut self) -> Result<JobInfo, JobError> {
        let shared = self.shared;
        job_info(self.conn, self.id, shared).map_err(|e| {
            if let JobError::Unexpected { .. } = e {
                self.conn.mark_broken();
            }
            e
        })
    }

    fn unexpected(&mut self, word: &'static str) -> JobError {
        Counters::add(&self.shared.counters.unexpected_replies);
        self.conn.mark_broken();
        tracing::warn!(
            job = self.id,
            server = self.server,
            reply = word,
            "unexpected reply"
        );
        JobError::Unexpected { word }
    }
}

/// `stats-job`, copied into a [`JobInfo`]. An unexpected reply leaves the
/// connection for the caller to mark broken.
pub(crate) fn job_info(
    conn: &mut Connection,
    id: u64,
    shared: &Shared,
) -> Result<JobInfo, JobError> {
    match conn.request(&Command::StatsJob { id }) {
        Ok(Reply::Ok { yaml }) => match JobStats::parse(yaml) {
            Ok(s) => Ok(JobInfo {
                pri: u32::try_from(s.pri).unwrap_or(u32::MAX),
                ttr: s.ttr,
                time_left: s.time_left,
                reserves: s.reserves,
                timeouts: s.timeouts,
                releases: s.releases,
                buries: s.buries,
            }),
            Err(_) => {
                Counters::add(&shared.counters.unexpected_replies);
                Err(JobError::Unexpected { word: "OK" })
            }
        },
        Ok(Reply::NotFound) => Err(JobError::LeaseLost),
        Ok(r) => {
            Counters::add(&shared.counters.unexpected_replies);
            Err(JobError::Unexpected { word: r.word() })
        }
        Err(e) => {
            if e.is_timeout() {
                Counters::add(&shared.counters.io_timeouts);
            }
            Err(JobError::Connection(e))
        }
    }
}
