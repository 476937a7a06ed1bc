//! JetStream's parts of the worker machine's rules: its tubes' names, pull
//! expiries, the leases of deliveries a probed pull may still bring,
//! delayed jobs given back early, what a delivery says of its job, the
//! buried copies, the consumers' record, and the small functions between
//! the machine's words and the wire's (acks, errors).

use std::collections::VecDeque;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use taskq_connect::nats::{ApiLink, JetStream};
use taskq_connect::READY_AT_HEADER;
use taskq_proto::nats::{AckKind, HeaderBlock, NatsError};
use taskq_proto::ConnectionError;

use crate::config::Config;
use crate::engine::seam::Settle;

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
