//! One turn on a lane: reserve, run the handler, settle the job, and go on
//! while the server yields jobs. The settle and the next reserve go out in one
//! write. Written against the engine seam ([`Link`]): the accounting is here,
//! the protocol in the engine.

use std::ops::ControlFlow;
use std::sync::atomic::Ordering;
use std::time::Duration;

use taskq_proto::{ConnectionError, IoCounts, Reconnect};

use super::account::{account_io, count_settled, failed, unexpected, After, UNAVAILABLE_PAUSE};
use super::settle::decide;
use crate::counters::Counters;
use crate::engine::{Ask, Fault, JobLink, Link, Settle, Taken, Took};
use crate::fair::Schedule;
use crate::handler::{handle_guarded, Handler, Outcome};
use crate::job::{Job, JobError};
use crate::shared::{LaneShared, Shared, HOLDING, IDLE, RESERVING};

/// One call of `Lanes::serve`: the lane's parts borrowed apart from its
/// link (which each step takes as an argument), with the thread's handler and
/// body buffer.
pub(super) struct Turn<'a> {
    pub(super) sh: &'a Shared,
    pub(super) ls: &'a LaneShared,
    /// The server's address, for the logs.
    pub(super) server: &'a str,
    /// The server's index in the configuration.
    pub(super) index: usize,
    /// The lane's reconnect rule, told of each reply (progress).
    pub(super) reconnect: &'a mut Reconnect,
    pub(super) sched: &'a mut Option<Schedule>,
    pub(super) io_seen: &'a mut IoCounts,
    pub(super) slice: u32,
    pub(super) tubes: &'a [String],
    pub(super) handler: &'a dyn Handler,
    pub(super) body: &'a mut Vec<u8>,
    /// The header block of the job held (JetStream), in a reused buffer.
    pub(super) headers: &'a mut Vec<u8>,
    /// The job held is larger than the limit (its size): it is settled
    /// without running.
    pub(super) too_big: Option<u64>,
}

impl Turn<'_> {
    /// The next reserve, as the schedule wants it.
    fn ask(&mut self) -> Ask<'_> {
        Ask {
            sched: self.sched.as_mut(),
            tubes: self.tubes,
            slice: self.slice,
        }
    }

    /// Sends the next reserve.
    pub(super) fn send_reserve<L: Link>(&mut self, link: &mut L) -> Result<(), ConnectionError> {
        let ask = self.ask();
        link.send(None, Some(ask))
    }

    /// Waits for the reserve in flight and copies the job it yields into the
    /// body buffer; the lane then holds the job. A weighted reserve that finds
    /// its tube empty is sent again for all tubes. `Break(After::Stop)` means
    /// the worker is stopping and the caller must close the link.
    pub(super) fn reserve<L: Link>(&mut self, link: &mut L) -> ControlFlow<After, u64> {
        let (sh, ls, server) = (self.sh, self.ls, self.server);
        loop {
            // A reserve is in flight, and a ticket is held for it.
            ls.state.store(RESERVING, Ordering::SeqCst);
            account_io(&sh.counters, link, self.io_seen);
            if sh.stop.load(Ordering::SeqCst) {
                ls.state.store(IDLE, Ordering::SeqCst);
                sh.give_ticket();
                return ControlFlow::Break(After::Stop);
            }
            let id = match link.reserved() {
                Ok(took @ (Took::Job { .. } | Took::TooBig { .. })) => {
                    let Taken {
                        id,
                        body,
                        headers,
                        too_big,
                    } = took.job().expect("a job");
                    // The handler may touch the job or look it up on this link,
                    // which reuses the receive buffer the body lies in: the body
                    // moves to the thread's own reused buffer first.
                    self.body.clear();
                    self.body.extend_from_slice(body);
                    self.headers.clear();
                    self.headers.extend_from_slice(headers);
                    self.too_big = too_big;
                    id
                }
                Ok(Took::TurnEmpty) => {
                    // Weighted: the tube whose turn it is has no ready job. Fall
                    // back to all of them, waiting; the ticket stays held.
                    self.reconnect.progress();
                    if let Some(s) = self.sched.as_mut() {
                        s.empty();
                    }
                    if let Err(e) = self.send_reserve(link) {
                        ls.state.store(IDLE, Ordering::SeqCst);
                        sh.give_ticket();
                        return ControlFlow::Break(failed(sh, server, None, &e));
                    }
                    continue;
                }
                Ok(took @ (Took::TimedOut | Took::Outstanding)) => {
                    ls.state.store(IDLE, Ordering::SeqCst);
                    self.reconnect.progress();
                    Counters::add(&sh.counters.reserve_timeouts);
                    // Jobs still out (on JetStream, deliveries lost with a
                    // connection come back after their ack wait): not idle.
                    let out = matches!(took, Took::Outstanding);
                    ls.outstanding.store(out, Ordering::SeqCst);
                    if out {
                        sh.busy();
                    }
                    sh.give_ticket();
                    // One lane per server.
                    return ControlFlow::Break(if sh.cfg.servers.len() > 1 {
                        After::Next
                    } else {
                        After::Again
                    });
                }
                Ok(Took::Unavailable) => {
                    // The server cannot serve reserves now (an election):
                    // not idle time; pause so as not to spin on its answers.
                    ls.state.store(IDLE, Ordering::SeqCst);
                    self.reconnect.progress();
                    sh.busy();
                    sh.give_ticket();
                    std::thread::sleep(UNAVAILABLE_PAUSE);
                    return ControlFlow::Break(After::Again);
                }
                Ok(Took::DeadlineSoon) => {
                    // Only a link holding a job near its lease's end gets this;
                    // ours holds none while it reserves. Not an error: ask again.
                    ls.state.store(IDLE, Ordering::SeqCst);
                    self.reconnect.progress();
                    Counters::add(&sh.counters.deadline_soon);
                    sh.give_ticket();
                    return ControlFlow::Break(After::Again);
                }
                Err(Fault::Unexpected(word)) => {
                    ls.state.store(IDLE, Ordering::SeqCst);
                    sh.give_ticket();
                    return ControlFlow::Break(unexpected(sh, link, server, None, word));
                }
                Err(Fault::Conn(e)) => {
                    ls.state.store(IDLE, Ordering::SeqCst);
                    sh.give_ticket();
                    // Unanswered: not idle time.
                    sh.busy();
                    if sh.stop.load(Ordering::SeqCst) {
                        return ControlFlow::Break(After::Stop);
                    }
                    return ControlFlow::Break(failed(sh, server, None, &e));
                }
            };
            ls.state.store(HOLDING, Ordering::SeqCst);
            self.reconnect.progress();
            if let Some(s) = self.sched.as_mut() {
                s.taken();
            }
            Counters::add(&sh.counters.reserved);
            sh.took_job(ls);
            return ControlFlow::Continue(id);
        }
    }

    /// Runs the handler on the job just reserved, or gives the job back
    /// untouched when the worker is stopping. Breaks if the link broke while
    /// the handler ran.
    pub(super) fn work<J: JobLink>(
        &mut self,
        link: &mut J,
        id: u64,
    ) -> ControlFlow<After, Outcome> {
        let (sh, server) = (self.sh, self.server);
        let too_big = self.too_big.take();
        let outcome = if sh.stop.load(Ordering::SeqCst) {
            // Reserved after the stop: give it back untouched.
            Outcome::Retry {
                delay: Duration::ZERO,
            }
        } else if let Some(size) = too_big {
            // Never run, never taken again: set aside for good.
            Counters::add(&sh.counters.too_big);
            tracing::warn!(
                job = id,
                server,
                size,
                limit = sh.cfg.limits.max_job_size,
                "job larger than max_job_size: set aside without running"
            );
            Outcome::Bury
        } else {
            let mut job = Job {
                id,
                body: self.body,
                headers: self.headers,
                link,
                server,
                server_index: self.index,
                shared: sh,
                context: None,
            };
            handle_guarded(self.handler, &mut job)
        };
        if link.is_broken() {
            // A touch or a lookup broke the link: the server puts the job
            // back when it notices the close.
            self.ls.state.store(IDLE, Ordering::SeqCst);
            Counters::add(&sh.counters.lease_dropped);
            sh.give_ticket();
            tracing::warn!(job = id, server, "connection broke while the job ran");
            return ControlFlow::Break(After::Broken);
        }
        ControlFlow::Continue(outcome)
    }

    /// Sends the settle, in one write with the next reserve unless the worker
    /// is stopping, and counts the reply. Continues when a reserve is in
    /// flight again.
    pub(super) fn settle<L: Link>(
        &mut self,
        link: &mut L,
        id: u64,
        outcome: Outcome,
    ) -> ControlFlow<After> {
        let (sh, ls, server) = (self.sh, self.ls, self.server);
        let settle = match decide(sh, link, (self.index, server), id, outcome) {
            Ok(settle) => settle,
            Err(JobError::LeaseLost) => {
                ls.state.store(IDLE, Ordering::SeqCst);
                Counters::add(&sh.counters.lost_lease_on_release);
                sh.give_ticket();
                tracing::warn!(job = id, server, "lease lost: job no longer ours");
                if sh.stop.load(Ordering::SeqCst) || !sh.take_ticket() {
                    return ControlFlow::Break(After::Again);
                }
                if let Err(e) = self.send_reserve(link) {
                    sh.give_ticket();
                    return ControlFlow::Break(failed(sh, server, None, &e));
                }
                return ControlFlow::Continue(());
            }
            Err(e) => {
                ls.state.store(IDLE, Ordering::SeqCst);
                Counters::add(&sh.counters.lease_dropped);
                sh.give_ticket();
                link.mark_broken();
                tracing::warn!(job = id, server, error = %e, "cannot settle job");
                return ControlFlow::Break(After::Broken);
            }
        };
        // Pipelining: the job's outcome and the next reserve go out in one
        // write, unless the worker is stopping.
        let next = !sh.stop.load(Ordering::SeqCst) && sh.take_ticket();
        let ask = if next { Some(self.ask()) } else { None };
        let sent = link.send(Some((id, settle)), ask);
        let is_delete = settle == Settle::Delete;
        if let Err(e) = sent {
            ls.state.store(IDLE, Ordering::SeqCst);
            if next {
                sh.give_ticket();
            }
            if link.carry_settle(id) {
                // Sent again on the next connection, and counted (its
                // ticket given back or kept) once that resolves it.
                return ControlFlow::Break(failed(sh, server, Some(id), &e));
            }
            sh.give_ticket();
            if is_delete && !e.not_sent() {
                Counters::add(&sh.counters.ack_unknown);
            } else {
                Counters::add(&sh.counters.lease_dropped);
            }
            return ControlFlow::Break(failed(sh, server, Some(id), &e));
        }
        let reply = link.settled();
        ls.state.store(IDLE, Ordering::SeqCst);
        if let Err(after) = count_settled(sh, link, server, id, settle, reply) {
            if next {
                sh.give_ticket();
            }
            return ControlFlow::Break(after);
        }
        if !next {
            return ControlFlow::Break(if sh.stop.load(Ordering::SeqCst) {
                After::Stop
            } else {
                After::Again
            });
        }
        ControlFlow::Continue(())
    }
}
