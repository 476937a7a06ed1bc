//! The JetStream engine: the worker's requests as pulls and acks on one NATS
//! connection to a cluster.
//!
//! - Reserves are pulls from the tube's durable consumer `taskq-T`: the asks
//!   queued for one write go out as one pull of that many messages, expiring
//!   with the reserve slice (a weighted turn or a prefetch refill pulls with
//!   `no_wait`). A pull ends after its batch, or with a status: 404/408
//!   (nothing now) answer the asks left empty; 409 (the consumer's leader
//!   changed, limits) and 503 (no responders: an election) answer them
//!   [`Took::Unavailable`], and the loop asks again after a pause.
//! - Settles are acks sent with a reply subject, so the server confirms each:
//!   delete `+ACK`, release `-NAK` with the delay, touch `+WPI`. A job is
//!   counted done only on its confirmation.
//! - Bury copies the job, headers and body as stored, to `taskq.T.buried` and
//!   acks the original only after the copy's PubAck: a crash between the two
//!   leaves the job twice, never nowhere. The copy's message id is derived
//!   from the original's sequence, so a repeated bury stores one copy.
//! - A job put with a delay carries `Taskq-Ready-At`; one delivered before
//!   then goes back at once with `-NAK` for the time left, answering its ask
//!   empty. A job the server held until its time (a message schedule,
//!   nats-server 2.12+: it comes with `Nats-Scheduler`) is checked the same
//!   way, but its first delivery is not an early one.
//!
//! Confirmations and deliveries arrive in whatever order the cluster sends
//! them, while the loop reads replies in the order it queued requests: what
//! comes early is kept (deliveries copied into reused buffers) until asked for.
//!
//! The lease is the consumer's ack wait, the same for every job of a tube;
//! it stands for beanstalkd's per-job TTR.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use taskq_proto::nats::schedule::SCHEDULER_HEADER;
use taskq_proto::nats::{
    AckKind, ConsumerSpec, Delivery, HeaderBlock, MsgSelect, NatsConfig, NatsConnection, NatsError,
    StreamSpec,
};
use taskq_proto::{Address, ConnectionError, Interrupter, IoCounts, Layout, READY_AT_HEADER};

use super::{Ask, Carry, Fault, JobLink, Link, Pool, Req, Settle, SettleReply, Took, Unconfirmed};
use crate::config::Config;
use crate::fair::Want;
use crate::job::JobInfo;

/// Deliveries one consumer may have unacked at once, across its workers:
/// room for many prefetching workers (the server's default is 1000).
const MAX_ACK_PENDING: i64 = 20_000;

/// A tube's names on the stream, and its consumer's lease.
#[derive(Debug)]
struct Tube {
    name: String,
    subject: String,
    buried: String,
    consumer: String,
    ack_wait: Duration,
}

/// A job this link holds.
#[derive(Debug)]
struct Held {
    seq: u64,
    tube: usize,
    /// Its ack subject.
    ack: Vec<u8>,
    delivered: u64,
    /// It carried a ready time and the client held it: its first delivery
    /// came early and went back.
    delayed: bool,
    /// When its lease started, at the earliest: the pull that brought it was
    /// sent, or the last touch (`+WPI`) was. The server's ack wait runs
    /// from a moment no earlier.
    leased: Instant,
}

/// A delivery read before its ask was.
#[derive(Debug)]
struct Early {
    subject: Vec<u8>,
    ack: Vec<u8>,
    body: Vec<u8>,
    delivered: u64,
    seq: u64,
    ready_at: Option<u64>,
    /// A message schedule published it (at its time).
    scheduled: bool,
    /// When the pull that brought it was sent.
    pulled: Instant,
}

impl Default for Early {
    fn default() -> Self {
        Early {
            subject: Vec::new(),
            ack: Vec::new(),
            body: Vec::new(),
            delivered: 0,
            seq: 0,
            ready_at: None,
            scheduled: false,
            pulled: Instant::now(),
        }
    }
}

/// The buffers deliveries are copied into, reused.
#[derive(Debug)]
struct Buffers {
    /// For subjects and ack subjects: of deliveries read ahead, of jobs held
    /// and of settles owed their confirmation (an ack subject is kept until
    /// then, to be sent again if it does not come). Made with the
    /// connection, as many as the loop can have out at once and each long
    /// enough for any of taskq's subjects, so that a peak costs no
    /// allocation later.
    names: Pool,
    /// For the bodies of deliveries read ahead; each grows to the largest
    /// body seen.
    bodies: Pool,
}

/// A settle queued or sent, owed its answer.
#[derive(Debug)]
enum Owed {
    /// The job was not held here: answered `NotFound` without asking.
    NotHeld,
    /// An ack sent with this confirmation token.
    Sent(u64, Unconfirmed),
}

/// How the pull under way ended, for the asks it did not answer with a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Nothing ready (404/408).
    Empty,
    /// The cluster could not serve it (409, 503, another status).
    Unavailable,
}

/// The pull the asks of one write became. One pull is under way at a time;
/// asks written while one is are pulled for when it is over.
#[derive(Debug, Clone, Copy)]
struct Pull {
    tube: usize,
    /// Asks it still owes an answer.
    left: u32,
    /// The asks do not wait (a weighted turn, a refill): an empty pull
    /// answers them [`Took::TurnEmpty`].
    no_wait: bool,
    /// More tubes to try, after this one, for the asks this pull leaves
    /// unanswered: every tube is tried without waiting before the last one
    /// waits (unless the asks do not wait at all).
    scan: usize,
    /// Sent to the server.
    sent: bool,
    /// When it was sent (or made, until then).
    at: Instant,
    ended: Option<End>,
}

impl Pull {
    /// This pull waits on the server: the asks wait and no tube is left to try.
    fn waits(&self) -> bool {
        !self.no_wait && self.scan == 0
    }
}

/// A worker thread's connection to a JetStream cluster.
#[derive(Debug)]
pub(crate) struct Nats {
    conn: NatsConnection,
    stream: String,
    tubes: Vec<Tube>,
    held: Vec<Held>,
    /// Reused buffers for what deliveries bring.
    bufs: Buffers,
    /// Asks queued for the next write, and where they pull from.
    asks: u32,
    ask_tube: usize,
    ask_no_wait: bool,
    ask_scan: usize,
    /// Pulls owed answers, oldest (the one under way) first.
    pulls: VecDeque<Pull>,
    /// Strict mode over several tubes: the tube the next blocking pull waits on.
    rotate: usize,
    /// Settles and touches queued or sent, in order: their confirmation
    /// tokens and what each confirmation means.
    settles: VecDeque<Owed>,
    /// For each touch: its token (0: the job was not held), the job, and
    /// when it was queued (its lease restarts then at the earliest, once
    /// confirmed).
    touches: VecDeque<(u64, u64, Instant)>,
    /// Settles whose confirmation did not come before the link failed.
    unanswered: Vec<Unconfirmed>,
    /// Of those, the ones the loop asked to send again on the next
    /// connection ([`Link::carry_settle`]), until [`Link::hand_over`].
    carried: Vec<Unconfirmed>,
    /// An empty waiting pull reads the consumers' info, to tell an idle
    /// queue from one whose jobs are still out (the worker exits when idle).
    check_idle: bool,
    /// Confirmations read before they were asked for.
    confirmed: Vec<u64>,
    early: VecDeque<Early>,
    /// The delivery handed out last, when it came early.
    current: Early,
    slice: Duration,
}

impl Nats {
    fn tube_of(&self, subject: &[u8]) -> Option<usize> {
        self.tubes
            .iter()
            .position(|t| t.subject.as_bytes() == subject)
    }

    fn held_index(&self, seq: u64) -> Option<usize> {
        self.held.iter().position(|h| h.seq == seq)
    }

    /// Reads until the confirmation `token` came, keeping what comes before.
    fn confirm(&mut self, token: u64) -> Result<(), Fault> {
        if let Some(i) = self.confirmed.iter().position(|&t| t == token) {
            self.confirmed.swap_remove(i);
            return Ok(());
        }
        loop {
            match self.conn.next_delivery() {
                Ok(Delivery::Confirmed(t)) if t == token => return Ok(()),
                Ok(Delivery::Confirmed(t)) => self.confirmed.push(t),
                Ok(d) => keep_early(d, self.pulls.front_mut(), &mut self.early, &mut self.bufs),
                Err(NatsError::NoResponders) => return Err(Fault::Unexpected("503")),
                Err(e) => return Err(Fault::Conn(conn_error(e))),
            }
        }
    }

    /// Takes a delivery as a held job; `None` when it is not ready yet (it
    /// went back with `-NAK` for the time left) or not one of our tubes.
    fn take(&mut self, e: &Early) -> Result<bool, Fault> {
        let (ack, seq, delivered, ready_at) = (&e.ack[..], e.seq, e.delivered, e.ready_at);
        let Some(tube) = self.tube_of(&e.subject) else {
            // A consumer filters on its tube's subject: this cannot happen.
            return Err(Fault::Unexpected("MSG"));
        };
        if let Some(at) = ready_at {
            let now = unix_ms();
            if at > now {
                let delay = Duration::from_millis(at - now);
                self.conn
                    .queue_ack(ack, AckKind::Nak { delay: Some(delay) }, false)
                    .and_then(|_| self.conn.flush())
                    .map_err(|e| Fault::Conn(conn_error(e)))?;
                return Ok(false);
            }
        }
        let buf = self.bufs.names.copy(ack);
        if let Some(i) = self.held_index(seq) {
            // Its lease ran out while held here and it came back to us.
            let old = std::mem::replace(&mut self.held[i].ack, buf);
            self.bufs.names.give(old);
            self.held[i].delivered = delivered;
            self.held[i].leased = e.pulled;
        } else {
            self.held.push(Held {
                seq,
                tube,
                ack: buf,
                delivered,
                delayed: ready_at.is_some() && !e.scheduled,
                leased: e.pulled,
            });
        }
        Ok(true)
    }

    /// What an ask that a pull answered without a job comes to. A wait
    /// that ended empty is idle only when the consumers have nothing out.
    fn empty(&mut self, no_wait: bool, end: End) -> Result<Took<'static>, Fault> {
        Ok(match end {
            End::Unavailable => Took::Unavailable,
            End::Empty if no_wait => Took::TurnEmpty,
            End::Empty if self.check_idle => self.outstanding()?,
            End::Empty => Took::TimedOut,
        })
    }

    /// [`Took::Outstanding`] while a tube's consumer has messages not yet
    /// delivered or deliveries not acknowledged (held by a worker, or lost
    /// with a connection and due again when their ack wait runs out), else
    /// [`Took::TimedOut`]. An answer the connection survives but that
    /// cannot tell (replies still owed, an API error) is not idle either.
    fn outstanding(&mut self) -> Result<Took<'static>, Fault> {
        for t in &self.tubes {
            match self.conn.consumer_info(&self.stream, &t.consumer) {
                Ok(ci) if ci.num_pending == 0 && ci.num_ack_pending == 0 => {}
                Ok(ci) => {
                    tracing::debug!(
                        tube = t.name,
                        pending = ci.num_pending,
                        ack_pending = ci.num_ack_pending,
                        "nothing delivered, but jobs are still out"
                    );
                    return Ok(Took::Outstanding);
                }
                Err(NatsError::NoResponders) => return Ok(Took::Unavailable),
                Err(e) if self.conn.is_broken() => return Err(Fault::Conn(conn_error(e))),
                Err(e) => {
                    tracing::debug!(tube = t.name, error = %e, "cannot read the consumer's info");
                    return Ok(Took::Outstanding);
                }
            }
        }
        Ok(Took::TimedOut)
    }

    /// Counts one ask of the pull under way answered; returns whether that
    /// pull waited. A pull with all its asks answered is over.
    fn answered(&mut self) -> bool {
        let Some(p) = self.pulls.front_mut() else {
            return false;
        };
        p.left = p.left.saturating_sub(1);
        let no_wait = p.no_wait;
        if p.left == 0 {
            self.pulls.pop_front();
        }
        no_wait
    }

    /// Sends the oldest pull if it is not under way yet.
    fn send_pull(&mut self) -> Result<(), Fault> {
        let Some(p) = self.pulls.front_mut() else {
            return Err(Fault::Conn(ConnectionError::NothingOwed));
        };
        if p.sent {
            return Ok(());
        }
        // The asks of later writes for the same tube go into this pull too:
        // a window refilled job by job is pulled for in one request.
        let (tube, no_wait, scan) = (p.tube, p.no_wait, p.scan);
        while self
            .pulls
            .get(1)
            .is_some_and(|q| q.tube == tube && q.no_wait == no_wait && q.scan == scan)
        {
            let q = self.pulls.remove(1).expect("checked above");
            self.pulls[0].left += q.left;
        }
        let p = &mut self.pulls[0];
        p.sent = true;
        p.at = Instant::now();
        let (batch, waits) = (p.left, p.waits());
        let consumer = &self.tubes[tube].consumer;
        let r = if !waits {
            self.conn.pull_no_wait(&self.stream, consumer, batch)
        } else {
            self.conn
                .pull(&self.stream, consumer, batch, self.slice, None)
        };
        r.map_err(|e| Fault::Conn(conn_error(e)))
    }

    /// Copies job `seq` to its tube's buried subject and waits for the copy's
    /// PubAck. Anything owed is read first (into the early queues): the copy
    /// needs the connection to itself.
    fn bury_copy(&mut self, seq: u64, tube: usize) -> Result<(), ConnectionError> {
        while self.conn.pulling() {
            match self.conn.next_delivery() {
                Ok(Delivery::Confirmed(t)) => self.confirmed.push(t),
                Ok(d) => keep_early(d, self.pulls.front_mut(), &mut self.early, &mut self.bufs),
                Err(NatsError::NoResponders) => {
                    if let Some(p) = self.pulls.front_mut() {
                        p.ended = Some(End::Unavailable);
                    }
                }
                Err(e) => return Err(conn_error(e)),
            }
        }
        while self.conn.confirms_owed() > 0 {
            match self.conn.next_delivery() {
                Ok(Delivery::Confirmed(t)) => self.confirmed.push(t),
                Ok(_) => {}
                Err(e) => return Err(conn_error(e)),
            }
        }
        let stored = self
            .conn
            .msg_get(&self.stream, MsgSelect::Seq(seq))
            .map_err(conn_error)?;
        let headers = if stored.headers.is_empty() {
            None
        } else {
            HeaderBlock::parse(&stored.headers).ok()
        };
        let extra: Vec<(&[u8], &[u8])> = headers
            .iter()
            .flat_map(|h| h.iter())
            .filter(|(k, _)| !k.eq_ignore_ascii_case(b"Nats-Msg-Id"))
            .collect();
        let id = format!("taskq-bury-{}-{seq}", self.stream);
        self.conn
            .publish_with(
                &self.tubes[tube].buried,
                id.as_bytes(),
                &extra,
                &stored.data,
            )
            .map(|_| ())
            .map_err(conn_error)
    }
}

/// The ack that carries out `settle`.
fn ack_kind(settle: Settle) -> AckKind {
    match settle {
        // A buried job's copy is stored: the original goes.
        Settle::Delete | Settle::Bury { .. } => AckKind::Ack,
        Settle::Release { delay, .. } => AckKind::Nak {
            delay: (delay > 0).then(|| Duration::from_secs(u64::from(delay))),
        },
    }
}

/// Sends the acks carried from failed connections again on a new one (in
/// setup, before anything else), one at a time, each confirmed before the
/// next. Acks are idempotent: one the server applied already is confirmed
/// again. A confirmed one is resolved; one whose job's lease ends first is
/// given up. On a failure (no answer, or no leader for the consumer yet) the
/// rest wait for the next connection.
fn resend(conn: &mut NatsConnection, carry: &mut Carry) -> Result<(), NatsError> {
    loop {
        carry.expire(Instant::now());
        let Some(u) = carry.open.last() else {
            return Ok(());
        };
        conn.ack(&u.to, ack_kind(u.settle), true)?;
        let u = carry.open.pop().expect("seen above");
        carry.resolved.push((u.id, u.settle, true));
    }
}

/// Keeps a delivery or status read while a confirmation was awaited.
fn keep_early(
    d: Delivery<'_>,
    pull: Option<&mut Pull>,
    early: &mut VecDeque<Early>,
    bufs: &mut Buffers,
) {
    let end = match d {
        Delivery::Msg {
            subject,
            reply,
            headers,
            body,
            info,
        } => {
            early.push_back(Early {
                subject: bufs.names.copy(subject),
                ack: bufs.names.copy(reply),
                body: bufs.bodies.copy(body),
                delivered: info.delivered,
                seq: info.stream_seq,
                ready_at: ready_at(headers.as_ref()),
                scheduled: headers.is_some_and(|h| h.get(SCHEDULER_HEADER).is_some()),
                pulled: pull.map_or_else(Instant::now, |p| p.at),
            });
            return;
        }
        Delivery::Heartbeat | Delivery::Confirmed(_) => return,
        Delivery::NoMessages | Delivery::Timeout => End::Empty,
        other => {
            tracing::debug!(status = ?other, "pull ended: the cluster cannot serve it now");
            End::Unavailable
        }
    };
    if let Some(p) = pull {
        p.ended = Some(end);
    }
}

/// The ready time a delayed job carries, in Unix milliseconds.
fn ready_at(headers: Option<&HeaderBlock<'_>>) -> Option<u64> {
    let v = headers?.get(READY_AT_HEADER)?;
    taskq_proto::parse_u64(v).ok()
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The transport's errors in the loop's terms.
fn conn_error(e: NatsError) -> ConnectionError {
    match e {
        NatsError::NotSent(io) => ConnectionError::NotSent(io),
        NatsError::Broken => ConnectionError::Broken,
        NatsError::NothingOwed => ConnectionError::NothingOwed,
        NatsError::Timeout { waited } => ConnectionError::Timeout { waited },
        NatsError::Closed => ConnectionError::Closed,
        NatsError::Io(io) => ConnectionError::Io(io),
        other => ConnectionError::Io(std::io::Error::other(other.to_string())),
    }
}

impl JobLink for Nats {
    fn addr(&self) -> SocketAddr {
        self.conn.peer_addr()
    }

    fn is_broken(&self) -> bool {
        self.conn.is_broken()
    }

    fn mark_broken(&mut self) {
        self.conn.mark_broken();
    }

    fn touch(&mut self, id: u64) -> Result<bool, Fault> {
        let Some(i) = self.held_index(id) else {
            return Ok(false);
        };
        let token = self
            .conn
            .queue_ack(&self.held[i].ack, AckKind::InProgress, true)
            .map_err(|e| Fault::Conn(conn_error(e)))?
            .expect("a confirmed ack has a token");
        let sent = Instant::now();
        self.conn.flush().map_err(|e| Fault::Conn(conn_error(e)))?;
        self.confirm(token)?;
        if let Some(i) = self.held_index(id) {
            self.held[i].leased = sent;
        }
        Ok(true)
    }

    fn info(&mut self, id: u64, tube: Option<&mut String>) -> Result<Option<JobInfo>, Fault> {
        let Some(h) = self.held.iter().find(|h| h.seq == id) else {
            return Ok(None);
        };
        let t = &self.tubes[h.tube];
        if let Some(out) = tube {
            out.clear();
            out.push_str(&t.name);
        }
        let left = t.ack_wait.saturating_sub(h.leased.elapsed());
        // Every redelivery followed a -NAK or a lease that ran out; the early
        // delivery of a delayed job is not an attempt.
        let releases = h
            .delivered
            .saturating_sub(1)
            .saturating_sub(u64::from(h.delayed));
        Ok(Some(JobInfo {
            pri: 0,
            ttr: t.ack_wait.as_secs().max(1),
            time_left: left.as_secs(),
            reserves: h.delivered,
            timeouts: 0,
            releases,
            buries: 0,
        }))
    }
}

impl Link for Nats {
    fn connect(
        cfg: &Config,
        server: &str,
        nth: usize,
        learned: &[String],
        carry: &mut Carry,
    ) -> Result<Nats, ConnectionError> {
        let addr = Address::parse(server)
            .map_err(|e| ConnectionError::NotSent(std::io::Error::other(e.to_string())))?;
        // Threads start on different seeds, so that one node that does not
        // answer holds back only some of them; after a failure the next
        // attempt starts on the next seed, not on the node that just failed.
        let mut seeds = addr.hosts().to_vec();
        let n = seeds.len();
        seeds.rotate_left(nth % n.max(1));
        // Then the nodes the cluster announced (`connect_urls`), so that a
        // worker given one node goes on through the others when it fails.
        for a in learned {
            if !seeds.contains(a) {
                seeds.push(a.clone());
            }
        }
        let ncfg = NatsConfig {
            connect_timeout: cfg.connect_timeout,
            io_timeout: cfg.io_timeout,
            access: cfg.jetstream.access.for_address(&addr),
            ..NatsConfig::default()
        };
        let mut conn = NatsConnection::connect(&seeds, ncfg).map_err(conn_error)?;
        let layout = Layout::new(&cfg.jetstream.stream)
            .map_err(|e| ConnectionError::NotSent(std::io::Error::other(e.to_string())))?;
        let setup = |e: NatsError| {
            tracing::warn!(server, error = %e, "cannot set the JetStream stream or consumer up");
            conn_error(e)
        };
        let replicas = cfg
            .jetstream
            .replicas
            .unwrap_or(if conn.servers().len() >= 3 { 3 } else { 1 });
        // Made with message schedules where the server holds them, as the
        // producer makes it.
        conn.ensure_stream_with_schedules(&StreamSpec {
            name: layout.stream().to_owned(),
            subjects: vec![layout.capture()],
            replicas,
            duplicate_window: None,
        })
        .map_err(setup)?;
        let mut tubes = Vec::with_capacity(cfg.tubes.len());
        for name in &cfg.tubes {
            let subject = layout.subject(name);
            let consumer = Layout::consumer(name);
            let info = conn
                .ensure_consumer(
                    layout.stream(),
                    &consumer,
                    &ConsumerSpec {
                        filter_subject: subject.clone(),
                        ack_wait: cfg.jetstream.ack_wait,
                        max_deliver: -1,
                        max_ack_pending: MAX_ACK_PENDING,
                        max_waiting: 512,
                    },
                )
                .map_err(setup)?;
            tubes.push(Tube {
                name: name.clone(),
                buried: layout.buried_subject(name),
                subject,
                consumer,
                ack_wait: info.ack_wait,
            });
        }
        resend(&mut conn, carry).map_err(|e| {
            tracing::debug!(server, error = %e, "acks carried from a failed connection not confirmed yet");
            conn_error(e)
        })?;
        let k = cfg.prefetch.max(1);
        // An ack subject: `$JS.ACK.` (an optional domain and account hash),
        // the stream, the consumer, five numbers; a subject is shorter. Out
        // at once: two for each delivery read ahead (up to a window's),
        // the window's jobs held, and the settles the loop has not read yet
        // (it reads them once more than twice the window's requests are
        // owed).
        let longest = tubes.iter().map(|t| t.consumer.len()).max().unwrap_or(0);
        let bufs = Buffers {
            names: Pool::made(5 * k + 8, 160 + layout.stream().len() + longest),
            bodies: Pool::with_room(2 * k),
        };
        Ok(Nats {
            conn,
            stream: layout.stream().to_owned(),
            tubes,
            held: Vec::with_capacity(k),
            bufs,
            asks: 0,
            ask_tube: 0,
            ask_no_wait: false,
            ask_scan: 0,
            pulls: VecDeque::with_capacity(k),
            rotate: fastrand::usize(..cfg.tubes.len().max(1)),
            settles: VecDeque::with_capacity(k),
            touches: VecDeque::with_capacity(k),
            unanswered: Vec::new(),
            carried: Vec::new(),
            check_idle: cfg.exit_when_idle.is_some(),
            confirmed: Vec::with_capacity(k),
            early: VecDeque::with_capacity(k),
            current: Early::default(),
            slice: Duration::from_secs(u64::from(cfg.reserve_secs())),
        })
    }

    fn learned(&self) -> &[String] {
        self.conn.servers()
    }

    fn io_counts(&self) -> IoCounts {
        self.conn.io_counts()
    }

    fn interrupter(&self) -> Option<Interrupter> {
        self.conn.interrupter().ok()
    }

    fn queue(&mut self, req: Req<'_>) -> Result<(), ConnectionError> {
        match req {
            Req::Settle(id, s) => {
                let Some(i) = self.held_index(id) else {
                    // Not held here (the lease ran out and the job went to
                    // another worker's link): answer as beanstalkd would.
                    self.settles.push_back(Owed::NotHeld);
                    return Ok(());
                };
                if let Settle::Bury { .. } = s {
                    self.bury_copy(id, self.held[i].tube)?;
                }
                let i = self.held_index(id).expect("still held");
                let token = self
                    .conn
                    .queue_ack(&self.held[i].ack, ack_kind(s), true)
                    .map_err(conn_error)?
                    .expect("a confirmed ack has a token");
                let h = self.held.swap_remove(i);
                let sent = Unconfirmed {
                    id,
                    settle: s,
                    to: h.ack,
                    due: h.leased + self.tubes[h.tube].ack_wait,
                };
                self.settles.push_back(Owed::Sent(token, sent));
                Ok(())
            }
            Req::Touch(id) => {
                let Some(i) = self.held_index(id) else {
                    self.touches.push_back((0, id, Instant::now()));
                    return Ok(());
                };
                let token = self
                    .conn
                    .queue_ack(&self.held[i].ack, AckKind::InProgress, true)
                    .map_err(conn_error)?
                    .expect("a confirmed ack has a token");
                self.touches.push_back((token, id, Instant::now()));
                Ok(())
            }
            Req::Ask(ask) => {
                if self.asks == 0 {
                    let (tube, no_wait, scan) = pick(ask, &mut self.rotate);
                    self.ask_tube = tube;
                    self.ask_no_wait = no_wait;
                    self.ask_scan = scan;
                }
                self.asks += 1;
                Ok(())
            }
        }
    }

    fn flush(&mut self) -> Result<(), ConnectionError> {
        if self.asks > 0 {
            self.pulls.push_back(Pull {
                tube: self.ask_tube,
                left: std::mem::take(&mut self.asks),
                no_wait: self.ask_no_wait,
                scan: self.ask_scan,
                sent: false,
                at: Instant::now(),
                ended: None,
            });
            if self.pulls.len() == 1 {
                // None under way: the pull goes out now, with the acks queued.
                return self.send_pull().map_err(|f| match f {
                    Fault::Conn(e) => e,
                    Fault::Unexpected(_) => ConnectionError::Broken,
                });
            }
        }
        self.conn.flush().map_err(conn_error)
    }

    fn discard(&mut self) {
        // Queued acks cannot be taken back out of the connection's buffer
        // one by one: give the link up; the server takes its jobs back.
        self.asks = 0;
        self.conn.mark_broken();
    }

    fn settled(&mut self) -> Result<SettleReply, Fault> {
        let (token, sent) = match self.settles.pop_front() {
            None => return Err(Fault::Conn(ConnectionError::NothingOwed)),
            Some(Owed::NotHeld) => return Ok(SettleReply::NotFound),
            Some(Owed::Sent(token, sent)) => (token, sent),
        };
        match self.confirm(token) {
            Ok(()) => {
                let reply = sent.settle.reply();
                self.bufs.names.give(sent.to);
                Ok(reply)
            }
            Err(f) => {
                // No confirmation (the connection failed, or the cluster had
                // no leader for the consumer): the link is given up, and the
                // loop may have the ack sent again on the next connection.
                self.conn.mark_broken();
                self.unanswered.push(sent);
                Err(f)
            }
        }
    }

    fn carry_settle(&mut self, id: u64) -> bool {
        let sent = if let Some(k) = self.unanswered.iter().position(|u| u.id == id) {
            self.unanswered.swap_remove(k)
        } else if let Some(k) = self
            .settles
            .iter()
            .position(|o| matches!(o, Owed::Sent(_, u) if u.id == id))
        {
            // Queued or sent, never read: the link failed first.
            match self.settles.remove(k) {
                Some(Owed::Sent(_, u)) => u,
                _ => unreachable!("found above"),
            }
        } else {
            return false;
        };
        self.conn.mark_broken();
        self.carried.push(sent);
        true
    }

    fn hand_over(&mut self, carry: &mut Carry) {
        carry.open.append(&mut self.carried);
    }

    fn reserved(&mut self) -> Result<Took<'_>, Fault> {
        loop {
            if let Some(e) = self.early.pop_front() {
                let no_wait = self.answered();
                let taken = self.take(&e);
                let old = std::mem::replace(&mut self.current, e);
                self.bufs.names.give(old.subject);
                self.bufs.names.give(old.ack);
                self.bufs.bodies.give(old.body);
                if !taken? {
                    return self.empty(no_wait, End::Empty);
                }
                return Ok(Took::Job {
                    id: self.current.seq,
                    body: &self.current.body,
                });
            }
            self.send_pull()?;
            let n = self.tubes.len();
            if let Some(p) = self.pulls.front_mut() {
                if p.ended == Some(End::Empty) && p.scan > 0 {
                    // Nothing on this tube now: the asks left try the next one.
                    p.tube = (p.tube + 1) % n;
                    p.scan -= 1;
                    p.sent = false;
                    p.ended = None;
                    continue;
                }
            }
            if let Some(end) = self.pulls.front().and_then(|p| p.ended) {
                let no_wait = self.answered();
                return self.empty(no_wait, end);
            }
            match self.conn.next_delivery() {
                Ok(Delivery::Confirmed(t)) => self.confirmed.push(t),
                Ok(d) => keep_early(d, self.pulls.front_mut(), &mut self.early, &mut self.bufs),
                Err(NatsError::NoResponders) => {
                    tracing::debug!("pull answered 503: no responders");
                    if let Some(p) = self.pulls.front_mut() {
                        p.ended = Some(End::Unavailable);
                    }
                }
                Err(e) => return Err(Fault::Conn(conn_error(e))),
            }
        }
    }

    fn touched(&mut self) -> Result<bool, Fault> {
        let Some((token, id, queued)) = self.touches.pop_front() else {
            return Err(Fault::Conn(ConnectionError::NothingOwed));
        };
        if token == 0 {
            return Ok(false);
        }
        self.confirm(token)?;
        // Only a touch the server confirmed restarted the lease.
        if let Some(i) = self.held_index(id) {
            self.held[i].leased = queued;
        }
        Ok(true)
    }

    fn quit(self) {
        drop(self.conn);
    }
}

/// Where an ask's pull starts, whether the ask waits, and how many more
/// tubes it may try: a weighted turn tries its tube alone; otherwise every
/// tube in turn (starting one further each time, so none is always last).
fn pick(ask: Ask<'_>, rotate: &mut usize) -> (usize, bool, usize) {
    let n = ask.tubes.len().max(1);
    let no_wait = ask.slice == 0;
    let want = ask.sched.map(|s| {
        let want = s.want();
        // The schedule records what the link "watches"; pulls need no switch.
        let _ = s.switch(want, |_, _| Ok(()));
        want
    });
    match want {
        Some(Want::Try(k)) => (k, true, 0),
        Some(Want::All) | None => {
            *rotate = (*rotate + 1) % n;
            (*rotate, no_wait, n - 1)
        }
    }
}
