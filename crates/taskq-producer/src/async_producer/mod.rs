//! The producer over tokio: the same puts, batches, outcomes and reconnect
//! rule as the blocking [`Producer`](crate::Producer), on beanstalkd
//! ([`beanstalkd`]: one `TcpStream` under the beanstalkd session) and on
//! JetStream ([`jetstream`]: one `TcpStream` under the NATS session).

use std::time::Instant;

use taskq_proto::IoCounts;

use crate::builder::Builder;
use crate::classify::Batch;
use crate::error::Error;
use crate::outcome::{BatchError, BatchReport, PutOutcome};
use crate::{JobId, PutOptions};

mod beanstalkd;
mod jetstream;

pub(crate) use beanstalkd::AsyncBeanstalkd;
pub(crate) use jetstream::AsyncJetStream;

impl Builder {
    /// Connects an [`AsyncProducer`] with these settings (resolving `addr`
    /// without blocking the runtime); fails with [`Error::NotSent`] when the
    /// server cannot be reached. `nats://HOST:PORT[,HOST:PORT...]` (or
    /// `tls://`) selects JetStream, with the credentials and TLS settings of
    /// [`nats_access`](Builder::nats_access); `HOST:PORT` beanstalkd.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use taskq_producer::Producer;
    ///
    /// # async fn run() -> Result<(), taskq_producer::Error> {
    /// let mut p = Producer::builder()
    ///     .io_timeout(Duration::from_millis(500))
    ///     .connect_async("127.0.0.1:11300")
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect_async(self, addr: &str) -> Result<AsyncProducer, Error> {
        let engine = match taskq_connect::Address::parse(addr) {
            Ok(a) if a.is_nats() => Engine::JetStream(AsyncJetStream::connect(self, a).await?),
            _ => Engine::Beanstalkd(AsyncBeanstalkd::connect(self, addr).await?),
        };
        Ok(AsyncProducer {
            engine,
            #[cfg(feature = "serde")]
            json: Vec::new(),
        })
    }
}

/// A producer of jobs for tokio, on one beanstalkd-protocol server or one
/// JetStream cluster.
///
/// Each put is one write and one read on a reused `TcpStream`, with no heap
/// allocation and no timer registration in steady state: the whole-reply
/// deadline is one timer kept per connection and re-armed only when it fires
/// early. Outcomes mean what they mean for the blocking
/// [`Producer`](crate::Producer); after a connection breaks, the next call
/// reconnects (at once the first time after progress, then after a capped,
/// jittered backoff) and restores the tube in use. On JetStream a put whose
/// outcome is unknown is sent again with the same `Nats-Msg-Id` within
/// [`resolve_for`](Builder::resolve_for), and the stream stores it once.
///
/// Settings come from the blocking producer's [`Builder`]:
/// `Producer::builder().io_timeout(..).connect_async(addr).await`.
///
/// A producer belongs to the runtime it was connected on, which must have its
/// time and I/O drivers enabled (`Builder::enable_all`). A put or batch
/// whose future is dropped (a `tokio::time::timeout` around it, say) has an
/// unknown outcome, and never hands its reply to a later call: a connection
/// left owing replies, or with half a request written, is replaced by the
/// next call, as a broken one is (on JetStream a lone put's late PubAck is
/// told apart by its reply subject and skipped, so its connection stays).
#[derive(Debug)]
pub struct AsyncProducer {
    engine: Engine,
    /// `put_json`'s buffer, kept.
    #[cfg(feature = "serde")]
    json: Vec<u8>,
}

#[derive(Debug)]
// One engine per producer: its size does not matter, and boxing either
// would put a pointer chase on every put.
#[allow(clippy::large_enum_variant)]
enum Engine {
    Beanstalkd(AsyncBeanstalkd),
    JetStream(AsyncJetStream),
}

impl AsyncProducer {
    /// Connects with the default settings (see [`Builder::connect_async`]
    /// for the addresses taken).
    ///
    /// ```no_run
    /// use taskq_producer::AsyncProducer;
    ///
    /// # async fn run() -> Result<(), taskq_producer::Error> {
    /// let mut p = AsyncProducer::connect("nats://127.0.0.1:4222").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect(addr: &str) -> Result<AsyncProducer, Error> {
        Builder::default().connect_async(addr).await
    }

    /// Puts later jobs into `tube`. Refused before sending when the name is
    /// invalid (on JetStream: not one subject token).
    pub async fn use_tube(&mut self, tube: &str) -> Result<(), Error> {
        match &mut self.engine {
            Engine::Beanstalkd(b) => b.use_tube(tube).await,
            Engine::JetStream(j) => j.use_tube(tube).await,
        }
    }

    /// The tube puts go to.
    pub fn tube(&self) -> &str {
        match &self.engine {
            Engine::Beanstalkd(b) => b.tube(),
            Engine::JetStream(j) => j.tube(),
        }
    }

    /// The largest body this producer sends.
    pub fn max_job_size(&self) -> usize {
        match &self.engine {
            Engine::Beanstalkd(b) => b.max_job_size(),
            Engine::JetStream(j) => j.max_job_size(),
        }
    }

    /// Puts `value` as its JSON (feature `serde`), serialized into a buffer
    /// the producer keeps (see [`Producer::put_json`](crate::Producer::put_json)).
    ///
    /// ```no_run
    /// # async fn run(p: &mut taskq_producer::AsyncProducer) -> Result<(), taskq_producer::Error> {
    /// p.put_json(&serde_json::json!({"user": 42}), Default::default()).await?;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "serde")]
    pub async fn put_json<T: serde::Serialize + ?Sized>(
        &mut self,
        value: &T,
        opts: PutOptions,
    ) -> Result<JobId, Error> {
        let mut buf = std::mem::take(&mut self.json);
        let r = match crate::json::encode(&mut buf, value) {
            Ok(()) => self.put(&buf, opts).await,
            Err(e) => Err(e),
        };
        self.json = buf;
        r
    }

    /// Puts one job: one write, one read. On JetStream the id is the
    /// job's stream sequence.
    ///
    /// ```no_run
    /// use taskq_producer::{AsyncProducer, PutOptions};
    ///
    /// # async fn run() -> Result<(), taskq_producer::Error> {
    /// let mut p = AsyncProducer::connect("127.0.0.1:11300").await?;
    /// p.use_tube("emails").await?;
    /// let id = p.put(b"welcome 42", PutOptions::default()).await?;
    /// println!("queued as {}", id.get());
    /// # Ok(())
    /// # }
    /// ```
    #[inline]
    pub async fn put(&mut self, body: &[u8], opts: PutOptions) -> Result<JobId, Error> {
        match &mut self.engine {
            Engine::Beanstalkd(b) => b.put(body, opts).await,
            Engine::JetStream(j) => j.put(body, opts).await,
        }
    }

    /// Puts many jobs with one write (per [`MAX_PIPELINE_JOBS`](crate::MAX_PIPELINE_JOBS)
    /// jobs or [`MAX_PIPELINE_BYTES`](crate::MAX_PIPELINE_BYTES) bytes) and reads the
    /// replies in order, exactly as [`Producer::put_batch`](crate::Producer::put_batch):
    /// `out[i]` receives the outcome of `bodies[i]`; `Err` says where the batch broke off.
    ///
    /// ```no_run
    /// use taskq_producer::{AsyncProducer, PutOptions, PutOutcome};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut p = AsyncProducer::connect("127.0.0.1:11300").await?;
    /// let mut out = [PutOutcome::NotSent; 2];
    /// let report = p.put_batch(&["a", "b"], PutOptions::default(), &mut out).await?;
    /// println!("{} inserted", report.inserted);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn put_batch<B: AsRef<[u8]>>(
        &mut self,
        bodies: &[B],
        opts: PutOptions,
        out: &mut [PutOutcome],
    ) -> Result<BatchReport, BatchError> {
        // One loop for both engines, as the blocking producer's: the
        // batch's rule (`Batch`: chunks, what a break makes of each job,
        // whether and when a chunk goes again) drives each engine's chunk.
        let (max, retry) = match &self.engine {
            Engine::Beanstalkd(b) => (b.max_job_size(), b.batch_retry()),
            Engine::JetStream(j) => (j.max_job_size(), j.batch_retry()),
        };
        let (mut batch, out) = Batch::start(bodies, out, max, retry)?;
        // JetStream: the batch's message ids, fixed before the first send
        // so that a chunk sent again is stored once.
        let first = match &mut self.engine {
            Engine::Beanstalkd(_) => 0,
            Engine::JetStream(j) => j.batch_ids(bodies.len()),
        };
        while let Some(chunk) = batch.next_chunk(bodies, first, opts) {
            let report = &mut batch.report;
            let r = match &mut self.engine {
                Engine::Beanstalkd(b) => b.batch_chunk(chunk, out, report).await,
                Engine::JetStream(j) => j.batch_chunk(chunk, out, report).await,
            };
            if let Some(pause) = batch.after(r, out, Instant::now)? {
                tokio::time::sleep(pause).await;
            }
        }
        Ok(batch.report)
    }

    /// True while a connection is open (it may still turn out broken on the next call).
    pub fn is_connected(&self) -> bool {
        match &self.engine {
            Engine::Beanstalkd(b) => b.is_connected(),
            Engine::JetStream(j) => j.is_connected(),
        }
    }

    /// Connections opened so far (1 after `connect`, more after reconnects).
    pub fn connects(&self) -> u64 {
        match &self.engine {
            Engine::Beanstalkd(b) => b.connects(),
            Engine::JetStream(j) => j.connects(),
        }
    }

    /// System calls on the current connection, for tests and benchmarks:
    /// writes and reads that moved bytes or failed.
    pub fn io_counts(&self) -> Option<IoCounts> {
        match &self.engine {
            Engine::Beanstalkd(b) => b.io_counts(),
            Engine::JetStream(j) => j.io_counts(),
        }
    }

    /// Server `PING`s the current connection answered (each one write of
    /// `PONG`): JetStream only, `None` on beanstalkd.
    pub fn pings_answered(&self) -> Option<u64> {
        match &self.engine {
            Engine::Beanstalkd(_) => None,
            Engine::JetStream(j) => j.pings_answered(),
        }
    }
}
