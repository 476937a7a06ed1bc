//! The machine's side of the writes and the clock: what to send next, and
//! the deadlines it owns.

use std::time::Instant;

use taskq_proto::ConnectionError;

use super::{Asked, Machine, Out, Owed, Sink, PROBE_MIN, TICKET_RETRY};
use crate::engine::{Ask, Fault, Req};
use crate::fair::{Schedule, Want};
use crate::shared::Shared;

impl Machine {
    /// Queues into `sink` every request due at `now`: the settles, lookups
    /// and touches decided, then the reserves the window has room for.
    /// `Err`: the sink refused (the connection is given up).
    pub(crate) fn transmit(
        &mut self,
        sh: &Shared,
        now: Instant,
        sink: &mut dyn Sink,
    ) -> Result<usize, ConnectionError> {
        if !self.life.up {
            return Ok(0);
        }
        self.keep_held(sh, now);
        let mut queued = 0;
        while let Some(o) = self.out.pop_front() {
            let (r, owed) = match o {
                Out::Settle(id, settle) => (
                    sink.req(Req::Settle(id, settle)),
                    Owed::Settle { id, settle },
                ),
                Out::Info(id, outcome, failure) => (
                    sink.info(id),
                    Owed::Info {
                        id,
                        outcome,
                        failure,
                    },
                ),
                Out::Ask(slot, id, Asked::Touch) => {
                    (sink.req(Req::Touch(id)), Owed::Touch { slot, id })
                }
                Out::Ask(slot, id, Asked::Stats) => (sink.info(id), Owed::Stats { slot, id }),
                Out::Lookup(slot, id) => (sink.info(id), Owed::Lookup { slot, id }),
                Out::Keep(slot, id) => (
                    sink.req(Req::Touch(id)),
                    Owed::Keep {
                        slot,
                        id,
                        sent: now,
                    },
                ),
            };
            if let Err(e) = r {
                self.out.push_front(o);
                return Err(e);
            }
            self.owed.push_back(owed);
            queued += 1;
        }
        let stopping = sh.stop.load(std::sync::atomic::Ordering::SeqCst);
        let ticket_due = self.ticket_at.is_none_or(|t| t <= now);
        if ticket_due {
            self.ticket_at = None;
        }
        if !stopping && !self.blocking && ticket_due {
            let room = self.free.len().saturating_sub(self.asks);
            let probe_due = self.probe_at.is_none_or(|t| t <= now);
            let want = if !self.dry {
                room
            } else if self.running() == 0 && self.owed.is_empty() && self.asks == 0 {
                // Nothing runs, nothing is owed: wait on the server.
                if sh.take_ticket() {
                    self.ask_with_ticket(sh, sink, sh.cfg.reserve_secs(), now)?;
                    self.blocking = true;
                    queued += 1;
                } else {
                    self.ticket_at = Some(now + TICKET_RETRY);
                }
                0
            } else if self.running() > 0 && self.asks == 0 && probe_due {
                // Jobs run: look again after a wait that doubles.
                self.probe_at = Some(now + self.probe_wait);
                self.probe_wait = (self.probe_wait * 2).min(sh.cfg.reserve_timeout.max(PROBE_MIN));
                room.min(1)
            } else {
                0
            };
            for _ in 0..want {
                if !sh.take_ticket() {
                    self.ticket_at = Some(now + TICKET_RETRY);
                    break;
                }
                self.ask_with_ticket(sh, sink, 0, now)?;
                self.asks += 1;
                queued += 1;
                // The window is filled by the schedule: each ask is a turn's job.
                if let Some(s) = self.sched.as_mut() {
                    s.taken();
                }
            }
        }
        Ok(queued)
    }

    /// [`ask`](Self::ask) for a ticket taken: given back if the sink
    /// refuses (no reserve owed holds it, and a break gives back only
    /// those owed; lost, the worker could never reach `max_jobs`).
    fn ask_with_ticket(
        &mut self,
        sh: &Shared,
        sink: &mut dyn Sink,
        slice: u32,
        now: Instant,
    ) -> Result<(), ConnectionError> {
        self.ask(sink, slice, &sh.cfg.tubes, now)
            .inspect_err(|_| sh.give_ticket())
    }

    fn ask(
        &mut self,
        sink: &mut dyn Sink,
        slice: u32,
        tubes: &[String],
        now: Instant,
    ) -> Result<(), ConnectionError> {
        // The one tube this reserve watches, if it watches one: a job it
        // takes is that tube's.
        let tube = match self.sched.as_ref().map(Schedule::want) {
            Some(Want::Try(k)) => Some(k),
            Some(Want::All) => None,
            None => (tubes.len() == 1).then_some(0),
        };
        let ask = Ask {
            sched: self.sched.as_mut(),
            tubes,
            slice,
        };
        sink.req(Req::Ask(ask))?;
        self.owed.push_back(Owed::Ask {
            wait: slice,
            tube,
            sent: now,
        });
        Ok(())
    }

    /// When the machine next wants [`transmit`](Self::transmit): the next
    /// probe, the next ticket look, the next connect, the idle exit. (The
    /// reply deadline is the session's; the driver wakes at the earlier.
    /// The idle exit's only while still ahead of `now`: once passed, the
    /// driver asks [`is_idle`](Self::is_idle) after each event.)
    pub(crate) fn poll_timeout(&self, sh: &Shared, now: Instant) -> Option<Instant> {
        let mut t: Option<Instant> = None;
        let mut at = |x: Instant| t = Some(t.map_or(x, |t| t.min(x)));
        if self.life.up {
            if let Some(h) = self.held_due(now) {
                at(h);
            }
            // The next probe, only while `transmit` would send it when
            // due: one it would not (a stop, no job running, a ticket
            // awaited) is no deadline, or once gone by the driver would
            // wake for it again and again.
            let stopping = sh.stop.load(std::sync::atomic::Ordering::SeqCst);
            if self.dry
                && self.asks == 0
                && !self.blocking
                && !stopping
                && self.running() > 0
                && self.ticket_at.is_none()
            {
                if let Some(p) = self.probe_at {
                    at(p);
                }
            }
            if let Some(t) = self.ticket_at {
                at(t);
            }
        }
        self.life.due(sh, now, &mut at);
        t
    }

    /// The session found the reply at the front of the pipeline overdue at
    /// `now` (`Session::handle_timeout`'s error `e`), or a reply the machine
    /// does not decode (the watch list's) out of step: the connection is
    /// given up, counted by `e`, and what it held is accounted for as at
    /// any break.
    pub(crate) fn reply_overdue(
        &mut self,
        sh: &Shared,
        now: Instant,
        e: ConnectionError,
        random: u64,
    ) {
        if self.life.up {
            let _ = self.fault(sh, now, None, Fault::Conn(e), random);
        }
    }
}
