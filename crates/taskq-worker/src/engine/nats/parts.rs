//! The JetStream link's parts: what it keeps of its tubes, its jobs and
//! what it read ahead, the pulls its asks became, and the small functions
//! between the loop's words and the wire's (acks, statuses, errors).

use std::collections::VecDeque;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use taskq_connect::nats::{ApiLink, JetStream, NatsConnection};
use taskq_connect::READY_AT_HEADER;
use taskq_proto::nats::schedule::SCHEDULER_HEADER;
use taskq_proto::nats::{AckKind, Delivery, HeaderBlock, NatsError};
use taskq_proto::ConnectionError;

use crate::config::Config;
use crate::engine::seam::{Ask, Carry, Pool, Settle, Unconfirmed};
use crate::fair::Want;

/// A tube's names on the stream, and its consumer's lease.
#[derive(Debug)]
pub(crate) struct Tube {
    pub(crate) name: String,
    pub(crate) subject: String,
    pub(crate) buried: String,
    pub(crate) consumer: String,
    pub(crate) ack_wait: Duration,
}

/// How much longer than the reserve slice a waiting pull lasts on the
/// server. nats-server before 2.11 (Debian's 2.9.10 among them) loses a
/// redelivery that falls due the moment the only waiting pull expires: it
/// drops the expired pull without its `408`, takes the message off its
/// redelivery queue without delivering it, and steps its cursor of new
/// messages back (so the last new one may be delivered twice); the lost job
/// comes back only after its ack wait (nats-server#5305, fixed in 2.11.0).
/// A release with a delay (a retry's backoff, `Outcome::Retry`) goes in the
/// same write as the next waiting pull, so a whole-second delay and a
/// whole-second slice fall due together by construction: this project's
/// tests on 2.9.10 saw the retried job wait out its ack wait that way. Past
/// the slice by 137 ms, the expiries of the pulls that follow miss delays
/// in whole seconds and tenths.
pub(crate) const PULL_EXPIRY_PAST_SLICE: Duration = Duration::from_millis(137);

/// A waiting pull's expiry on the server for `cfg`'s reserve slice (whole
/// seconds, at least one): the slice plus [`PULL_EXPIRY_PAST_SLICE`].
pub(crate) fn pull_expiry(cfg: &Config) -> Duration {
    Duration::from_secs(u64::from(cfg.reserve_secs())) + PULL_EXPIRY_PAST_SLICE
}

/// When a pull its probe ended may have started the leases of what it
/// delivers. The server may have held such a pull after all (its `408` was
/// late, not missing: `NatsSession::strays_possible`), and then a message
/// read later may be that pull's, whatever pull the session counts it
/// against: its lease may have started as early as that pull was sent.
/// Leases measured from later (the pull it is counted against, or the
/// read) would end later than the server's, and a touch or a carried ack
/// could then come after the server gave the job to someone else.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Strays(Option<Instant>);

impl Strays {
    /// A pull sent at `sent` was ended by its probe.
    pub(crate) fn ended(&mut self, sent: Instant) {
        self.0 = Some(self.0.map_or(sent, |s| s.min(sent)));
    }

    /// What the session says before a delivery is read: whether strays are
    /// still possible (forgotten once they are not).
    pub(crate) fn heard(&mut self, possible: bool) {
        if !possible {
            self.0 = None;
        }
    }

    /// The earliest a delivery counted against a pull sent at `pulled`
    /// (`None`: against none) may have started its lease; `None` when
    /// neither tells (a message no pull can have asked for).
    pub(crate) fn lease_start(&self, pulled: Option<Instant>) -> Option<Instant> {
        match (self.0, pulled) {
            (Some(s), Some(p)) => Some(s.min(p)),
            (s, p) => s.or(p),
        }
    }
}

/// How many delayed jobs given back early a link remembers.
const GIVEN_BACK_KEPT: usize = 1024;

/// Delayed jobs a connection gave back because they came before their
/// ready time: stream sequence and how many times, until taken (at most
/// `GIVEN_BACK_KEPT`, the oldest forgotten first). Those deliveries are
/// not attempts.
#[derive(Debug, Default)]
pub(crate) struct GivenBack(VecDeque<(u64, u64)>);

impl GivenBack {
    /// Notes that delayed job `seq` went back early once more.
    pub(crate) fn note(&mut self, seq: u64) {
        if let Some(n) = self.0.iter_mut().find(|(s, _)| *s == seq) {
            n.1 += 1;
            return;
        }
        if self.0.len() == GIVEN_BACK_KEPT {
            self.0.pop_front();
        }
        self.0.push_back((seq, 1));
    }

    /// How many deliveries of job `seq`, taken now on its `delivered`-th
    /// delivery, came before its ready time: as counted here; a delivery
    /// that is not the first of a delayed job with no count here went back
    /// early once (at another worker, or before this one forgot it). A job
    /// a message schedule published (`scheduled`) came at its time.
    pub(crate) fn early_deliveries(
        &mut self,
        seq: u64,
        delivered: u64,
        ready_at: Option<u64>,
        scheduled: bool,
    ) -> u64 {
        let counted = self
            .0
            .iter()
            .position(|(s, _)| *s == seq)
            .and_then(|i| self.0.remove(i))
            .map(|(_, n)| n);
        if ready_at.is_none() || scheduled {
            return 0;
        }
        counted.unwrap_or(u64::from(delivered > 1))
    }
}

/// The time left before a delayed job's ready time (Unix milliseconds),
/// when it came early.
pub(crate) fn not_ready(ready_at: Option<u64>) -> Option<Duration> {
    let at = ready_at?;
    let now = unix_ms();
    (at > now).then(|| Duration::from_millis(at - now))
}

/// What the worker knows of a job from its deliveries, in beanstalkd's
/// terms: every redelivery followed a `-NAK` or a lease that ran out; the
/// early deliveries of a delayed job are not attempts. The lease left runs
/// from `leased` for the consumer's `ack_wait`.
pub(crate) fn delivered_info(
    ack_wait: Duration,
    leased: Instant,
    delivered: u64,
    early: u64,
) -> crate::job_info::JobInfo {
    let left = ack_wait.saturating_sub(leased.elapsed());
    crate::job_info::JobInfo {
        pri: 0,
        ttr: ack_wait.as_secs().max(1),
        time_left: left.as_secs(),
        reserves: delivered,
        timeouts: 0,
        releases: delivered.saturating_sub(1).saturating_sub(early),
        buries: 0,
    }
}

/// The message id of job `seq`'s buried copy: derived from the original's
/// sequence, so that a bury repeated (after a failure) stores one copy.
pub(crate) fn bury_copy_id(stream: &str, seq: u64) -> String {
    format!("taskq-bury-{stream}-{seq}")
}

/// The headers a buried copy keeps of the stored job's `raw` header
/// block: all but its message id (the copy has its own).
pub(crate) fn kept_headers(raw: &[u8]) -> Vec<(&[u8], &[u8])> {
    let Some(h) = (!raw.is_empty())
        .then(|| HeaderBlock::parse(raw).ok())
        .flatten()
    else {
        return Vec::new();
    };
    h.iter()
        .filter(|(k, _)| !k.eq_ignore_ascii_case(b"Nats-Msg-Id"))
        .collect()
}

/// True while a tube's consumer has messages not yet delivered or
/// deliveries not acknowledged (held by a worker, or lost with a
/// connection and due again when their ack wait runs out): the worker is
/// not idle then. Over either driver's link.
///
/// A consumer's counts can lag its stream's: just after a stream leader
/// was elected, a consumer led elsewhere has reported nothing pending for
/// seconds while thousands of jobs were stored for it (2.9.10). So when
/// the consumer says none, the stream's own record is asked too: on a
/// work queue every job not yet acknowledged is stored on the tube's
/// subject. It is trusted only where every stored job will be delivered
/// again (no `max_deliver` limit), or a job past its last delivery would
/// keep the worker from ever being idle.
pub(crate) async fn jobs_out<L: ApiLink>(
    link: &mut L,
    stream: &str,
    tubes: &[Tube],
) -> Result<bool, NatsError> {
    let mut js = JetStream(link);
    for t in tubes {
        let ci = js.consumer_info(stream, &t.consumer).await?;
        if ci.num_pending != 0 || ci.num_ack_pending != 0 {
            tracing::debug!(
                tube = t.name,
                pending = ci.num_pending,
                ack_pending = ci.num_ack_pending,
                "nothing delivered, but jobs are still out"
            );
            return Ok(true);
        }
        if ci.max_deliver > 0 {
            continue;
        }
        let stored = js.subject_counts(stream, &t.subject).await?;
        if let Some(&n) = stored.get(&t.subject).filter(|&&n| n > 0) {
            tracing::debug!(
                tube = t.name,
                stored = n,
                "the consumer counts nothing out, but its stream holds jobs"
            );
            return Ok(true);
        }
    }
    Ok(false)
}

/// A job this link holds.
#[derive(Debug)]
pub(super) struct Held {
    pub(super) seq: u64,
    pub(super) tube: usize,
    /// Its ack subject.
    pub(super) ack: Vec<u8>,
    pub(super) delivered: u64,
    /// Its deliveries that came before its ready time and went back (a
    /// delay the client holds): not attempts.
    pub(super) early: u64,
    /// When its lease started, at the earliest: the pull that brought it was
    /// sent, or the last touch (`+WPI`) was. The server's ack wait runs
    /// from a moment no earlier.
    pub(super) leased: Instant,
    /// Larger than the worker's limit: set aside with `+TERM`, not copied.
    pub(super) too_big: bool,
}

/// A delivery read before its ask was.
#[derive(Debug)]
pub(super) struct Early {
    pub(super) subject: Vec<u8>,
    pub(super) ack: Vec<u8>,
    pub(super) body: Vec<u8>,
    /// Its header block, as sent (empty when it has none).
    pub(super) headers: Vec<u8>,
    pub(super) delivered: u64,
    pub(super) seq: u64,
    pub(super) ready_at: Option<u64>,
    /// A message schedule published it (at its time).
    pub(super) scheduled: bool,
    /// When the pull that brought it was sent.
    pub(super) pulled: Instant,
    /// Larger than the worker's limit (its size): its body was not kept.
    pub(super) too_big: Option<u64>,
}

impl Default for Early {
    fn default() -> Self {
        Early {
            subject: Vec::new(),
            ack: Vec::new(),
            body: Vec::new(),
            headers: Vec::new(),
            delivered: 0,
            seq: 0,
            ready_at: None,
            scheduled: false,
            pulled: Instant::now(),
            too_big: None,
        }
    }
}

/// The buffers deliveries are copied into, reused.
#[derive(Debug)]
pub(super) struct Buffers {
    /// For subjects and ack subjects: of deliveries read ahead, of jobs held
    /// and of settles owed their confirmation (an ack subject is kept until
    /// then, to be sent again if it does not come). Made with the
    /// connection, as many as the loop can have out at once and each long
    /// enough for any of taskq's subjects, so that a peak costs no
    /// allocation later.
    pub(super) names: Pool,
    /// For the bodies of deliveries read ahead; each grows to the largest
    /// body seen.
    pub(super) bodies: Pool,
    /// The worker's limit on a job's body (`max_job_size`): a larger one is
    /// not copied (nor grows the buffers): its job is terminated unrun.
    pub(super) max_body: usize,
}

/// A settle queued or sent, owed its answer.
#[derive(Debug)]
pub(super) enum Owed {
    /// The job was not held here: answered `NotFound` without asking.
    NotHeld,
    /// An ack sent with this confirmation token.
    Sent(u64, Unconfirmed),
}

/// How the pull under way ended, for the asks it did not answer with a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum End {
    /// Nothing ready (404/408).
    Empty,
    /// The cluster could not serve it (409, 503, another status).
    Unavailable,
}

/// The pull the asks of one write became. One pull is under way at a time;
/// asks written while one is are pulled for when it is over.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pull {
    pub(super) tube: usize,
    /// Asks it still owes an answer.
    pub(super) left: u32,
    /// The asks do not wait (a weighted turn, a refill): an empty pull
    /// answers them [`Took::TurnEmpty`](crate::engine::Took::TurnEmpty).
    pub(super) no_wait: bool,
    /// More tubes to try, after this one, for the asks this pull leaves
    /// unanswered: every tube is tried without waiting before the last one
    /// waits (unless the asks do not wait at all).
    pub(super) scan: usize,
    /// Sent to the server.
    pub(super) sent: bool,
    /// When it was sent (or made, until then).
    pub(super) at: Instant,
    pub(super) ended: Option<End>,
}

impl Pull {
    /// This pull waits on the server: the asks wait and no tube is left to try.
    pub(super) fn waits(&self) -> bool {
        !self.no_wait && self.scan == 0
    }
}

/// The ack that carries out `settle`.
pub(crate) fn ack_kind(settle: Settle) -> AckKind {
    match settle {
        // A buried job's copy is stored: the original goes. (A job too big
        // to copy is terminated instead; sent again on a later connection,
        // it goes as `+ACK`, which removes it from the work queue too.)
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
pub(super) fn resend(conn: &mut NatsConnection, carry: &mut Carry) -> Result<(), NatsError> {
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
pub(super) fn keep_early(
    d: Delivery<'_>,
    pull: Option<&mut Pull>,
    strays: &mut Strays,
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
            let too_big = (body.len() > bufs.max_body).then_some(body.len() as u64);
            let kept = if too_big.is_some() { &[][..] } else { body };
            early.push_back(Early {
                subject: bufs.names.copy(subject),
                ack: bufs.names.copy(reply),
                body: bufs.bodies.copy(kept),
                headers: bufs
                    .names
                    .copy(headers.as_ref().map_or(&[], |h| h.as_bytes())),
                too_big,
                delivered: info.delivered,
                seq: info.stream_seq,
                ready_at: ready_at(headers.as_ref()),
                scheduled: headers.is_some_and(|h| h.get(SCHEDULER_HEADER).is_some()),
                pulled: strays
                    .lease_start(pull.map(|p| p.at))
                    .unwrap_or_else(Instant::now),
            });
            return;
        }
        Delivery::Heartbeat | Delivery::Confirmed(_) => return,
        Delivery::NoMessages | Delivery::Timeout => End::Empty,
        Delivery::Unanswered => {
            // Over: the server never took it, or took it and answers late;
            // asked again after a pause.
            tracing::debug!("a pull never answered; its probe came back");
            if let Some(p) = pull.as_ref() {
                strays.ended(p.at);
            }
            End::Unavailable
        }
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
pub(crate) fn ready_at(headers: Option<&HeaderBlock<'_>>) -> Option<u64> {
    let v = headers?.get(READY_AT_HEADER)?;
    taskq_proto::parse_u64(v).ok()
}

pub(crate) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A failure to connect or to set the stream up, in the loop's terms:
/// nothing of a job was sent, so no outcome is unknown (a refusal names
/// the server's reason; a deadline stays a timeout, for its counter).
pub(crate) fn connect_error(e: NatsError) -> ConnectionError {
    match e {
        NatsError::Timeout { waited } => ConnectionError::Timeout { waited },
        NatsError::NotSent(io) => ConnectionError::NotSent(io),
        other => ConnectionError::NotSent(std::io::Error::other(other.to_string())),
    }
}

/// The transport's errors in the loop's terms.
pub(crate) fn conn_error(e: NatsError) -> ConnectionError {
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

/// Where an ask's pull starts, whether the ask waits, and how many more
/// tubes it may try: a weighted turn tries its tube alone; otherwise every
/// tube in turn (starting one further each time, so none is always last).
pub(super) fn pick(ask: Ask<'_>, rotate: &mut usize) -> (usize, bool, usize) {
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
