//! The machine's side of the replies: what each one comes to, and a
//! failed request.

use std::time::{Duration, Instant};

use taskq_proto::ConnectionError;

use super::{
    Answer, Answered, Expect, Machine, Out, Owed, Slot, Start, Step, PROBE_MIN, TICKET_YIELD,
};
use crate::counters::Counters;
use crate::engine::{Fault, Settle, Took};
use crate::handler::Outcome;
use crate::job::JobError;
use crate::shared::Shared;
use crate::worker::account::{delivered_again_while_running, failed, tally};
use crate::worker::settle::{settle_with_info, Settled};

impl Machine {
    /// The kind of the reply owed next, if any.
    pub(crate) fn expect(&self) -> Option<Expect> {
        self.owed.front().map(|o| match o {
            Owed::Ask { .. } => Expect::Took,
            Owed::Settle { .. } => Expect::Settled,
            Owed::Touch { .. } | Owed::Keep { .. } => Expect::Touched,
            Owed::Info { .. } | Owed::Lookup { .. } | Owed::Stats { .. } => Expect::Info,
        })
    }

    /// Takes the reply to the request at the front of the pipeline, read at
    /// `now`. `Ok(Some(start))`: a job to run in that slot. `Err(())`: the
    /// connection must be given up ([`broke`](Self::broke) was called).
    #[allow(clippy::result_unit_err)]
    pub(crate) fn on_reply(
        &mut self,
        sh: &Shared,
        now: Instant,
        answer: Answer<'_>,
        random: u64,
    ) -> Result<Step, ()> {
        let Some(owed) = self.owed.pop_front() else {
            return self.fault(
                sh,
                now,
                None,
                Fault::Conn(ConnectionError::NothingOwed),
                random,
            );
        };
        let r = match (owed, answer) {
            (Owed::Ask { wait, tube, sent }, Answer::Took(took)) => {
                if wait == 0 {
                    self.asks -= 1;
                } else {
                    self.blocking = false;
                }
                self.took(sh, now, took, tube, sent).map(|s| match s {
                    None => Step::Nothing,
                    Some(s) if s.run => Step::Take(s),
                    Some(s) => Step::Hold(s),
                })
            }
            (Owed::Settle { id, settle }, Answer::Settled(reply)) => {
                let settled = Settled::of(settle == Settle::Delete, &reply);
                tally(sh, self.name(sh), id, settle, settled);
                match reply {
                    Ok(_) if !matches!(settled, Settled::AckUnknown | Settled::LeaseDropped) => {
                        self.life.reconnect.progress();
                        Ok(Step::Nothing)
                    }
                    Ok(r) => Err((Some(id), Fault::Unexpected(r.word()))),
                    Err(f) => Err((Some(id), f)),
                }
            }
            (
                Owed::Info {
                    id,
                    outcome,
                    failure,
                },
                Answer::Info(info),
            ) => match info {
                Ok(Some(info)) => {
                    self.life.reconnect.progress();
                    let settle = settle_with_info(sh, self.server, id, outcome, &info, failure);
                    self.out.push_back(Out::Settle(id, settle));
                    Ok(Step::Nothing)
                }
                Ok(None) => {
                    self.life.reconnect.progress();
                    self.lease_lost(sh, id);
                    Ok(Step::Nothing)
                }
                Err(f) => {
                    Counters::add(&sh.counters.lease_dropped);
                    sh.give_ticket();
                    Err((Some(id), f))
                }
            },
            (Owed::Touch { slot, id }, Answer::Touched(t)) => match t {
                Ok(ok) => {
                    self.life.reconnect.progress();
                    if ok {
                        Counters::add(&sh.counters.touched);
                        self.answers.push_back((slot, id, Answered::Touch(Ok(()))));
                    } else {
                        let lost = Answered::Touch(Err(JobError::LeaseLost));
                        self.answers.push_back((slot, id, lost));
                    }
                    Ok(Step::Nothing)
                }
                Err(f) => {
                    self.owed.push_front(Owed::Touch { slot, id });
                    Err((Some(id), f))
                }
            },
            (Owed::Keep { slot, id, sent }, Answer::Touched(t)) => match t {
                Ok(ok) => {
                    self.life.reconnect.progress();
                    // Still held (not handed to a handler meanwhile)?
                    let k = self.held.iter().position(|h| h.slot == slot && h.id == id);
                    if ok {
                        Counters::add(&sh.counters.touched);
                        if let Some(k) = k {
                            self.held[k].leased = sent;
                            self.held[k].touching = false;
                        }
                    } else if let Some(k) = k {
                        // Its lease ran out while it waited: never run.
                        // Handed ahead, its thread has it: told not to run
                        // it, and the loss is counted when it comes back.
                        if self.held.remove(k).is_some_and(|h| h.handed) {
                            self.lost.push((slot, id));
                            self.revoke.push_back((slot, id));
                        } else {
                            self.slots[slot] = Slot::Free;
                            self.free.push(slot);
                            self.lease_lost(sh, id);
                        }
                    }
                    Ok(Step::Nothing)
                }
                Err(f) => {
                    self.owed.push_front(Owed::Keep { slot, id, sent });
                    Err((Some(id), f))
                }
            },
            (Owed::Lookup { slot, id }, Answer::Info(info)) => match info {
                Ok(Some(info)) => {
                    self.life.reconnect.progress();
                    let stopped = sh.stop.load(std::sync::atomic::Ordering::SeqCst);
                    if let Some(Slot::Running { info: i, .. }) = self.slots.get_mut(slot) {
                        *i = Some(info);
                    }
                    if stopped {
                        // Not started before the stop: given back untouched.
                        self.finished(sh, slot, super::UNSTARTED, None);
                        return Ok(Step::Nothing);
                    }
                    let n = crate::worker::settle::attempt(sh, self.server, id, info.releases);
                    let attempt = u32::try_from(n).unwrap_or(u32::MAX);
                    if self.ready(slot, id, (attempt, true), None) {
                        Ok(Step::Run { slot, id, attempt })
                    } else {
                        Ok(Step::Wait { slot })
                    }
                }
                Ok(None) => {
                    // Its lease ran out before it started: never run.
                    self.life.reconnect.progress();
                    self.slots[slot] = Slot::Free;
                    self.free.push(slot);
                    self.lease_lost(sh, id);
                    Ok(Step::Nothing)
                }
                Err(f) => {
                    self.owed.push_front(Owed::Lookup { slot, id });
                    Err((Some(id), f))
                }
            },
            (Owed::Stats { slot, id }, Answer::Info(info)) => match info {
                Ok(Some(info)) => {
                    self.life.reconnect.progress();
                    // Kept for the settle too (not looked up when taken).
                    if let Some(Slot::Running {
                        id: i, info: kept, ..
                    }) = self.slots.get_mut(slot)
                    {
                        if *i == id && kept.is_none() {
                            *kept = Some(info);
                        }
                    }
                    self.answers
                        .push_back((slot, id, Answered::Stats(Ok(info))));
                    Ok(Step::Told { slot })
                }
                Ok(None) => {
                    self.life.reconnect.progress();
                    let lost = Answered::Stats(Err(JobError::LeaseLost));
                    self.answers.push_back((slot, id, lost));
                    Ok(Step::Nothing)
                }
                Err(f) => {
                    self.owed.push_front(Owed::Stats { slot, id });
                    Err((Some(id), f))
                }
            },
            (owed, _) => {
                // The driver decoded another kind of reply: out of step.
                self.owed.push_front(owed);
                Err((None, Fault::Conn(ConnectionError::Broken)))
            }
        };
        match r {
            Ok(start) => Ok(start),
            Err((job, f)) => self.fault(sh, now, job, f, random),
        }
    }

    /// A lookup found job `id` no longer ours: its lease ran out.
    pub(super) fn lease_lost(&mut self, sh: &Shared, id: u64) {
        Counters::add(&sh.counters.lost_lease_on_release);
        sh.give_ticket();
        tracing::warn!(
            job = id,
            server = self.name(sh),
            "lease lost: job no longer ours"
        );
    }

    /// Job `id`, reserved at `asked`, is one a slot of this connection
    /// holds already: its lease ran out while it ran or waited, and the
    /// server handed it to this connection again. One job, run once: the
    /// new reservation is its lease now (the settle of the slot's run,
    /// sent on this connection, settles it), and the delivery is not run
    /// again (counted `lost_lease_on_release`, its ticket given back), as
    /// the JetStream machine does. A job the server no longer counted as
    /// ours (revoked, never to run) is not one the slot runs: its
    /// delivery is taken as any other.
    fn reserved_again(&mut self, sh: &Shared, id: u64, asked: Instant) -> bool {
        let epoch = self.epoch;
        let Some(slot) = self.slots.iter().position(
            |s| matches!(s, Slot::Running { id: j, epoch: e, .. } if *j == id && *e == epoch),
        ) else {
            return false;
        };
        if self.lost.contains(&(slot, id)) {
            return false;
        }
        if let Some(Slot::Running { asked: a, .. }) = self.slots.get_mut(slot) {
            *a = asked;
        }
        if let Some(h) = self.held.iter_mut().find(|h| h.slot == slot) {
            h.asked = asked;
            h.leased = asked;
        }
        delivered_again_while_running(sh, self.name(sh), id);
        true
    }

    /// What a reserve's reply comes to.
    fn took(
        &mut self,
        sh: &Shared,
        now: Instant,
        took: Result<Took<'_>, Fault>,
        tube: Option<usize>,
        asked: Instant,
    ) -> Result<Option<Start>, (Option<u64>, Fault)> {
        let took = took.map_err(|f| {
            sh.give_ticket();
            (None, f)
        })?;
        self.life.reconnect.progress();
        let Some(job) = took.job() else {
            sh.give_ticket();
            match took {
                Took::TimedOut => {
                    Counters::add(&sh.counters.reserve_timeouts);
                    self.quiet = true;
                    if sh.cfg.max_jobs.is_some() {
                        self.ticket_at = Some(now + TICKET_YIELD);
                    }
                }
                Took::TurnEmpty => {
                    if let Some(s) = self.sched.as_mut() {
                        s.empty();
                    }
                }
                Took::DeadlineSoon => {
                    Counters::add(&sh.counters.deadline_soon);
                    // Some lease of this connection's is about to run out:
                    // the held jobs' are touched now.
                    self.soon = !self.held.is_empty();
                }
                Took::Job { .. } | Took::TooBig { .. } => {}
            }
            self.dry = true;
            return Ok(None);
        };
        self.life.last_busy = now;
        self.quiet = false;
        self.dry = false;
        self.probe_wait = PROBE_MIN;
        self.probe_at = None;
        let id = job.id;
        if self.reserved_again(sh, id, asked) {
            return Ok(None);
        }
        Counters::add(&sh.counters.reserved);
        if sh.stop.load(std::sync::atomic::Ordering::SeqCst) {
            // Reserved after the stop: given back untouched.
            self.settle(
                sh,
                id,
                Outcome::Retry {
                    delay: Duration::ZERO,
                },
                None,
            );
            return Ok(None);
        }
        if let Some(size) = job.too_big {
            // Never run, never taken again: set aside for good.
            Counters::add(&sh.counters.too_big);
            tracing::warn!(
                job = id,
                server = self.name(sh),
                size,
                limit = sh.cfg.limits.max_job_size,
                "job larger than max_job_size: set aside without running"
            );
            self.settle(sh, id, Outcome::Bury, None);
            return Ok(None);
        }
        let Some(slot) = self.free.pop() else {
            // More jobs than room: never asked for, so out of step.
            return Err((Some(id), Fault::Unexpected("RESERVED")));
        };
        // Its tube and attempt are told to the handler: looked up first, in
        // the next write (the settle needs the same numbers), unless the
        // handler is not told its attempt and the reserve says its tube.
        // Not looked up first when the handler is not told its attempt
        // (`job_lookup` off) and either the reserve says its tube or the
        // handler asks for it when it wants it (the blocking worker's).
        let now_or_held = !sh.cfg.job_lookup && (tube.is_some() || sh.lazy_lookup);
        self.slots[slot] = Slot::Running {
            id,
            epoch: self.epoch,
            info: None,
            started: false,
            asked,
        };
        if !now_or_held {
            self.out.push_back(Out::Lookup(slot, id));
            return Ok(Some(Start {
                slot,
                id,
                tube: None,
                run: false,
            }));
        }
        // It starts now, or waits held (its body kept, as for a lookup).
        let run = self.ready(slot, id, (0, false), tube);
        Ok(Some(Start {
            slot,
            id,
            tube,
            run,
        }))
    }

    /// Counts a failed request and gives the connection up.
    pub(super) fn fault(
        &mut self,
        sh: &Shared,
        now: Instant,
        job: Option<u64>,
        f: Fault,
        random: u64,
    ) -> Result<Step, ()> {
        match f {
            Fault::Conn(e) => {
                failed(sh, self.name(sh), job, &e);
            }
            Fault::Unexpected(word) => {
                Counters::add(&sh.counters.unexpected_replies);
                tracing::warn!(
                    ?job,
                    server = self.name(sh),
                    reply = word,
                    "unexpected reply"
                );
            }
        }
        self.broke(sh, now, random);
        Err(())
    }
}
