//! One thread's loop over its lanes (one per server): pick a server, connect
//! with backoff, take a `max_jobs` ticket, and hand the lane to a [`Turn`].

use std::ops::ControlFlow;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use taskq_proto::{IoCounts, Reconnect};

use super::account::{account_io, count_resolved, failed, After};
use super::prefetch::Pipe;
use super::turn::Turn;
use crate::counters::Counters;
use crate::engine::{Carry, Link};
use crate::fair::Schedule;
use crate::handler::Handler;
use crate::shared::{Keep, LaneShared, Shared, CONNECTING, IDLE};

/// Longest nap of a thread that has nothing to do (all servers backing off, or no
/// `max_jobs` ticket free), so that it notices a stop soon.
const NAP: Duration = Duration::from_millis(50);

/// One server as one thread sees it.
struct Lane<L> {
    server: usize,
    conn: Option<L>,
    /// The reconnect rule: at once after progress, else with backoff.
    reconnect: Reconnect,
    ever_connected: bool,
    /// Connect attempts so far, from the thread's index (where a cluster's
    /// seeds are tried from).
    connects: usize,
    /// The addresses the last connection was told of (at its connect, or by
    /// a later `INFO`), tried after the configured ones on the next connect.
    learned: Vec<String>,
    /// Settles a failed connection sent without an answer, for the next
    /// connection to send again.
    carry: Carry,
    /// Weighted tubes: this connection's place in the cycle.
    sched: Option<Schedule>,
    /// The connection's system calls already added to the counters.
    io_seen: IoCounts,
    /// With prefetch: the window, made on the first turn and kept (with its
    /// buffers) across connections.
    pipe: Option<Arc<Mutex<Pipe<L>>>>,
}

/// The thread's side: its lanes, the handler, and the reused body buffer.
pub(super) struct Lanes<L> {
    shared: Arc<Shared>,
    handler: Arc<dyn Handler>,
    thread: usize,
    lanes: Vec<Lane<L>>,
    body: Vec<u8>,
    headers: Vec<u8>,
}

impl<L: Link + Send + 'static> Lanes<L> {
    pub(super) fn new(shared: Arc<Shared>, handler: Arc<dyn Handler>, thread: usize) -> Lanes<L> {
        let lanes = (0..shared.cfg.servers.len())
            .map(|server| Lane {
                server,
                conn: None,
                reconnect: Reconnect::new(),
                ever_connected: false,
                connects: thread,
                learned: Vec::new(),
                carry: Carry::default(),
                sched: shared
                    .cfg
                    .is_weighted()
                    .then(|| Schedule::new(&shared.cfg.weights, shared.cfg.run_scale, thread)),
                io_seen: IoCounts::default(),
                pipe: None,
            })
            .collect();
        Lanes {
            shared,
            handler,
            thread,
            lanes,
            body: Vec::new(),
            headers: Vec::new(),
        }
    }

    fn lane_shared(&self, server: usize) -> &LaneShared {
        &self.shared.lanes[self.thread * self.lanes.len() + server]
    }

    pub(super) fn run(mut self) {
        let m = self.lanes.len();
        // Threads start on different servers so that all are covered at once.
        let mut cur = self.thread % m;
        while !self.shared.stop.load(Ordering::SeqCst) {
            let now = Instant::now();
            let ready = (0..m).map(|k| (cur + k) % m).find(|&i| {
                self.lanes[i].conn.is_some() || self.lanes[i].reconnect.wait_left(now).is_none()
            });
            let Some(i) = ready else {
                // Every server is backing off: sleep, costing no CPU.
                let left = self
                    .lanes
                    .iter()
                    .filter_map(|l| l.reconnect.wait_left(now))
                    .min()
                    .unwrap_or(NAP);
                std::thread::sleep(left.min(NAP));
                continue;
            };
            cur = i;
            if self.lanes[i].conn.is_none() && !self.connect(i) {
                cur = (i + 1) % m;
                continue;
            }
            if !self.shared.take_ticket() {
                std::thread::sleep(NAP / 5);
                continue;
            }
            match self.serve(i) {
                After::Again => {}
                After::Next => cur = (i + 1) % m,
                After::Broken => {
                    self.broke(i);
                    cur = (i + 1) % m;
                }
                After::Stop => break,
            }
        }
        for i in 0..m {
            self.lane_shared(i).state.store(IDLE, Ordering::SeqCst);
            if let Some(mut c) = self.lanes[i].conn.take() {
                account_io(&self.shared.counters, &c, &mut self.lanes[i].io_seen);
                c.hand_over(&mut self.lanes[i].carry);
                c.quit();
            }
            self.settle_carried(i);
        }
    }

    /// At the end: settles still carried get one more connection to be
    /// confirmed on (not when aborting); what is left is counted unknown.
    fn settle_carried(&mut self, i: usize) {
        if self.lanes[i].carry.open.is_empty() {
            return;
        }
        if !self.shared.abort.load(Ordering::SeqCst) && self.connect(i) {
            let sh = &*self.shared;
            if let Some(c) = self.lanes[i].conn.take() {
                account_io(&sh.counters, &c, &mut self.lanes[i].io_seen);
                c.quit();
            }
        }
        let sh = &*self.shared;
        let lane = &mut self.lanes[i];
        lane.carry.give_up();
        count_carried(sh, sh.cfg.servers[lane.server].as_str(), &mut lane.carry);
        self.lane_shared(i).carrying.store(false, Ordering::SeqCst);
    }

    /// Opens the lane's connection and restores its watch list; on failure, sets
    /// the next attempt with capped exponential backoff and full jitter.
    fn connect(&mut self, i: usize) -> bool {
        let sh = &*self.shared;
        let addr = sh.cfg.servers[self.lanes[i].server].as_str();
        let lane = &mut self.lanes[i];
        let ls = &sh.lanes[self.thread * sh.cfg.servers.len() + i];
        ls.state.store(CONNECTING, Ordering::SeqCst);
        // Settles whose jobs' leases have ended are given up first.
        lane.carry.expire(Instant::now());
        count_carried(sh, addr, &mut lane.carry);
        let result = L::connect(&sh.cfg, addr, lane.connects, &lane.learned, &mut lane.carry);
        ls.state.store(IDLE, Ordering::SeqCst);
        // However long it took, the time was the server's (an election can
        // hold a stream lookup for seconds): not idle time.
        sh.busy();
        lane.connects = lane.connects.wrapping_add(1);
        count_carried(sh, addr, &mut lane.carry);
        ls.carrying
            .store(!lane.carry.open.is_empty(), Ordering::SeqCst);
        match result {
            Ok(conn) => {
                lane.learned.clear();
                lane.learned.extend_from_slice(conn.learned());
                if let Some(cut) = conn.interrupter() {
                    *self.shared.lanes[self.thread * self.shared.cfg.servers.len() + i]
                        .cut
                        .lock()
                        .unwrap_or_else(|e| e.into_inner()) = Some(cut);
                }
                if lane.ever_connected {
                    Counters::add(&sh.counters.reconnects);
                    tracing::warn!(server = addr, "reconnected");
                }
                lane.ever_connected = true;
                lane.reconnect.opened();
                lane.io_seen = IoCounts::default();
                account_io(&sh.counters, &conn, &mut lane.io_seen);
                if let Some(s) = lane.sched.as_mut() {
                    s.watching_all();
                }
                lane.conn = Some(conn);
                true
            }
            Err(e) => {
                Counters::add(&sh.counters.connect_failures);
                if e.is_timeout() {
                    Counters::add(&sh.counters.io_timeouts);
                }
                let first = lane.reconnect.failures() == 0;
                let now = Instant::now();
                lane.reconnect
                    .connect_failed(&sh.cfg.reconnect_backoff, now, fastrand::u64(..));
                let wait = lane.reconnect.wait_left(now);
                if first {
                    tracing::warn!(server = addr, error = %e, "cannot connect; backing off");
                } else {
                    tracing::debug!(server = addr, error = %e, ?wait, "cannot connect");
                }
                false
            }
        }
    }

    /// Drops a broken connection. The first reconnect is immediate; a connection
    /// that broke before any reply counts as a failure, so a server that cuts
    /// every connection is retried with backoff, not in a tight loop.
    fn broke(&mut self, i: usize) {
        let ls = &self.shared.lanes[self.thread * self.lanes.len() + i];
        ls.state.store(IDLE, Ordering::SeqCst);
        let lane = &mut self.lanes[i];
        if let Some(mut c) = lane.conn.take() {
            account_io(&self.shared.counters, &c, &mut lane.io_seen);
            c.hand_over(&mut lane.carry);
            // The cluster's addresses as the connection last heard them
            // (an `INFO` after the connect announces nodes that joined).
            if !c.learned().is_empty() {
                lane.learned.clear();
                lane.learned.extend_from_slice(c.learned());
            }
        }
        ls.carrying
            .store(!lane.carry.open.is_empty(), Ordering::SeqCst);
        lane.reconnect.broke(
            &self.shared.cfg.reconnect_backoff,
            Instant::now(),
            fastrand::u64(..),
        );
    }

    /// Reserves and works jobs on lane `i` while it yields them. Holds one
    /// `max_jobs` ticket on entry, for the first reserve.
    fn serve(&mut self, i: usize) -> After {
        let sh = &*self.shared;
        let lane = self.thread * self.lanes.len() + i;
        let ls = &sh.lanes[lane];
        let Lane {
            server: index,
            conn: slot,
            reconnect,
            sched,
            io_seen,
            pipe,
            ..
        } = &mut self.lanes[i];
        let server = sh.cfg.servers[*index].as_str();
        let mut turn = Turn {
            sh,
            ls,
            server,
            index: *index,
            reconnect,
            sched,
            io_seen,
            slice: sh.cfg.reserve_secs(),
            tubes: &sh.cfg.tubes,
            handler: &*self.handler,
            body: &mut self.body,
            headers: &mut self.headers,
            too_big: None,
        };
        if sh.cfg.prefetch > 1 {
            return serve_window(&mut turn, slot, pipe, lane);
        }
        let Some(conn) = slot.as_mut() else {
            sh.give_ticket();
            return After::Broken;
        };
        if let Err(e) = turn.send_reserve(conn) {
            sh.give_ticket();
            return failed(sh, server, None, &e);
        }
        loop {
            let id = match turn.reserve(conn) {
                ControlFlow::Continue(id) => id,
                ControlFlow::Break(after) => {
                    if matches!(after, After::Stop) {
                        // Closing returns any job the server hands out meanwhile.
                        *slot = None;
                    }
                    return after;
                }
            };
            let outcome = match turn.work(conn, id) {
                ControlFlow::Continue(outcome) => outcome,
                ControlFlow::Break(after) => return after,
            };
            if let ControlFlow::Break(after) = turn.settle(conn, id, outcome) {
                return after;
            }
        }
    }
}

/// [`Lanes::serve`] with prefetch: the lane's link moves into its window
/// (made on the first turn, and registered for a stop to empty) for the
/// turn, and back after.
fn serve_window<L: Link + Send + 'static>(
    turn: &mut Turn<'_>,
    slot: &mut Option<L>,
    pipe: &mut Option<Arc<Mutex<Pipe<L>>>>,
    lane: usize,
) -> After {
    let (sh, ls) = (turn.sh, turn.ls);
    // Each reserve of the window takes its own ticket.
    sh.give_ticket();
    let Some(conn) = slot.take() else {
        return After::Broken;
    };
    let pipe = pipe
        .get_or_insert_with(|| {
            let p = Arc::new(Mutex::new(Pipe::new(turn.index, lane, sh.cfg.prefetch)));
            let keep: Arc<dyn Keep> = p.clone();
            *ls.keeper.lock().unwrap_or_else(|e| e.into_inner()) = Some(keep);
            p
        })
        .clone();
    pipe.lock().unwrap_or_else(|e| e.into_inner()).link = Some(conn);
    let after = turn.window(&pipe);
    *slot = pipe.lock().unwrap_or_else(|e| e.into_inner()).link.take();
    after
}

/// Counts the carried settles resolved since the last call.
fn count_carried(sh: &Shared, server: &str, carry: &mut Carry) {
    for (id, settle, confirmed) in carry.resolved.drain(..) {
        count_resolved(sh, server, id, settle, confirmed);
    }
}
