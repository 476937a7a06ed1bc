//! The operators' commands on NATS JetStream: the requests that read and
//! move jobs in taskq's layout (`taskq_connect::Layout`). The snapshot
//! (`crate::snapshot::nats`) reads tubes through [`Js`], and the job
//! operations (`crate::jobs`) move them; what has no JetStream meaning is
//! refused with [`Unsupported`].

use std::fmt;
use std::time::Duration;

use serde_json::{json, Value};
use taskq_connect::nats::{MsgSelect, NatsConfig, NatsConnection, StoredMsg, StreamInfo};
use taskq_connect::{redact_address, Address, Engine, Layout};
use taskq_proto::nats::{ApiError, HeaderBlock, NatsError};

/// The header that dedups a publish; a kicked copy gets its own.
const MSG_ID: &[u8] = b"Nats-Msg-Id";

/// `--stream` of the commands that read or move jobs.
#[derive(clap::Args, Debug, Clone)]
pub struct StreamArgs {
    /// JetStream (nats:// addresses): the stream, capturing `<NAME in lower case>.>`.
    #[arg(long, value_name = "NAME", default_value = taskq_connect::DEFAULT_STREAM)]
    pub stream: String,
}

/// `--stream` and `--replicas` of the commands that may create the stream.
#[derive(clap::Args, Debug, Clone)]
pub struct CreateArgs {
    #[command(flatten)]
    pub stream: StreamArgs,
    /// JetStream: replicas of the stream when this command creates it
    /// (default: 3 on a cluster of 3 or more nodes, else 1); an existing
    /// stream keeps its replicas.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=5))]
    pub replicas: Option<u64>,
}

impl CreateArgs {
    /// The producer settings these options stand for, for `addr` (with its
    /// credentials and TLS as `main` read them).
    pub fn producer(&self, b: taskq_producer::Builder, addr: &str) -> taskq_producer::Builder {
        let b = b
            .stream(&self.stream.stream)
            .nats_access(crate::access::for_str(addr));
        match self.replicas {
            Some(n) => b.replicas(n as usize),
            None => b,
        }
    }

    /// The worker settings these options stand for, for `addr`.
    pub fn worker(&self, addr: &str) -> taskq_worker::JetStreamConfig {
        taskq_worker::JetStreamConfig {
            stream: self.stream.stream.clone(),
            replicas: self.replicas.map(|n| n as usize),
            access: crate::access::for_str(addr),
            ..taskq_worker::JetStreamConfig::default()
        }
    }
}

/// The engine an address selects, for the commands that serve both.
#[derive(Debug, Clone)]
pub enum Route {
    /// beanstalkd at this `HOST:PORT`.
    Beanstalkd(String),
    /// A JetStream cluster.
    Nats(Address),
}

/// Parses `addr` and says which engine serves it.
pub fn route(addr: &str) -> Result<Route, String> {
    let a = Address::parse(addr).map_err(|e| format!("{}: {e}", redact_address(addr)))?;
    Ok(match a.engine() {
        Engine::Nats => Route::Nats(a),
        Engine::Beanstalkd => Route::Beanstalkd(a.hosts()[0].clone()),
    })
}

/// True when `addr` selects JetStream (an address that does not parse is
/// left to the command's own error).
pub fn is_nats(addr: &str) -> bool {
    Address::parse(addr).is_ok_and(|a| a.is_nats())
}

/// A tube name JetStream can carry (one subject token), checked before
/// anything is sent.
pub fn check_tube(tube: &str) -> Result<(), String> {
    taskq_connect::validate_subject_tube(tube).map_err(|e| format!("tube {tube:?}: {e}"))
}

/// A command, or a form of one, that has no meaning on an engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsupported {
    /// The command or option refused.
    pub what: &'static str,
    /// The engine that cannot do it.
    pub engine: Engine,
    /// Why, and what to do instead.
    pub why: &'static str,
}

impl Unsupported {
    /// `what` refused on JetStream.
    pub fn nats(what: &'static str, why: &'static str) -> Unsupported {
        Unsupported {
            what,
            engine: Engine::Nats,
            why,
        }
    }
}

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.engine {
            Engine::Nats => "nats (JetStream)",
            Engine::Beanstalkd => "beanstalkd",
        };
        write!(f, "{} is not supported on {name}: {}", self.what, self.why)
    }
}

impl std::error::Error for Unsupported {}

/// A durable consumer as the operators' commands show it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConsumerRow {
    /// Its name (`taskq-T` for taskq's).
    pub name: String,
    /// Its filter subject (empty for none).
    pub filter: String,
    /// Messages not delivered yet.
    pub pending: u64,
    /// Deliveries not acked yet.
    pub ack_pending: u64,
    /// Messages among the unacked ones delivered more than once.
    pub redelivered: u64,
    /// Pull requests waiting.
    pub waiting: u64,
    /// Deliveries made so far (its consumer sequence).
    pub delivered: u64,
    /// The stream sequence of the last message it delivered.
    pub delivered_stream: u64,
    /// Its ack wait (the lease of every job of the tube).
    pub ack_wait: Duration,
    /// Its `max_deliver` (-1: no limit).
    pub max_deliver: i64,
    /// Its cluster leader, in a cluster.
    pub leader: Option<String>,
    /// Seconds of pause left (nats-server 2.11+), 0 when not paused.
    pub pause_left: u64,
}

/// A number at `path` in `v` (0 when absent).
fn num(v: &Value, path: &[&str]) -> u64 {
    path.iter()
        .try_fold(v, |v, k| v.get(k))
        .and_then(Value::as_u64)
        .unwrap_or(0)
}

impl ConsumerRow {
    /// Reads a consumer's info object (as `CONSUMER.INFO` and `CONSUMER.LIST` give it).
    fn from_json(v: &Value) -> ConsumerRow {
        let text = |path: &[&str]| {
            path.iter()
                .try_fold(v, |v, k| v.get(k))
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        ConsumerRow {
            name: text(&["name"]).unwrap_or_default(),
            filter: text(&["config", "filter_subject"]).unwrap_or_default(),
            pending: num(v, &["num_pending"]),
            ack_pending: num(v, &["num_ack_pending"]),
            redelivered: num(v, &["num_redelivered"]),
            waiting: num(v, &["num_waiting"]),
            delivered: num(v, &["delivered", "consumer_seq"]),
            delivered_stream: num(v, &["delivered", "stream_seq"]),
            ack_wait: Duration::from_nanos(num(v, &["config", "ack_wait"])),
            max_deliver: v["config"]["max_deliver"].as_i64().unwrap_or(-1),
            leader: text(&["cluster", "leader"]),
            pause_left: if v["paused"].as_bool() == Some(true) {
                num(v, &["pause_remaining"]).div_ceil(1_000_000_000)
            } else {
                0
            },
        }
    }

    /// The tube whose consumer this is.
    pub fn tube(&self) -> Option<&str> {
        Layout::tube_of_consumer(&self.name)
    }
}

/// An admin connection to a JetStream cluster and the layout it reads.
pub struct Js {
    conn: NatsConnection,
    layout: Layout,
    addr: String,
}

/// True for the API's "not found" (no such stream, consumer or message).
fn not_found(e: &NatsError) -> bool {
    matches!(e, NatsError::Api(a) if a.code == 404)
}

/// True when a consumer or message is not found in a stream that exists.
fn absent(e: &NatsError) -> bool {
    not_found(e) && !matches!(e, NatsError::Api(a) if a.err_code == 10059)
}

impl Js {
    /// Connects to the first seed of `addr` that answers.
    pub fn connect(addr: &Address, stream: &StreamArgs, io_timeout_ms: u64) -> Result<Js, String> {
        let layout = Layout::new(&stream.stream)
            .map_err(|e| format!("--stream {:?}: {e}", stream.stream))?;
        let conn = NatsConnection::connect(addr.hosts(), Js::config(addr, io_timeout_ms))
            .map_err(|e| format!("{addr}: {e}"))?;
        Ok(Js {
            conn,
            layout,
            addr: addr.to_string(),
        })
    }

    /// The settings of an admin connection to `addr`: `--io-timeout` bounds
    /// connecting and each reply; the API patience and the rest are the
    /// shared defaults.
    pub fn config(addr: &Address, io_timeout_ms: u64) -> NatsConfig {
        let t = Duration::from_millis(io_timeout_ms.max(1));
        NatsConfig {
            connect_timeout: t,
            io_timeout: t,
            name: "taskq admin".into(),
            access: crate::access::for_address(addr),
            ..NatsConfig::default()
        }
    }

    /// The layout read.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// An error of request `what`, naming the stream when it is missing.
    fn failed(&self, what: &str, e: NatsError) -> String {
        if matches!(&e, NatsError::Api(a) if a.err_code == 10059) {
            return format!(
                "no stream {} on {} (nothing was put there yet, or another --stream)",
                self.layout.stream(),
                self.addr
            );
        }
        format!("{what}: {e}")
    }

    /// A JetStream API request with a JSON body; the reply's `error` object
    /// becomes [`NatsError::Api`]. Asked again while the cluster has no
    /// leader, for up to the API patience (the proto's one retry).
    fn api(&mut self, subject: &str, body: &Value) -> Result<Value, NatsError> {
        self.conn.api_request(subject, body)
    }

    /// The stream's info; a missing stream is `Ok(None)`.
    pub fn stream_info(&mut self) -> Result<Option<StreamInfo>, String> {
        match self.conn.stream_info(self.layout.stream()) {
            Ok(s) => Ok(Some(s)),
            Err(e) if not_found(&e) => Ok(None),
            Err(e) => Err(self.failed("stream info", e)),
        }
    }

    /// The count of messages on each subject `filter` matches, given to
    /// `each` a page at a time (none of a page kept after it): a stream may
    /// hold a subject for every delayed job.
    pub fn fold_subject_counts(
        &mut self,
        filter: &str,
        each: impl FnMut(&str, u64),
    ) -> Result<(), String> {
        let stream = self.layout.stream().to_owned();
        self.conn
            .fold_subject_counts(&stream, filter, each)
            .map_err(|e| self.failed("stream info", e))
    }

    /// Every consumer of the stream, by name.
    pub fn consumers(&mut self) -> Result<Vec<ConsumerRow>, String> {
        let subject = format!("$JS.API.CONSUMER.LIST.{}", self.layout.stream());
        let mut out: Vec<ConsumerRow> = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        loop {
            let v = self
                .api(&subject, &json!({ "offset": out.len() }))
                .map_err(|e| self.failed("consumer list", e))?;
            let page = v["consumers"].as_array().map_or(&[][..], Vec::as_slice);
            let before = out.len();
            for row in page.iter().map(ConsumerRow::from_json) {
                if seen.insert(row.name.clone()) {
                    out.push(row);
                }
            }
            // A consumer a tube at most, as taskq makes them: past the most
            // tubes taskq reads, a server's list is not followed further.
            if out.len() > crate::snapshot::MAX_TUBES {
                return Err(crate::snapshot::too_many_tubes("the consumer list"));
            }
            // The server's total is its word: a page that brings no new
            // consumer (a server that ignores the offset, or a total that
            // never comes) ends the list rather than looping on it.
            if out.len() == before || out.len() as u64 >= num(&v, &["total"]) {
                break;
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Tube `tube`'s consumer, `None` before a worker made it.
    pub fn consumer(&mut self, tube: &str) -> Result<Option<ConsumerRow>, String> {
        let subject = format!(
            "$JS.API.CONSUMER.INFO.{}.{}",
            self.layout.stream(),
            Layout::consumer(tube)
        );
        match self.api(&subject, &Value::Null) {
            Ok(v) => Ok(Some(ConsumerRow::from_json(&v))),
            Err(e) if absent(&e) => Ok(None),
            Err(e) => Err(self.failed("consumer info", e)),
        }
    }

    /// The error for a stream that does not exist.
    pub fn no_stream(&self) -> String {
        self.failed("stream info", missing_stream())
    }

    /// The JetStream API level the server serves (`$JS.API.INFO`): 0 before
    /// nats-server 2.11, which brought levels (and consumer pause) in at 1.
    pub fn api_level(&mut self) -> Result<u64, String> {
        let v = self
            .api("$JS.API.INFO", &Value::Null)
            .map_err(|e| self.failed("account info", e))?;
        Ok(num(&v, &["api", "level"]))
    }

    /// The version the connected server announced in its INFO (`None` when
    /// it gave none).
    pub fn server_version(&self) -> Option<String> {
        let v = self.conn.server_version();
        (!v.is_empty()).then(|| v.to_owned())
    }

    /// Pauses tube `tube`'s consumer until `until` (`None`: resumes it), so
    /// no worker is handed its jobs meanwhile. A tube no worker has asked for
    /// yet gets its consumer now, as a worker would create it (with
    /// `ack_wait`, or the worker's default), paused from its first moment;
    /// a worker started later finds it paused and leaves it so. Needs
    /// nats-server 2.11 or later; refused, naming the server's version,
    /// before that.
    pub fn pause(
        &mut self,
        tube: &str,
        until: Option<std::time::SystemTime>,
        ack_wait: Option<Duration>,
    ) -> Result<(), String> {
        check_tube(tube)?;
        if self.api_level()? < 1 {
            let version = self
                .server_version()
                .unwrap_or_else(|| "of unknown version".to_owned());
            return Err(format!(
                "pause is not supported on nats-server {version} at {}: consumer pause came with nats-server 2.11; stop the tube's workers instead",
                self.addr
            ));
        }
        let stream = self.layout.stream().to_owned();
        let consumer = Layout::consumer(tube);
        match self.conn.pause_consumer(&stream, &consumer, until) {
            Ok(_) => return Ok(()),
            Err(e) if absent(&e) && until.is_none() => {
                return Err(format!(
                    "tube {tube} has no consumer {consumer} yet (no worker has asked for its jobs), so it is not paused"
                ))
            }
            Err(e) if absent(&e) => {}
            Err(e) => return Err(self.failed("consumer pause", e)),
        }
        let mut worker = taskq_worker::JetStreamConfig {
            stream: stream.clone(),
            ..taskq_worker::JetStreamConfig::default()
        };
        if let Some(w) = ack_wait {
            worker.ack_wait = w;
        }
        let spec = worker.consumer_spec(&self.layout, tube);
        let made = self
            .conn
            .ensure_consumer_paused(&stream, &consumer, &spec, until)
            .map_err(|e| self.failed("consumer create", e))?;
        if made.paused {
            return Ok(());
        }
        // A worker created it between the two requests: the create left it
        // as the worker made it (not paused), so pause that one.
        match self.conn.pause_consumer(&stream, &consumer, until) {
            Ok(_) => Ok(()),
            Err(e) => Err(self.failed("consumer pause", e)),
        }
    }

    /// The first message on `subject` at or after sequence `from`.
    pub fn first_on(&mut self, subject: &str, from: u64) -> Result<Option<StoredMsg>, String> {
        let which = MsgSelect::NextBySubject { subject, seq: from };
        match self.conn.msg_get(self.layout.stream(), which) {
            Ok(m) => Ok(Some(m)),
            Err(e) if absent(&e) => Ok(None),
            Err(e) => Err(self.failed(&format!("reading {subject}"), e)),
        }
    }

    /// The job with id (stream sequence) `seq`, `None` when there is none.
    pub fn job(&mut self, seq: u64) -> Result<Option<StoredMsg>, String> {
        match self.conn.msg_get(self.layout.stream(), MsgSelect::Seq(seq)) {
            Ok(m) => Ok(Some(m)),
            Err(e) if absent(&e) => Ok(None),
            Err(e) => Err(self.failed(&format!("reading job {seq}"), e)),
        }
    }

    /// The job a worker of `tube` would be handed next: the first message on
    /// `taskq.T` its consumer has not delivered yet.
    pub fn next_ready(&mut self, tube: &str) -> Result<Option<StoredMsg>, String> {
        let from = self
            .consumer(tube)?
            .map_or(1, |c| c.delivered_stream.saturating_add(1));
        self.first_on(&self.layout.subject(tube), from)
    }

    /// Deletes job `seq`; false when there is none.
    pub fn delete(&mut self, seq: u64) -> Result<bool, String> {
        match self.conn.msg_delete(self.layout.stream(), seq) {
            Ok(done) => Ok(done),
            Err(e) if absent(&e) => Ok(false),
            Err(e) => Err(self.failed(&format!("deleting job {seq}"), e)),
        }
    }

    /// Moves buried copy `m` back to tube `tube`: republishes it with its
    /// headers and a message id of its own sequence (a kick repeated after a
    /// crash is stored once), and deletes the buried copy only after the
    /// PubAck (a crash between the two leaves it twice, never nowhere).
    /// Returns the job's new id.
    pub fn kick_one(&mut self, m: &StoredMsg, tube: &str) -> Result<u64, String> {
        check_tube(tube)?;
        let headers = if m.headers.is_empty() {
            None
        } else {
            Some(
                HeaderBlock::parse(&m.headers)
                    .map_err(|e| format!("buried job {}: unreadable headers: {e}", m.seq))?,
            )
        };
        let extra: Vec<(&[u8], &[u8])> = headers
            .iter()
            .flat_map(|h| h.iter())
            .filter(|(k, _)| !k.eq_ignore_ascii_case(MSG_ID))
            .collect();
        let id = format!("taskq-kick-{}-{}", self.layout.stream(), m.seq);
        let subject = self.layout.subject(tube);
        let ack = self
            .conn
            .publish_with(&subject, id.as_bytes(), &extra, &m.data)
            .map_err(|e| format!("kicking buried job {} to {subject}: {e}", m.seq))?;
        self.delete(m.seq).map_err(|e| {
            format!(
                "{e} (it was kicked as job {}: it is there twice)",
                ack.stream_seq
            )
        })?;
        Ok(ack.stream_seq)
    }

    /// Moves up to `bound` of `tube`'s buried jobs back, oldest first; returns how many.
    pub fn kick(&mut self, tube: &str, bound: u64) -> Result<u64, String> {
        check_tube(tube)?;
        let Some(info) = self.stream_info()? else {
            return Ok(0);
        };
        let buried = self.layout.buried_subject(tube);
        kick_each(
            self,
            tube,
            bound,
            info.last_seq,
            |js, from| Ok(js.first_on(&buried, from)?.map(|m| (m.seq, m))),
            |js, m| js.kick_one(&m, tube).map(|_| ()),
        )
    }
}

/// The kick loop, without I/O: `next(cx, from)` finds the first buried job
/// at or after sequence `from` (its sequence and itself), `kick(cx, job)`
/// moves it back.
///
/// A kick moves the jobs buried when it began: those up to `last`, the
/// stream's last sequence then. Sequences only grow, and a job it moved
/// back that fails again is buried as a newer message; without this bound
/// a long kick beside running workers would meet such jobs again, kick each
/// many times (restarting its attempts every time), count every pass, and
/// go on for as long as they keep failing. beanstalkd's `kick` likewise
/// moves the jobs buried when it runs.
fn kick_each<C, M>(
    cx: &mut C,
    tube: &str,
    bound: u64,
    last: u64,
    mut next: impl FnMut(&mut C, u64) -> Result<Option<(u64, M)>, String>,
    mut kick: impl FnMut(&mut C, M) -> Result<(), String>,
) -> Result<u64, String> {
    let (mut kicked, mut from) = (0, 1);
    while kicked < bound {
        let Some((seq, m)) = next(cx, from)? else {
            break;
        };
        if seq > last {
            break;
        }
        // The ones moved already are moved: an error says how many.
        kick(cx, m).map_err(|e| {
            format!("{e} (after kicking {kicked} of tube {tube}'s buried jobs back)")
        })?;
        from = seq + 1;
        kicked += 1;
    }
    Ok(kicked)
}

/// The API's answer for a stream that does not exist.
fn missing_stream() -> NatsError {
    NatsError::Api(ApiError {
        code: 404,
        err_code: 10059,
        description: "stream not found".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::kick_each;
    use std::collections::BTreeSet;

    /// A tube's buried messages by sequence, and the stream's last one.
    struct Stream {
        buried: BTreeSet<u64>,
        last: u64,
        /// Each kicked job fails again at once and is buried anew, as
        /// workers running beside a kick can do.
        fails_again: bool,
        kicks: Vec<u64>,
    }

    /// A kick as `taskq kick` makes it: bounded by the stream's last
    /// sequence when it begins.
    fn kick(s: &mut Stream, bound: u64) -> Result<u64, String> {
        let last = s.last;
        kick_each(
            s,
            "mail",
            bound,
            last,
            |s, from| Ok(s.buried.range(from..).next().map(|&q| (q, q))),
            |s, q| {
                s.kicks.push(q);
                s.buried.remove(&q);
                s.last += 1; // the job's copy, ready again
                if s.fails_again {
                    s.last += 1;
                    s.buried.insert(s.last);
                }
                Ok(())
            },
        )
    }

    fn stream(buried: u64, fails_again: bool) -> Stream {
        Stream {
            buried: (1..=buried).map(|i| 2 * i).collect(),
            last: 2 * buried,
            fails_again,
            kicks: Vec::new(),
        }
    }

    #[test]
    fn a_kick_moves_the_jobs_buried_before_it_once_each_and_stops() {
        // Nobody buries meanwhile: every buried job, once, oldest first.
        let mut s = stream(5, false);
        assert_eq!(kick(&mut s, u64::MAX), Ok(5));
        assert_eq!(s.kicks, [2, 4, 6, 8, 10]);
        // Each kicked job buried again at once: still each of the five
        // once, and the kick ends; the new burials wait for the next kick.
        let mut s = stream(5, true);
        assert_eq!(kick(&mut s, u64::MAX), Ok(5));
        assert_eq!(s.kicks, [2, 4, 6, 8, 10]);
        assert_eq!(s.buried.len(), 5);
        assert_eq!(kick(&mut s, 2), Ok(2), "a bound below the count holds");
        // Every job buried when the kick began is moved, the last one too.
        let mut s = stream(2, false);
        s.buried.insert(5);
        s.last = 5;
        assert_eq!(kick(&mut s, u64::MAX), Ok(3));
        assert_eq!(s.kicks, [2, 4, 5]);
    }

    #[test]
    fn a_failed_kick_says_how_many_went_back_before_it() {
        let mut s = stream(3, false);
        let e = kick_each(
            &mut s,
            "mail",
            u64::MAX,
            6,
            |s, from| Ok(s.buried.range(from..).next().map(|&q| (q, q))),
            |s, q| {
                if q == 4 {
                    return Err("kicking buried job 4: no reply".into());
                }
                s.buried.remove(&q);
                s.last += 1;
                Ok(())
            },
        )
        .unwrap_err();
        assert_eq!(
            e,
            "kicking buried job 4: no reply (after kicking 1 of tube mail's buried jobs back)"
        );
    }
}
