//! What puts came to: a batch's outcomes, report and break, a put with its
//! queue position, and the batch limits. Shared by the blocking and the async
//! producer and by both engines, so it depends on none of them.

use crate::error::{Error, Rejection};
use crate::JobId;

/// Most jobs sent in one write by [`Producer::put_batch`](crate::Producer::put_batch); a longer batch goes
/// out in several writes. Bounds the replies waiting in the socket while the
/// request is still being written, so neither side blocks on a full buffer.
pub const MAX_PIPELINE_JOBS: usize = 1024;

/// Most request bytes gathered for one write by [`Producer::put_batch`](crate::Producer::put_batch) (a single
/// larger job still goes out alone, in one write).
pub const MAX_PIPELINE_BYTES: usize = 4 << 20;

/// The outcome of one job of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    /// Inserted with this id.
    Inserted(JobId),
    /// The server answered with a rejection (see [`Rejection::queued`] for `BURIED <id>`).
    Rejected(Rejection),
    /// Sent, but no reply came before the batch broke off: it may be queued.
    Unknown,
    /// Never reached the server.
    NotSent,
}

impl PutOutcome {
    /// The id when the job was inserted (including inserted but buried).
    pub fn id(self) -> Option<JobId> {
        match self {
            PutOutcome::Inserted(id) | PutOutcome::Rejected(Rejection::InsertedBuried { id }) => {
                Some(id)
            }
            _ => None,
        }
    }
}

/// What a whole batch came to, when every reply was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BatchReport {
    /// Jobs answered `INSERTED`.
    pub inserted: usize,
    /// Jobs the server rejected (including `BURIED <id>`).
    pub rejected: usize,
}

/// A batch that broke off: the replies of the first `replied` jobs were read
/// (their outcomes are in the caller's slice); each later job is
/// [`PutOutcome::Unknown`] or [`PutOutcome::NotSent`] there.
#[derive(Debug)]
pub struct BatchError {
    /// Jobs whose replies were read before the break.
    pub replied: usize,
    /// What broke the batch off.
    pub error: Error,
}

impl std::fmt::Display for BatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "batch broke off after {} replies: {}",
            self.replied, self.error
        )
    }
}

/// `Display` names the error that broke the batch, so `source` does not repeat it.
impl std::error::Error for BatchError {}

/// A put together with the state of its tube right after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// The new job's id.
    pub id: JobId,
    /// `current-jobs-ready` of the tube right after the put (the job itself
    /// included when it was put without delay); `None` when the statistics
    /// reply did not arrive (the job is inserted all the same).
    pub ready: Option<u64>,
    /// True when the job was put without delay, so it counts among the ready jobs.
    pub is_ready: bool,
}

impl Position {
    /// Ready jobs in the tube other than this one: how many are in line with it.
    /// Ready jobs run by priority then age, so this is an upper bound on the
    /// jobs ahead when this job has the most urgent priority, and exact for a
    /// tube where every job has the same priority.
    pub fn ahead(&self) -> Option<u64> {
        self.ready
            .map(|r| r.saturating_sub(u64::from(self.is_ready)))
    }
}
