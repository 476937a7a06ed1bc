//! The queue itself: tubes, jobs and connections, and the moves of a job
//! between ready, delayed, reserved and buried with beanstalkd's semantics.
//! Every method runs under the server's lock. The commands are in `commands`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use taskq_proto::server::encode_reply_head;
use taskq_proto::Reply;

use super::config::Defects;
use super::counters::Stats;
use super::ledger::Book;

/// Jobs with a priority below this count as urgent.
const URGENT: u32 = 1024;
/// A waiting reserve gets `DEADLINE_SOON` this long before a held job's TTR runs out.
const SAFETY_MARGIN: Duration = Duration::from_secs(1);

pub(crate) type Name = Arc<str>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JobState {
    Ready,
    Delayed { until: Instant },
    Reserved { by: u64, until: Instant },
    Buried { seq: u64 },
}

#[derive(Debug)]
pub(crate) struct Job {
    pub(crate) id: u64,
    pub(crate) tube: Name,
    pub(crate) pri: u32,
    pub(crate) delay: u32,
    pub(crate) ttr: u32,
    pub(crate) body: Box<[u8]>,
    pub(crate) state: JobState,
    pub(crate) created: Instant,
    pub(crate) reserves: u64,
    pub(crate) timeouts: u64,
    pub(crate) releases: u64,
    pub(crate) buries: u64,
    pub(crate) kicks: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Tube {
    pub(crate) ready: BTreeSet<(u32, u64)>,
    pub(crate) delayed: BTreeSet<(Instant, u64)>,
    pub(crate) buried: BTreeMap<u64, u64>,
    pub(crate) reserved: u64,
    pub(crate) urgent: u64,
    pub(crate) jobs: u64,
    pub(crate) total_jobs: u64,
    pub(crate) using: u64,
    pub(crate) watching: u64,
    pub(crate) waiting: u64,
    pub(crate) cmd_delete: u64,
    pub(crate) cmd_pause: u64,
    /// Pause length in seconds and when it ends.
    pub(crate) pause: Option<(u32, Instant)>,
}

#[derive(Debug)]
pub(crate) struct ConnState {
    pub(crate) using: Name,
    pub(crate) watching: Vec<Name>,
    pub(crate) reserved: Vec<u64>,
    pub(crate) producer: bool,
    pub(crate) worker: bool,
    pub(crate) waiting: bool,
}

/// What a command asks of its connection after it ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The reply is in the output buffer.
    Replied,
    /// A put was inserted; its reply is in the buffer. Acknowledge the id once it is sent.
    Inserted(u64),
    /// A reserve found nothing yet: wait until the deadline (`None`: forever).
    Wait(Option<Instant>),
    /// `quit`: close the connection.
    Quit,
}

pub(crate) struct State {
    pub(crate) next_id: u64,
    pub(crate) jobs: HashMap<u64, Job>,
    pub(crate) tubes: HashMap<Name, Tube>,
    /// Tube names in creation order, removed by swapping with the last, as beanstalkd lists them.
    pub(crate) tube_order: Vec<Name>,
    pub(crate) delayed: BTreeSet<(Instant, u64)>,
    pub(crate) leases: BTreeSet<(Instant, u64)>,
    pub(crate) conns: HashMap<u64, ConnState>,
    pub(crate) bury_seq: u64,
    pub(crate) stats: Stats,
    pub(crate) max_job_size: usize,
    pub(crate) draining: bool,
    pub(crate) defects: Defects,
    pub(crate) default_tube: Name,
    pub(crate) book: Book,
    pub(crate) started: Instant,
    pub(crate) server_id: u64,
}

impl State {
    pub(crate) fn new(max_job_size: usize, defects: Defects) -> State {
        let default_tube: Name = Arc::from("default");
        let mut s = State {
            next_id: 1,
            jobs: HashMap::new(),
            tubes: HashMap::new(),
            tube_order: Vec::new(),
            delayed: BTreeSet::new(),
            leases: BTreeSet::new(),
            conns: HashMap::new(),
            bury_seq: 0,
            stats: Stats::default(),
            max_job_size,
            draining: false,
            defects,
            default_tube: default_tube.clone(),
            book: Book::default(),
            started: Instant::now(),
            server_id: fastrand::u64(..),
        };
        s.tube_mut(&default_tube);
        s
    }

    /// Finds or makes a tube; returns its shared name.
    pub(crate) fn tube_mut(&mut self, name: &str) -> Name {
        if let Some((k, _)) = self.tubes.get_key_value(name) {
            return k.clone();
        }
        let k: Name = Arc::from(name);
        self.tubes.insert(k.clone(), Tube::default());
        self.tube_order.push(k.clone());
        k
    }

    pub(crate) fn tube(&mut self, name: &Name) -> &mut Tube {
        self.tubes.entry(name.clone()).or_default()
    }

    /// Frees a tube nothing refers to any more (the default tube lives forever).
    pub(crate) fn gc_tube(&mut self, name: &Name) {
        if **name == *self.default_tube {
            return;
        }
        if let Some(t) = self.tubes.get(name) {
            if t.using == 0 && t.watching == 0 && t.jobs == 0 {
                self.tubes.remove(name);
                if let Some(i) = self.tube_order.iter().position(|n| n == name) {
                    self.tube_order.swap_remove(i);
                }
            }
        }
    }

    pub(crate) fn open(&mut self, conn: u64, peer: SocketAddr) {
        let d = self.default_tube.clone();
        let t = self.tube(&d);
        t.using += 1;
        t.watching += 1;
        self.conns.insert(
            conn,
            ConnState {
                using: d.clone(),
                watching: vec![d],
                reserved: Vec::new(),
                producer: false,
                worker: false,
                waiting: false,
            },
        );
        self.stats.total_connections += 1;
        self.book.open(conn, peer);
    }

    /// The connection closed: its reserved jobs go back to ready at once.
    pub(crate) fn close(&mut self, conn: u64) {
        self.set_waiting(conn, false);
        let Some(c) = self.conns.remove(&conn) else {
            return;
        };
        for id in c.reserved {
            self.book.return_on_close(conn, id);
            self.unreserve(id);
            self.make_ready(id);
        }
        let t = self.tube(&c.using);
        t.using -= 1;
        self.gc_tube(&c.using);
        for w in &c.watching {
            self.tube(w).watching -= 1;
            self.gc_tube(w);
        }
        self.book.close(conn);
    }

    /// Moves time forward: delayed jobs become ready, leases run out, pauses end.
    /// Returns true when a job became ready.
    pub(crate) fn tick(&mut self, now: Instant) -> bool {
        let mut woke = false;
        while let Some(&(until, id)) = self.delayed.first() {
            if until > now {
                break;
            }
            self.delayed.pop_first();
            let tube = self.jobs[&id].tube.clone();
            self.tube(&tube).delayed.remove(&(until, id));
            self.make_ready(id);
            woke = true;
        }
        while let Some(&(until, id)) = self.leases.first() {
            if until > now {
                break;
            }
            let JobState::Reserved { by, .. } = self.jobs[&id].state else {
                self.leases.pop_first();
                continue;
            };
            self.unreserve(id);
            if let Some(c) = self.conns.get_mut(&by) {
                c.reserved.retain(|&j| j != id);
            }
            self.stats.job_timeouts += 1;
            if let Some(j) = self.jobs.get_mut(&id) {
                j.timeouts += 1;
            }
            self.book.expire(by, id);
            self.make_ready(id);
            woke = true;
        }
        for t in self.tubes.values_mut() {
            if let Some((_, until)) = t.pause {
                if until <= now {
                    t.pause = None;
                    woke = true;
                }
            }
        }
        woke
    }

    /// When the next timed event (a delay, a lease, a pause) falls due.
    pub(crate) fn next_event(&self) -> Option<Instant> {
        let d = self.delayed.first().map(|e| e.0);
        let l = self.leases.first().map(|e| e.0);
        let p = self
            .tubes
            .values()
            .filter_map(|t| t.pause.map(|p| p.1))
            .min();
        [d, l, p].into_iter().flatten().min()
    }

    /// Takes a job out of the reserved state (it must be reserved).
    pub(crate) fn unreserve(&mut self, id: u64) {
        let j = &self.jobs[&id];
        if let JobState::Reserved { until, .. } = j.state {
            self.leases.remove(&(until, id));
            let tube = j.tube.clone();
            self.tube(&tube).reserved -= 1;
            self.stats.reserved -= 1;
        }
    }

    pub(crate) fn make_ready(&mut self, id: u64) {
        let j = self.jobs.get_mut(&id).expect("job exists");
        j.state = JobState::Ready;
        let (pri, tube) = (j.pri, j.tube.clone());
        let t = self.tube(&tube);
        t.ready.insert((pri, id));
        if pri < URGENT {
            t.urgent += 1;
        }
    }

    /// Takes a job out of whatever waiting state it is in (ready, delayed, buried).
    pub(crate) fn unqueue(&mut self, id: u64) {
        let j = &self.jobs[&id];
        let (pri, state, tube) = (j.pri, j.state, j.tube.clone());
        let t = self.tubes.get_mut(&tube).expect("job's tube exists");
        match state {
            JobState::Ready => {
                t.ready.remove(&(pri, id));
                if pri < URGENT {
                    t.urgent -= 1;
                }
            }
            JobState::Delayed { until } => {
                t.delayed.remove(&(until, id));
                self.delayed.remove(&(until, id));
            }
            JobState::Buried { seq } => {
                t.buried.remove(&seq);
            }
            JobState::Reserved { .. } => {}
        }
    }

    pub(crate) fn delay_job(&mut self, id: u64, until: Instant) {
        let j = self.jobs.get_mut(&id).expect("job exists");
        j.state = JobState::Delayed { until };
        let tube = j.tube.clone();
        self.tube(&tube).delayed.insert((until, id));
        self.delayed.insert((until, id));
    }

    pub(crate) fn bury_job(&mut self, id: u64) {
        self.bury_seq += 1;
        let seq = self.bury_seq;
        let j = self.jobs.get_mut(&id).expect("job exists");
        j.state = JobState::Buried { seq };
        j.buries += 1;
        let tube = j.tube.clone();
        self.tube(&tube).buried.insert(seq, id);
    }

    pub(crate) fn reserve_job(&mut self, conn: u64, id: u64, now: Instant) -> Reply<'_> {
        let j = self.jobs.get_mut(&id).expect("job exists");
        let until = now + Duration::from_secs(u64::from(j.ttr));
        j.state = JobState::Reserved { by: conn, until };
        j.reserves += 1;
        let tube = j.tube.clone();
        self.tube(&tube).reserved += 1;
        self.stats.reserved += 1;
        self.leases.insert((until, id));
        if let Some(c) = self.conns.get_mut(&conn) {
            c.reserved.push(id);
        }
        self.book.hand_out(conn, id, now, until);
        let j = &self.jobs[&id];
        Reply::Reserved { id, body: &j.body }
    }

    pub(crate) fn remove_job(&mut self, id: u64) -> Job {
        let j = self.jobs.remove(&id).expect("job exists");
        let t = self.tube(&j.tube);
        t.jobs -= 1;
        self.gc_tube(&j.tube);
        j
    }

    pub(crate) fn set_waiting(&mut self, conn: u64, waiting: bool) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        if c.waiting == waiting {
            return;
        }
        c.waiting = waiting;
        let watching = c.watching.clone();
        for w in &watching {
            let t = self.tube(w);
            if waiting {
                t.waiting += 1;
            } else {
                t.waiting -= 1;
            }
        }
        if waiting {
            self.stats.waiting += 1;
        } else {
            self.stats.waiting -= 1;
        }
    }

    /// The best ready job among the tubes this connection watches: lowest
    /// priority value, then lowest id; paused tubes are skipped.
    pub(crate) fn best_ready(&self, conn: u64) -> Option<u64> {
        let c = self.conns.get(&conn)?;
        c.watching
            .iter()
            .filter_map(|w| {
                let t = self.tubes.get(w)?;
                if t.pause.is_some() {
                    return None;
                }
                t.ready.first().copied()
            })
            .min()
            .map(|(_, id)| id)
    }

    /// When a waiting reserve of this connection must answer `DEADLINE_SOON`.
    pub(crate) fn deadline_soon_at(&self, conn: u64) -> Option<Instant> {
        let c = self.conns.get(&conn)?;
        c.reserved
            .iter()
            .filter_map(|id| match self.jobs.get(id)?.state {
                JobState::Reserved { until, .. } => Some(until),
                _ => None,
            })
            .min()
            .map(|until| until.checked_sub(SAFETY_MARGIN).unwrap_or(until))
    }

    pub(crate) fn deadline_soon(&self, conn: u64, now: Instant) -> bool {
        let Some(c) = self.conns.get(&conn) else {
            return false;
        };
        c.reserved
            .iter()
            .filter_map(|id| match self.jobs.get(id)?.state {
                JobState::Reserved { until, .. } => Some(until),
                _ => None,
            })
            .min()
            .is_some_and(|until| now + SAFETY_MARGIN >= until)
    }

    /// One attempt of a reserve: a job, `DEADLINE_SOON`, `TIMED_OUT`, or nothing yet.
    pub(crate) fn try_reserve(
        &mut self,
        conn: u64,
        now: Instant,
        deadline: Option<Instant>,
        out: &mut Vec<u8>,
    ) -> bool {
        self.tick(now);
        if let Some(id) = self.best_ready(conn) {
            self.set_waiting(conn, false);
            self.unqueue(id);
            let r = self.reserve_job(conn, id, now);
            push_reply(out, &r);
            return true;
        }
        let reply = if self.deadline_soon(conn, now) {
            Reply::DeadlineSoon
        } else if deadline.is_some_and(|d| d <= now) {
            Reply::TimedOut
        } else {
            self.set_waiting(conn, true);
            return false;
        };
        self.set_waiting(conn, false);
        push_reply(out, &reply);
        true
    }
}

/// Appends a whole reply to the output buffer.
pub(crate) fn push_reply(out: &mut Vec<u8>, reply: &Reply<'_>) {
    let mut head = [0u8; taskq_proto::MAX_LINE];
    // Every reply line the server builds fits in a line buffer.
    let n = encode_reply_head(reply, &mut head).unwrap_or(0);
    out.extend_from_slice(&head[..n]);
    if let Some(body) = taskq_proto::server::reply_body(reply) {
        out.extend_from_slice(body);
        out.extend_from_slice(b"\r\n");
    }
}
