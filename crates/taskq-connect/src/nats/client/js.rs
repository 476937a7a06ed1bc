//! The JetStream management API (cold path): requests with JSON bodies and
//! JSON replies read with serde_json. Streams and consumers are looked up
//! before anything is created, and an existing one is never changed, but for
//! one explicit call: [`NatsConnection::allow_msg_schedules`].

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use serde::Deserialize;
use serde_json::{json, Value};

use super::{ApiError, NatsConnection, NatsError};
use crate::nats::api::{run_blocking, ApiLink, JetStream};
use taskq_proto::nats::schedule::rfc3339_utc_at;
use taskq_proto::nats::subject_covers;

/// The work-queue stream taskq needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamSpec {
    /// The stream's name.
    pub name: String,
    /// Subjects it must capture (it may capture more, through wildcards).
    pub subjects: Vec<String>,
    /// Copies kept in a cluster.
    pub replicas: usize,
    /// The dedup window for `Nats-Msg-Id`; `None` takes the server's (2 minutes).
    pub duplicate_window: Option<Duration>,
}

/// The durable pull consumer taskq needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerSpec {
    /// Only messages on this subject (empty: all of the stream).
    pub filter_subject: String,
    /// How long a delivery is leased before the server redelivers it.
    pub ack_wait: Duration,
    /// Deliveries before the server gives up on a message (-1: no limit).
    pub max_deliver: i64,
    /// Deliveries outstanding at once.
    pub max_ack_pending: i64,
    /// Pull requests waiting at once.
    pub max_waiting: i64,
}

/// A stream as the server describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamInfo {
    /// The stream's name.
    pub name: String,
    /// Its subjects.
    pub subjects: Vec<String>,
    /// `limits`, `interest` or `workqueue`.
    pub retention: String,
    /// Copies kept.
    pub replicas: usize,
    /// Messages stored.
    pub messages: u64,
    /// First and last sequence numbers stored.
    pub first_seq: u64,
    /// Last sequence number stored.
    pub last_seq: u64,
    /// Consumers.
    pub consumer_count: u64,
    /// The cluster leader's name, in a cluster.
    pub leader: Option<String>,
    /// It allows message schedules (`allow_msg_schedules`, nats-server 2.12+).
    pub allow_msg_schedules: bool,
    /// How long it remembers a message id (`Nats-Msg-Id`) to store a copy
    /// sent again with it once (`duplicate_window`; the server's default is
    /// 2 minutes). Zero when the server did not say.
    pub duplicate_window: Duration,
}

/// A consumer as the server describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerInfo {
    /// Its stream.
    pub stream: String,
    /// Its (durable) name.
    pub name: String,
    /// Messages not yet delivered.
    pub num_pending: u64,
    /// Deliveries not yet acked.
    pub num_ack_pending: u64,
    /// Messages delivered more than once.
    pub num_redelivered: u64,
    /// Deliveries made so far, redeliveries included (`delivered.consumer_seq`).
    pub delivered: u64,
    /// Pull requests waiting.
    pub num_waiting: u64,
    /// The ack wait in force.
    pub ack_wait: Duration,
    /// Its `max_deliver`.
    pub max_deliver: i64,
    /// Its `max_ack_pending`.
    pub max_ack_pending: i64,
    /// Its `filter_subject` (empty for none).
    pub filter_subject: String,
    /// The cluster leader's name, in a cluster.
    pub leader: Option<String>,
    /// It is paused: it hands out nothing until its pause ends (nats-server
    /// 2.11+; always false before).
    pub paused: bool,
    /// What is left of its pause (zero when not paused).
    pub pause_remaining: Duration,
}

/// Which stored message [`NatsConnection::msg_get`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MsgSelect<'a> {
    /// The message with this sequence number.
    Seq(u64),
    /// The first message on `subject` at or after `seq`.
    NextBySubject {
        /// The subject.
        subject: &'a str,
        /// Where to start.
        seq: u64,
    },
}

/// A message read from a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMsg {
    /// Its subject.
    pub subject: String,
    /// Its sequence number.
    pub seq: u64,
    /// Its header block, as stored (empty when none).
    pub headers: Vec<u8>,
    /// Its body.
    pub data: Vec<u8>,
    /// When it was stored (RFC 3339).
    pub time: String,
}

#[derive(Deserialize)]
struct RawStream {
    config: RawStreamConfig,
    #[serde(default)]
    state: RawState,
    #[serde(default)]
    cluster: Option<RawCluster>,
}

#[derive(Deserialize)]
struct RawStreamConfig {
    name: String,
    #[serde(default)]
    subjects: Vec<String>,
    #[serde(default)]
    retention: String,
    #[serde(default)]
    num_replicas: usize,
    #[serde(default)]
    allow_msg_schedules: bool,
    /// Nanoseconds.
    #[serde(default)]
    duplicate_window: u64,
}

#[derive(Deserialize, Default)]
struct RawState {
    #[serde(default)]
    messages: u64,
    #[serde(default)]
    first_seq: u64,
    #[serde(default)]
    last_seq: u64,
    #[serde(default)]
    consumer_count: u64,
}

#[derive(Deserialize)]
struct RawCluster {
    #[serde(default)]
    leader: Option<String>,
}

#[derive(Deserialize)]
struct RawConsumer {
    stream_name: String,
    name: String,
    config: RawConsumerConfig,
    #[serde(default)]
    num_pending: u64,
    #[serde(default)]
    num_ack_pending: u64,
    #[serde(default)]
    num_redelivered: u64,
    #[serde(default)]
    delivered: RawSeqs,
    #[serde(default)]
    num_waiting: u64,
    #[serde(default)]
    cluster: Option<RawCluster>,
    #[serde(default)]
    paused: bool,
    #[serde(default)]
    pause_remaining: u64,
}

#[derive(Deserialize, Default)]
struct RawSeqs {
    #[serde(default)]
    consumer_seq: u64,
}

#[derive(Deserialize)]
struct RawConsumerConfig {
    #[serde(default)]
    ack_wait: u64,
    #[serde(default)]
    max_deliver: i64,
    #[serde(default)]
    max_ack_pending: i64,
    #[serde(default)]
    filter_subject: String,
}

#[derive(Deserialize)]
struct RawMsg {
    message: RawStored,
}

#[derive(Deserialize)]
struct RawStored {
    subject: String,
    seq: u64,
    #[serde(default)]
    hdrs: String,
    #[serde(default)]
    data: String,
    #[serde(default)]
    time: String,
}

impl From<RawStream> for StreamInfo {
    fn from(r: RawStream) -> Self {
        StreamInfo {
            name: r.config.name,
            subjects: r.config.subjects,
            retention: r.config.retention,
            replicas: r.config.num_replicas,
            messages: r.state.messages,
            first_seq: r.state.first_seq,
            last_seq: r.state.last_seq,
            consumer_count: r.state.consumer_count,
            leader: r.cluster.and_then(|c| c.leader),
            allow_msg_schedules: r.config.allow_msg_schedules,
            duplicate_window: Duration::from_nanos(r.config.duplicate_window),
        }
    }
}

impl From<RawConsumer> for ConsumerInfo {
    fn from(r: RawConsumer) -> Self {
        ConsumerInfo {
            stream: r.stream_name,
            name: r.name,
            num_pending: r.num_pending,
            num_ack_pending: r.num_ack_pending,
            num_redelivered: r.num_redelivered,
            delivered: r.delivered.consumer_seq,
            num_waiting: r.num_waiting,
            ack_wait: Duration::from_nanos(r.config.ack_wait),
            max_deliver: r.config.max_deliver,
            max_ack_pending: r.config.max_ack_pending,
            filter_subject: r.config.filter_subject,
            leader: r.cluster.and_then(|c| c.leader),
            paused: r.paused,
            pause_remaining: Duration::from_nanos(r.pause_remaining),
        }
    }
}

/// Standard base64 (with padding), as the server encodes stored messages.
fn base64(s: &str) -> Result<Vec<u8>, NatsError> {
    let bad = || NatsError::Mismatch("stored message is not base64".into());
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let b = s.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(b.len() * 3 / 4);
    for chunk in b.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= val(c).ok_or_else(bad)? << (18 - 6 * i);
        }
        let bytes = n.to_be_bytes();
        match chunk.len() {
            4 => out.extend_from_slice(&bytes[1..4]),
            3 => out.extend_from_slice(&bytes[1..3]),
            2 => out.push(bytes[1]),
            _ => return Err(bad()),
        }
    }
    Ok(out)
}

/// What the server said, as an error may hold it (see [`taskq_proto::peer_text`]).
fn shown(said: &impl std::fmt::Display) -> String {
    taskq_proto::peer_text(said.to_string().as_bytes())
}

/// Time `t` as the API takes it (`pause_until`): RFC 3339, rounded up.
fn rfc3339(t: SystemTime) -> Value {
    json!(String::from_utf8_lossy(&rfc3339_utc_at(t)))
}

/// Runs `$call` (an async block, made again for each try) again while the
/// cluster answers "no responders", 503, or cannot place an asset for a
/// peer offline ([`is_transient`]), until the API patience runs out.
macro_rules! patiently {
    ($js:expr, $call:expr) => {{
        // No end for a patience past what the clock can hold.
        let until = Instant::now().checked_add($js.0.api_patience());
        loop {
            let r: Result<_, NatsError> = $call.await;
            match r {
                Err(e) if is_transient(&e) && until.is_none_or(|u| Instant::now() < u) => {
                    $js.0.pause(taskq_proto::defaults::API_RETRY_PAUSE).await
                }
                r => break r,
            }
        }
    }};
}

fn is_not_found(e: &NatsError) -> bool {
    matches!(e, NatsError::Api(a) if a.code == 404)
}

/// A cluster without a leader (or a server still starting JetStream), or
/// one that cannot place a replicated asset while a node it needs is not
/// seen online (`10005` "no suitable peers for placement, peer offline": a
/// cluster still forming, or a node restarting): try again. The other
/// placement refusals (insufficient resources, unmatched tags) stand.
fn is_transient(e: &NatsError) -> bool {
    matches!(e, NatsError::NoResponders)
        || matches!(e, NatsError::Api(a) if a.code == 503 || a.err_code == 10008 || peer_offline(a))
}

/// `10005` because a peer is offline.
fn peer_offline(a: &taskq_proto::nats::ApiError) -> bool {
    a.err_code == 10005 && a.description.contains("peer offline")
}

impl<L: ApiLink> JetStream<'_, L> {
    /// A JetStream API call: the reply's `error` object becomes [`NatsError::Api`].
    async fn api<T: serde::de::DeserializeOwned>(
        &mut self,
        subject: &str,
        body: &Value,
    ) -> Result<T, NatsError> {
        let payload = if body.is_null() {
            Vec::new()
        } else {
            body.to_string().into_bytes()
        };
        let reply = self.0.request(subject, &payload).await?;
        let v: Value = serde_json::from_slice(&reply).map_err(|e| {
            NatsError::Mismatch(format!("unreadable JetStream reply: {}", shown(&e)))
        })?;
        if let Some(e) = v.get("error") {
            return Err(NatsError::Api(ApiError {
                code: e.get("code").and_then(Value::as_u64).unwrap_or(0),
                err_code: e.get("err_code").and_then(Value::as_u64).unwrap_or(0),
                description: taskq_proto::peer_text(
                    e.get("description")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .as_bytes(),
                ),
            }));
        }
        serde_json::from_value(v)
            .map_err(|e| NatsError::Mismatch(format!("unexpected JetStream reply: {}", shown(&e))))
    }

    /// Any JetStream API request (`$JS.API.…`) with a JSON body (`null`:
    /// none), asked again while the cluster has no leader, for up to the
    /// [API patience](crate::nats::NatsConfig::api_patience). The reply's `error` object
    /// becomes [`NatsError::Api`]; anything else is the reply as it came.
    pub async fn api_request(&mut self, subject: &str, body: &Value) -> Result<Value, NatsError> {
        patiently!(self, async { self.api(subject, body).await })
    }

    /// The stream `name`.
    pub async fn stream_info(&mut self, name: &str) -> Result<StreamInfo, NatsError> {
        let raw: RawStream = self
            .api(&format!("$JS.API.STREAM.INFO.{name}"), &Value::Null)
            .await?;
        Ok(raw.into())
    }

    /// How many messages stream `name` holds on each subject `filter`
    /// matches (`subjects_filter`), from its leader's record; subjects that
    /// hold none are left out. Asked again while the cluster has no leader,
    /// for up to the API patience. The map holds every subject: for a
    /// stream of many (each delayed job has its own), fold them as they
    /// come with [`fold_subject_counts`](Self::fold_subject_counts).
    pub async fn subject_counts(
        &mut self,
        name: &str,
        filter: &str,
    ) -> Result<BTreeMap<String, u64>, NatsError> {
        let mut out = BTreeMap::new();
        self.fold_subject_counts(name, filter, |s, n| {
            out.insert(s.to_owned(), n);
        })
        .await?;
        Ok(out)
    }

    /// [`subject_counts`](Self::subject_counts) a page at a time: `each`
    /// is called with every subject and its count, in order, and nothing
    /// of a page is kept after it, so memory is one page (bounded by the
    /// connection's `max_payload`) plus what `each` keeps, whatever a
    /// server sends.
    ///
    /// The server answers at most a page of subjects a request (100,000 on
    /// nats-server), sorted: the rest are asked for by offset, until the
    /// total is reached or a page brings nothing past the last subject
    /// seen, and never more than `MAX_PAGES` pages, whatever total a server
    /// claims. A subject at or before the last one seen is skipped: one
    /// added between two pages shifts the page boundary, and a server that
    /// ignores the offset sends the same page again.
    pub async fn fold_subject_counts(
        &mut self,
        name: &str,
        filter: &str,
        mut each: impl FnMut(&str, u64),
    ) -> Result<(), NatsError> {
        #[derive(Deserialize, Default)]
        struct State {
            #[serde(default)]
            subjects: Option<BTreeMap<String, u64>>,
        }
        #[derive(Deserialize)]
        struct Raw {
            #[serde(default)]
            state: State,
            /// Subjects that match in all: the server gives them in pages.
            #[serde(default)]
            total: u64,
        }
        const MAX_PAGES: usize = 1000;
        let subject = format!("$JS.API.STREAM.INFO.{name}");
        // Subjects taken so far (the next page's offset), and the last.
        let mut seen: u64 = 0;
        let mut last: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let body = json!({ "subjects_filter": filter, "offset": seen });
            let raw: Raw = patiently!(self, async { self.api(&subject, &body).await })?;
            let page = raw.state.subjects.unwrap_or_default();
            let mut new = page
                .into_iter()
                .filter(|(s, _)| last.as_deref().is_none_or(|l| s.as_str() > l))
                .peekable();
            if new.peek().is_none() {
                break;
            }
            let mut end = None;
            for (s, n) in new {
                each(&s, n);
                seen += 1;
                end = Some(s);
            }
            last = end;
            if seen >= raw.total {
                break;
            }
        }
        Ok(())
    }

    /// Makes sure the work-queue stream of `spec` exists: looks it up first,
    /// creates it when missing, and retries while the cluster has no leader.
    /// An existing stream that is not a work queue, or does not capture all
    /// of `spec.subjects`, is [`NatsError::Mismatch`] and is left unchanged.
    pub async fn ensure_stream(&mut self, spec: &StreamSpec) -> Result<StreamInfo, NatsError> {
        self.ensure_stream_as(spec, false).await
    }

    /// [`ensure_stream`](Self::ensure_stream), and a stream it creates
    /// allows message schedules (`allow_msg_schedules`) when the server
    /// holds them ([`holds_schedules`](Self::holds_schedules): nats-server
    /// 2.12+). An existing stream is left as it is.
    pub async fn ensure_stream_with_schedules(
        &mut self,
        spec: &StreamSpec,
    ) -> Result<StreamInfo, NatsError> {
        let schedules = taskq_proto::nats::holds_schedules(self.0.server_version());
        self.ensure_stream_as(spec, schedules).await
    }

    /// Turns message schedules on for the existing stream `name`: its
    /// configuration as the server gives it, with `allow_msg_schedules`
    /// set, sent back as an update. The server cannot turn them off again
    /// (it answers 10052). An API error (a server or a stream that cannot
    /// have them, an account not allowed to update streams) leaves the
    /// stream as it was.
    pub async fn allow_msg_schedules(&mut self, name: &str) -> Result<StreamInfo, NatsError> {
        patiently!(self, async {
            let info: Value = self
                .api(&format!("$JS.API.STREAM.INFO.{name}"), &Value::Null)
                .await?;
            let mut cfg = info
                .get("config")
                .cloned()
                .ok_or_else(|| NatsError::Mismatch(format!("stream {name} has no config")))?;
            cfg["allow_msg_schedules"] = json!(true);
            let raw: RawStream = self
                .api(&format!("$JS.API.STREAM.UPDATE.{name}"), &cfg)
                .await?;
            Ok(raw.into())
        })
    }

    async fn ensure_stream_as(
        &mut self,
        spec: &StreamSpec,
        schedules: bool,
    ) -> Result<StreamInfo, NatsError> {
        patiently!(self, async {
            let info = match self.stream_info(&spec.name).await {
                Ok(info) => info,
                Err(e) if is_not_found(&e) => {
                    let mut cfg = json!({
                        "name": spec.name,
                        "subjects": spec.subjects,
                        "retention": "workqueue",
                        "storage": "file",
                        "num_replicas": spec.replicas,
                    });
                    if let Some(w) = spec.duplicate_window {
                        cfg["duplicate_window"] = json!(w.as_nanos() as u64);
                    }
                    if schedules {
                        cfg["allow_msg_schedules"] = json!(true);
                    }
                    let created: Result<RawStream, _> = self
                        .api(&format!("$JS.API.STREAM.CREATE.{}", spec.name), &cfg)
                        .await;
                    match created {
                        Ok(raw) => raw.into(),
                        // Created meanwhile by someone else: look again.
                        Err(NatsError::Api(a)) if a.err_code == 10058 => {
                            self.stream_info(&spec.name).await?
                        }
                        Err(e) => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            };
            if info.retention != "workqueue" {
                return Err(NatsError::Mismatch(format!(
                    "stream {} has retention {:?}, not workqueue",
                    shown(&info.name),
                    info.retention
                )));
            }
            if let Some(s) = spec
                .subjects
                .iter()
                .find(|s| !info.subjects.iter().any(|p| subject_covers(p, s)))
            {
                return Err(NatsError::Mismatch(format!(
                    "stream {} does not capture {s} (its subjects: {:?})",
                    shown(&info.name),
                    info.subjects
                )));
            }
            Ok(info)
        })
    }

    /// The consumer `durable` of `stream`.
    pub async fn consumer_info(
        &mut self,
        stream: &str,
        durable: &str,
    ) -> Result<ConsumerInfo, NatsError> {
        let raw: RawConsumer = self
            .api(
                &format!("$JS.API.CONSUMER.INFO.{stream}.{durable}"),
                &Value::Null,
            )
            .await?;
        Ok(raw.into())
    }

    /// Makes sure the durable pull consumer exists: looks it up first and
    /// creates it only when missing. An existing consumer is never changed
    /// (creating it again with another ack wait would silently update it), so
    /// the answer is its actual configuration: read the real ack wait there.
    pub async fn ensure_consumer(
        &mut self,
        stream: &str,
        durable: &str,
        spec: &ConsumerSpec,
    ) -> Result<ConsumerInfo, NatsError> {
        self.ensure_consumer_paused(stream, durable, spec, None)
            .await
    }

    /// [`ensure_consumer`](Self::ensure_consumer), and a consumer this call
    /// creates is created paused until `pause_until` (`None`: not paused), in
    /// the same request, so it never hands out a job before its pause.
    /// Consumer pause needs nats-server 2.11 or later (JetStream API level 1).
    /// An existing consumer is left as it is, its pause too: see
    /// [`pause_consumer`](Self::pause_consumer).
    pub async fn ensure_consumer_paused(
        &mut self,
        stream: &str,
        durable: &str,
        spec: &ConsumerSpec,
        pause_until: Option<SystemTime>,
    ) -> Result<ConsumerInfo, NatsError> {
        patiently!(self, async {
            match self.consumer_info(stream, durable).await {
                Err(e) if is_not_found(&e) => {
                    self.create_consumer(stream, durable, spec, pause_until)
                        .await
                }
                r => r,
            }
        })
    }

    /// Sends the create request of the durable pull consumer of `spec`
    /// without looking first: what [`ensure_consumer_paused`] sends once it
    /// found none. On an existing consumer the server takes it for an update:
    /// it changes the ack wait and the limits to the request's, silently, but
    /// not the pause (nats-server 2.15.1: a consumer paused stays paused, and
    /// `pause_until` given to one not paused does not pause it). Use
    /// [`ensure_consumer`](Self::ensure_consumer) unless the update is meant.
    ///
    /// [`ensure_consumer_paused`]: Self::ensure_consumer_paused
    pub async fn create_consumer(
        &mut self,
        stream: &str,
        durable: &str,
        spec: &ConsumerSpec,
        pause_until: Option<SystemTime>,
    ) -> Result<ConsumerInfo, NatsError> {
        let mut cfg = json!({
            "durable_name": durable,
            "ack_policy": "explicit",
            "deliver_policy": "all",
            "ack_wait": spec.ack_wait.as_nanos() as u64,
            "max_deliver": spec.max_deliver,
            "max_ack_pending": spec.max_ack_pending,
            "max_waiting": spec.max_waiting,
        });
        if !spec.filter_subject.is_empty() {
            cfg["filter_subject"] = json!(spec.filter_subject);
        }
        if let Some(t) = pause_until {
            cfg["pause_until"] = rfc3339(t);
        }
        let body = json!({ "stream_name": stream, "config": cfg });
        let raw: RawConsumer = self
            .api(
                &format!("$JS.API.CONSUMER.DURABLE.CREATE.{stream}.{durable}"),
                &body,
            )
            .await?;
        Ok(raw.into())
    }

    /// Pauses the existing consumer `durable` of `stream` until `until`
    /// (whole seconds, rounded up), or resumes it (`None`); a later pause
    /// replaces an earlier one. Answers whether it is paused now. Needs
    /// nats-server 2.11 or later (JetStream API level 1); a missing consumer
    /// is the API's 404.
    pub async fn pause_consumer(
        &mut self,
        stream: &str,
        durable: &str,
        until: Option<SystemTime>,
    ) -> Result<bool, NatsError> {
        #[derive(Deserialize)]
        struct Paused {
            #[serde(default)]
            paused: bool,
        }
        let body = match until {
            Some(t) => json!({ "pause_until": rfc3339(t) }),
            None => json!({}),
        };
        patiently!(self, async {
            let p: Paused = self
                .api(&format!("$JS.API.CONSUMER.PAUSE.{stream}.{durable}"), &body)
                .await?;
            Ok(p.paused)
        })
    }

    /// Reads a stored message.
    pub async fn msg_get(
        &mut self,
        stream: &str,
        which: MsgSelect<'_>,
    ) -> Result<StoredMsg, NatsError> {
        let body = match which {
            MsgSelect::Seq(seq) => json!({ "seq": seq }),
            MsgSelect::NextBySubject { subject, seq } => {
                json!({ "next_by_subj": subject, "seq": seq })
            }
        };
        let raw: RawMsg = self
            .api(&format!("$JS.API.STREAM.MSG.GET.{stream}"), &body)
            .await?;
        let m = raw.message;
        Ok(StoredMsg {
            subject: m.subject,
            seq: m.seq,
            headers: base64(&m.hdrs)?,
            data: base64(&m.data)?,
            time: m.time,
        })
    }

    /// Deletes a stored message; true when it was there.
    pub async fn msg_delete(&mut self, stream: &str, seq: u64) -> Result<bool, NatsError> {
        #[derive(Deserialize)]
        struct Done {
            #[serde(default)]
            success: bool,
        }
        let d: Done = self
            .api(
                &format!("$JS.API.STREAM.MSG.DELETE.{stream}"),
                &json!({ "seq": seq }),
            )
            .await?;
        Ok(d.success)
    }

    /// Deletes a stream; true when it was there.
    pub async fn stream_delete(&mut self, stream: &str) -> Result<bool, NatsError> {
        #[derive(Deserialize)]
        struct Done {
            #[serde(default)]
            success: bool,
        }
        let d: Done = self
            .api(&format!("$JS.API.STREAM.DELETE.{stream}"), &Value::Null)
            .await?;
        Ok(d.success)
    }
}

/// The JetStream API on the blocking driver: each call is the one of
/// [`JetStream`], run to its end here (every request on this connection is
/// a blocking call, so the call never waits on anything else).
impl NatsConnection {
    /// [`JetStream::api_request`] on this connection.
    pub fn api_request(&mut self, subject: &str, body: &Value) -> Result<Value, NatsError> {
        run_blocking(JetStream(self).api_request(subject, body))
    }

    /// [`JetStream::stream_info`] on this connection.
    pub fn stream_info(&mut self, name: &str) -> Result<StreamInfo, NatsError> {
        run_blocking(JetStream(self).stream_info(name))
    }

    /// [`JetStream::fold_subject_counts`] on this connection.
    pub fn fold_subject_counts(
        &mut self,
        name: &str,
        filter: &str,
        each: impl FnMut(&str, u64),
    ) -> Result<(), NatsError> {
        run_blocking(JetStream(self).fold_subject_counts(name, filter, each))
    }

    /// [`JetStream::subject_counts`] on this connection.
    pub fn subject_counts(
        &mut self,
        name: &str,
        filter: &str,
    ) -> Result<BTreeMap<String, u64>, NatsError> {
        run_blocking(JetStream(self).subject_counts(name, filter))
    }

    /// [`JetStream::ensure_stream`] on this connection.
    pub fn ensure_stream(&mut self, spec: &StreamSpec) -> Result<StreamInfo, NatsError> {
        run_blocking(JetStream(self).ensure_stream(spec))
    }

    /// [`JetStream::ensure_stream_with_schedules`] on this connection.
    pub fn ensure_stream_with_schedules(
        &mut self,
        spec: &StreamSpec,
    ) -> Result<StreamInfo, NatsError> {
        run_blocking(JetStream(self).ensure_stream_with_schedules(spec))
    }

    /// [`JetStream::allow_msg_schedules`] on this connection.
    pub fn allow_msg_schedules(&mut self, name: &str) -> Result<StreamInfo, NatsError> {
        run_blocking(JetStream(self).allow_msg_schedules(name))
    }

    /// [`JetStream::consumer_info`] on this connection.
    pub fn consumer_info(
        &mut self,
        stream: &str,
        durable: &str,
    ) -> Result<ConsumerInfo, NatsError> {
        run_blocking(JetStream(self).consumer_info(stream, durable))
    }

    /// [`JetStream::ensure_consumer`] on this connection.
    pub fn ensure_consumer(
        &mut self,
        stream: &str,
        durable: &str,
        spec: &ConsumerSpec,
    ) -> Result<ConsumerInfo, NatsError> {
        run_blocking(JetStream(self).ensure_consumer(stream, durable, spec))
    }

    /// [`JetStream::ensure_consumer_paused`] on this connection.
    pub fn ensure_consumer_paused(
        &mut self,
        stream: &str,
        durable: &str,
        spec: &ConsumerSpec,
        pause_until: Option<SystemTime>,
    ) -> Result<ConsumerInfo, NatsError> {
        run_blocking(JetStream(self).ensure_consumer_paused(stream, durable, spec, pause_until))
    }

    /// [`JetStream::create_consumer`] on this connection.
    pub fn create_consumer(
        &mut self,
        stream: &str,
        durable: &str,
        spec: &ConsumerSpec,
        pause_until: Option<SystemTime>,
    ) -> Result<ConsumerInfo, NatsError> {
        run_blocking(JetStream(self).create_consumer(stream, durable, spec, pause_until))
    }

    /// [`JetStream::pause_consumer`] on this connection.
    pub fn pause_consumer(
        &mut self,
        stream: &str,
        durable: &str,
        until: Option<SystemTime>,
    ) -> Result<bool, NatsError> {
        run_blocking(JetStream(self).pause_consumer(stream, durable, until))
    }

    /// [`JetStream::msg_get`] on this connection.
    pub fn msg_get(&mut self, stream: &str, which: MsgSelect<'_>) -> Result<StoredMsg, NatsError> {
        run_blocking(JetStream(self).msg_get(stream, which))
    }

    /// [`JetStream::msg_delete`] on this connection.
    pub fn msg_delete(&mut self, stream: &str, seq: u64) -> Result<bool, NatsError> {
        run_blocking(JetStream(self).msg_delete(stream, seq))
    }

    /// [`JetStream::stream_delete`] on this connection.
    pub fn stream_delete(&mut self, stream: &str) -> Result<bool, NatsError> {
        run_blocking(JetStream(self).stream_delete(stream))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use taskq_proto::nats::ApiError;

    fn api(code: u64, err_code: u64, description: &str) -> NatsError {
        NatsError::Api(ApiError {
            code,
            err_code,
            description: description.into(),
        })
    }

    /// What the API calls wait out within their patience: no leader, and a
    /// placement refused for a peer not seen online (a cluster still
    /// forming: CI saw `taskq demo` refused so on a fresh 2.15.1 cluster);
    /// the other refusals are answers.
    #[test]
    fn a_cluster_forming_or_without_a_leader_is_waited_out_and_refusals_stand() {
        assert!(is_transient(&NatsError::NoResponders));
        assert!(is_transient(&api(503, 0, "")));
        assert!(is_transient(&api(
            500,
            10008,
            "JetStream system temporarily unavailable"
        )));
        assert!(is_transient(&api(
            400,
            10005,
            "no suitable peers for placement, peer offline"
        )));
        assert!(!is_transient(&api(
            400,
            10005,
            "no suitable peers for placement, insufficient resources"
        )));
        assert!(!is_transient(&api(404, 10059, "stream not found")));
        assert!(!is_transient(&api(
            400,
            10058,
            "stream name already in use"
        )));
    }
}
