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
//!   counted done only on its confirmation. A prefetch window gathers
//!   ([`Link::GATHER`]): the acks of a window of jobs and the pull that
//!   refills it are queued one by one and written together.
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
use std::time::{Duration, Instant};

use taskq_connect::nats::{
    run_blocking, ApiLink, JetStream, NatsConfig, NatsConnection, StreamSpec,
};
use taskq_connect::{Address, Layout};
use taskq_proto::nats::{AckKind, NatsError, NatsLimits};
use taskq_proto::{ConnectionError, Interrupter, IoCounts};

use super::seam::{
    Carry, Fault, JobLink, Link, Pool, Req, Settle, SettleReply, Took, Unconfirmed, BODY_ROOM,
};
use crate::config::Config;
use crate::job_info::JobInfo;
use parts::{
    ack_kind, conn_error, connect_error, delivered_info, pick, pull_expiry, resend, Buffers, Early,
    End, GivenBack, Held, Owed, Pull, Strays, Tube,
};

pub(crate) mod parts;
mod reading;

/// The largest `max_payload` a nats-server accepts in its configuration
/// (64 MiB).
const MAX_SERVER_PAYLOAD: usize = 64 << 20;

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
    /// How early a delivery's lease may have started, while a pull its
    /// probe ended may still deliver.
    strays: Strays,
    /// Delayed jobs this link gave back because they came before their
    /// ready time.
    given_back: GivenBack,
    /// The delivery handed out last, when it came early.
    current: Early,
    /// A waiting pull's expiry on the server (`parts::pull_expiry`).
    expiry: Duration,
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
        Ok(Some(delivered_info(
            t.ack_wait,
            h.leased,
            h.delivered,
            h.early,
        )))
    }
}

impl Link for Nats {
    const GATHER: bool = true;

    fn connect(
        cfg: &Config,
        server: &str,
        nth: usize,
        learned: &[String],
        carry: &mut Carry,
    ) -> Result<Nats, ConnectionError> {
        let addr = Address::parse(server)
            .map_err(|e| ConnectionError::NotSent(std::io::Error::other(e.to_string())))?;
        let seeds = seeds(&addr, nth, learned);
        let ncfg = nats_config(cfg, &addr);
        let mut conn = NatsConnection::connect(&seeds, ncfg).map_err(connect_error)?;
        let nodes = conn.servers().len();
        let (layout, tubes) = run_blocking(set_up(&mut conn, cfg, server, nodes))?;
        resend(&mut conn, carry).map_err(|e| {
            tracing::debug!(server, error = %e, "acks carried from a failed connection not confirmed yet");
            conn_error(e)
        })?;
        let k = cfg.prefetch.max(1);
        // An ack subject: `$JS.ACK.` (an optional domain and account hash),
        // the stream, the consumer, five numbers; a subject is shorter. Out
        // at once: three for each delivery read ahead (its subject, ack
        // subject and header block; up to a window's), the window's jobs
        // held, and the settles the loop has not read yet (it reads them
        // once more than twice the window's requests are owed).
        let longest = tubes.iter().map(|t| t.consumer.len()).max().unwrap_or(0);
        let bufs = Buffers {
            names: Pool::made(6 * k + 8, 160 + layout.stream().len() + longest),
            // As many as can be read ahead at once, made now: a later peak
            // of deliveries read ahead makes none.
            bodies: Pool::made(2 * k + 2, BODY_ROOM),
            max_body: cfg.limits.max_job_size,
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
            settles: VecDeque::with_capacity(2 * k + 8),
            touches: VecDeque::with_capacity(2 * k + 8),
            unanswered: Vec::new(),
            carried: Vec::new(),
            check_idle: cfg.exit_when_idle.is_some(),
            confirmed: Vec::with_capacity(2 * k + 8),
            early: VecDeque::with_capacity(2 * k),
            strays: Strays::default(),
            given_back: GivenBack::default(),
            current: Early::default(),
            expiry: pull_expiry(cfg),
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
                // A job too big to run is terminated: copying it would
                // read it whole (and its copy could exceed the server's
                // limit on a message).
                let term = matches!(s, Settle::Bury { .. }) && self.held[i].too_big;
                if let (Settle::Bury { .. }, false) = (s, term) {
                    self.bury_copy(id, self.held[i].tube)?;
                }
                let i = self.held_index(id).expect("still held");
                let kind = if term { AckKind::Term } else { ack_kind(s) };
                let token = self
                    .conn
                    .queue_ack(&self.held[i].ack, kind, true)
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
                let now = Instant::now();
                let Some(i) = self.held_index(id) else {
                    self.touches.push_back((0, id, now));
                    return Ok(());
                };
                let h = &self.held[i];
                if h.leased + self.tubes[h.tube].ack_wait <= now + Carry::MARGIN {
                    // Its ack wait has run out: the server may have handed
                    // it to another worker, and a `+WPI` now would still be
                    // confirmed (acks name the stream sequence), the job
                    // then run twice. It is given up as lost.
                    let h = self.held.swap_remove(i);
                    self.bufs.names.give(h.ack);
                    self.touches.push_back((0, id, now));
                    return Ok(());
                }
                let token = self
                    .conn
                    .queue_ack(&self.held[i].ack, AckKind::InProgress, true)
                    .map_err(conn_error)?
                    .expect("a confirmed ack has a token");
                self.touches.push_back((token, id, now));
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
                self.bufs.names.give(old.headers);
                if !taken? {
                    return self.empty(no_wait, End::Empty);
                }
                if let Some(len) = self.current.too_big {
                    return Ok(Took::TooBig {
                        id: self.current.seq,
                        len,
                    });
                }
                return Ok(Took::Job {
                    id: self.current.seq,
                    body: &self.current.body,
                    headers: &self.current.headers,
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
            match self.read_one(None) {
                Ok(_) => {}
                Err(NatsError::NoResponders) => self.pull_unavailable(),
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

/// The seeds a connection tries, in order: the address's nodes, started
/// `nth` further on (threads start on different seeds, so that one node
/// that does not answer holds back only some of them, and after a failure
/// the next attempt starts on the next seed, not on the node that just
/// failed); then the nodes the cluster announced (`connect_urls`), so that
/// a worker given one node goes on through the others when it fails.
pub(crate) fn seeds(addr: &Address, nth: usize, learned: &[String]) -> Vec<String> {
    let mut seeds = addr.hosts().to_vec();
    let n = seeds.len();
    seeds.rotate_left(nth % n.max(1));
    for a in learned {
        if !seeds.contains(a) {
            seeds.push(a.clone());
        }
    }
    seeds
}

/// A worker's connection settings for `addr`.
pub(crate) fn nats_config(cfg: &Config, addr: &Address) -> NatsConfig {
    NatsConfig {
        connect_timeout: cfg.connect_timeout,
        io_timeout: cfg.io_timeout,
        access: cfg.jetstream.access.for_address(addr),
        // Lowered to the server's `max_payload` at connect: whatever the
        // server stores, the worker reads whole (and terminates what is
        // over its own limit) rather than breaking on it.
        limits: NatsLimits {
            max_payload: MAX_SERVER_PAYLOAD,
            ..NatsLimits::default()
        },
        ..NatsConfig::default()
    }
}

/// Makes or looks up the stream (with message schedules where the server
/// holds them, as the producer makes it) and each tube's durable consumer,
/// with the settings a worker gives them, over either driver's link;
/// `nodes` is how many the cluster announced (the default replicas).
pub(crate) async fn set_up<L: ApiLink>(
    link: &mut L,
    cfg: &Config,
    server: &str,
    nodes: usize,
) -> Result<(Layout, Vec<Tube>), ConnectionError> {
    let layout = Layout::new(&cfg.jetstream.stream)
        .map_err(|e| ConnectionError::NotSent(std::io::Error::other(e.to_string())))?;
    let setup = |e: NatsError| {
        tracing::warn!(server, error = %e, "cannot set the JetStream stream or consumer up");
        connect_error(e)
    };
    let replicas = cfg
        .jetstream
        .replicas
        .unwrap_or(if nodes >= 3 { 3 } else { 1 });
    let mut js = JetStream(link);
    js.ensure_stream_with_schedules(&StreamSpec {
        name: layout.stream().to_owned(),
        subjects: vec![layout.capture()],
        replicas,
        duplicate_window: None,
    })
    .await
    .map_err(setup)?;
    let mut tubes = Vec::with_capacity(cfg.tubes.len());
    for name in &cfg.tubes {
        let spec = cfg.jetstream.consumer_spec(&layout, name);
        let consumer = Layout::consumer(name);
        let info = js
            .ensure_consumer(layout.stream(), &consumer, &spec)
            .await
            .map_err(setup)?;
        tubes.push(Tube {
            name: name.clone(),
            buried: layout.buried_subject(name),
            subject: spec.filter_subject,
            consumer,
            ack_wait: info.ack_wait,
        });
    }
    Ok((layout, tubes))
}

#[cfg(test)]
mod tests {
    use super::parts::jobs_out;
    use super::*;
    use crate::engine::seam::Ask;

    /// Jobs on a one-node JetStream, and a link to it with a window of `k`.
    fn link_with_jobs(c: &taskq_testkit::NatsCluster, jobs: usize, k: usize) -> Nats {
        let mut p = taskq_producer::Producer::connect(c.url()).unwrap();
        for i in 0..jobs {
            p.put(
                format!("job {i}").as_bytes(),
                taskq_producer::PutOptions::default(),
            )
            .unwrap();
        }
        let cfg = Config {
            servers: vec![c.url()],
            prefetch: k,
            ..Config::default()
        };
        Nats::connect(&cfg, &cfg.servers[0], 0, &[], &mut Carry::default()).unwrap()
    }

    fn ask(tubes: &[String]) -> Req<'_> {
        Req::Ask(Ask {
            sched: None,
            tubes,
            slice: 0,
        })
    }

    /// Writes made since `from`, the `PONG`s answering the server's `PING`s
    /// set apart (each is a write of its own).
    fn writes_since(link: &Nats, from: (u64, u64)) -> u64 {
        let pongs = link.conn.pings_answered() - from.1;
        link.io_counts().writes - from.0 - pongs
    }

    /// A consumer that counts nothing out while its stream still holds a job
    /// for it (made so by construction: the job's one delivery allowed has
    /// run out, then the limit is lifted, so that the consumer neither counts
    /// it nor will deliver it until asked again, as a consumer lagging behind
    /// a new stream leader reports) does not let the worker call itself idle;
    /// while the consumer limits its deliveries, the job may never come again
    /// and does not keep the worker either.
    #[test]
    fn the_streams_record_keeps_a_worker_from_idling_on_a_consumer_that_counts_nothing() {
        let c = taskq_testkit::NatsCluster::start(1).unwrap();
        let mut p = taskq_producer::Producer::connect(c.url()).unwrap();
        p.put(b"job", taskq_producer::PutOptions::default())
            .unwrap();
        let cfg = Config {
            servers: vec![c.url()],
            reserve_timeout: Duration::from_millis(300),
            ..Config::default()
        };
        let mut link = Nats::connect(&cfg, &cfg.servers[0], 0, &[], &mut Carry::default()).unwrap();
        let out = |l: &mut Nats| run_blocking(jobs_out(&mut l.conn, &l.stream, &l.tubes)).unwrap();
        assert!(out(&mut link), "the consumer counts one pending");
        let info_subject = "$JS.API.CONSUMER.INFO.TASKQ.taskq-default";
        let limit = |l: &mut Nats, max_deliver: i64| {
            let info = l.conn.api_request(info_subject, &serde_json::Value::Null);
            let mut config = info.unwrap()["config"].clone();
            config["max_deliver"] = max_deliver.into();
            config["ack_wait"] = 1_000_000_000u64.into();
            let updated = l.conn.api_request(
                "$JS.API.CONSUMER.CREATE.TASKQ.taskq-default",
                &serde_json::json!({ "stream_name": "TASKQ", "config": config }),
            );
            assert!(updated.is_ok(), "{updated:?}");
        };
        limit(&mut link, 1);
        // Its one delivery, never acknowledged: past its ack wait the
        // consumer gives up on it, when next asked for a job, and counts it
        // no more.
        let tubes = ["default".to_owned()];
        link.queue(ask(&tubes)).unwrap();
        link.flush().unwrap();
        assert!(matches!(link.reserved().unwrap(), Took::Job { .. }));
        let given_up = Instant::now() + Duration::from_secs(20);
        loop {
            std::thread::sleep(Duration::from_millis(1100));
            let wait = Ask {
                sched: None,
                tubes: &tubes,
                slice: 1,
            };
            link.queue(Req::Ask(wait)).unwrap();
            link.flush().unwrap();
            let took = link.reserved().unwrap();
            assert!(!matches!(took, Took::Job { .. }), "delivered again");
            let info = link.conn.consumer_info("TASKQ", "taskq-default").unwrap();
            if (info.num_pending, info.num_ack_pending) == (0, 0) {
                break;
            }
            assert!(Instant::now() < given_up, "still counted: {info:?}");
        }
        let stored = link.conn.subject_counts("TASKQ", "taskq.>").unwrap();
        assert_eq!(stored.get("taskq.default"), Some(&1), "{stored:?}");
        assert!(!out(&mut link), "a job past its last delivery");
        limit(&mut link, -1);
        let info = link.conn.consumer_info("TASKQ", "taskq-default").unwrap();
        assert_eq!((info.num_pending, info.num_ack_pending), (0, 0));
        assert!(out(&mut link), "the stream holds a job for it");
    }

    #[test]
    fn acks_and_the_pull_that_refills_go_out_in_one_write_and_are_confirmed() {
        let c = taskq_testkit::NatsCluster::start(1).unwrap();
        let (k, half) = (16, 8);
        let mut link = link_with_jobs(&c, k + half, k);
        let tubes = ["default".to_owned()];
        let mark = |l: &Nats| (l.io_counts().writes, l.conn.pings_answered());
        // A window's asks: one pull of 16, one write.
        let before = mark(&link);
        for _ in 0..k {
            link.queue(ask(&tubes)).unwrap();
        }
        link.flush().unwrap();
        assert_eq!(writes_since(&link, before), 1);
        let mut ids = Vec::new();
        for _ in 0..k {
            match link.reserved().unwrap() {
                Took::Job { id, .. } => ids.push(id),
                other => panic!("{other:?}"),
            }
        }
        // Half of them done: their acks and the pull for as many more,
        // queued one by one, written together.
        let before = mark(&link);
        for &id in &ids[..half] {
            link.queue(Req::Settle(id, Settle::Delete)).unwrap();
        }
        for _ in 0..half {
            link.queue(ask(&tubes)).unwrap();
        }
        assert_eq!(
            writes_since(&link, before),
            0,
            "nothing written before the flush"
        );
        link.flush().unwrap();
        assert_eq!(writes_since(&link, before), 1, "acks and pull in one write");
        // Each ack counted on its confirmation; the pull brings the rest.
        for _ in 0..half {
            assert_eq!(link.settled().unwrap(), SettleReply::Deleted);
        }
        for _ in 0..half {
            assert!(matches!(link.reserved().unwrap(), Took::Job { .. }));
        }
        assert_eq!(writes_since(&link, before), 1, "the reads wrote nothing");
        let info = link.conn.consumer_info("TASKQ", "taskq-default").unwrap();
        assert_eq!(info.num_ack_pending, k as u64, "8 acked of 24 delivered");
    }

    /// A job held past its ack wait is not touched: the server may have
    /// handed it to another worker, and a `+WPI` would still be confirmed.
    /// The touch answers "lost", the job is no longer held, and nothing is
    /// written; a job whose lease is young is touched and confirmed.
    #[test]
    fn a_touch_of_a_job_held_past_its_ack_wait_is_lost_not_sent() {
        let c = taskq_testkit::NatsCluster::start(1).unwrap();
        let mut link = link_with_jobs(&c, 2, 2);
        let tubes = ["default".to_owned()];
        link.queue(ask(&tubes)).unwrap();
        link.queue(ask(&tubes)).unwrap();
        link.flush().unwrap();
        let mut ids = Vec::new();
        for _ in 0..2 {
            match link.reserved().unwrap() {
                Took::Job { id, .. } => ids.push(id),
                other => panic!("{other:?}"),
            }
        }
        // Job 0's lease began an ack wait ago.
        let i = link.held_index(ids[0]).unwrap();
        let wait = link.tubes[link.held[i].tube].ack_wait;
        link.held[i].leased = link.held[i]
            .leased
            .checked_sub(wait)
            .expect("the machine is up longer than an ack wait");
        let before = link.io_counts().writes;
        link.queue(Req::Touch(ids[0])).unwrap();
        link.queue(Req::Touch(ids[1])).unwrap();
        link.flush().unwrap();
        assert!(!link.touched().unwrap(), "past its ack wait: lost");
        assert!(link.touched().unwrap(), "young: touched");
        assert!(link.held_index(ids[0]).is_none());
        assert!(link.held_index(ids[1]).is_some());
        assert_eq!(link.io_counts().writes - before, 1, "one touch written");
    }
}
