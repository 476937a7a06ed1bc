//! What each step on a lane comes to: where the lane goes next ([`After`]),
//! the counters a settle's answer or a failure adds to, and the system
//! calls a link made. Shared by the turn without prefetch, the window and
//! the lane's loop.

use std::sync::atomic::Ordering;
use std::time::Duration;

use taskq_proto::{ConnectionError, IoCounts};

use super::settle::Settled;
use crate::counters::Counters;
use crate::engine::{Fault, JobLink, Link, Settle, SettleReply};
use crate::shared::Shared;

/// The pause after a reserve the server could not serve (an election).
pub(crate) const UNAVAILABLE_PAUSE: Duration = Duration::from_millis(250);

/// How a lane's turn ended.
#[derive(Debug)]
pub(crate) enum After {
    /// Reserve again on the same lane.
    Again,
    /// No job there within the slice: try the next server.
    Next,
    /// The connection broke; it was dropped.
    Broken,
    /// The worker is stopping.
    Stop,
}

/// Adds the system calls a link made since the last call to the counters.
pub(super) fn account_io<L: Link>(counters: &Counters, link: &L, seen: &mut IoCounts) {
    let now = link.io_counts();
    counters
        .writes
        .fetch_add(now.writes - seen.writes, Ordering::Relaxed);
    counters
        .reads
        .fetch_add(now.reads - seen.reads, Ordering::Relaxed);
    *seen = now;
}

/// Counts the reply to the settle of job `id`, and gives its `max_jobs`
/// ticket back unless it was deleted. `Err`: no answer that fits, and the
/// link is given up; a settle the link keeps to send again on the next
/// connection ([`Link::carry_settle`]) is counted when that resolves it.
pub(super) fn count_settled<L: Link>(
    sh: &Shared,
    link: &mut L,
    server: &str,
    id: u64,
    settle: Settle,
    reply: Result<SettleReply, Fault>,
) -> Result<(), After> {
    if let Err(fault) = &reply {
        if link.carry_settle(id) {
            return Err(match fault {
                Fault::Conn(e) => failed(sh, server, Some(id), e),
                Fault::Unexpected(word) => {
                    tracing::warn!(job = id, server, reply = word, "settle not confirmed");
                    After::Broken
                }
            });
        }
    }
    let settled = Settled::of(settle == Settle::Delete, &reply);
    tally(sh, server, id, settle, settled);
    if let Settled::AckUnknown | Settled::LeaseDropped = settled {
        return Err(match reply {
            Err(Fault::Unexpected(word)) => unexpected(sh, link, server, Some(id), word),
            Err(Fault::Conn(e)) => failed(sh, server, Some(id), &e),
            // An answer that fits another kind of settle.
            Ok(r) => unexpected(sh, link, server, Some(id), r.word()),
        });
    }
    Ok(())
}

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

/// A request failed: count a timeout or an undecodable reply, log, and give up the link.
pub(crate) fn failed(sh: &Shared, server: &str, job: Option<u64>, e: &ConnectionError) -> After {
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
    After::Broken
}

/// A reply that cannot answer the request: the stream is out of step.
pub(super) fn unexpected<L: JobLink + ?Sized>(
    sh: &Shared,
    link: &mut L,
    server: &str,
    job: Option<u64>,
    word: &str,
) -> After {
    Counters::add(&sh.counters.unexpected_replies);
    link.mark_broken();
    match job {
        Some(id) => tracing::warn!(job = id, server, reply = word, "unexpected reply"),
        None => tracing::warn!(server, reply = word, "unexpected reply"),
    }
    After::Broken
}
