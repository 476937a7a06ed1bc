//! The JetStream machine driven by hand: pulls and acks queued on a real
//! NATS session, the server's deliveries, statuses and confirmations as its
//! bytes, time as given `Instant`s. No socket, no clock read, no sleep.

use taskq_proto::nats::{Credentials, NatsLimits};
use taskq_proto::{earliest, Limits};

use super::*;
use crate::config::Config;
use crate::machine::lease::{HOLD_MAX, TOUCH_AFTER};
use crate::Snapshot;

const MS: Duration = Duration::from_millis(1);
const INBOX: &str = "_INBOX.t.";
const STREAM: &str = "TASKQ";
const ACK_WAIT: Duration = Duration::from_secs(30);
/// What a waiting pull asks the server to wait: the reserve slice (1 s).
/// A waiting pull's expiry: the one-second slice plus
/// `PULL_EXPIRY_PAST_SLICE`.
const EXPIRES: &str = "\"expires\":1137000000";

/// Tube `name` as the driver's setup names it on the stream.
fn tube(name: &str) -> Tube {
    Tube {
        name: name.to_owned(),
        subject: format!("taskq.{name}"),
        buried: format!("taskq-buried.{name}"),
        consumer: format!("taskq-{name}"),
        ack_wait: ACK_WAIT,
    }
}

/// Hands `bytes` to the session as reads as large as its room allows.
fn feed(s: &mut NatsSession, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        let room = s.recv_room().unwrap();
        let n = room.len().min(bytes.len());
        room[..n].copy_from_slice(&bytes[..n]);
        s.received(n);
        bytes = &bytes[n..];
    }
}

/// A session through its handshake: the server's `INFO`, our `CONNECT`,
/// the inbox's `SUB` and `PING`, the server's `+OK` and `PONG`.
fn session() -> NatsSession {
    let mut s = NatsSession::with_inbox(NatsLimits::default(), "127.0.0.1:4222", INBOX.as_bytes());
    feed(
        &mut s,
        b"INFO {\"server_id\":\"N1\",\"version\":\"2.10.0\",\"headers\":true,\"max_payload\":1048576}\r\n",
    );
    s.poll_info().unwrap().expect("the whole INFO");
    s.queue_connect("taskq-test", &Credentials::default(), false)
        .unwrap();
    let sent = String::from_utf8(s.queued().to_vec()).unwrap();
    assert!(sent.contains("SUB _INBOX.t.* 1\r\nPING\r\n"), "{sent}");
    s.wipe_queue();
    feed(&mut s, b"+OK\r\nPONG\r\n");
    assert!(s.poll_connected().unwrap());
    s
}

/// One `PUB` the machine queued.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pub {
    subject: String,
    reply: Option<String>,
    body: String,
}

impl Pub {
    /// The reply token it is confirmed or answered under.
    fn token(&self) -> u64 {
        let reply = self.reply.as_deref().expect("a reply subject");
        reply.strip_prefix(INBOX).unwrap().parse().unwrap()
    }
}

/// The `PUB`s in one write; a `PING` (a probe) as one with subject `PING`.
fn pubs(mut bytes: &[u8]) -> Vec<Pub> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let eol = bytes.windows(2).position(|w| w == b"\r\n").unwrap();
        let line = std::str::from_utf8(&bytes[..eol]).unwrap();
        if line == "PING" {
            out.push(Pub {
                subject: line.to_owned(),
                reply: None,
                body: String::new(),
            });
            bytes = &bytes[eol + 2..];
            continue;
        }
        let words: Vec<&str> = line.split(' ').collect();
        assert_eq!(words[0], "PUB", "{line}");
        let (subject, reply, len) = match words[..] {
            [_, s, n] => (s, None, n),
            [_, s, r, n] => (s, Some(r.to_owned()), n),
            _ => panic!("{line}"),
        };
        let len: usize = len.parse().unwrap();
        let body = &bytes[eol + 2..eol + 2 + len];
        assert_eq!(&bytes[eol + 2 + len..eol + 4 + len], b"\r\n");
        out.push(Pub {
            subject: subject.to_owned(),
            reply,
            body: String::from_utf8(body.to_vec()).unwrap(),
        });
        bytes = &bytes[eol + 4 + len..];
    }
    out
}

/// The ack subject of delivery `delivered` of job `seq` on `tube`'s consumer.
fn ack_subject(tube: &str, delivered: u64, seq: u64) -> String {
    format!("$JS.ACK.{STREAM}.taskq-{tube}.{delivered}.{seq}.{seq}.1700000000000000000.0")
}

/// Job `seq` delivered the `delivered`-th time on `tube`, as the server
/// writes it on the pull's inbox subscription.
fn job(tube: &str, seq: u64, delivered: u64, body: &str) -> Vec<u8> {
    let ack = ack_subject(tube, delivered, seq);
    format!("MSG taskq.{tube} 1 {ack} {}\r\n{body}\r\n", body.len()).into_bytes()
}

/// The same with headers (`name: value` lines).
fn job_with(tube: &str, seq: u64, delivered: u64, headers: &str, body: &str) -> Vec<u8> {
    let ack = ack_subject(tube, delivered, seq);
    let h = format!("NATS/1.0\r\n{headers}\r\n\r\n");
    let total = h.len() + body.len();
    format!(
        "HMSG taskq.{tube} 1 {ack} {} {total}\r\n{h}{body}\r\n",
        h.len()
    )
    .into_bytes()
}

/// The server's confirmation of the ack sent under `token`.
fn confirm(token: u64) -> Vec<u8> {
    format!("MSG {INBOX}{token} 1 0\r\n\r\n").into_bytes()
}

/// A status (`408 Request Timeout`) ending the pull sent under `token`.
fn status(token: u64, line: &str) -> Vec<u8> {
    let h = format!("NATS/1.0 {line}\r\n\r\n");
    format!("HMSG {INBOX}{token} 1 {} {}\r\n{h}\r\n", h.len(), h.len()).into_bytes()
}

/// A job the machine said to run.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Run {
    slot: usize,
    id: u64,
    tube: usize,
    attempt: u32,
    body: String,
}

/// A machine on a session, with the worker state it counts into.
struct Rig {
    sh: Shared,
    m: JsMachine,
    wire: NatsSession,
    t0: Instant,
}

impl Rig {
    fn new(cfg: Config) -> Rig {
        Rig::of(Shared::new(cfg, false))
    }

    /// The blocking worker's machine: every job handed to the handler
    /// threads at once.
    fn blocking(cfg: Config) -> Rig {
        Rig::of(Shared::new(cfg, true))
    }

    fn of(sh: Shared) -> Rig {
        let t0 = Instant::now();
        let mut m = JsMachine::new(&sh, 0, t0);
        assert!(m.wants_connect(&sh, t0));
        m.connected(&sh, t0, STREAM, tubes(&sh));
        let wire = wire(&sh);
        Rig { sh, m, wire, t0 }
    }

    fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }

    /// The connection broke at `ms`; a new one is set up at `then`.
    fn reconnect(&mut self, ms: u64, then: u64) {
        self.m.broke(&self.sh, self.at(ms), 0);
        assert!(self.m.wants_connect(&self.sh, self.at(then)));
        self.wire = wire(&self.sh);
        let tubes = tubes(&self.sh);
        self.m.connected(&self.sh, self.at(then), STREAM, tubes);
    }

    /// The connection broke at `ms`, and the next one is set up only past
    /// the jobs' ack wait: when (in ms).
    fn away_past_the_ack_wait(&mut self, ms: u64) -> u64 {
        let late = ACK_WAIT.as_millis() as u64 + 1_000;
        self.reconnect(ms, late);
        late
    }

    /// What the machine queues at `ms`, written in one write.
    fn send(&mut self, ms: u64) -> Vec<Pub> {
        let now = self.at(ms);
        self.m.transmit(&self.sh, now, &mut self.wire).unwrap();
        let bytes = self
            .wire
            .to_flush()
            .unwrap()
            .map(<[u8]>::to_vec)
            .unwrap_or_default();
        self.wire.queue_sent();
        // The driver waits for what it wrote from now.
        self.wire.start_wait(now);
        pubs(&bytes)
    }

    /// The driver's next wake: the earlier of the machine's deadlines and
    /// the session's.
    fn due(&self, now: Instant) -> Option<Instant> {
        earliest(self.m.poll_timeout(&self.sh, now), self.wire.poll_timeout())
    }

    /// The driver's deadline check at `now`: the session probes a pull
    /// past its expiry (the `PING` goes with the next write); true when a
    /// reply was overdue and the machine gave the connection up. A
    /// connection given up is the driver's no more: nothing to check.
    fn overdue(&mut self, now: Instant) -> bool {
        if self.wire.is_broken() {
            return false;
        }
        match self.wire.handle_timeout(now) {
            Ok(()) => false,
            Err(e) => {
                self.m.reply_overdue(&self.sh, now, e, 0);
                true
            }
        }
    }

    /// The server's bytes arrive at `ms`: everything whole goes to the
    /// machine, as the driver gives it. The jobs to run, and whether the
    /// machine gave the connection up.
    fn recv(&mut self, ms: u64, bytes: &[u8]) -> (Vec<Run>, bool) {
        let now = self.at(ms);
        feed(&mut self.wire, bytes);
        let mut runs = Vec::new();
        loop {
            let f = match self.wire.poll_delivery() {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(NatsError::NothingOwed) => {
                    while self.wire.poll_event().unwrap().is_some() {}
                    break;
                }
                Err(e) => panic!("{e}"),
            };
            let pull = f.pull();
            let strays = self.wire.strays_possible();
            let d = match self.wire.take_delivery(f) {
                Ok(d) => d,
                Err(NatsError::NoResponders) => {
                    self.m.pull_unavailable(&self.sh, now, pull);
                    continue;
                }
                Err(e) => panic!("{e}"),
            };
            let body = match d {
                Delivery::Msg { body, .. } => String::from_utf8(body.to_vec()).unwrap(),
                _ => String::new(),
            };
            match self.m.on_delivery(&self.sh, now, d, pull, strays, 0) {
                Ok(JsStep::Run {
                    slot,
                    id,
                    tube,
                    attempt,
                }) => runs.push(Run {
                    slot,
                    id,
                    tube,
                    attempt,
                    body,
                }),
                Ok(JsStep::Nothing) | Ok(JsStep::Hold { .. }) => {}
                Err(()) => return (runs, true),
            }
        }
        (runs, false)
    }

    /// [`recv`](Self::recv) that must keep the connection.
    fn take(&mut self, ms: u64, bytes: &[u8]) -> Vec<Run> {
        let (runs, broke) = self.recv(ms, bytes);
        assert!(!broke);
        runs
    }

    fn finish(&mut self, run: &Run, outcome: Outcome) {
        self.m.finished(&self.sh, run.slot, outcome, None);
    }

    fn counts(&self) -> Snapshot {
        self.sh.counters.snapshot()
    }
}

/// A session as the driver sets it up: at the worker's I/O timeout.
fn wire(sh: &Shared) -> NatsSession {
    let mut s = session();
    s.set_io_timeout(sh.cfg.io_timeout);
    s
}

fn tubes(sh: &Shared) -> Vec<Tube> {
    sh.cfg.tubes.iter().map(|t| tube(t)).collect()
}

fn cfg(concurrency: usize) -> Config {
    Config {
        concurrency,
        ..Config::default()
    }
}

/// A pull of `batch` from `tube`'s consumer, waiting (`EXPIRES`) or not.
fn pull(tube: &str, batch: u32, waits: bool) -> (String, String) {
    let wait = if waits {
        EXPIRES.to_owned()
    } else {
        "\"no_wait\":true".to_owned()
    };
    (
        format!("$JS.API.CONSUMER.MSG.NEXT.{STREAM}.taskq-{tube}"),
        format!("{{\"batch\":{batch},{wait}}}"),
    )
}

/// An ack (`+ACK`, `-NAK ...`) of delivery `delivered` of job `seq`.
fn ack(tube: &str, delivered: u64, seq: u64, body: &str) -> (String, String) {
    (ack_subject(tube, delivered, seq), body.to_owned())
}

/// What each `PUB` is: subject and body.
fn what(sent: &[Pub]) -> Vec<(String, String)> {
    sent.iter()
        .map(|p| (p.subject.clone(), p.body.clone()))
        .collect()
}

#[test]
fn one_pull_fills_the_window_and_its_deliveries_run_in_distinct_slots() {
    let mut r = Rig::new(cfg(3));
    let sent = r.send(0);
    // One tube: the pull waits the reserve slice for the whole room.
    assert_eq!(what(&sent), [pull("default", 3, true)]);
    assert!(sent[0].reply.is_some());
    assert!(
        r.send(1).is_empty(),
        "no second pull while one is under way"
    );
    let runs = r.take(
        2,
        &[job("default", 11, 1, "a"), job("default", 12, 3, "b")].concat(),
    );
    assert_eq!(runs.len(), 2);
    assert_ne!(runs[0].slot, runs[1].slot);
    assert_eq!(
        runs.iter()
            .map(|r| (r.id, r.tube, r.attempt, r.body.as_str()))
            .collect::<Vec<_>>(),
        [(11, 0, 1, "a"), (12, 0, 3, "b")]
    );
    assert!(r.send(3).is_empty(), "the pull may still bring one");
    let last = r.take(4, &job("default", 13, 1, "c"));
    assert_eq!(last.len(), 1);
    assert!(!runs.iter().any(|x| x.slot == last[0].slot));
    assert_eq!(r.m.running(), 3);
    // The pull is over and the window full: nothing to ask for.
    assert!(r.send(5).is_empty());
    assert_eq!(r.counts().reserved, 3);
    // One ends: its ack, then a pull for the one slot free.
    r.finish(&runs[1], Outcome::Done);
    assert_eq!(
        what(&r.send(6)),
        [ack("default", 3, 12, "+ACK"), pull("default", 1, true)]
    );
    // The slot it freed is the one the next job runs in.
    let next = r.take(7, &job("default", 14, 1, "d"));
    assert_eq!(next[0].slot, runs[1].slot);
}

#[test]
fn an_ack_counts_only_on_its_own_confirmation() {
    let mut r = Rig::new(cfg(2));
    r.send(0);
    let runs = r.take(
        1,
        &[job("default", 5, 1, "x"), job("default", 6, 1, "y")].concat(),
    );
    r.finish(&runs[0], Outcome::Done);
    let first = r.send(2);
    assert_eq!(
        what(&first),
        [ack("default", 1, 5, "+ACK"), pull("default", 1, true)]
    );
    r.finish(&runs[1], Outcome::Fail);
    // The room freed while the first pull waits is asked for at once, by
    // a second waiting pull behind it.
    let second = r.send(3);
    assert_eq!(
        what(&second),
        [
            ack("default", 1, 6, "-NAK {\"delay\":1000000000}"),
            pull("default", 1, true)
        ]
    );
    let (done, nak) = (first[0].token(), second[0].token());
    assert_ne!(done, nak);
    let c = r.counts();
    assert_eq!(
        (c.deleted, c.released),
        (0, 0),
        "nothing before a confirmation"
    );
    // A confirmation under a token nobody owes: read past by the session,
    // and nothing to the machine either.
    r.take(4, &confirm(99));
    assert_eq!(
        r.m.on_delivery(&r.sh, r.at(4), Delivery::Confirmed(99), None, false, 0),
        Ok(JsStep::Nothing)
    );
    let c = r.counts();
    assert_eq!((c.deleted, c.released), (0, 0));
    // Out of order: the -NAK's first counts job 6's release only.
    r.take(5, &confirm(nak));
    let c = r.counts();
    assert_eq!((c.deleted, c.released), (0, 1));
    r.take(6, &confirm(done));
    let c = r.counts();
    assert_eq!((c.deleted, c.released), (1, 1));
    // The same token again counts nothing more.
    assert_eq!(
        r.m.on_delivery(&r.sh, r.at(7), Delivery::Confirmed(done), None, false, 0),
        Ok(JsStep::Nothing)
    );
    let c = r.counts();
    assert_eq!((c.deleted, c.released, c.unexpected_replies), (1, 1, 0));
}

#[test]
fn a_failure_naks_with_the_backoff_and_the_last_attempt_is_copied_then_acked() {
    let cfg = Config {
        max_attempts: 3,
        ..cfg(1)
    };
    let mut r = Rig::new(cfg);
    assert_eq!(what(&r.send(0)), [pull("default", 1, true)]);
    // Attempts 1 and 2: back with the doubling backoff (1 s, 2 s).
    let mut at = 1;
    for (delivered, nak) in [
        (1, "-NAK {\"delay\":1000000000}"),
        (2, "-NAK {\"delay\":2000000000}"),
    ] {
        let run = r.take(at, &job("default", 7, delivered, "j"));
        assert_eq!(run[0].attempt, delivered as u32);
        r.finish(&run[0], Outcome::Fail);
        assert_eq!(r.m.next_copy(), None);
        let sent = r.send(at + 1);
        assert_eq!(
            what(&sent),
            [ack("default", delivered, 7, nak), pull("default", 1, true)]
        );
        r.take(at + 2, &confirm(sent[0].token()));
        at += 10;
    }
    assert_eq!(r.counts().released, 2);
    // The last attempt: buried, its copy first.
    let run = r.take(at, &job("default", 7, 3, "j"));
    assert_eq!(run[0].attempt, 3);
    r.finish(&run[0], Outcome::Fail);
    assert_eq!(r.m.next_copy(), Some((7, 0)));
    assert_eq!(
        what(&r.send(at + 1)),
        [pull("default", 1, true)],
        "not acked before its copy is stored"
    );
    assert_eq!(r.m.next_copy(), Some((7, 0)), "still owed its copy");
    r.m.copied(&r.sh, true);
    assert_eq!(r.m.next_copy(), None);
    let sent = r.send(at + 2);
    assert_eq!(what(&sent), [ack("default", 3, 7, "+ACK")]);
    assert_eq!(r.counts().buried, 0, "not buried before the confirmation");
    r.take(at + 3, &confirm(sent[0].token()));
    let c = r.counts();
    assert_eq!((c.buried, c.deleted, c.released), (1, 0, 2));
    // A copy that cannot be stored: the job comes back after its lease.
    let run = r.take(at + 10, &job("default", 8, 3, "k"));
    r.finish(&run[0], Outcome::Fail);
    assert_eq!(r.m.next_copy(), Some((8, 0)));
    r.m.copied(&r.sh, false);
    assert_eq!(r.m.next_copy(), None);
    assert_eq!(what(&r.send(at + 11)), [pull("default", 1, true)]);
    let c = r.counts();
    assert_eq!((c.lease_dropped, c.buried, c.deleted), (1, 1, 0));
}

#[test]
fn a_job_over_max_job_size_is_terminated_unrun_and_counted_buried_on_confirmation() {
    let cfg = Config {
        limits: Limits {
            max_job_size: 10,
            ..Limits::default()
        },
        ..cfg(1)
    };
    let mut r = Rig::new(cfg);
    r.send(0);
    let runs = r.take(1, &job("default", 3, 1, "01234567890123456789"));
    assert!(runs.is_empty(), "never run");
    assert_eq!(r.m.running(), 0);
    assert_eq!(r.m.next_copy(), None, "no copy of a job too big");
    let sent = r.send(2);
    assert_eq!(
        what(&sent),
        [ack("default", 1, 3, "+TERM"), pull("default", 1, true)]
    );
    let c = r.counts();
    assert_eq!((c.too_big, c.buried), (1, 0));
    r.take(3, &confirm(sent[0].token()));
    let c = r.counts();
    assert_eq!((c.too_big, c.buried, c.deleted), (1, 1, 0));
    // One at the limit runs.
    let runs = r.take(4, &job("default", 4, 1, "0123456789"));
    assert_eq!(runs.len(), 1);
}

#[test]
fn acks_unconfirmed_at_a_break_go_first_on_the_next_connection_and_count_once() {
    let mut r = Rig::new(cfg(2));
    r.send(0);
    let runs = r.take(
        1,
        &[job("default", 7, 1, "a"), job("default", 8, 2, "b")].concat(),
    );
    r.finish(&runs[0], Outcome::Done);
    r.finish(&runs[1], Outcome::Fail);
    let sent = r.send(2);
    assert_eq!(
        what(&sent),
        [
            ack("default", 1, 7, "+ACK"),
            ack("default", 2, 8, "-NAK {\"delay\":2000000000}"),
            pull("default", 2, true)
        ]
    );
    r.reconnect(3, 4);
    let c = r.counts();
    // Nothing resolved before the new connection's first write.
    assert_eq!(
        (
            c.deleted,
            c.released,
            c.ack_unknown,
            c.lease_dropped,
            c.reconnects
        ),
        (0, 0, 0, 0, 1),
        "carried, not counted"
    );
    let resent = r.send(4);
    assert_eq!(
        what(&resent),
        [
            ack("default", 1, 7, "+ACK"),
            ack("default", 2, 8, "-NAK {\"delay\":2000000000}"),
            pull("default", 2, true)
        ]
    );
    r.take(
        5,
        &[confirm(resent[1].token()), confirm(resent[0].token())].concat(),
    );
    let c = r.counts();
    assert_eq!((c.acks_resent, c.deleted, c.released), (2, 1, 1));
    // Each once: the tokens of the broken connection count nothing now.
    for t in [sent[0].token(), sent[1].token(), resent[0].token()] {
        assert_eq!(
            r.m.on_delivery(&r.sh, r.at(6), Delivery::Confirmed(t), None, false, 0),
            Ok(JsStep::Nothing)
        );
    }
    let c = r.counts();
    assert_eq!((c.acks_resent, c.deleted, c.released), (2, 1, 1));
}

#[test]
fn a_carried_ack_whose_lease_has_ended_at_the_reconnect_is_given_up() {
    let mut r = Rig::new(cfg(1));
    r.send(0);
    // Job 1 pulled at 0 (its lease ends at 30 s), job 2 by a pull at 10 s.
    let a = r.take(1, &job("default", 1, 1, "a"));
    r.finish(&a[0], Outcome::Done);
    let sent = r.send(10_000);
    assert_eq!(
        what(&sent),
        [ack("default", 1, 1, "+ACK"), pull("default", 1, true)]
    );
    let b = r.take(10_001, &job("default", 2, 1, "b"));
    r.finish(&b[0], Outcome::Done);
    assert_eq!(
        what(&r.send(10_002)),
        [ack("default", 1, 2, "+ACK"), pull("default", 1, true)]
    );
    // Back at 35 s: job 1's lease may have ended, job 2's runs to 40 s.
    r.reconnect(10_003, 35_000);
    let resent = r.send(35_000);
    let c = r.counts();
    assert_eq!((c.ack_unknown, c.deleted, c.acks_resent), (1, 0, 0));
    assert_eq!(
        what(&resent),
        [ack("default", 1, 2, "+ACK"), pull("default", 1, true)]
    );
    r.take(35_001, &confirm(resent[0].token()));
    let c = r.counts();
    assert_eq!((c.ack_unknown, c.deleted, c.acks_resent), (1, 1, 1));
}

#[test]
fn a_confirmed_touch_restarts_the_lease_a_carried_ack_is_kept_for() {
    let mut r = Rig::new(cfg(1));
    r.send(0);
    let run = r.take(1, &job("default", 4, 1, "t"));
    r.m.handler_asks(run[0].slot, 4, Asked::Touch);
    let sent = r.send(5_000);
    assert_eq!(what(&sent), [ack("default", 1, 4, "+WPI")]);
    assert_eq!(r.counts().touched, 0);
    assert!(r.m.answered().is_none(), "answered on its confirmation");
    r.take(5_001, &confirm(sent[0].token()));
    assert!(matches!(r.m.answered(), Some((s, 4, Answered::Touch(Ok(())))) if s == run[0].slot));
    assert_eq!(r.counts().touched, 1);
    r.finish(&run[0], Outcome::Done);
    assert_eq!(
        what(&r.send(6_000)),
        [ack("default", 1, 4, "+ACK"), pull("default", 1, true)]
    );
    // Past the first lease (30 s), within the one the touch began (35 s).
    r.reconnect(6_001, 32_000);
    assert_eq!(r.counts().ack_unknown, 0);
    assert_eq!(
        what(&r.send(32_000)),
        [ack("default", 1, 4, "+ACK"), pull("default", 1, true)]
    );
}

#[test]
fn a_touch_owed_at_a_break_or_asked_on_none_fails_at_once() {
    let mut r = Rig::new(cfg(1));
    r.send(0);
    let run = r.take(1, &job("default", 4, 1, "t"));
    r.m.handler_asks(run[0].slot, 4, Asked::Touch);
    assert_eq!(what(&r.send(2)), [ack("default", 1, 4, "+WPI")]);
    r.m.broke(&r.sh, r.at(3), 0);
    assert!(matches!(
        r.m.answered(),
        Some((_, 4, Answered::Touch(Err(JobError::Connection(_)))))
    ));
    r.m.handler_asks(run[0].slot, 4, Asked::Touch);
    assert!(matches!(
        r.m.answered(),
        Some((_, 4, Answered::Touch(Err(JobError::Connection(_)))))
    ));
    assert!(r.m.answered().is_none());
    assert_eq!(r.counts().touched, 0);
    // On the next connection, a touch asked and not written yet when that
    // one breaks too: answered now, not whenever a connection comes back,
    // and never sent.
    r.reconnect(4, 1_000);
    r.m.handler_asks(run[0].slot, 4, Asked::Touch);
    r.reconnect(1_001, 2_000);
    assert!(matches!(
        r.m.answered(),
        Some((_, 4, Answered::Touch(Err(JobError::Connection(_)))))
    ));
    assert!(r.m.answered().is_none());
    let sent = what(&r.send(2_000));
    assert!(
        !sent.iter().any(|(_, body)| body.contains("+WPI")),
        "{sent:?}"
    );
}

#[test]
fn the_reply_deadline_is_the_oldest_confirmation_or_the_waiting_pulls_expiry() {
    let cfg = Config {
        io_timeout: Duration::from_secs(5),
        ..cfg(2)
    };
    let mut r = Rig::new(cfg);
    r.send(0);
    // The waiting pull: probed at its expiry (1.137 s) plus the grace
    // (half the I/O timeout).
    assert_eq!(r.due(r.at(0)), Some(r.at(3_637)));
    let runs = r.take(
        10,
        &[job("default", 1, 1, "a"), job("default", 2, 1, "b")].concat(),
    );
    assert_eq!(r.due(r.at(10)), None, "nothing owed");
    assert!(!r.overdue(r.at(60_000)));
    r.finish(&runs[0], Outcome::Done);
    let first = r.send(100);
    r.finish(&runs[1], Outcome::Done);
    let second = r.send(300);
    // Each: an ack and a waiting pull for the slot it freed.
    assert_eq!((first.len(), second.len()), (2, 2));
    // The first pull is probed at 100 + 3.637 s; the probe's PONG is owed
    // (it does not come here), and the pull is due at its expiry plus the
    // I/O timeout.
    assert_eq!(r.due(r.at(300)), Some(r.at(3_737)));
    assert!(!r.overdue(r.at(3_737)));
    assert_eq!(r.send(3_737)[0].subject, "PING");
    // The oldest confirmation (100 + 5 s) is before the pull's (100 + 6.137 s).
    assert_eq!(r.due(r.at(3_737)), Some(r.at(5_100)));
    r.take(400, &confirm(first[0].token()));
    assert_eq!(r.due(r.at(400)), Some(r.at(5_300)));
    assert_eq!(r.counts().deleted, 1);
    assert!(!r.overdue(r.at(5_300) - MS));
    assert_eq!(r.counts().io_timeouts, 0);
    assert!(r.overdue(r.at(5_300)));
    let c = r.counts();
    assert_eq!((c.io_timeouts, c.deleted, c.ack_unknown), (1, 1, 0));
    // Down: no more timeouts of this connection, a reconnect at once
    // (there was progress).
    assert!(!r.overdue(r.at(20_000)));
    assert_eq!(r.counts().io_timeouts, 1);
    assert!(r.m.wants_connect(&r.sh, r.at(5_300)));
}

#[test]
fn a_no_wait_pulls_deadline_is_the_io_timeout() {
    let cfg = Config {
        io_timeout: Duration::from_secs(5),
        tubes: vec!["a".into(), "b".into()],
        ..cfg(1)
    };
    let mut r = Rig::new(cfg);
    let sent = r.send(0);
    // Two tubes: each is tried without waiting before the last one waits.
    assert_eq!(what(&sent), [pull("b", 1, false)]);
    // Probed after the grace (2.5 s), due after the I/O timeout.
    assert_eq!(r.due(r.at(0)), Some(r.at(2_500)));
    r.take(10, &status(sent[0].token(), "404 No Messages"));
    let sent = r.send(10);
    assert_eq!(what(&sent), [pull("a", 1, true)]);
    assert_eq!(r.due(r.at(10)), Some(r.at(3_647)));
    assert!(!r.overdue(r.at(3_647)));
    assert_eq!(r.send(3_647)[0].subject, "PING");
    assert_eq!(r.due(r.at(3_647)), Some(r.at(6_147)));
    assert!(!r.overdue(r.at(6_147) - MS));
    assert!(r.overdue(r.at(6_147)));
    assert_eq!(r.counts().io_timeouts, 1);
}

/// A pull no status ended by its expiry plus the grace is probed with a
/// `PING` in the next write, once; the `PONG` coming while it is still
/// under way ends it as never taken, with the connection kept, and the
/// pull is asked again after the pause. The grace is at most half the I/O
/// timeout, and nothing is probed for a pull that ended meanwhile.
#[test]
fn a_pull_never_answered_is_probed_and_its_pong_ends_it_without_a_break() {
    let cfg = Config {
        io_timeout: Duration::from_millis(1_200),
        ..cfg(1)
    };
    let mut r = Rig::new(cfg);
    let sent = r.send(0);
    assert_eq!(what(&sent), [pull("default", 1, true)]);
    // Expiry 1.137 s, grace 0.6 s (half the I/O timeout).
    assert_eq!(r.due(r.at(0)), Some(r.at(1_737)));
    assert!(!r.overdue(r.at(1_736)));
    assert!(r.send(1_736).is_empty());
    assert!(!r.overdue(r.at(1_737)));
    assert_eq!(what(&r.send(1_737)), [("PING".to_owned(), String::new())]);
    // Once: what is due next is the pull itself, at expiry + I/O timeout.
    assert!(!r.overdue(r.at(1_837)));
    assert!(r.send(1_837).is_empty());
    assert_eq!(r.due(r.at(1_837)), Some(r.at(2_337)));
    // The PONG: the pull is over, the connection stays.
    r.take(1_887, b"PONG\r\n");
    let again = r.at(1_887) + UNAVAILABLE_PAUSE;
    assert_eq!(r.due(r.at(1_887)), Some(again));
    let after = u64::try_from((again - r.t0).as_millis()).unwrap();
    assert!(!r.overdue(r.at(after)));
    let sent = r.send(after);
    assert_eq!(what(&sent), [pull("default", 1, true)]);
    let c = r.counts();
    assert_eq!(
        (c.io_timeouts, c.reconnects, c.unexpected_replies),
        (0, 0, 0)
    );
    // A pull ended by its status before the probe went: no probe.
    let t = after + 1_600;
    assert!(!r.overdue(r.at(t)));
    r.take(t + 1, &status(sent[0].token(), "408 Request Timeout"));
    let sent = r.send(t + 2);
    assert!(sent.iter().all(|p| p.subject != "PING"), "{sent:?}");
}

/// One slot, its pull sent at 0 and ended at 1,800 ms by its probe's
/// `PONG` (the server's `408` not come): the server may still hold it.
fn probed_at_1800() -> Rig {
    let cfg = Config {
        io_timeout: Duration::from_millis(1_200),
        ..cfg(1)
    };
    let mut r = Rig::new(cfg);
    assert_eq!(what(&r.send(0)), [pull("default", 1, true)]);
    assert!(!r.overdue(r.at(1_737)));
    assert_eq!(what(&r.send(1_737)), [("PING".to_owned(), String::new())]);
    assert!(r.take(1_800, b"PONG\r\n").is_empty());
    r
}

/// A message for a pull the machine ended first (its probe's PONG came
/// before the server's own answer) is run in a free slot, not dropped,
/// even with nothing owed; with no slot free it goes straight back.
#[test]
fn a_delivery_for_a_pull_its_probe_ended_is_run_not_dropped() {
    let mut r = probed_at_1800();
    assert!(!r.wire.pulling(), "nothing owed");
    // The server had the pull after all: its job comes now.
    let runs = r.take(1_850, &job("default", 7, 1, "late"));
    assert_eq!(runs.len(), 1);
    assert_eq!((runs[0].id, runs[0].body.as_str()), (7, "late"));
    assert_eq!(r.counts().reserved, 1);
    // Another, while the one slot is taken: back at once, not run.
    assert!(r.take(1_860, &job("default", 8, 1, "later")).is_empty());
    let sent = r.send(1_870);
    assert!(
        sent.iter()
            .any(|p| p.subject == ack_subject("default", 1, 8) && p.body.starts_with("-NAK")),
        "{sent:?}"
    );
    r.finish(&runs[0], Outcome::Done);
    let sent = r.send(1_880);
    assert!(sent
        .iter()
        .any(|p| p.subject == ack_subject("default", 1, 7)));
    let c = r.counts();
    assert_eq!((c.reserved, c.io_timeouts, c.unexpected_replies), (1, 0, 0));
}

/// A message read while a pull its probe ended may still deliver has its
/// lease counted from when that pull was sent, not from when it was read:
/// the server's ack wait may have started that early. Its settle, decided
/// while the connection is down and past that lease, is given up (the job
/// comes back) rather than sent late. Counted from the read, it would have
/// been sent.
#[test]
fn a_strays_lease_counts_from_the_pull_its_probe_ended() {
    let mut r = probed_at_1800();
    assert!(r.wire.strays_possible());
    let read = 5_000;
    let runs = r.take(read, &job("default", 7, 1, "late"));
    assert_eq!(runs.len(), 1);
    // Down, and the job done after the pull's lease and before the read's.
    let done = u64::try_from(ACK_WAIT.as_millis()).unwrap() + read / 2;
    r.m.broke(&r.sh, r.at(read + 100), 0);
    r.finish(&runs[0], Outcome::Done);
    assert!(r.m.wants_connect(&r.sh, r.at(done)));
    r.wire = wire(&r.sh);
    let tubes = tubes(&r.sh);
    r.m.connected(&r.sh, r.at(done), STREAM, tubes);
    let sent = r.send(done + 1);
    assert!(
        sent.iter()
            .all(|p| p.subject != ack_subject("default", 1, 7)),
        "{sent:?}"
    );
    let c = r.counts();
    assert_eq!((c.reserved, c.lease_dropped, c.deleted), (1, 1, 0));
}

#[test]
fn after_a_stop_no_pull_goes_a_late_delivery_is_naked_back_and_then_it_is_done() {
    let mut r = Rig::new(cfg(2));
    let sent = r.send(0);
    assert_eq!(what(&sent), [pull("default", 2, true)]);
    let runs = r.take(1, &job("default", 1, 1, "a"));
    assert_eq!(runs.len(), 1);
    r.sh.shutdown();
    assert!(!r.m.is_done(&r.sh), "job 1 runs");
    // The pull brings one more after the stop: back untouched, never run.
    let late = r.take(2, &job("default", 2, 1, "b"));
    assert!(late.is_empty());
    let sent = r.send(3);
    assert_eq!(what(&sent), [ack("default", 1, 2, "-NAK")]);
    assert!(!r.m.is_done(&r.sh));
    r.take(4, &confirm(sent[0].token()));
    assert_eq!(r.counts().released, 1);
    assert!(!r.m.is_done(&r.sh), "job 1 still runs");
    r.finish(&runs[0], Outcome::Done);
    let sent = r.send(5);
    assert_eq!(
        what(&sent),
        [ack("default", 1, 1, "+ACK")],
        "no pull after the stop"
    );
    assert!(!r.m.is_done(&r.sh), "its ack is owed");
    r.take(6, &confirm(sent[0].token()));
    assert!(r.m.is_done(&r.sh));
    assert!(r.send(7).is_empty());
    assert!(!r.m.wants_connect(&r.sh, r.at(7)));
    let c = r.counts();
    assert_eq!((c.reserved, c.deleted, c.released), (2, 1, 1));
}

#[test]
fn a_stop_with_nothing_running_queues_no_pull() {
    let mut r = Rig::new(cfg(2));
    r.sh.shutdown();
    assert!(r.send(0).is_empty());
    assert!(!r.wire.pulling());
    assert!(r.m.is_done(&r.sh));
}

#[test]
fn an_empty_wait_with_nothing_running_asks_for_the_idle_check_before_pulling_again() {
    let cfg = Config {
        exit_when_idle: Some(Duration::from_millis(100)),
        ..cfg(1)
    };
    let mut r = Rig::new(cfg);
    let sent = r.send(0);
    assert!(!r.m.wants_idle_check());
    r.take(1_000, &status(sent[0].token(), "408 Request Timeout"));
    assert_eq!(r.counts().reserve_timeouts, 1);
    assert!(r.m.wants_idle_check());
    assert!(r.send(1_001).is_empty(), "no pull until it is answered");
    assert!(!r.m.is_idle(&r.sh, r.at(1_001)), "not known quiet yet");
    // Jobs are still out: busy, and the pulls go on.
    r.m.idle_checked(r.at(1_002), Some(true));
    assert!(!r.m.wants_idle_check());
    assert!(!r.m.is_idle(&r.sh, r.at(1_050)));
    let sent = r.send(1_003);
    assert_eq!(what(&sent), [pull("default", 1, true)]);
    r.take(2_003, &status(sent[0].token(), "408 Request Timeout"));
    assert!(r.m.wants_idle_check());
    r.m.idle_checked(r.at(2_004), Some(false));
    assert!(r.m.is_idle(&r.sh, r.at(2_004)));
    assert_eq!(what(&r.send(2_005)), [pull("default", 1, true)]);
}

#[test]
fn an_empty_wait_while_a_job_runs_asks_for_no_idle_check() {
    let cfg = Config {
        exit_when_idle: Some(Duration::from_millis(100)),
        ..cfg(2)
    };
    let mut r = Rig::new(cfg);
    let sent = r.send(0);
    let runs = r.take(1, &job("default", 1, 1, "a"));
    assert_eq!(runs.len(), 1);
    r.take(1_000, &status(sent[0].token(), "408 Request Timeout"));
    assert!(!r.m.wants_idle_check());
    assert_eq!(what(&r.send(1_001)), [pull("default", 1, true)]);
}

#[test]
fn a_pull_the_cluster_cannot_serve_is_tried_again_after_the_pause() {
    for line in ["409 Leadership Change", "503"] {
        let mut r = Rig::new(cfg(1));
        let sent = r.send(0);
        r.take(10, &status(sent[0].token(), line));
        let again = r.at(10) + UNAVAILABLE_PAUSE;
        assert_eq!(r.due(r.at(10)), Some(again), "{line}");
        assert!(r.send(11).is_empty(), "{line}");
        let before = u64::try_from((again - r.t0 - MS).as_millis()).unwrap();
        assert!(r.send(before).is_empty(), "{line}");
        let after = u64::try_from((again - r.t0).as_millis()).unwrap();
        assert_eq!(what(&r.send(after)), [pull("default", 1, true)], "{line}");
        let c = r.counts();
        assert_eq!((c.reserve_timeouts, c.unexpected_replies), (0, 0), "{line}");
    }
}

#[test]
fn a_weighted_turns_pull_asks_at_most_its_jobs_left_without_waiting() {
    let mut cfg = cfg(8);
    cfg.set_tubes(&["vip:4", "standard:1"]).unwrap();
    cfg.run_scale = 1;
    let mut r = Rig::new(cfg);
    // Runs of 4 and 1; server 0 starts on vip: 4 of the 8 free.
    let sent = r.send(0);
    assert_eq!(what(&sent), [pull("vip", 4, false)]);
    let jobs: Vec<u8> = (1..=4).flat_map(|s| job("vip", s, 1, "v")).collect();
    let runs = r.take(1, &jobs);
    assert_eq!(runs.iter().map(|r| r.tube).collect::<Vec<_>>(), [0; 4]);
    // Vip's run is over: standard's turn, one job.
    let sent = r.send(2);
    assert_eq!(what(&sent), [pull("standard", 1, false)]);
    let s = r.take(3, &job("standard", 5, 1, "s"));
    assert_eq!(s[0].tube, 1);
    // Vip again, at most the room: 3 of 4.
    assert_eq!(what(&r.send(4)), [pull("vip", 3, false)]);
}

#[test]
fn a_weighted_fallback_run_ends_after_the_jobs_left_of_its_turn() {
    let mut cfg = cfg(4);
    cfg.set_tubes(&["vip:4", "standard:1"]).unwrap();
    cfg.run_scale = 1;
    let mut r = Rig::new(cfg);
    let sent = r.send(0);
    assert_eq!(what(&sent), [pull("vip", 4, false)]);
    // Vip has nothing ready: the rest of its run (4 jobs) is a fallback run
    // over every tube.
    r.take(1, &status(sent[0].token(), "404 No Messages"));
    let sent = r.send(2);
    assert_eq!(what(&sent), [pull("standard", 4, false)]);
    let jobs: Vec<u8> = (1..=4).flat_map(|s| job("standard", s, 1, "s")).collect();
    let runs = r.take(3, &jobs);
    assert_eq!(runs.len(), 4);
    for run in &runs {
        r.finish(run, Outcome::Done);
    }
    // Four jobs taken in the fallback run: it is over, and standard's turn
    // (one job, without waiting) is next, as `fair::Schedule` and the
    // thread worker have it.
    let sent = r.send(4);
    assert_eq!(sent.len(), 5, "{sent:?}");
    assert_eq!(what(&sent[4..]), [pull("standard", 1, false)]);
}

#[test]
fn a_delayed_job_delivered_early_goes_back_unrun_and_is_no_attempt() {
    let mut r = Rig::new(cfg(1));
    let sent = r.send(0);
    // Ready in 2100: back for the time left, unconfirmed, uncounted.
    let early = r.take(
        1,
        &job_with("default", 9, 1, "Taskq-Ready-At: 4102444800000", "d"),
    );
    assert!(early.is_empty());
    assert_eq!(r.m.running(), 0);
    let back = r.send(2);
    assert_eq!(back.len(), 2, "{back:?}");
    assert_eq!(back[0].subject, ack_subject("default", 1, 9));
    assert_eq!(back[0].reply, None, "not confirmed");
    let nanos: u64 = back[0]
        .body
        .strip_prefix("-NAK {\"delay\":")
        .and_then(|b| b.strip_suffix('}'))
        .unwrap()
        .parse()
        .unwrap();
    assert!(nanos > 70 * 365 * 24 * 3600 * 1_000_000_000, "{nanos}");
    assert_eq!(what(&back[1..]), [pull("default", 1, true)]);
    assert_ne!(back[1].token(), sent[0].token());
    let c = r.counts();
    assert_eq!((c.reserved, c.released), (0, 0));
    // Delivered again once ready: its first attempt.
    let runs = r.take(3, &job_with("default", 9, 2, "Taskq-Ready-At: 1000", "d"));
    assert_eq!(runs.len(), 1);
    assert_eq!((runs[0].id, runs[0].attempt), (9, 1));
    assert_eq!(r.counts().reserved, 1);
}

#[test]
fn max_jobs_bounds_the_pull_and_stops_once_done_is_confirmed() {
    let cfg = Config {
        max_jobs: Some(2),
        ..cfg(4)
    };
    let mut r = Rig::new(cfg);
    let sent = r.send(0);
    assert_eq!(what(&sent), [pull("default", 2, true)]);
    let runs = r.take(
        1,
        &[job("default", 1, 1, "a"), job("default", 2, 1, "b")].concat(),
    );
    for run in &runs {
        r.finish(run, Outcome::Done);
    }
    let acks = r.send(2);
    assert_eq!(
        what(&acks),
        [ack("default", 1, 1, "+ACK"), ack("default", 1, 2, "+ACK")],
        "no ticket left for a pull"
    );
    assert!(!r.sh.stop.load(Ordering::SeqCst));
    r.take(
        3,
        &[confirm(acks[0].token()), confirm(acks[1].token())].concat(),
    );
    assert!(r.sh.stop.load(Ordering::SeqCst));
    assert!(r.m.is_done(&r.sh));
}

#[test]
fn carried_acks_go_before_those_decided_while_down() {
    let mut r = Rig::new(cfg(2));
    r.send(0);
    let runs = r.take(
        1,
        &[job("default", 1, 1, "a"), job("default", 2, 1, "b")].concat(),
    );
    r.finish(&runs[0], Outcome::Done);
    assert_eq!(
        what(&r.send(2)),
        [ack("default", 1, 1, "+ACK"), pull("default", 1, true)]
    );
    r.m.broke(&r.sh, r.at(3), 0);
    // Job 2 ran on across the break; while down nothing is queued.
    assert_eq!(r.m.running(), 1);
    r.finish(&runs[1], Outcome::Done);
    assert_eq!(r.m.running(), 0);
    assert!(r.send(4).is_empty());
    r.wire = wire(&r.sh);
    let tubes = tubes(&r.sh);
    r.m.connected(&r.sh, r.at(5), STREAM, tubes);
    let sent = r.send(5);
    assert_eq!(
        what(&sent),
        [
            ack("default", 1, 1, "+ACK"),
            ack("default", 1, 2, "+ACK"),
            pull("default", 2, true)
        ]
    );
    r.take(
        6,
        &[confirm(sent[0].token()), confirm(sent[1].token())].concat(),
    );
    let c = r.counts();
    // Only job 1's ack was sent on the broken connection.
    assert_eq!((c.acks_resent, c.deleted, c.ack_unknown), (1, 2, 0));
}

#[test]
fn a_retry_naks_with_its_delay_and_a_bury_asked_for_is_copied_first() {
    let mut r = Rig::new(cfg(1));
    r.send(0);
    let run = r.take(1, &job("default", 3, 1, "r"));
    r.finish(
        &run[0],
        Outcome::Retry {
            delay: Duration::from_millis(1_500),
        },
    );
    assert_eq!(r.m.next_copy(), None);
    // Whole seconds, rounded up.
    let sent = r.send(2);
    assert_eq!(
        what(&sent),
        [
            ack("default", 1, 3, "-NAK {\"delay\":2000000000}"),
            pull("default", 1, true)
        ]
    );
    r.take(3, &confirm(sent[0].token()));
    // Not a failed attempt: the redelivery is still the first attempt.
    let run = r.take(4, &job("default", 3, 2, "r"));
    assert_eq!(run[0].attempt, 1);
    r.finish(&run[0], Outcome::Bury);
    assert_eq!(r.m.next_copy(), Some((3, 0)));
    assert_eq!(what(&r.send(5)), [pull("default", 1, true)]);
    r.m.copied(&r.sh, true);
    let sent = r.send(6);
    assert_eq!(what(&sent), [ack("default", 2, 3, "+ACK")]);
    r.take(7, &confirm(sent[0].token()));
    let c = r.counts();
    assert_eq!((c.released, c.buried, c.deleted), (1, 1, 0));
}

#[test]
fn a_delivery_on_a_subject_of_no_tube_breaks_the_connection() {
    let mut r = Rig::new(cfg(2));
    r.send(0);
    let (runs, broke) = r.recv(1, &job("other", 1, 1, "x"));
    assert!(runs.is_empty() && broke);
    assert_eq!(r.counts().unexpected_replies, 1);
    assert_eq!(r.m.running(), 0);
    assert!(r.send(2).is_empty(), "down: nothing queued");
}

#[test]
fn room_freed_while_a_pull_waits_is_asked_for_behind_it_and_each_status_ends_its_own_pull() {
    let mut r = Rig::new(cfg(4));
    let sent = r.send(0);
    assert_eq!(what(&sent), [pull("default", 4, true)]);
    let first = sent[0].token();
    // Two of four come and are done: their acks, and a pull for the two
    // slots the first pull no longer covers, behind it.
    let runs = r.take(
        1,
        &[job("default", 1, 1, "a"), job("default", 2, 1, "b")].concat(),
    );
    assert_eq!(runs.len(), 2);
    assert!(r.send(2).is_empty(), "the window is asked for in full");
    r.finish(&runs[0], Outcome::Done);
    r.finish(&runs[1], Outcome::Done);
    let sent = r.send(3);
    assert_eq!(
        what(&sent),
        [
            ack("default", 1, 1, "+ACK"),
            ack("default", 1, 2, "+ACK"),
            pull("default", 2, true)
        ]
    );
    let second = sent[2].token();
    // The first pull expires: only it ends; the next job answers the
    // second, and runs.
    let runs = r.take(4, &status(first, "408 Request Timeout"));
    assert!(runs.is_empty());
    // Its two slots are asked for again, behind the second pull.
    let third = r.send(5);
    assert_eq!(what(&third), [pull("default", 2, true)]);
    let runs = r.take(6, &job("default", 3, 1, "c"));
    assert_eq!(runs.len(), 1, "answers the second pull");
    assert_eq!(r.counts().reserve_timeouts, 1);
    // The second pull's status ends it, not a later one.
    r.take(7, &status(second, "408 Request Timeout"));
    assert_eq!(r.counts().reserve_timeouts, 2);
    assert_eq!(r.counts().unexpected_replies, 0);
}

#[test]
fn at_most_four_pulls_wait_in_a_row() {
    let mut r = Rig::new(cfg(8));
    assert_eq!(what(&r.send(0)), [pull("default", 8, true)]);
    let mut pulls = 1;
    for k in 0..6u64 {
        // A job comes (for the oldest pull) and is done: its slot is asked
        // for again while fewer than four pulls wait.
        let runs = r.take(10 * k + 1, &job("default", k + 1, 1, "x"));
        r.finish(&runs[0], Outcome::Done);
        let sent = r.send(10 * k + 2);
        let new = sent
            .iter()
            .filter(|p| p.subject.contains("MSG.NEXT"))
            .count();
        pulls += new;
        assert!(pulls <= 4, "{pulls} pulls under way");
    }
    assert_eq!(pulls, 4);
}

/// The acks waiting for a connection are checked against their leases when
/// the connection's first write goes, not when it came up: what the driver
/// did in between (an idle check, a copy) took time, and an ack sent after
/// its job's lease may have ended could land on the job given out again,
/// both runs counting as done. Given up instead, counted, the job back.
#[test]
fn acks_waiting_for_a_connection_are_checked_against_their_leases_at_its_first_write() {
    let mut r = Rig::new(cfg(2));
    r.send(0);
    // Both jobs pulled at 0: their leases end at 30 s.
    let runs = r.take(
        1,
        &[job("default", 1, 1, "a"), job("default", 2, 1, "b")].concat(),
    );
    r.finish(&runs[0], Outcome::Done);
    let sent = r.send(10);
    assert_eq!(what(&sent)[0], ack("default", 1, 1, "+ACK"));
    // Down with job 1's ack unconfirmed; job 2 is done while down.
    r.m.broke(&r.sh, r.at(20), 0);
    r.finish(&runs[1], Outcome::Done);
    // Up again within the leases; the first write goes 30 s - 50 ms, within
    // the margin of their end.
    r.wire = wire(&r.sh);
    let tubes = tubes(&r.sh);
    r.m.connected(&r.sh, r.at(29_000), STREAM, tubes);
    assert_eq!(r.counts().lease_dropped, 0, "not checked yet");
    let sent = r.send(29_950);
    assert!(
        sent.iter().all(|p| !p.subject.starts_with("$JS.ACK")),
        "{sent:?}"
    );
    let c = r.counts();
    assert_eq!(
        (c.acks_resent, c.ack_unknown, c.lease_dropped, c.deleted),
        (0, 1, 1, 0)
    );
}

#[test]
fn a_pause_that_ended_while_no_pull_may_go_is_no_deadline() {
    let mut r = Rig::new(cfg(2));
    let sent = r.send(0);
    assert_eq!(r.take(1, &job("default", 1, 1, "a")).len(), 1);
    // The server cannot serve the pull: the next waits a pause.
    r.take(10, &status(sent[0].token(), "409 Leadership Change"));
    r.sh.shutdown();
    // The pause is over, but after the stop no pull goes: the passed
    // pause is no deadline, or the driver would wake in a loop.
    assert!(r.send(300).is_empty());
    let now = r.at(300);
    let due = r.m.poll_timeout(&r.sh, now);
    assert!(due.is_none_or(|t| t > now), "{due:?}");
}

#[test]
fn a_job_delivered_again_while_its_handler_runs_is_not_run_twice_and_settles_on_the_new_delivery() {
    let mut r = Rig::new(cfg(2));
    let sent = r.send(0);
    let first = r.take(1, &job("default", 7, 1, "a"));
    assert_eq!(first.len(), 1);
    // The pull ends; the next one asks for the slot still free.
    r.take(1_137, &status(sent[0].token(), "408 Request Timeout"));
    assert_eq!(what(&r.send(31_000)), [pull("default", 1, true)]);
    // Job 7's lease ran out while its handler ran: the server gives it
    // out again, to this worker.
    let again = r.take(31_001, &job("default", 7, 2, "a"));
    assert!(again.is_empty(), "not run a second time");
    assert_eq!(r.m.running(), 1);
    assert_eq!(r.counts().reserved, 1);
    // Its end acks the newer delivery, once.
    r.finish(&first[0], Outcome::Done);
    let sent = r.send(31_002);
    assert_eq!(what(&sent)[0], ack("default", 2, 7, "+ACK"));
    assert_eq!(
        what(&sent).iter().filter(|p| p.1 == "+ACK").count(),
        1,
        "{:?}",
        what(&sent)
    );
}

#[test]
fn after_a_stop_an_ack_decided_at_a_break_goes_out_on_one_more_connection() {
    let mut r = Rig::new(cfg(1));
    r.send(0);
    let run = r.take(1, &job("default", 1, 1, "a"));
    r.sh.shutdown();
    r.m.broke(&r.sh, r.at(2), 0);
    r.finish(&run[0], Outcome::Done);
    // Not done: the server was reachable a moment ago; its ack is owed.
    assert!(!r.m.is_done(&r.sh));
    assert!(r.m.wants_connect(&r.sh, r.at(3)));
    r.wire = wire(&r.sh);
    let tubes = tubes(&r.sh);
    r.m.connected(&r.sh, r.at(3), STREAM, tubes);
    let sent = r.send(3);
    assert_eq!(what(&sent), [ack("default", 1, 1, "+ACK")]);
    r.take(4, &confirm(sent[0].token()));
    assert!(r.m.is_done(&r.sh));
    assert_eq!(r.counts().deleted, 1);
}

/// Jobs 1, 2 and 3, each delivered the first time.
fn three_jobs() -> Vec<u8> {
    [
        job("default", 1, 1, "a"),
        job("default", 2, 1, "b"),
        job("default", 3, 1, "c"),
    ]
    .concat()
}

/// Jobs 2 and 3 of [`three_jobs`], waiting: due TOUCH_AFTER after their
/// pull (sent at 0), and touched (`+WPI`) then. What was sent.
fn first_touches_of_2_and_3(r: &mut Rig) -> Vec<Pub> {
    assert_eq!(
        r.m.poll_timeout(&r.sh, r.at(2)),
        Some(r.at(0) + TOUCH_AFTER)
    );
    touches_of_2_and_3(r, 500)
}

/// What is sent at `ms`: the touches (`+WPI`) of jobs 2 and 3, and nothing else.
fn touches_of_2_and_3(r: &mut Rig, ms: u64) -> Vec<Pub> {
    let sent = r.send(ms);
    assert_eq!(
        what(&sent),
        [ack("default", 1, 2, "+WPI"), ack("default", 1, 3, "+WPI")],
        "at {ms} ms"
    );
    sent
}

/// A window of `prefetch` jobs on `concurrency` handlers.
fn prefetch(concurrency: usize, prefetch: usize) -> Config {
    Config {
        prefetch,
        ..cfg(concurrency)
    }
}

#[test]
fn with_prefetch_one_pull_fills_the_window_and_held_jobs_start_as_handlers_free() {
    let mut r = Rig::new(prefetch(1, 3));
    // The pull asks for the whole window, not for the handlers.
    assert_eq!(what(&r.send(0)), [pull("default", 3, true)]);
    let runs = r.take(
        1,
        &[
            job("default", 1, 1, "a"),
            job("default", 2, 2, "b"),
            job("default", 3, 1, "c"),
        ]
        .concat(),
    );
    // One handler: the first runs, the others wait in the order they came.
    assert_eq!(runs.iter().map(|r| r.id).collect::<Vec<_>>(), [1]);
    assert!(r.m.begun().is_none());
    r.finish(&runs[0], Outcome::Done);
    let b = r.m.begun().unwrap();
    assert_eq!((b.id, b.attempt, b.tube), (2, 2, Some(0)));
    assert!(r.m.begun().is_none());
    // The ack, and a pull for the one slot free.
    assert_eq!(
        what(&r.send(2)),
        [ack("default", 1, 1, "+ACK"), pull("default", 1, true)]
    );
    r.m.finished(&r.sh, b.slot, Outcome::Done, None);
    assert_eq!(r.m.begun().map(|b| b.id), Some(3));
}

#[test]
fn a_held_job_is_touched_while_it_waits_and_given_back_unstarted_after_hold_max_or_at_a_stop() {
    let mut r = Rig::new(prefetch(1, 3));
    r.send(0);
    let runs = r.take(1, &three_jobs());
    assert_eq!(runs.len(), 1);
    // Touched (+WPI) TOUCH_AFTER after the pull was sent, once until
    // confirmed; the lease restarts at the touch's send.
    let sent = first_touches_of_2_and_3(&mut r);
    assert!(r.send(600).is_empty(), "one touch owed each at a time");
    r.take(
        601,
        &[confirm(sent[0].token()), confirm(sent[1].token())].concat(),
    );
    assert_eq!(r.counts().touched, 2);
    assert_eq!(r.m.poll_timeout(&r.sh, r.at(601)), Some(r.at(1000)));
    // A stop: both held jobs go back at once, unstarted; the running one
    // finishes and is acked.
    r.sh.shutdown();
    let back = r.send(700);
    assert_eq!(
        what(&back),
        [ack("default", 1, 2, "-NAK"), ack("default", 1, 3, "-NAK")]
    );
    assert!(!r.m.is_done(&r.sh));
    r.finish(&runs[0], Outcome::Done);
    assert!(r.m.begun().is_none(), "nothing starts after a stop");
    let last = r.send(800);
    assert_eq!(what(&last), [ack("default", 1, 1, "+ACK")]);
    let tokens: Vec<u8> = back
        .iter()
        .chain(&last)
        .flat_map(|p| confirm(p.token()))
        .collect();
    r.take(801, &tokens);
    assert!(r.m.is_done(&r.sh));
    let c = r.counts();
    assert_eq!((c.deleted, c.released), (1, 2));

    // Held HOLD_MAX (each touch confirmed): given back unstarted.
    let mut r = Rig::new(prefetch(1, 2));
    r.send(0);
    r.take(
        1,
        &[job("default", 1, 1, "a"), job("default", 2, 1, "b")].concat(),
    );
    let mut t = 500;
    while t < HOLD_MAX.as_millis() as u64 {
        let sent = r.send(t);
        assert_eq!(what(&sent), [ack("default", 1, 2, "+WPI")], "at {t} ms");
        r.take(t, &confirm(sent[0].token()));
        t += 500;
    }
    // Its room is asked for again.
    assert_eq!(
        what(&r.send(t)),
        [ack("default", 1, 2, "-NAK"), pull("default", 1, true)]
    );
}

#[test]
fn held_jobs_wait_across_a_break_and_one_whose_ack_wait_ran_out_meanwhile_is_lost() {
    let mut r = Rig::new(prefetch(1, 3));
    r.send(0);
    let runs = r.take(1, &three_jobs());
    // JetStream keeps a job's lease across a break: the held jobs wait on,
    // touched on the next connection.
    r.reconnect(2, 400);
    assert_eq!(
        what(&r.send(500)),
        [ack("default", 1, 2, "+WPI"), ack("default", 1, 3, "+WPI")]
    );
    // No connection past their ack wait (30 s): the server may have given
    // them to another worker, so they are lost, never run here.
    let late = r.away_past_the_ack_wait(600);
    let sent = r.send(late);
    assert!(
        !what(&sent)
            .iter()
            .any(|(s, _)| s.contains(".2.2.") || s.contains(".3.3.")),
        "{sent:?}"
    );
    assert_eq!(r.counts().lost_lease_on_release, 2);
    r.finish(&runs[0], Outcome::Done);
    assert!(r.m.begun().is_none());
}

#[test]
fn handed_ahead_every_job_starts_at_once_and_its_lease_is_kept_until_its_thread_runs_it() {
    let mut r = Rig::blocking(prefetch(1, 3));
    assert_eq!(what(&r.send(0)), [pull("default", 3, true)]);
    let runs = r.take(1, &three_jobs());
    // All three go to the handler threads' queue at once, one handler or not.
    assert_eq!(runs.iter().map(|r| r.id).collect::<Vec<_>>(), [1, 2, 3]);
    assert!(r.m.begun().is_none());
    // The thread runs job 1; jobs 2 and 3 wait in its queue, touched
    // (+WPI) TOUCH_AFTER after their pull, job 1 left to its handler.
    r.m.runs_now(runs[0].slot, 1);
    let sent = first_touches_of_2_and_3(&mut r);
    r.take(
        501,
        &[confirm(sent[0].token()), confirm(sent[1].token())].concat(),
    );
    // Never given back from here, however long they wait: touched on,
    // each at its touch age.
    let mut t = 1000;
    while t <= HOLD_MAX.as_millis() as u64 + 1000 {
        let sent = touches_of_2_and_3(&mut r, t);
        r.take(
            t,
            &[confirm(sent[0].token()), confirm(sent[1].token())].concat(),
        );
        t += 500;
    }
    // Job 2 runs: its lease is its handler's now; job 3's is still kept.
    r.m.runs_now(runs[1].slot, 2);
    let sent = r.send(t);
    assert_eq!(what(&sent), [ack("default", 1, 3, "+WPI")]);
    r.take(t, &confirm(sent[0].token()));
    // A stop: nothing goes back from here; job 3's thread gives it back
    // unrun, not an attempt, and job 1 is acked.
    r.sh.shutdown();
    assert!(r.send(t + 1).is_empty());
    r.finish(&runs[0], Outcome::Done);
    r.finish(&runs[2], crate::machine::UNSTARTED);
    let last = r.send(t + 2);
    assert_eq!(
        what(&last),
        [ack("default", 1, 1, "+ACK"), ack("default", 1, 3, "-NAK")]
    );
    r.take(
        t + 3,
        &[confirm(last[0].token()), confirm(last[1].token())].concat(),
    );
    assert!(!r.m.is_done(&r.sh), "job 2 still runs");
    r.finish(&runs[1], Outcome::Done);
    let end = r.send(t + 4);
    assert_eq!(what(&end), [ack("default", 1, 2, "+ACK")]);
    r.take(t + 5, &confirm(end[0].token()));
    assert!(r.m.is_done(&r.sh));
    let c = r.counts();
    assert_eq!((c.deleted, c.released), (2, 1));
}

#[test]
fn handed_ahead_a_job_whose_ack_wait_ran_out_in_the_queue_is_revoked_and_never_acked() {
    let mut r = Rig::blocking(prefetch(1, 2));
    r.send(0);
    let runs = r.take(
        1,
        &[job("default", 1, 1, "a"), job("default", 2, 1, "b")].concat(),
    );
    r.m.runs_now(runs[0].slot, 1);
    // No connection past job 2's ack wait: the server may give it out
    // again. Its thread is told not to run it; its slot stays taken until
    // that thread gives it back.
    let late = r.away_past_the_ack_wait(2);
    let sent = r.send(late);
    assert!(!what(&sent).iter().any(|(_, w)| w == "+WPI"), "{sent:?}");
    assert_eq!(r.m.revoked(), Some((runs[1].slot, 2)));
    assert_eq!(r.m.running(), 2);
    // Given back unrun: counted lost once, never acked (an ack of its old
    // delivery would settle the server's newer one).
    r.finish(&runs[1], crate::machine::UNSTARTED);
    assert_eq!(r.counts().lost_lease_on_release, 1);
    let sent = r.send(late + 1);
    assert!(
        !what(&sent).iter().any(|(s, _)| s.contains(".1.2.")),
        "{sent:?}"
    );
    assert_eq!(r.m.running(), 1);
}

#[test]
fn pulls_wait_for_confirmations_once_the_acks_owed_pass_the_window_and_its_slack() {
    // A window of one, and a server that confirms no ack: each job done is
    // acked and its room pulled again while the acks owed are at most the
    // window and ACKS_OVER; the next room waits for a confirmation.
    let mut r = Rig::new(cfg(1));
    assert_eq!(what(&r.send(0)), [pull("default", 1, true)]);
    let mut first = None;
    let owed_at_most = 1 + ACKS_OVER;
    for seq in 1..=owed_at_most as u64 + 1 {
        let t = 10 * seq;
        let runs = r.take(t, &job("default", seq, 1, "x"));
        r.finish(&runs[0], Outcome::Done);
        let sent = r.send(t + 1);
        first.get_or_insert(sent[0].token());
        if seq <= owed_at_most as u64 {
            assert_eq!(
                what(&sent),
                [ack("default", 1, seq, "+ACK"), pull("default", 1, true)],
                "job {seq}"
            );
        } else {
            assert_eq!(what(&sent), [ack("default", 1, seq, "+ACK")], "job {seq}");
        }
    }
    // One confirmation: room again.
    r.take(1_000, &confirm(first.unwrap()));
    assert_eq!(what(&r.send(1_001)), [pull("default", 1, true)]);
}
