//! One producer on one server: put, put_batch, put with queue position, and
//! reconnection after a broken connection.

use std::net::SocketAddr;
use std::time::Instant;

use taskq_proto::{ConnectionConfig, IoCounts};

use crate::builder::{Builder, DEFAULT_RESOLVE_FOR};
use crate::classify::{check_tube, in_backoff, too_big, Attempts, Batch, BatchRetry, Chunk, Rule};
use crate::engine::Link;
use crate::error::{Error, Invalid, NotSent};
use crate::nats::{open_again, NatsSetup};
use crate::outcome::{BatchError, BatchReport, Position, PutOutcome};
use crate::reconnects::Reconnects;
use crate::target::IntoTarget;
use crate::{JobId, PutOptions};

// Making a producer is here, beside the fields it fills; the settings are
// in builder.rs.
impl Builder {
    /// Connects now; fails with [`Error::NotSent`] when the server cannot be reached.
    ///
    /// `addr` is an address string (`nats://HOST:PORT[,HOST:PORT...]` selects
    /// JetStream; `HOST:PORT` or `beanstalk://HOST:PORT` beanstalkd) or socket
    /// addresses (beanstalkd).
    ///
    /// On JetStream a connection that was accepted and then broke, a reply
    /// that did not come, or a cluster without a leader (an election), while
    /// connecting or looking up the stream, is tried again with the reconnect
    /// backoff until [`resolve_for`](Self::resolve_for) runs out. No server
    /// listening, a server's refusal, or a stream that does not fit fails at once.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use taskq_producer::Producer;
    ///
    /// let mut p = Producer::builder()
    ///     .io_timeout(Duration::from_millis(500))
    ///     .connect("nats://127.0.0.1:4222")?;
    /// # Ok::<(), taskq_producer::Error>(())
    /// ```
    pub fn connect(self, addr: impl IntoTarget) -> Result<Producer, Error> {
        let mut p = self.build(addr)?;
        p.open_first()?;
        Ok(p)
    }

    /// Resolves the address but connects on the first call.
    ///
    /// ```no_run
    /// use taskq_producer::{Producer, PutOptions};
    ///
    /// // Nothing is sent yet: the first put connects.
    /// let mut p = Producer::builder().tube("emails").build("127.0.0.1:11300")?;
    /// let id = p.put(b"welcome 42", PutOptions::default())?;
    /// # Ok::<(), taskq_producer::Error>(())
    /// ```
    pub fn build(self, addr: impl IntoTarget) -> Result<Producer, Error> {
        let target = addr
            .into_target()
            .map_err(|e| Error::NotSent(NotSent::Io(e)))?;
        let nats = match target.engine() {
            taskq_connect::Engine::Beanstalkd => None,
            taskq_connect::Engine::Nats => Some(self.nats_setup(target.address())?),
        };
        let addrs = target.addrs().to_vec();
        let tube = self.checked_tube(&addrs, nats.is_some())?;
        Ok(Producer {
            addrs,
            cfg: self.cfg,
            reconnects: Reconnects::new(self.backoff),
            retries: self.retries,
            tube,
            conn: None,
            nats,
            #[cfg(feature = "serde")]
            json: Vec::new(),
        })
    }
}

/// A producer of jobs on one beanstalkd-protocol server.
///
/// Each put is one write and one read on a reused connection, with no heap
/// allocation in steady state. After a connection breaks, the next call
/// reconnects (waiting out a capped, jittered backoff after failed attempts)
/// and restores the tube in use.
#[derive(Debug)]
pub struct Producer {
    addrs: Vec<SocketAddr>,
    cfg: ConnectionConfig,
    reconnects: Reconnects,
    retries: u32,
    /// The tube in use; `None` is `default`, which a new connection starts with.
    tube: Option<String>,
    conn: Option<Link>,
    /// JetStream's layout and message ids; `None` on beanstalkd.
    nats: Option<NatsSetup>,
    /// `put_json`'s buffer, kept.
    #[cfg(feature = "serde")]
    json: Vec<u8>,
}

impl Producer {
    /// Connects with the default settings (see [`Builder::connect`] for the
    /// addresses taken).
    ///
    /// ```no_run
    /// use taskq_producer::Producer;
    ///
    /// let beanstalkd = Producer::connect("127.0.0.1:11300")?;
    /// let jetstream = Producer::connect("nats://127.0.0.1:4222,127.0.0.1:4223")?;
    /// # Ok::<(), taskq_producer::Error>(())
    /// ```
    pub fn connect(addr: impl IntoTarget) -> Result<Producer, Error> {
        Builder::default().connect(addr)
    }

    /// Starts a [`Builder`] for non-default settings.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use taskq_producer::Producer;
    ///
    /// let mut p = Producer::builder()
    ///     .tube("emails")
    ///     .connect_timeout(Duration::from_secs(1))
    ///     .connect("127.0.0.1:11300")?;
    /// # Ok::<(), taskq_producer::Error>(())
    /// ```
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// Puts later jobs into `tube`. Refused before sending when the name is invalid.
    pub fn use_tube(&mut self, tube: &str) -> Result<(), Error> {
        check_tube(tube, self.nats.is_some())?;
        let wanted = (tube != "default").then_some(tube);
        if self.tube.as_deref() == wanted && self.conn.is_some() {
            return Ok(());
        }
        self.tube = wanted.map(str::to_owned);
        if self.conn.is_none() {
            // A fresh connection issues the `use` itself.
            return self.connected(true).map(|_| ());
        }
        let conn = self.conn.as_mut().expect("checked above");
        let r = conn.use_tube(tube);
        if r.is_err() {
            self.broke();
        }
        r
    }

    /// Sets the tube without waiting for a down server: issued now when
    /// connected, otherwise on reconnect. A failure drops the connection, so the
    /// reconnect issues it.
    pub(crate) fn want_tube(&mut self, tube: &str) {
        let wanted = (tube != "default").then_some(tube);
        if self.tube.as_deref() == wanted {
            return;
        }
        self.tube = wanted.map(str::to_owned);
        if let Some(conn) = self.conn.as_mut() {
            if conn.use_tube(tube).is_err() {
                self.broke();
            }
        }
    }

    /// The largest body this producer sends.
    pub fn max_job_size(&self) -> usize {
        self.cfg.limits.max_job_size
    }

    /// The tube puts go to.
    pub fn tube(&self) -> &str {
        self.tube.as_deref().unwrap_or("default")
    }

    /// Puts `value` as its JSON (feature `serde`), serialized into a buffer
    /// the producer keeps: a value whose serialization allocates nothing is
    /// put without allocating. A value that does not serialize is
    /// [`Invalid::Unserializable`](crate::Invalid::Unserializable), and
    /// nothing is sent.
    ///
    /// ```no_run
    /// # fn run() -> Result<(), taskq_producer::Error> {
    /// #[derive(serde::Serialize)]
    /// struct Welcome<'a> { user: u64, name: &'a str }
    ///
    /// let mut p = taskq_producer::Producer::connect("127.0.0.1:11300")?;
    /// p.put_json(&Welcome { user: 42, name: "Ada" }, Default::default())?;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "serde")]
    pub fn put_json<T: serde::Serialize + ?Sized>(
        &mut self,
        value: &T,
        opts: PutOptions,
    ) -> Result<JobId, Error> {
        let mut buf = std::mem::take(&mut self.json);
        let r = crate::json::encode(&mut buf, value).and_then(|()| self.put(&buf, opts));
        self.json = buf;
        r
    }

    /// Puts one job: one write, one read.
    ///
    /// ```no_run
    /// use taskq_producer::{Producer, PutOptions};
    ///
    /// let mut p = Producer::connect("127.0.0.1:11300")?;
    /// let opts = PutOptions { pri: 0, ttr: 30, ..PutOptions::default() };
    /// match p.put(b"resize a.png", opts) {
    ///     Ok(id) => println!("queued as {}", id.get()),
    ///     Err(e) if e.outcome_unknown() => println!("may be queued: {e}"),
    ///     Err(e) => println!("not queued: {e}"),
    /// }
    /// # Ok::<(), taskq_producer::Error>(())
    /// ```
    #[inline]
    pub fn put(&mut self, body: &[u8], opts: PutOptions) -> Result<JobId, Error> {
        // Steady state: a live connection and nothing to recover from. (A body
        // over the maximum is refused by the connection before sending, with
        // the same error `put_cold` gives.) The first put on a new connection
        // goes the cold way, which records the progress that makes the next
        // reconnect immediate.
        // A link that broke earlier refuses the put before sending anything
        // (`NotSent(Broken)`), and the cold path replaces it.
        if self.reconnects.made_progress() {
            if let Some(link) = self.conn.as_mut() {
                return match link.put(body, opts) {
                    Ok(id) => Ok(id),
                    Err(e) => self.put_failed(body, opts, e),
                };
            }
        }
        self.put_cold(body, opts)
    }

    /// The hot path's put did not come back inserted: a rejection is the
    /// answer; an unknown or not-sent outcome drops a broken connection and is
    /// retried in at-least-once mode.
    #[cold]
    fn put_failed(&mut self, body: &[u8], opts: PutOptions, e: Error) -> Result<JobId, Error> {
        if matches!(e, Error::NotSent(NotSent::Broken)) {
            // Broken before this put: nothing was sent; reconnect and put.
            self.drop_if_broken();
            return self.put_cold(body, opts);
        }
        let k = match &self.conn {
            Some(Link::Nats(n)) => Some(n.last()),
            _ => None,
        };
        self.drop_if_broken();
        self.attempt_again(k, body, opts, Err(e))
    }

    /// The rule a put of this producer goes again by: at-least-once
    /// retries on beanstalkd, resolution within `resolve_for` on JetStream.
    fn rule(&self) -> Rule {
        match &self.nats {
            Some(n) => Rule::Resolve(n.resolve_for()),
            None => Rule::Retries(self.retries),
        }
    }

    /// After attempt `r`, sends the put again while the one put rule
    /// ([`Attempts`]) says so: on JetStream with the message id of counter
    /// `k` (`Some`), which the stream stores once however many copies reach
    /// it.
    #[cold]
    fn attempt_again(
        &mut self,
        k: Option<u64>,
        body: &[u8],
        opts: PutOptions,
        mut r: Result<JobId, Error>,
    ) -> Result<JobId, Error> {
        let mut attempts = Attempts::new(self.rule());
        while let Some(again) = attempts.again(&r, Instant::now()) {
            if let Some(pause) = again.pause() {
                std::thread::sleep(pause);
            }
            r = match k {
                Some(k) => self.put_once_as(k, body, opts),
                None => self.put_once(body, opts, true),
            };
        }
        attempts.outcome(r)
    }

    /// JetStream: one attempt at the put of counter `k` (its message id),
    /// reconnecting first if needed.
    fn put_once_as(&mut self, k: u64, body: &[u8], opts: PutOptions) -> Result<JobId, Error> {
        let r = match self.connected(true) {
            Ok(Link::Nats(n)) => n.put_as(k, body, opts),
            Ok(Link::Beanstalkd(_)) => Err(Error::Invalid(Invalid::Unsupported {
                what: "a message id on a beanstalkd connection",
            })),
            Err(e) => Err(e),
        };
        match &r {
            Ok(_) | Err(Error::Rejected(_)) => self.reconnects.progress(),
            Err(_) => self.drop_if_broken(),
        }
        r
    }

    /// A put that needs a connection first (or a body refused before that).
    #[cold]
    fn put_cold(&mut self, body: &[u8], opts: PutOptions) -> Result<JobId, Error> {
        let max = self.cfg.limits.max_job_size;
        if body.len() > max {
            return Err(too_big(body.len(), max));
        }
        if let Some(setup) = &self.nats {
            // The first send is the resolution's own: nothing was sent yet.
            let k = setup.ids.take(1);
            return self.attempt_again(Some(k), body, opts, Err(Error::NotSent(NotSent::Broken)));
        }
        let r = self.put_once(body, opts, true);
        self.attempt_again(None, body, opts, r)
    }

    /// One attempt at a put; `wait` says whether to sleep out a reconnect backoff.
    pub(crate) fn put_once(
        &mut self,
        body: &[u8],
        opts: PutOptions,
        wait: bool,
    ) -> Result<JobId, Error> {
        let r = self.connected(wait)?.put(body, opts);
        match &r {
            Ok(_) => self.reconnects.progress(),
            Err(Error::Rejected(_)) => self.reconnects.progress(),
            Err(_) => self.drop_if_broken(),
        }
        r
    }

    /// Puts many jobs with one write (per
    /// [`MAX_PIPELINE_JOBS`](crate::MAX_PIPELINE_JOBS) jobs or
    /// [`MAX_PIPELINE_BYTES`](crate::MAX_PIPELINE_BYTES) bytes) and reads the
    /// replies in order.
    ///
    /// `out[i]` receives the outcome of `bodies[i]`. `Ok` means every reply was
    /// read (some jobs may still be rejected: see the report); `Err` says where
    /// the batch broke off. Nothing is sent when a body is too big or `out` is
    /// too short. In at-least-once mode the jobs from the break on are sent again
    /// on a fresh connection.
    ///
    /// ```no_run
    /// use taskq_producer::{Producer, PutOptions, PutOutcome};
    ///
    /// let mut p = Producer::connect("127.0.0.1:11300")?;
    /// let bodies = ["a.png", "b.png", "c.png"];
    /// let mut out = [PutOutcome::NotSent; 3];
    /// if let Err(e) = p.put_batch(&bodies, PutOptions::default(), &mut out) {
    ///     println!("{e}"); // the jobs after e.replied are Unknown or NotSent in `out`
    /// }
    /// for (body, outcome) in bodies.iter().zip(&out) {
    ///     println!("{body}: {outcome:?}");
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn put_batch<B: AsRef<[u8]>>(
        &mut self,
        bodies: &[B],
        opts: PutOptions,
        out: &mut [PutOutcome],
    ) -> Result<BatchReport, BatchError> {
        // JetStream: the re-sends are the engine's own (within
        // `resolve_for`), not only at-least-once mode's.
        let until = self.nats.as_ref().map(|n| Instant::now() + n.resolve_for());
        let retry = BatchRetry::new(self.retries, until);
        let (mut batch, out) = Batch::start(bodies, out, self.cfg.limits.max_job_size, retry)?;
        // JetStream: the batch's message ids, fixed before the first send so
        // that a chunk sent again is stored once.
        let first = self
            .nats
            .as_ref()
            .map_or(0, |n| n.ids.take(bodies.len() as u64));
        while let Some(chunk) = batch.next_chunk(bodies, first, opts) {
            let r = self.batch_chunk(chunk, out, &mut batch.report);
            if let Some(pause) = batch.after(r, out, Instant::now)? {
                std::thread::sleep(pause);
            }
        }
        Ok(batch.report)
    }

    /// Sends `chunk` in one write and reads its replies; returns where the
    /// next chunk starts.
    fn batch_chunk<B: AsRef<[u8]>>(
        &mut self,
        chunk: Chunk<'_, B>,
        out: &mut [PutOutcome],
        report: &mut BatchReport,
    ) -> Result<usize, BatchError> {
        let link = self.connected(true).map_err(|error| BatchError {
            replied: chunk.from,
            error,
        })?;
        if let Err(e) = link.put_chunk(chunk, out, report) {
            self.drop_if_broken();
            return Err(e);
        }
        self.reconnects.progress();
        Ok(chunk.end)
    }

    /// Puts a job and asks for its tube's statistics in the same write, giving
    /// the id and the number of ready jobs in line ("you are seventh").
    ///
    /// The put goes again by the rule [`put`](Self::put) keeps (retries in
    /// at-least-once mode; on JetStream, the same message id within
    /// `resolve_for`); a put that needed another attempt has no count.
    /// JetStream keeps no per-tube ready count: `ready` is `None` there.
    pub fn put_with_position(&mut self, body: &[u8], opts: PutOptions) -> Result<Position, Error> {
        let is_ready = opts.delay == 0;
        if self.nats.is_some() {
            let id = self.put(body, opts)?;
            return Ok(Position {
                id,
                ready: None,
                is_ready,
            });
        }
        if body.len() > self.cfg.limits.max_job_size {
            return Err(too_big(body.len(), self.cfg.limits.max_job_size));
        }
        let (first, ready) = match self.connected(true).map(|_| ()) {
            Ok(()) => {
                let tube = self.tube.as_deref().unwrap_or("default");
                let link = self.conn.as_mut().expect("connected above");
                let got = link.put_with_ready(body, opts, tube);
                if link.is_broken() {
                    self.drop_if_broken();
                } else {
                    self.reconnects.progress();
                }
                got
            }
            Err(e) => (Err(e), None),
        };
        let id = match first {
            Ok(id) => id,
            Err(e) => self.attempt_again(None, body, opts, Err(e))?,
        };
        Ok(Position {
            id,
            ready,
            is_ready,
        })
    }

    /// True while a connection is open (it may still turn out broken on the next call).
    pub fn is_connected(&self) -> bool {
        self.conn.as_ref().is_some_and(|c| !c.is_broken())
    }

    /// Connections opened so far (1 after `connect`, more after reconnects).
    pub fn connects(&self) -> u64 {
        self.reconnects.count()
    }

    /// System calls on the current connection, for tests and benchmarks.
    pub fn io_counts(&self) -> Option<IoCounts> {
        self.conn.as_ref().map(Link::io_counts)
    }

    /// The addresses this producer connects to.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// True when the server is in its reconnect backoff: a call now would wait
    /// (or, in a multi-server producer, skip it).
    pub fn in_backoff(&self) -> bool {
        self.conn.is_none() && self.reconnects.wait_left().is_some()
    }

    /// Closes the connection (sending `quit`); the next call reconnects.
    pub fn disconnect(&mut self) {
        if let Some(c) = self.conn.take() {
            c.quit();
        }
    }

    /// The open connection, opening one (and restoring the tube) if needed.
    pub(crate) fn connected(&mut self, wait: bool) -> Result<&mut Link, Error> {
        if self.conn.as_ref().is_some_and(|c| !c.is_broken()) {
            return Ok(self.conn.as_mut().expect("checked above"));
        }
        self.conn = None;
        if let Some(left) = self.reconnects.wait_left() {
            if !wait {
                return Err(in_backoff(left));
            }
            std::thread::sleep(left);
        }
        self.open_link()
    }

    /// Opens a connection now, whatever is left of the backoff.
    fn open_link(&mut self) -> Result<&mut Link, Error> {
        let opened = Link::open(
            &self.addrs,
            self.cfg,
            self.tube.as_deref(),
            self.nats.as_mut(),
        );
        self.reconnects.opened(&mut self.conn, opened)
    }

    /// The first connection of [`Builder::connect`]: one attempt on
    /// beanstalkd; on JetStream, attempts while they fail in a way that comes
    /// and goes, within `resolve_for`.
    /// The backoff is cut short at the end of `resolve_for`, where the last
    /// attempt is made, so the attempts span the whole of it.
    fn open_first(&mut self) -> Result<(), Error> {
        let until = Instant::now()
            + self
                .nats
                .as_ref()
                .map_or(DEFAULT_RESOLVE_FOR, NatsSetup::resolve_for);
        loop {
            let wait = self.reconnects.wait_left().unwrap_or_default();
            std::thread::sleep(wait.min(until.saturating_duration_since(Instant::now())));
            self.conn = None;
            let e = match self.open_link() {
                Ok(_) => return Ok(()),
                Err(e) => e,
            };
            let again = self.nats.is_some() && open_again(&e);
            if !again || Instant::now() >= until {
                return Err(e);
            }
        }
    }

    /// Forgets a connection that broke so the next call opens a new one.
    fn drop_if_broken(&mut self) {
        if self.conn.as_ref().is_some_and(Link::is_broken) {
            self.broke();
        }
    }

    fn broke(&mut self) {
        // The first reconnect after a healthy spell is immediate; repeated breaks back off.
        self.reconnects.broke(&mut self.conn);
    }
}
