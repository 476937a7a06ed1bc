//! The command that settles a job, and the ledger of this process's own
//! releases that keeps a retry from counting as a failed attempt.

use std::sync::atomic::Ordering;
use std::time::Duration;

use taskq_proto::{Command, Connection};

use super::Shared;
use crate::job::{job_info, JobError};
use crate::Outcome;

/// The command that settles a job. Anything but a delete needs the job's
/// priority (and for `Fail`, its release count): one `stats-job` on that rare path.
pub(super) fn decide(
    sh: &Shared,
    conn: &mut Connection,
    server: usize,
    id: u64,
    outcome: Outcome,
) -> Result<Command<'static>, JobError> {
    let aborting = sh.abort.load(Ordering::SeqCst);
    let outcome = match outcome {
        Outcome::Done => {
            if sh.tempfails_any.load(Ordering::Relaxed) {
                forget_tempfails(sh, server, id);
            }
            return Ok(Command::Delete { id });
        }
        // Aborting: whatever is not done goes back now.
        _ if aborting => Outcome::Retry {
            delay: Duration::ZERO,
        },
        o => o,
    };
    let info = job_info(conn, id, sh).inspect_err(|e| {
        if matches!(e, JobError::Unexpected { .. }) {
            conn.mark_broken();
        }
    })?;
    let release = |delay: Duration| Command::Release {
        id,
        pri: info.pri,
        delay: taskq_proto::secs_ceil(delay),
    };
    Ok(match outcome {
        Outcome::Retry { delay } => {
            note_tempfail(sh, server, id);
            release(delay)
        }
        Outcome::TempFail => {
            note_tempfail(sh, server, id);
            let n = u32::try_from(info.releases).unwrap_or(u32::MAX);
            release(sh.cfg.retry_backoff.ceiling(n))
        }
        Outcome::Bury => {
            forget_tempfails(sh, server, id);
            Command::Bury { id, pri: info.pri }
        }
        _ => {
            let attempts = attempt(sh, server, id, info.releases);
            if attempts >= u64::from(sh.cfg.max_attempts) {
                forget_tempfails(sh, server, id);
                let status = crate::command::take_failure();
                let status = status
                    .as_ref()
                    .map_or(&"handler failed" as &dyn std::fmt::Display, |f| f);
                tracing::warn!(job = id, attempts, %status, "buried after the last attempt");
                Command::Bury { id, pri: info.pri }
            } else {
                let n = u32::try_from(attempts - 1).unwrap_or(u32::MAX);
                release(sh.cfg.retry_backoff.ceiling(n))
            }
        }
    })
}

/// This attempt plus the earlier failed ones of job `id`: its releases not made
/// for a temporary failure by this process, plus one.
pub(crate) fn attempt(sh: &Shared, server: usize, id: u64, releases: u64) -> u64 {
    let temp = if sh.tempfails_any.load(Ordering::Relaxed) {
        let map = sh.tempfails.lock().unwrap_or_else(|e| e.into_inner());
        u64::from(map.get(&(server, id)).copied().unwrap_or(0))
    } else {
        0
    };
    releases.saturating_sub(temp) + 1
}

fn note_tempfail(sh: &Shared, server: usize, id: u64) {
    let mut map = sh.tempfails.lock().unwrap_or_else(|e| e.into_inner());
    // Bounded: a job forgotten here at worst counts a retry as an attempt.
    if map.len() >= 100_000 {
        map.clear();
    }
    *map.entry((server, id)).or_insert(0) += 1;
    sh.tempfails_any.store(true, Ordering::Relaxed);
}

fn forget_tempfails(sh: &Shared, server: usize, id: u64) {
    let mut map = sh.tempfails.lock().unwrap_or_else(|e| e.into_inner());
    map.remove(&(server, id));
    if map.is_empty() {
        sh.tempfails_any.store(false, Ordering::Relaxed);
    }
}
