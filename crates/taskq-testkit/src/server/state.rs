//! The queue itself: tubes, jobs and connections with beanstalkd's semantics.
//! Every method runs under the server's lock and writes its reply into the
//! connection's output buffer.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use taskq_proto::server::encode_reply_head;
use taskq_proto::{Command, CommandKind, Reply};

use super::ledger::Book;
use super::stats::Stats;
use super::Defects;

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
    fn tube_mut(&mut self, name: &str) -> Name {
        if let Some((k, _)) = self.tubes.get_key_value(name) {
            return k.clone();
        }
        let k: Name = Arc::from(name);
        self.tubes.insert(k.clone(), Tube::default());
        self.tube_order.push(k.clone());
        k
    }

    fn tube(&mut self, name: &Name) -> &mut Tube {
        self.tubes.entry(name.clone()).or_default()
    }

    /// Frees a tube nothing refers to any more (the default tube lives forever).
    fn gc_tube(&mut self, name: &Name) {
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
    fn unreserve(&mut self, id: u64) {
        let j = &self.jobs[&id];
        if let JobState::Reserved { until, .. } = j.state {
            self.leases.remove(&(until, id));
            let tube = j.tube.clone();
            self.tube(&tube).reserved -= 1;
            self.stats.reserved -= 1;
        }
    }

    fn make_ready(&mut self, id: u64) {
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
    fn unqueue(&mut self, id: u64) {
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

    fn delay_job(&mut self, id: u64, until: Instant) {
        let j = self.jobs.get_mut(&id).expect("job exists");
        j.state = JobState::Delayed { until };
        let tube = j.tube.clone();
        self.tube(&tube).delayed.insert((until, id));
        self.delayed.insert((until, id));
    }

    fn bury_job(&mut self, id: u64) {
        self.bury_seq += 1;
        let seq = self.bury_seq;
        let j = self.jobs.get_mut(&id).expect("job exists");
        j.state = JobState::Buried { seq };
        j.buries += 1;
        let tube = j.tube.clone();
        self.tube(&tube).buried.insert(seq, id);
    }

    fn reserve_job(&mut self, conn: u64, id: u64, now: Instant) -> Reply<'_> {
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

    fn remove_job(&mut self, id: u64) -> Job {
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
    fn best_ready(&self, conn: u64) -> Option<u64> {
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

    fn deadline_soon(&self, conn: u64, now: Instant) -> bool {
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

    /// Carries out one command for `conn` and writes its reply into `out`.
    pub(crate) fn execute(
        &mut self,
        conn: u64,
        cmd: &Command<'_>,
        now: Instant,
        out: &mut Vec<u8>,
    ) -> Outcome {
        self.tick(now);
        self.stats.count(cmd);
        let reply = match *cmd {
            Command::Put {
                pri,
                delay,
                ttr,
                body,
            } => return self.put(conn, pri, delay, ttr, body, now, out),
            Command::Use { tube } => {
                let name = self.tube_mut(tube);
                let c = self.conns.get_mut(&conn).expect("open connection");
                let old = std::mem::replace(&mut c.using, name.clone());
                self.tube(&name).using += 1;
                self.tube(&old).using -= 1;
                self.gc_tube(&old);
                push_reply(out, &Reply::Using { tube: &name });
                return Outcome::Replied;
            }
            Command::Reserve => return self.reserve(conn, None, now, out),
            Command::ReserveWithTimeout { timeout } => {
                let d = now + Duration::from_secs(u64::from(timeout));
                return self.reserve(conn, Some(d), now, out);
            }
            Command::ReserveJob { id } => {
                let held_elsewhere = self.defects.hand_out_held_jobs
                    && matches!(self.jobs.get(&id).map(|j| j.state),
                        Some(JobState::Reserved { by, .. }) if by != conn);
                match self.jobs.get(&id).map(|j| j.state) {
                    Some(JobState::Reserved { by, .. }) if held_elsewhere => {
                        // A deliberate defect: hand a held job to a second connection.
                        if let Some(c) = self.conns.get_mut(&by) {
                            c.reserved.retain(|&j| j != id);
                        }
                        self.unreserve(id);
                        self.conn(conn).worker = true;
                        let r = self.reserve_job(conn, id, now);
                        push_reply(out, &r);
                        return Outcome::Replied;
                    }
                    None | Some(JobState::Reserved { .. }) => Reply::NotFound,
                    Some(_) => {
                        self.conn(conn).worker = true;
                        self.unqueue(id);
                        let r = self.reserve_job(conn, id, now);
                        push_reply(out, &r);
                        return Outcome::Replied;
                    }
                }
            }
            Command::Delete { id } => self.delete(conn, id, now),
            Command::Release { id, pri, delay } => {
                if !self.held_by(conn, id) {
                    self.book.release(conn, id, false);
                    Reply::NotFound
                } else {
                    self.unreserve(id);
                    self.conn(conn).reserved.retain(|&j| j != id);
                    self.book.release(conn, id, true);
                    if self.defects.lose_released_jobs {
                        // A deliberate defect: the released job vanishes.
                        let _ = self.remove_job(id);
                        push_reply(out, &Reply::Released);
                        return Outcome::Replied;
                    }
                    let j = self.jobs.get_mut(&id).expect("held job exists");
                    j.pri = pri;
                    j.delay = delay;
                    j.releases += 1;
                    if delay > 0 {
                        self.delay_job(id, now + Duration::from_secs(u64::from(delay)));
                    } else {
                        self.make_ready(id);
                    }
                    Reply::Released
                }
            }
            Command::Bury { id, pri } => {
                if !self.held_by(conn, id) {
                    Reply::NotFound
                } else {
                    self.unreserve(id);
                    self.conn(conn).reserved.retain(|&j| j != id);
                    self.book.bury(conn, id);
                    self.jobs.get_mut(&id).expect("held job exists").pri = pri;
                    self.bury_job(id);
                    Reply::Buried
                }
            }
            Command::Touch { id } => {
                if !self.held_by(conn, id) {
                    self.book.touch(conn, id, None);
                    Reply::NotFound
                } else {
                    self.unreserve(id);
                    let j = self.jobs.get_mut(&id).expect("held job exists");
                    let until = now + Duration::from_secs(u64::from(j.ttr));
                    j.state = JobState::Reserved { by: conn, until };
                    let tube = j.tube.clone();
                    self.tube(&tube).reserved += 1;
                    self.stats.reserved += 1;
                    self.leases.insert((until, id));
                    self.book.touch(conn, id, Some(until));
                    Reply::Touched
                }
            }
            Command::Watch { tube } => {
                let name = self.tube_mut(tube);
                let c = self.conns.get_mut(&conn).expect("open connection");
                if !c.watching.contains(&name) {
                    c.watching.push(name.clone());
                    let waiting = c.waiting;
                    let t = self.tube(&name);
                    t.watching += 1;
                    t.waiting += u64::from(waiting);
                }
                let count = self.conns[&conn].watching.len() as u64;
                Reply::Watching { count }
            }
            Command::Ignore { tube } => {
                let c = self.conns.get_mut(&conn).expect("open connection");
                match c.watching.iter().position(|w| &**w == tube) {
                    Some(_) if c.watching.len() < 2 => Reply::NotIgnored,
                    Some(i) => {
                        let name = c.watching.swap_remove(i);
                        let count = c.watching.len() as u64;
                        self.tube(&name).watching -= 1;
                        self.gc_tube(&name);
                        Reply::Watching { count }
                    }
                    None => Reply::Watching {
                        count: c.watching.len() as u64,
                    },
                }
            }
            Command::Peek { id } => match self.jobs.get(&id) {
                Some(j) => {
                    push_reply(out, &Reply::Found { id, body: &j.body });
                    return Outcome::Replied;
                }
                None => Reply::NotFound,
            },
            Command::PeekReady | Command::PeekDelayed | Command::PeekBuried => {
                let t = &self.tubes[&self.conns[&conn].using];
                let id = match cmd {
                    Command::PeekReady => t.ready.first().map(|e| e.1),
                    Command::PeekDelayed => t.delayed.first().map(|e| e.1),
                    _ => t.buried.first_key_value().map(|e| *e.1),
                };
                match id {
                    Some(id) => {
                        push_reply(
                            out,
                            &Reply::Found {
                                id,
                                body: &self.jobs[&id].body,
                            },
                        );
                        return Outcome::Replied;
                    }
                    None => Reply::NotFound,
                }
            }
            Command::Kick { bound } => {
                let using = self.conns[&conn].using.clone();
                let count = self.kick(&using, bound);
                Reply::Kicked { count }
            }
            Command::KickJob { id } => match self.jobs.get(&id).map(|j| j.state) {
                Some(JobState::Buried { .. } | JobState::Delayed { .. }) => {
                    self.unqueue(id);
                    self.jobs.get_mut(&id).expect("job exists").kicks += 1;
                    self.make_ready(id);
                    Reply::KickedJob
                }
                _ => Reply::NotFound,
            },
            Command::Stats => {
                let yaml = super::stats::server_yaml(self, now);
                push_reply(
                    out,
                    &Reply::Ok {
                        yaml: yaml.as_bytes(),
                    },
                );
                return Outcome::Replied;
            }
            Command::StatsJob { id } => match self.jobs.get(&id) {
                Some(j) => {
                    let yaml = super::stats::job_yaml(j, now);
                    push_reply(
                        out,
                        &Reply::Ok {
                            yaml: yaml.as_bytes(),
                        },
                    );
                    return Outcome::Replied;
                }
                None => Reply::NotFound,
            },
            Command::StatsTube { tube } => match self.tubes.get_key_value(tube) {
                Some((name, t)) => {
                    let yaml = super::stats::tube_yaml(name, t, now);
                    push_reply(
                        out,
                        &Reply::Ok {
                            yaml: yaml.as_bytes(),
                        },
                    );
                    return Outcome::Replied;
                }
                None => Reply::NotFound,
            },
            Command::ListTubes => {
                let yaml = super::stats::list_yaml(&self.tube_order);
                push_reply(
                    out,
                    &Reply::Ok {
                        yaml: yaml.as_bytes(),
                    },
                );
                return Outcome::Replied;
            }
            Command::ListTubesWatched => {
                let yaml = super::stats::list_yaml(&self.conns[&conn].watching);
                push_reply(
                    out,
                    &Reply::Ok {
                        yaml: yaml.as_bytes(),
                    },
                );
                return Outcome::Replied;
            }
            Command::ListTubeUsed => {
                push_reply(
                    out,
                    &Reply::Using {
                        tube: &self.conns[&conn].using,
                    },
                );
                return Outcome::Replied;
            }
            Command::PauseTube { tube, delay } => match self.tubes.get_mut(tube) {
                Some(t) => {
                    // beanstalkd pauses for at least a moment, so that waiters wake.
                    let until = if delay == 0 {
                        now + Duration::from_nanos(1)
                    } else {
                        now + Duration::from_secs(u64::from(delay))
                    };
                    t.pause = Some((delay, until));
                    t.cmd_pause += 1;
                    Reply::Paused
                }
                None => Reply::NotFound,
            },
            Command::Quit => return Outcome::Quit,
            _ => Reply::UnknownCommand,
        };
        push_reply(out, &reply);
        Outcome::Replied
    }

    fn conn(&mut self, conn: u64) -> &mut ConnState {
        self.conns.get_mut(&conn).expect("open connection")
    }

    fn held_by(&self, conn: u64, id: u64) -> bool {
        matches!(self.jobs.get(&id).map(|j| j.state), Some(JobState::Reserved { by, .. }) if by == conn)
    }

    #[allow(clippy::too_many_arguments)]
    fn put(
        &mut self,
        conn: u64,
        pri: u32,
        delay: u32,
        ttr: u32,
        body: &[u8],
        now: Instant,
        out: &mut Vec<u8>,
    ) -> Outcome {
        self.conn(conn).producer = true;
        // beanstalkd spends an id on every well-formed put line.
        let id = self.next_id;
        self.next_id += 1;
        if self.draining {
            push_reply(out, &Reply::Draining);
            return Outcome::Replied;
        }
        let tube = self.conns[&conn].using.clone();
        self.jobs.insert(
            id,
            Job {
                id,
                tube: tube.clone(),
                pri,
                delay,
                ttr: ttr.max(1),
                body: body.into(),
                state: JobState::Ready,
                created: now,
                reserves: 0,
                timeouts: 0,
                releases: 0,
                buries: 0,
                kicks: 0,
            },
        );
        let t = self.tube(&tube);
        t.jobs += 1;
        t.total_jobs += 1;
        self.stats.total_jobs += 1;
        if delay > 0 {
            self.delay_job(id, now + Duration::from_secs(u64::from(delay)));
        } else {
            self.make_ready(id);
        }
        self.book.put(conn, id, now);
        push_reply(out, &Reply::Inserted { id });
        Outcome::Inserted(id)
    }

    /// A command beanstalkd counts although it refuses it (a put with good
    /// numbers but a body too big, trailing bytes or no CRLF; a pause-tube of
    /// an impossible name). For a missing CRLF it had already marked a producer
    /// and spent an id.
    pub(crate) fn refused(&mut self, conn: u64, kind: CommandKind, spent_id: bool) {
        self.stats.count_kind(kind);
        if spent_id {
            self.conn(conn).producer = true;
            self.next_id += 1;
        }
    }

    /// Counts a `reserve-with-timeout` whose negative timeout made it a plain reserve.
    pub(crate) fn count_as_reserve_with_timeout(&mut self) {
        self.stats.cmd[super::stats::CMD_RESERVE] -= 1;
        self.stats.cmd[super::stats::CMD_RESERVE_WITH_TIMEOUT] += 1;
    }

    fn reserve(
        &mut self,
        conn: u64,
        deadline: Option<Instant>,
        now: Instant,
        out: &mut Vec<u8>,
    ) -> Outcome {
        self.conn(conn).worker = true;
        if self.try_reserve(conn, now, deadline, out) {
            Outcome::Replied
        } else {
            Outcome::Wait(deadline)
        }
    }

    fn delete(&mut self, conn: u64, id: u64, now: Instant) -> Reply<'static> {
        let found = match self.jobs.get(&id).map(|j| j.state) {
            Some(JobState::Reserved { by, .. }) if by == conn => {
                self.unreserve(id);
                self.conn(conn).reserved.retain(|&j| j != id);
                true
            }
            Some(JobState::Reserved { .. }) | None => false,
            Some(_) => {
                self.unqueue(id);
                true
            }
        };
        self.book.delete(conn, id, found, now);
        if !found {
            return Reply::NotFound;
        }
        let j = self.remove_job(id);
        if let Some(t) = self.tubes.get_mut(&j.tube) {
            t.cmd_delete += 1;
        }
        Reply::Deleted
    }

    /// Kicks up to `bound` jobs of a tube: buried ones if it has any, else delayed ones.
    fn kick(&mut self, tube: &Name, bound: u32) -> u64 {
        let mut n = 0;
        while n < u64::from(bound) {
            let t = &self.tubes[tube];
            let id = if !t.buried.is_empty() {
                t.buried.first_key_value().map(|e| *e.1)
            } else {
                t.delayed.first().map(|e| e.1)
            };
            let Some(id) = id else { break };
            let was_buried = matches!(self.jobs[&id].state, JobState::Buried { .. });
            self.unqueue(id);
            self.jobs.get_mut(&id).expect("job exists").kicks += 1;
            self.make_ready(id);
            n += 1;
            // Only one kind per kick: stop when the buried ones run out.
            if was_buried && self.tubes[tube].buried.is_empty() {
                break;
            }
        }
        n
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
