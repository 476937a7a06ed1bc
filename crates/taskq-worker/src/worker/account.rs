//! What each step of the machines comes to: the counters a settle's answer
//! or a failure adds to, and the `max_jobs` tickets they keep or give back.

use std::sync::atomic::Ordering;
use std::time::Duration;

use taskq_proto::ConnectionError;

use super::settle::Settled;
use crate::counters::Counters;
use crate::engine::Settle;
use crate::shared::Shared;

/// The pause after a reserve the server could not serve (an election).
pub(crate) const UNAVAILABLE_PAUSE: Duration = Duration::from_millis(250);

/// Counts a settle carried from a failed connection and now resolved:
/// `confirmed` by the server on a later connection, or given up when the
/// job's lease ended first (outcome unknown).
pub(crate) fn count_resolved(sh: &Shared, server: &str, id: u64, settle: Settle, confirmed: bool) {
    let is_delete = settle == Settle::Delete;
    let settled = if confirmed {
        Settled::of(is_delete, &Ok(settle.reply()))
    } else {
        Settled::unanswered(is_delete)
    };
    if confirmed {
        Counters::add(&sh.counters.acks_resent);
        tracing::info!(
            job = id,
            server,
            command = settle.name(),
            "confirmed on a later connection"
        );
    } else {
        tracing::warn!(
            job = id,
            server,
            command = settle.name(),
            "no confirmation before the job's lease ended: outcome unknown"
        );
    }
    tally(sh, server, id, settle, settled);
}

/// Adds what a settle came to to the counters, and keeps its `max_jobs`
/// ticket for a job done or gives it back.
pub(crate) fn tally(sh: &Shared, server: &str, id: u64, settle: Settle, settled: Settled) {
    Counters::add(settled.counter(&sh.counters));
    match settled {
        Settled::Deleted => {
            let done = sh.counters.deleted.load(Ordering::Relaxed);
            if sh.cfg.max_jobs.is_some_and(|max| done >= max) {
                sh.shutdown();
            }
        }
        Settled::Released | Settled::Buried => sh.give_ticket(),
        Settled::LostLease | Settled::LostLeaseOnRelease => {
            sh.give_ticket();
            tracing::warn!(
                job = id,
                server,
                command = settle.name(),
                "lease lost: NOT_FOUND"
            );
        }
        Settled::AckUnknown | Settled::LeaseDropped => sh.give_ticket(),
    }
}

/// A job handed to this worker again while its handler still runs (its
/// lease ran out, and the server gave it back to the same connection): it
/// is not run again, and its settle goes on the newer delivery. The
/// reserve's ticket goes back, and the lease lost is counted and said. One
/// rule for both workers.
pub(crate) fn delivered_again_while_running(sh: &Shared, server: &str, job: u64) {
    sh.give_ticket();
    Counters::add(&sh.counters.lost_lease_on_release);
    tracing::warn!(
        job,
        server,
        "job delivered again while its handler runs: its lease ran out"
    );
}

/// A request failed: count a timeout or an undecodable reply, and log (the
/// machine gives the connection up).
pub(crate) fn failed(sh: &Shared, server: &str, job: Option<u64>, e: &ConnectionError) {
    if e.is_timeout() {
        Counters::add(&sh.counters.io_timeouts);
    }
    if matches!(e, ConnectionError::Protocol(_)) {
        // A garbage line, or a reply word that cannot answer the command.
        Counters::add(&sh.counters.unexpected_replies);
    }
    match job {
        Some(id) => tracing::warn!(job = id, server, error = %e, "connection failed"),
        None => tracing::warn!(server, error = %e, "connection failed"),
    }
}
