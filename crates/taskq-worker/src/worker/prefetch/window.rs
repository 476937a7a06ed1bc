//! The window's turn: the lane's thread takes the next job from the window
//! (refilling it, or waiting on one blocking reserve when the server had
//! nothing ready), runs it, and settles it with the refill and the touches
//! in one write, or gathers its settle for the refill's write.

use std::net::{Ipv4Addr, SocketAddr};
use std::ops::ControlFlow;
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::Instant;

use taskq_proto::ConnectionError;

use super::{lock, Owed, Pipe, TOUCH_AFTER};
use crate::counters::Counters;
use crate::engine::{Ask, Fault, JobLink, Link, Req, Settle};
use crate::handler::Outcome;
use crate::job::JobError;
use crate::job_info::JobInfo;
use crate::shared::{Shared, HOLDING, IDLE};
use crate::worker::account::{account_io, failed, After};
use crate::worker::settle::decide;
use crate::worker::turn::Turn;

/// The link as a handler sees it while its job runs: each request takes the
/// window's lock and reads the replies owed first.
struct Locked<'a, L> {
    pipe: &'a Mutex<Pipe<L>>,
    sh: &'a Shared,
}

/// The link of a locked window: replies owed are read before a request.
struct Caught<'a, L> {
    pipe: &'a mut Pipe<L>,
    sh: &'a Shared,
}

impl<L: Link> Caught<'_, L> {
    fn ready(&mut self) -> Result<&mut L, Fault> {
        self.pipe
            .absorb(self.sh)
            .map_err(|_| Fault::Conn(ConnectionError::Broken))?;
        self.pipe.link().map_err(Fault::Conn)
    }
}

impl<L: Link> JobLink for Caught<'_, L> {
    fn addr(&self) -> SocketAddr {
        self.pipe
            .link
            .as_ref()
            .map_or(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)), L::addr)
    }

    fn is_broken(&self) -> bool {
        self.pipe.link.as_ref().is_none_or(L::is_broken)
    }

    fn mark_broken(&mut self) {
        if let Some(l) = self.pipe.link.as_mut() {
            l.mark_broken();
        }
    }

    fn touch(&mut self, id: u64) -> Result<bool, Fault> {
        self.ready()?.touch(id)
    }

    fn info(&mut self, id: u64, tube: Option<&mut String>) -> Result<Option<JobInfo>, Fault> {
        self.ready()?.info(id, tube)
    }
}

impl<L: Link> Locked<'_, L> {
    fn with<T>(&self, f: impl FnOnce(&mut Caught<'_, L>) -> T) -> T {
        let mut p = lock(self.pipe);
        f(&mut Caught {
            pipe: &mut p,
            sh: self.sh,
        })
    }
}

impl<L: Link> JobLink for Locked<'_, L> {
    fn addr(&self) -> SocketAddr {
        self.with(|c| c.addr())
    }

    fn is_broken(&self) -> bool {
        self.with(|c| c.is_broken())
    }

    fn mark_broken(&mut self) {
        self.with(|c| c.mark_broken());
    }

    fn touch(&mut self, id: u64) -> Result<bool, Fault> {
        self.with(|c| c.touch(id))
    }

    fn info(&mut self, id: u64, tube: Option<&mut String>) -> Result<Option<JobInfo>, Fault> {
        self.with(|c| c.info(id, tube))
    }
}

impl Turn<'_> {
    /// Works jobs through the window on `pipe` while the server yields them.
    /// Holds no `max_jobs` ticket: each reserve takes its own.
    pub(crate) fn window<L: Link>(&mut self, pipe: &Mutex<Pipe<L>>) -> After {
        loop {
            let id = match self.next_job(pipe) {
                ControlFlow::Continue(id) => id,
                ControlFlow::Break(after) => return after,
            };
            let mut link = Locked { pipe, sh: self.sh };
            let outcome = match self.work(&mut link, id) {
                ControlFlow::Continue(o) => o,
                ControlFlow::Break(after) => {
                    let mut p = lock(pipe);
                    p.running = None;
                    p.forget(self.sh);
                    return after;
                }
            };
            if let ControlFlow::Break(after) = self.settle_refill(pipe, id, outcome) {
                return after;
            }
        }
    }

    /// Reads the owed replies (writing what was held back first) and
    /// passes on what they told the lane.
    fn absorb<L: Link>(&mut self, p: &mut Pipe<L>) -> Result<(), After> {
        p.send_gathered(self.sh)?;
        self.absorb_until(p, usize::MAX)
    }

    /// [`Pipe::absorb_until`], passing on what the replies told the lane.
    fn absorb_until<L: Link>(&mut self, p: &mut Pipe<L>, held: usize) -> Result<(), After> {
        let r = p.absorb_until(self.sh, held);
        if std::mem::take(&mut p.progress) {
            self.reconnect.progress();
        }
        if std::mem::take(&mut p.turn_empty) {
            if let Some(s) = self.sched.as_mut() {
                s.empty();
            }
        }
        r
    }

    /// Queues no-wait reserves for the window's free room (one, to probe,
    /// when the server had nothing ready last time), each with a ticket.
    fn refill<L: Link>(&mut self, p: &mut Pipe<L>, sent: Instant) -> Result<usize, After> {
        let room = self.sh.cfg.prefetch.saturating_sub(p.held.len() + p.asks);
        let room = if p.dry { room.min(1) } else { room };
        let mut asked = 0;
        while asked < room && self.sh.take_ticket() {
            let ask = Ask {
                sched: self.sched.as_mut(),
                tubes: self.tubes,
                slice: 0,
            };
            if let Err(e) = p.queue(Req::Ask(ask), Owed::Ask { sent }) {
                self.sh.give_ticket();
                p.forget(self.sh);
                return Err(failed(self.sh, self.server, None, &e));
            }
            p.asks += 1;
            asked += 1;
            // The window is filled by the schedule: each ask is a turn's job.
            if let Some(s) = self.sched.as_mut() {
                s.taken();
            }
        }
        Ok(asked)
    }

    /// The next job to run: the oldest waiting one (its lease confirmed when
    /// it is old), or what a refill or a blocking reserve brings. At a stop,
    /// gives the waiting jobs back.
    fn next_job<L: Link>(&mut self, pipe: &Mutex<Pipe<L>>) -> ControlFlow<After, u64> {
        let (sh, ls) = (self.sh, self.ls);
        let k = sh.cfg.prefetch;
        let mut p = lock(pipe);
        // Half the window left: read the older replies (long come) up to
        // three quarters full, so the server always has requests to answer
        // and the handler jobs to run. A gathering window reads all that was
        // written once it is empty (its refill went out when it emptied, or
        // earlier for slow jobs).
        let (low, upto) = if L::GATHER {
            (0, usize::MAX)
        } else {
            (k / 2, (3 * k / 4).max(1))
        };
        if p.held.len() <= low && p.owed.len() > p.unsent {
            if let Err(after) = self.absorb_until(&mut p, upto) {
                ls.state.store(IDLE, Ordering::SeqCst);
                return ControlFlow::Break(after);
            }
        }
        loop {
            if sh.stop.load(Ordering::SeqCst) {
                let r = p.release(sh, |_| true);
                ls.state.store(IDLE, Ordering::SeqCst);
                return ControlFlow::Break(r.err().unwrap_or(After::Stop));
            }
            if let Some(h) = p.held.front() {
                let now = Instant::now();
                if now.duration_since(h.leased) >= TOUCH_AFTER {
                    // It may be at the end of its lease. A touch may be owed
                    // for it already: read the replies first.
                    if !p.owed.is_empty() {
                        if let Err(after) = self.absorb(&mut p) {
                            ls.state.store(IDLE, Ordering::SeqCst);
                            return ControlFlow::Break(after);
                        }
                        continue;
                    }
                    // Restart it and wait for the answer before starting it.
                    let id = h.id;
                    let r = p
                        .queue(Req::Touch(id), Owed::Touch { id, sent: now })
                        .map_err(|e| {
                            p.forget(sh);
                            failed(sh, self.server, Some(id), &e)
                        })
                        .and_then(|()| p.flush(sh))
                        .and_then(|()| self.absorb(&mut p));
                    if let Err(after) = r {
                        ls.state.store(IDLE, Ordering::SeqCst);
                        return ControlFlow::Break(after);
                    }
                    continue;
                }
                let Some(h) = p.held.pop_front() else {
                    continue;
                };
                let old = std::mem::replace(self.body, h.body);
                p.bodies.give(old);
                let old = std::mem::replace(self.headers, h.headers);
                p.headers.give(old);
                self.too_big = h.too_big;
                p.running = Some(h.id);
                ls.state.store(HOLDING, Ordering::SeqCst);
                return ControlFlow::Continue(h.id);
            }
            if let Err(after) = self.absorb(&mut p) {
                ls.state.store(IDLE, Ordering::SeqCst);
                return ControlFlow::Break(after);
            }
            if !p.held.is_empty() {
                continue;
            }
            if !p.dry {
                let asked = match self.refill(&mut p, Instant::now()) {
                    Ok(n) => n,
                    Err(after) => return ControlFlow::Break(after),
                };
                if asked > 0 {
                    ls.state.store(HOLDING, Ordering::SeqCst);
                    if let Err(after) = p.flush(sh) {
                        ls.state.store(IDLE, Ordering::SeqCst);
                        return ControlFlow::Break(after);
                    }
                    continue;
                }
            }
            // Nothing ready last time (or no ticket): one blocking reserve,
            // as without prefetch.
            ls.state.store(IDLE, Ordering::SeqCst);
            if !sh.take_ticket() {
                return ControlFlow::Break(After::Again);
            }
            let Some(link) = p.link.as_mut() else {
                sh.give_ticket();
                return ControlFlow::Break(After::Broken);
            };
            if let Err(e) = self.send_reserve(link) {
                sh.give_ticket();
                return ControlFlow::Break(failed(sh, self.server, None, &e));
            }
            let r = self.reserve(link);
            if let ControlFlow::Continue(id) = r {
                p.dry = false;
                p.running = Some(id);
            }
            return r;
        }
    }

    /// Settles the job that ran and, in the same write, touches the waiting
    /// jobs whose leases need it and refills the window.
    fn settle_refill<L: Link>(
        &mut self,
        pipe: &Mutex<Pipe<L>>,
        id: u64,
        outcome: Outcome,
    ) -> ControlFlow<After> {
        let (sh, ls, server) = (self.sh, self.ls, self.server);
        let mut p = lock(pipe);
        p.running = None;
        let settle = decide(
            sh,
            &mut Caught { pipe: &mut p, sh },
            (self.index, server),
            id,
            outcome,
        );
        ls.state.store(HOLDING, Ordering::SeqCst);
        let now = Instant::now();
        let touched = p.queue_leases(sh, now);
        if let Err(after) = touched {
            // Its settle was never sent: the server takes it back (or had
            // it back already: its lease was lost). Its ticket comes back
            // either way.
            match settle {
                Err(JobError::LeaseLost) => Counters::add(&sh.counters.lost_lease_on_release),
                _ => Counters::add(&sh.counters.lease_dropped),
            }
            sh.give_ticket();
            ls.state.store(IDLE, Ordering::SeqCst);
            return ControlFlow::Break(after);
        }
        let touched = touched.unwrap_or(true);
        let queued = match settle {
            Ok(s) => p.queue(Req::Settle(id, s), Owed::Settle { id, settle: s }),
            Err(JobError::LeaseLost) => {
                Counters::add(&sh.counters.lost_lease_on_release);
                sh.give_ticket();
                tracing::warn!(job = id, server, "lease lost: job no longer ours");
                Ok(())
            }
            Err(e) => {
                Counters::add(&sh.counters.lease_dropped);
                sh.give_ticket();
                tracing::warn!(job = id, server, error = %e, "cannot settle job");
                p.forget(sh);
                ls.state.store(IDLE, Ordering::SeqCst);
                return ControlFlow::Break(After::Broken);
            }
        };
        let mut r = queued.map_err(|e| {
            if let Ok(s) = settle {
                Counters::add(if s == Settle::Delete && !e.not_sent() {
                    &sh.counters.ack_unknown
                } else {
                    &sh.counters.lease_dropped
                });
                sh.give_ticket();
            }
            p.forget(sh);
            failed(sh, server, Some(id), &e)
        });
        let stop = sh.stop.load(Ordering::SeqCst);
        if r.is_ok() && !stop && p.gathers(sh, touched, now) {
            // The next job is in hand: the settle waits for the refill's write.
            p.gathered.get_or_insert(now);
            return ControlFlow::Continue(());
        }
        if r.is_ok() && !stop {
            r = self.refill(&mut p, now).map(|_| ());
        }
        let r = r.and_then(|()| p.flush(sh)).and_then(|()| {
            if p.owed.len() > 2 * sh.cfg.prefetch {
                self.absorb(&mut p)
            } else {
                Ok(())
            }
        });
        if let Some(link) = p.link.as_ref() {
            account_io(&sh.counters, link, self.io_seen);
        }
        match r {
            Ok(()) => ControlFlow::Continue(()),
            Err(after) => {
                ls.state.store(IDLE, Ordering::SeqCst);
                ControlFlow::Break(after)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use taskq_proto::IoCounts;

    use super::super::scripted::Scripted;
    use super::super::{lock, Pipe};
    use crate::config::Config;
    use crate::worker::account::After;
    use crate::worker::turn::Turn;
    use crate::worker::Worker;

    /// Drains `jobs` jobs through a window of `k` on a scripted link that
    /// gathers or not (`G`), and gives what each write carried.
    fn drain_window<const G: bool>(k: usize, jobs: u64) -> Vec<Vec<String>> {
        let cfg = Config {
            max_jobs: Some(jobs),
            prefetch: k,
            ..Config::default()
        };
        let sh = Worker::new(cfg, |_: &mut crate::Job<'_>| crate::Outcome::Done)
            .unwrap()
            .shared;
        let pipe = Mutex::new(Pipe::<Scripted<G>>::new(0, 0, k));
        // Every write is made by the rule under test, none by the clock.
        lock(&pipe).gather_max = Duration::from_secs(3600);
        lock(&pipe).link = Some(Scripted {
            jobs,
            ..Scripted::default()
        });
        let handler = |_: &mut crate::Job<'_>| crate::Outcome::Done;
        let (mut reconnect, mut sched) = (taskq_proto::Reconnect::new(), None);
        let (mut io_seen, mut body) = (IoCounts::default(), Vec::new());
        let mut headers = Vec::new();
        let tubes = ["default".to_owned()];
        let mut turn = Turn {
            sh: &sh,
            ls: &sh.lanes[0],
            server: "scripted",
            index: 0,
            reconnect: &mut reconnect,
            sched: &mut sched,
            io_seen: &mut io_seen,
            slice: 1,
            tubes: &tubes,
            handler: &handler,
            body: &mut body,
            headers: &mut headers,
            too_big: None,
        };
        assert!(matches!(turn.window(&pipe), After::Stop));
        let c = sh.counters.snapshot();
        assert_eq!((c.reserved, c.deleted), (jobs, jobs));
        let mut p = lock(&pipe);
        assert!(p.owed.is_empty() && p.held.is_empty() && p.unsent == 0);
        std::mem::take(&mut p.link.as_mut().unwrap().sent)
    }

    /// How many of a write's requests are settles, and how many asks.
    fn kinds(write: &[String]) -> (usize, usize) {
        let settles = write.iter().filter(|r| r.starts_with("Delete")).count();
        let asks = write.iter().filter(|r| r.starts_with("reserve")).count();
        assert_eq!(settles + asks, write.len(), "{write:?}");
        (settles, asks)
    }

    #[test]
    fn a_gathering_window_writes_its_settles_with_the_refill_once_a_window() {
        let (k, jobs) = (16, 256);
        let writes = drain_window::<true>(k, jobs);
        // The first write asks for a whole window. Every later one, until
        // `max_jobs` runs out, carries the settles of the window's jobs done
        // since the last and the asks that refill it: one pull, one write.
        assert_eq!(kinds(&writes[0]), (0, k));
        let steady = &writes[1..writes.len() - 1];
        for w in steady {
            assert_eq!(kinds(w), (k, k), "{writes:?}");
        }
        // Settles come first in a write, then the asks.
        assert!(steady.iter().all(|w| w[0].starts_with("Delete")));
        // Then `max_jobs` leaves nothing to ask for: the last settles wait
        // for the window to empty.
        assert_eq!(kinds(&writes[writes.len() - 1]), (k, 0));
        // 256 jobs: a window, 15 writes of 16 settles and 16 asks, the end.
        assert_eq!(writes.len(), 17, "{writes:?}");
        let settles: usize = writes.iter().map(|w| kinds(w).0).sum();
        assert_eq!(settles, jobs as usize);
    }

    #[test]
    fn a_window_that_does_not_gather_writes_once_a_job() {
        let (k, jobs) = (16, 64);
        let writes = drain_window::<false>(k, jobs);
        assert_eq!(kinds(&writes[0]), (0, k));
        // Each job: its settle and the ask that refills its place.
        for w in &writes[1..writes.len() - 1] {
            assert_eq!(kinds(w).0, 1, "{writes:?}");
        }
        assert_eq!(writes.len(), jobs as usize + 1);
    }
}
