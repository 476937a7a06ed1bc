//! The ledger: the server's own record of every job and every connection, kept
//! apart from the queue state so that a fault in the state is visible in it.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::Instant;

/// What one connection did, as the server saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnCounts {
    /// The client's address.
    pub peer: SocketAddr,
    /// Requests read (commands, including malformed ones).
    pub requests: u64,
    /// Jobs inserted by a `put` on this connection.
    pub put: u64,
    /// Jobs handed out to this connection (`reserve*`).
    pub reserved: u64,
    /// `delete` commands received, whatever their answer (beanstalkd's `cmd-delete`).
    pub cmd_delete: u64,
    /// `delete` answered `DELETED`.
    pub deleted: u64,
    /// `delete` answered `NOT_FOUND`.
    pub delete_not_found: u64,
    /// `release` answered `RELEASED` (or `BURIED`).
    pub released: u64,
    /// `release` answered `NOT_FOUND`.
    pub release_not_found: u64,
    /// `bury` answered `BURIED`.
    pub buried: u64,
    /// `touch` answered `TOUCHED`.
    pub touched: u64,
    /// `touch` answered `NOT_FOUND`.
    pub touch_not_found: u64,
    /// Leases held by this connection that ran out (TTR) and went back to ready.
    pub expired: u64,
    /// Jobs this connection held when it closed, put back to ready.
    pub returned_on_close: u64,
    /// True once the connection has closed.
    pub closed: bool,
}

impl ConnCounts {
    fn new(peer: SocketAddr) -> ConnCounts {
        ConnCounts {
            peer,
            requests: 0,
            put: 0,
            reserved: 0,
            cmd_delete: 0,
            deleted: 0,
            delete_not_found: 0,
            released: 0,
            release_not_found: 0,
            buried: 0,
            touched: 0,
            touch_not_found: 0,
            expired: 0,
            returned_on_close: 0,
            closed: false,
        }
    }

    fn add(&mut self, o: &ConnCounts) {
        self.requests += o.requests;
        self.put += o.put;
        self.reserved += o.reserved;
        self.cmd_delete += o.cmd_delete;
        self.deleted += o.deleted;
        self.delete_not_found += o.delete_not_found;
        self.released += o.released;
        self.release_not_found += o.release_not_found;
        self.buried += o.buried;
        self.touched += o.touched;
        self.touch_not_found += o.touch_not_found;
        self.expired += o.expired;
        self.returned_on_close += o.returned_on_close;
    }
}

/// What [`Ledger::check`](super::Ledger::check) found.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct LedgerReport {
    /// Jobs inserted.
    pub added: u64,
    /// Jobs whose `INSERTED` reply was written to the socket in full.
    pub acknowledged: u64,
    /// Jobs deleted (done).
    pub done: u64,
    /// Jobs acknowledged as inserted and never deleted: after a drain, must be empty.
    pub lost: Vec<u64>,
    /// Jobs inserted without a complete acknowledgement and never deleted.
    pub unacknowledged_left: Vec<u64>,
    /// Jobs deleted that the ledger never saw put: must be empty.
    pub unexpected: Vec<u64>,
    /// Jobs handed to a connection while another still held them: must be empty.
    pub double_held: Vec<u64>,
    /// Jobs handed out more than once (a lease ran out, was released, or its connection closed).
    pub handed_out_again: u64,
    /// Leases that ran out (TTR).
    pub expired: u64,
    /// Every connection's counts, by connection id (accept order, from 1).
    pub connections: BTreeMap<u64, ConnCounts>,
    /// The random fault seed in force, if any, to replay a failing run.
    pub seed: Option<u64>,
}

impl LedgerReport {
    /// True when nothing was lost, nothing unexpected was done and no job was held twice.
    pub fn is_clean(&self) -> bool {
        self.lost.is_empty() && self.unexpected.is_empty() && self.double_held.is_empty()
    }

    /// The counts of all connections added up (`peer` is the first connection's).
    pub fn totals(&self) -> Option<ConnCounts> {
        let mut it = self.connections.values();
        let mut t = *it.next()?;
        for c in it {
            t.add(c);
        }
        Some(t)
    }
}

impl std::fmt::Display for LedgerReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "added {} (acknowledged {}), done {}, lost {}, unacknowledged left {}, unexpected {}, \
             double-held {}, handed out again {}, expired {}, connections {}",
            self.added,
            self.acknowledged,
            self.done,
            self.lost.len(),
            self.unacknowledged_left.len(),
            self.unexpected.len(),
            self.double_held.len(),
            self.handed_out_again,
            self.expired,
            self.connections.len()
        )?;
        if let Some(seed) = self.seed {
            write!(f, ", fault seed {seed}")?;
        }
        Ok(())
    }
}

/// One job's story, as the ledger tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobHistory {
    /// The connection that put it.
    pub put_by: u64,
    /// When it was put.
    pub put_at: Instant,
    /// True once its `INSERTED` reply was written in full.
    pub acknowledged: bool,
    /// The connection holding it now and until when.
    pub holder: Option<(u64, Instant)>,
    /// How many times it was handed out.
    pub handed_out: u64,
    /// Who deleted it, and when.
    pub deleted: Option<(u64, Instant)>,
}

#[derive(Debug)]
struct JobRecord {
    put_by: u64,
    put_at: Instant,
    acknowledged: bool,
    /// The connection holding the job and until when, by the ledger's own account.
    holder: Option<(u64, Instant)>,
    handed_out: u64,
    deleted: Option<(u64, Instant)>,
}

/// The record the server keeps; lives under the server's lock.
#[derive(Debug, Default)]
pub(crate) struct Book {
    jobs: HashMap<u64, JobRecord>,
    conns: BTreeMap<u64, ConnCounts>,
    unexpected: Vec<u64>,
    double_held: Vec<u64>,
    expired: u64,
}

impl Book {
    pub(crate) fn open(&mut self, conn: u64, peer: SocketAddr) {
        self.conns.insert(conn, ConnCounts::new(peer));
    }

    pub(crate) fn conn(&mut self, conn: u64) -> &mut ConnCounts {
        self.conns
            .entry(conn)
            .or_insert_with(|| ConnCounts::new(SocketAddr::from(([0, 0, 0, 0], 0))))
    }

    pub(crate) fn close(&mut self, conn: u64) {
        self.conn(conn).closed = true;
    }

    pub(crate) fn put(&mut self, conn: u64, id: u64, now: Instant) {
        self.conn(conn).put += 1;
        self.jobs.insert(
            id,
            JobRecord {
                put_by: conn,
                put_at: now,
                acknowledged: false,
                holder: None,
                handed_out: 0,
                deleted: None,
            },
        );
    }

    pub(crate) fn acknowledge(&mut self, id: u64, yes: bool) {
        if let Some(j) = self.jobs.get_mut(&id) {
            j.acknowledged = yes;
        }
    }

    pub(crate) fn hand_out(&mut self, conn: u64, id: u64, now: Instant, until: Instant) {
        self.conn(conn).reserved += 1;
        if let Some(j) = self.jobs.get_mut(&id) {
            if let Some((other, held_until)) = j.holder {
                if other != conn && held_until > now {
                    self.double_held.push(id);
                }
            }
            j.holder = Some((conn, until));
            j.handed_out += 1;
        }
    }

    pub(crate) fn touch(&mut self, conn: u64, id: u64, until: Option<Instant>) {
        match until {
            Some(until) => {
                self.conn(conn).touched += 1;
                if let Some(j) = self.jobs.get_mut(&id) {
                    if let Some((c, _)) = j.holder {
                        if c == conn {
                            j.holder = Some((conn, until));
                        }
                    }
                }
            }
            None => self.conn(conn).touch_not_found += 1,
        }
    }

    fn let_go(&mut self, conn: u64, id: u64) {
        if let Some(j) = self.jobs.get_mut(&id) {
            if matches!(j.holder, Some((c, _)) if c == conn) {
                j.holder = None;
            }
        }
    }

    pub(crate) fn release(&mut self, conn: u64, id: u64, found: bool) {
        if found {
            self.conn(conn).released += 1;
            self.let_go(conn, id);
        } else {
            self.conn(conn).release_not_found += 1;
        }
    }

    pub(crate) fn bury(&mut self, conn: u64, id: u64) {
        self.conn(conn).buried += 1;
        self.let_go(conn, id);
    }

    pub(crate) fn expire(&mut self, conn: u64, id: u64) {
        self.conn(conn).expired += 1;
        self.expired += 1;
        self.let_go(conn, id);
    }

    pub(crate) fn return_on_close(&mut self, conn: u64, id: u64) {
        self.conn(conn).returned_on_close += 1;
        self.let_go(conn, id);
    }

    pub(crate) fn delete(&mut self, conn: u64, id: u64, found: bool, now: Instant) {
        let c = self.conn(conn);
        c.cmd_delete += 1;
        if !found {
            c.delete_not_found += 1;
            return;
        }
        c.deleted += 1;
        match self.jobs.get_mut(&id) {
            Some(j) => {
                j.holder = None;
                j.deleted = Some((conn, now));
            }
            None => self.unexpected.push(id),
        }
    }

    pub(crate) fn request(&mut self, conn: u64) {
        self.conn(conn).requests += 1;
    }

    /// One job's history, if the book saw it put.
    pub(crate) fn history(&self, id: u64) -> Option<JobHistory> {
        let j = self.jobs.get(&id)?;
        Some(JobHistory {
            put_by: j.put_by,
            put_at: j.put_at,
            acknowledged: j.acknowledged,
            holder: j.holder,
            handed_out: j.handed_out,
            deleted: j.deleted,
        })
    }

    /// The counts of one connection.
    pub(crate) fn connection(&self, id: u64) -> Option<ConnCounts> {
        self.conns.get(&id).copied()
    }

    pub(crate) fn report(&self, seed: Option<u64>) -> LedgerReport {
        let mut lost = Vec::new();
        let mut unack = Vec::new();
        let mut done = 0;
        let mut acknowledged = 0;
        let mut again = 0;
        for (&id, j) in &self.jobs {
            acknowledged += u64::from(j.acknowledged);
            again += j.handed_out.saturating_sub(1);
            match (j.deleted, j.acknowledged) {
                (Some(_), _) => done += 1,
                (None, true) => lost.push(id),
                (None, false) => unack.push(id),
            }
        }
        lost.sort_unstable();
        unack.sort_unstable();
        LedgerReport {
            added: self.jobs.len() as u64,
            acknowledged,
            done,
            lost,
            unacknowledged_left: unack,
            unexpected: self.unexpected.clone(),
            double_held: self.double_held.clone(),
            handed_out_again: again,
            expired: self.expired,
            connections: self.conns.clone(),
            seed,
        }
    }
}
