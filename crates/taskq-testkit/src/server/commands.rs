//! The commands: each one run against the queue state under the server's
//! lock, its reply written into the connection's output buffer.

use std::time::{Duration, Instant};

use taskq_proto::{Command, CommandKind, Reply};

use super::counters::{CMD_RESERVE, CMD_RESERVE_WITH_TIMEOUT};
use super::state::{push_reply, ConnState, Job, JobState, Name, Outcome, State};

impl State {
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
                return push_yaml(out, &super::stats::server_yaml(self, now));
            }
            Command::StatsJob { id } => match self.jobs.get(&id) {
                Some(j) => {
                    return push_yaml(out, &super::stats::job_yaml(j, now));
                }
                None => Reply::NotFound,
            },
            Command::StatsTube { tube } => match self.tubes.get_key_value(tube) {
                Some((name, t)) => {
                    return push_yaml(out, &super::stats::tube_yaml(name, t, now));
                }
                None => Reply::NotFound,
            },
            Command::ListTubes => {
                return push_yaml(out, &super::stats::list_yaml(&self.tube_order));
            }
            Command::ListTubesWatched => {
                return push_yaml(out, &super::stats::list_yaml(&self.conns[&conn].watching));
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
        self.stats.cmd[CMD_RESERVE] -= 1;
        self.stats.cmd[CMD_RESERVE_WITH_TIMEOUT] += 1;
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

/// Answers `OK` with a YAML document.
fn push_yaml(out: &mut Vec<u8>, yaml: &str) -> Outcome {
    push_reply(
        out,
        &Reply::Ok {
            yaml: yaml.as_bytes(),
        },
    );
    Outcome::Replied
}
