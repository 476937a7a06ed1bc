//! The command that settles a job, what its reply counts as, and the ledger
//! of this process's own releases that keeps a retry from counting as a
//! failed attempt.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::counters::Counters;
use crate::engine::{Fault, Settle, SettleReply};
use crate::handler::Outcome;
use crate::job_info::JobInfo;
use crate::shared::Shared;

/// What the reply to a settle command (`delete`, `release` or `bury`) counts
/// as. The rule the counts rest on: a job is done only on `DELETED`; a delete
/// answered `NOT_FOUND` lost its lease (the server counted the delete in
/// `cmd-delete` all the same); a delete without a reply may or may not have
/// been carried out (`ack_unknown`), which brackets the server's record:
/// `deleted + lost_lease <= cmd-delete <= deleted + lost_lease + ack_unknown`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// `DELETED`: done.
    Deleted,
    /// `RELEASED`.
    Released,
    /// `BURIED`.
    Buried,
    /// `NOT_FOUND` to a delete: the lease ran out and the job went back.
    LostLease,
    /// `NOT_FOUND` to a release or bury.
    LostLeaseOnRelease,
    /// A delete with no (decodable) reply: it may have been carried out.
    AckUnknown,
    /// A release or bury with no (decodable) reply: the server gives the job
    /// back when it sees the connection close.
    LeaseDropped,
}

impl Settled {
    /// The meaning of `reply` to a settle (`is_delete` tells which kind).
    pub(crate) fn of(is_delete: bool, reply: &Result<SettleReply, Fault>) -> Settled {
        match (reply, is_delete) {
            (Ok(SettleReply::Deleted), true) => Settled::Deleted,
            (Ok(SettleReply::Released), false) => Settled::Released,
            (Ok(SettleReply::Buried), false) => Settled::Buried,
            (Ok(SettleReply::NotFound), true) => Settled::LostLease,
            (Ok(SettleReply::NotFound), false) => Settled::LostLeaseOnRelease,
            (_, true) => Settled::AckUnknown,
            (_, false) => Settled::LeaseDropped,
        }
    }

    /// A settle with no answer: it may have been carried out (a delete is
    /// unknown), or the job goes back (a release or bury is dropped).
    pub(crate) fn unanswered(is_delete: bool) -> Settled {
        if is_delete {
            Settled::AckUnknown
        } else {
            Settled::LeaseDropped
        }
    }

    /// The counter this outcome adds one to.
    pub(crate) fn counter(self, c: &Counters) -> &AtomicU64 {
        match self {
            Settled::Deleted => &c.deleted,
            Settled::Released => &c.released,
            Settled::Buried => &c.buried,
            Settled::LostLease => &c.lost_lease,
            Settled::LostLeaseOnRelease => &c.lost_lease_on_release,
            Settled::AckUnknown => &c.ack_unknown,
            Settled::LeaseDropped => &c.lease_dropped,
        }
    }
}

/// The first half of the settle rule, needing nothing from the server: a
/// job done is deleted (`Some(Settle::Delete)`); any other outcome needs the
/// job's numbers (`stats-job`) and is [`settle_with_info`]'s (`None`).
pub(crate) fn settle_without_info(
    sh: &Shared,
    server: usize,
    id: u64,
    outcome: Outcome,
) -> Option<Settle> {
    if outcome != Outcome::Done {
        return None;
    }
    if sh.tempfails_any.load(Ordering::Relaxed) {
        forget_tempfails(sh, server, id);
    }
    Some(Settle::Delete)
}

/// The second half of the settle rule, once the job's numbers are known:
/// retry with the backoff, or bury after `max_attempts`; while aborting,
/// whatever is not done goes back at once. `failure` says how the last
/// failed attempt ended, for the bury warning.
pub(crate) fn settle_with_info(
    sh: &Shared,
    server: usize,
    id: u64,
    outcome: Outcome,
    info: &JobInfo,
    failure: Option<crate::failure::Failure>,
) -> Settle {
    let outcome = match outcome {
        Outcome::Done => return Settle::Delete,
        // Aborting: whatever is not done goes back now.
        _ if sh.abort.load(Ordering::SeqCst) => Outcome::Retry {
            delay: Duration::ZERO,
        },
        o => o,
    };
    let release = |delay: Duration| Settle::Release {
        pri: info.pri,
        delay: taskq_proto::secs_ceil(delay),
    };
    match outcome {
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
            Settle::Bury { pri: info.pri }
        }
        _ => {
            let attempts = attempt(sh, server, id, info.releases);
            if attempts >= u64::from(sh.cfg.max_attempts) {
                forget_tempfails(sh, server, id);
                let status = failure
                    .as_ref()
                    .map_or(&"handler failed" as &dyn std::fmt::Display, |f| f);
                tracing::warn!(job = id, attempts, %status, "buried after the last attempt");
                Settle::Bury { pri: info.pri }
            } else {
                let n = u32::try_from(attempts - 1).unwrap_or(u32::MAX);
                release(sh.cfg.retry_backoff.ceiling(n))
            }
        }
    }
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

/// Notes that this process released job `id` of server `server` for a
/// reason that is not a failed attempt (a retry asked for, a job given back
/// unstarted): `attempt` does not count that release.
pub(crate) fn note_tempfail(sh: &Shared, server: usize, id: u64) {
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

#[cfg(test)]
mod tests {
    //! The settle and counting rules, through the protocol session with
    //! scripted bytes: no socket, no clock, no sleep.

    use taskq_proto::{Command, ConnectionError, Limits, Reply, Session};

    use super::*;
    use crate::engine::settle_reply;

    /// The settle commands, each with whether it is a delete.
    const SETTLES: [(Command<'static>, bool); 3] = [
        (Command::Delete { id: 7 }, true),
        (
            Command::Release {
                id: 7,
                pri: 1,
                delay: 0,
            },
            false,
        ),
        (Command::Bury { id: 7, pri: 1 }, false),
    ];

    /// The reply the session decodes from `bytes` for `cmd`, or what a driver
    /// reports when the peer closes after them: `Closed` (no whole reply).
    fn answer(cmd: &Command<'_>, bytes: &[u8]) -> Result<SettleReply, Fault> {
        settle_reply(decode(cmd, bytes))
    }

    fn decode(cmd: &Command<'_>, bytes: &[u8]) -> Result<Reply<'static>, ConnectionError> {
        let mut s = Session::new(Limits::default());
        s.encode(cmd).unwrap();
        if !bytes.is_empty() {
            let room = s.recv_room().unwrap();
            room[..bytes.len()].copy_from_slice(bytes);
            s.received(bytes.len());
        }
        match s.poll_reply() {
            // Only bodiless replies answer a settle, so nothing borrowed is lost.
            Ok(Some(r)) => Ok(match r {
                Reply::Deleted => Reply::Deleted,
                Reply::Released => Reply::Released,
                Reply::Buried => Reply::Buried,
                Reply::NotFound => Reply::NotFound,
                Reply::InternalError => Reply::InternalError,
                Reply::OutOfMemory => Reply::OutOfMemory,
                Reply::BadFormat => Reply::BadFormat,
                Reply::UnknownCommand => Reply::UnknownCommand,
                other => panic!("a settle cannot be answered {other:?}"),
            }),
            Ok(None) => Err(ConnectionError::Closed),
            Err(e) => Err(e),
        }
    }

    #[test]
    fn every_reply_cut_at_every_byte_counts_as_unknown_and_whole_as_its_outcome() {
        let cases: [(&[u8], [Settled; 3]); 4] = [
            (
                b"DELETED\r\n",
                [
                    Settled::Deleted,
                    Settled::LeaseDropped,
                    Settled::LeaseDropped,
                ],
            ),
            (
                b"RELEASED\r\n",
                [
                    Settled::AckUnknown,
                    Settled::Released,
                    Settled::LeaseDropped,
                ],
            ),
            (
                // A release the server cannot carry out for lack of memory buries the job.
                b"BURIED\r\n",
                [Settled::AckUnknown, Settled::Buried, Settled::Buried],
            ),
            (
                b"NOT_FOUND\r\n",
                [
                    Settled::LostLease,
                    Settled::LostLeaseOnRelease,
                    Settled::LostLeaseOnRelease,
                ],
            ),
        ];
        let mut checked = 0;
        for (bytes, want) in cases {
            for (k, (cmd, is_delete)) in SETTLES.iter().enumerate() {
                for cut in 0..bytes.len() {
                    let got = Settled::of(*is_delete, &answer(cmd, &bytes[..cut]));
                    let unknown = if *is_delete {
                        Settled::AckUnknown
                    } else {
                        Settled::LeaseDropped
                    };
                    assert_eq!(got, unknown, "{cmd:?} cut at {cut} of {bytes:?}");
                    checked += 1;
                }
                let got = Settled::of(*is_delete, &answer(cmd, bytes));
                assert_eq!(got, want[k], "{cmd:?} answered {bytes:?}");
                checked += 1;
            }
        }
        // Four replies of 8 to 11 bytes, each cut at every byte, for three commands.
        assert_eq!(checked, 3 * (9 + 10 + 8 + 11 + 4));
    }

    #[test]
    fn error_replies_and_garbage_never_count_as_done() {
        let cases: [&[u8]; 8] = [
            b"INTERNAL_ERROR\r\n",
            b"OUT_OF_MEMORY\r\n",
            b"BAD_FORMAT\r\n",
            b"UNKNOWN_COMMAND\r\n",
            b"INSERTED 7\r\n",
            b"DELETED extra\r\n",
            b"DELETED\n",
            b"\xff\xfe garbage\r\n",
        ];
        for bytes in cases {
            for (cmd, is_delete) in &SETTLES {
                let reply = answer(cmd, bytes);
                let got = Settled::of(*is_delete, &reply);
                assert!(reply.is_err(), "{cmd:?} answered {bytes:?}: {reply:?}");
                let want = if *is_delete {
                    Settled::AckUnknown
                } else {
                    Settled::LeaseDropped
                };
                assert_eq!(got, want, "{cmd:?} answered {bytes:?}: {reply:?}");
            }
        }
    }

    #[test]
    fn the_counts_bracket_the_servers_delete_count_in_every_case() {
        // Each case: what the worker saw, and whether the server received the
        // delete (a reply cut short means it did; one never sent means not).
        let c = Counters::default();
        let mut cmd_delete = 0;
        let delete = Command::Delete { id: 7 };
        let seen: [(&[u8], bool); 5] = [
            (b"DELETED\r\n", true),
            (b"NOT_FOUND\r\n", true),
            (b"DELE", true),
            (b"", true),
            (b"INTERNAL_ERROR\r\n", true),
        ];
        for (bytes, received) in seen {
            Counters::add(Settled::of(true, &answer(&delete, bytes)).counter(&c));
            cmd_delete += u64::from(received);
        }
        let s = c.snapshot();
        assert_eq!((s.deleted, s.lost_lease, s.ack_unknown), (1, 1, 3));
        assert!(s.deleted + s.lost_lease <= cmd_delete);
        assert!(cmd_delete <= s.deleted + s.lost_lease + s.ack_unknown);
    }
}
