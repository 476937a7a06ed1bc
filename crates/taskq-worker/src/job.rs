//! What a handler sees of a reserved job.

use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use taskq_proto::nats::HeaderBlock;
use taskq_proto::JobId;

use crate::counters::Counters;
use crate::engine::{Fault, JobLink};
use crate::job_info::JobInfo;
use crate::shared::Shared;
use crate::worker::settle::attempt;

/// A reserved job, lent to the handler for as long as it runs.
///
/// The body is borrowed from the worker's reused buffer. The handler may
/// [`touch`](Job::touch) the job to restart its TTR and look up its
/// [`stats`](Job::stats); both go out on the connection the job was
/// reserved on, with the worker's next write, and the handler's thread
/// waits for the answer.
pub struct Job<'a> {
    pub(crate) id: u64,
    pub(crate) body: &'a [u8],
    /// The header block as sent (JetStream); empty where there is none.
    pub(crate) headers: &'a [u8],
    pub(crate) link: &'a mut dyn JobLink,
    pub(crate) server: &'a str,
    /// The server's index in the configuration.
    pub(crate) server_index: usize,
    pub(crate) shared: &'a Shared,
    /// The job's tube, as the reserve or its lookup told it; empty when
    /// not known yet (several tubes were watched, and the handler asks for
    /// it when it wants it: [`asked`](Self::asked)).
    pub(crate) tube: &'a str,
    /// Its attempt number, when known (JetStream's delivery, a lookup).
    pub(crate) attempt: Option<u32>,
    /// The tube, once a lookup this handler asked for named it.
    pub(crate) asked: Option<String>,
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

/// Why a touch or a stats lookup failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum JobError {
    /// The server no longer counts this job as ours (`NOT_FOUND`): the lease ran out.
    LeaseLost,
    /// The connection failed; the server will put the job back by itself.
    Connection(taskq_proto::ConnectionError),
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

/// `Display` names the connection's error, so `source` does not repeat it.
impl std::error::Error for JobError {}

impl<'a> Job<'a> {
    /// The job's id on its server (the same type a producer's put returns).
    pub fn id(&self) -> JobId {
        JobId::new(self.id)
    }

    /// The job body, exactly as put.
    pub fn body(&self) -> &'a [u8] {
        self.body
    }

    /// The headers the job was put with, on JetStream (the message's
    /// header block, as stored; taskq's own, such as `Nats-Msg-Id`,
    /// included). `None` for a job without headers, and always on
    /// beanstalkd, which has none. Read from the delivery: no request.
    pub fn headers(&self) -> Option<HeaderBlock<'a>> {
        if self.headers.is_empty() {
            return None;
        }
        HeaderBlock::parse(self.headers).ok()
    }

    /// The server the job came from, as configured (`HOST:PORT`).
    pub fn server(&self) -> &str {
        self.server
    }

    /// The server's resolved address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.link.addr()
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

    /// Restarts the job's TTR (counted `touched` on the server's answer).
    pub fn touch(&mut self) -> Result<(), JobError> {
        match self.link.touch(self.id) {
            Ok(true) => Ok(()),
            Ok(false) => Err(JobError::LeaseLost),
            Err(f) => Err(job_fault(self.link, self.shared, self.id, self.server, f)),
        }
    }

    /// Looks the job up (`stats-job` on beanstalkd).
    pub fn stats(&mut self) -> Result<JobInfo, JobError> {
        job_info(self.link, self.shared, self.id, self.server, None)
    }

    /// The name of the tube the job was put in.
    ///
    /// Known without asking the server on JetStream (the delivery's subject)
    /// and when the worker watches one tube; on beanstalkd with several
    /// tubes the first call of this or [`attempt`](Self::attempt) asks once
    /// (`stats-job`) for both. Empty when that lookup failed (the
    /// connection broke, or the lease was lost; see [`attempt`](Self::attempt)).
    pub fn tube(&mut self) -> &str {
        if !self.tube.is_empty() {
            return self.tube;
        }
        if self.asked.is_none() {
            self.look_up();
        }
        self.asked.as_deref().unwrap_or("")
    }

    /// This run's attempt number: 1 on the first delivery, counted as
    /// [`Config::max_attempts`](crate::Config::max_attempts) counts (a
    /// release for [`Outcome::TempFail`](crate::Outcome::TempFail) or
    /// [`Outcome::Retry`](crate::Outcome::Retry) made by this worker is not
    /// an attempt), so the job is buried on a failure when it equals
    /// `max_attempts`.
    ///
    /// On JetStream from the delivery count the server sent with the job,
    /// without a request. On beanstalkd from the job's `releases` in one
    /// `stats-job`, asked on the first call and kept. 0 when that lookup
    /// failed: the connection broke (the settle meets the same failure) or
    /// the lease was lost; the failure is logged.
    pub fn attempt(&mut self) -> u32 {
        if self.attempt.is_none() {
            self.look_up();
        }
        self.attempt.unwrap_or(0)
    }

    /// Asks the job's server for its numbers once: its attempt, and its
    /// tube when not known.
    fn look_up(&mut self) {
        let mut tube = String::new();
        let want = self.tube.is_empty().then_some(&mut tube);
        match job_info(self.link, self.shared, self.id, self.server, want) {
            Ok(info) => {
                let n = attempt(self.shared, self.server_index, self.id, info.releases);
                self.attempt = Some(u32::try_from(n).unwrap_or(u32::MAX));
                if self.tube.is_empty() {
                    self.asked = Some(tube);
                }
            }
            Err(error) => {
                tracing::warn!(job = self.id, server = self.server, %error, "cannot tell the job's tube and attempt");
            }
        }
    }

    /// The body decoded from JSON as a `T` (feature `serde`). A body that
    /// does not decode is a [`DecodeError`](crate::DecodeError), never a
    /// panic; returned from the handler as its outcome
    /// (`return e.into()`), it buries the job and logs why.
    #[cfg(feature = "serde")]
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, crate::DecodeError> {
        crate::json::decode(self.id, self.body)
    }
}

/// Looks job `id` up on its link. A reply that cannot answer gives the link up.
pub(crate) fn job_info(
    link: &mut dyn JobLink,
    shared: &Shared,
    id: u64,
    server: &str,
    tube: Option<&mut String>,
) -> Result<JobInfo, JobError> {
    match link.info(id, tube) {
        Ok(Some(info)) => Ok(info),
        Ok(None) => Err(JobError::LeaseLost),
        Err(f) => Err(job_fault(link, shared, id, server, f)),
    }
}

/// Counts and logs a failed request about a held job, and says what it means.
fn job_fault(link: &mut dyn JobLink, shared: &Shared, id: u64, server: &str, f: Fault) -> JobError {
    match f {
        Fault::Conn(e) => {
            if e.is_timeout() {
                Counters::add(&shared.counters.io_timeouts);
            }
            JobError::Connection(e)
        }
        Fault::Unexpected(word) => {
            Counters::add(&shared.counters.unexpected_replies);
            link.mark_broken();
            tracing::warn!(job = id, server, reply = word, "unexpected reply");
            JobError::Unexpected { word }
        }
    }
}
