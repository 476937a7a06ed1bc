//! One producer on one server: put, put_batch, put with queue position, and
//! reconnection after a broken connection.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use taskq_proto::{Backoff, ConnectionConfig, IoCounts};

use crate::nats::NatsSetup;
use crate::reconnects::Reconnects;
use crate::target::IntoTarget;
use taskq_proto::nats::NatsAccess;

use crate::classify::{check_tube, chunk_end, in_backoff, resend_from, start_batch, too_big};
use crate::engine::Link;
use crate::error::{Error, Rejection};
use crate::NotSent;
use crate::{JobId, PutOptions};

/// The pause before re-sending a put JetStream answered `503`.
pub(crate) const RESOLVE_PAUSE: Duration = Duration::from_millis(100);

/// Most jobs sent in one write by [`Producer::put_batch`]; a longer batch goes
/// out in several writes. Bounds the replies waiting in the socket while the
/// request is still being written, so neither side blocks on a full buffer.
pub const MAX_PIPELINE_JOBS: usize = 1024;

/// Most request bytes gathered for one write by [`Producer::put_batch`] (a single
/// larger job still goes out alone, in one write).
pub const MAX_PIPELINE_BYTES: usize = 4 << 20;

/// The outcome of one job of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    /// Inserted with this id.
    Inserted(JobId),
    /// The server answered with a rejection (see [`Rejection::queued`] for `BURIED <id>`).
    Rejected(Rejection),
    /// Sent, but no reply came before the batch broke off: it may be queued.
    Unknown,
    /// Never reached the server.
    NotSent,
}

impl PutOutcome {
    /// The id when the job was inserted (including inserted but buried).
    pub fn id(self) -> Option<JobId> {
        match self {
            PutOutcome::Inserted(id) | PutOutcome::Rejected(Rejection::InsertedBuried { id }) => {
                Some(id)
            }
            _ => None,
        }
    }
}

/// What a whole batch came to, when every reply was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BatchReport {
    /// Jobs answered `INSERTED`.
    pub inserted: usize,
    /// Jobs the server rejected (including `BURIED <id>`).
    pub rejected: usize,
}

/// A batch that broke off: the replies of the first `replied` jobs were read
/// (their outcomes are in the caller's slice); each later job is
/// [`PutOutcome::Unknown`] or [`PutOutcome::NotSent`] there.
#[derive(Debug)]
pub struct BatchError {
    /// Jobs whose replies were read before the break.
    pub replied: usize,
    /// What broke the batch off.
    pub error: Error,
}

impl std::fmt::Display for BatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "batch broke off after {} replies: {}",
            self.replied, self.error
        )
    }
}

/// `Display` names the error that broke the batch, so `source` does not repeat it.
impl std::error::Error for BatchError {}

/// A put together with the state of its tube right after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// The new job's id.
    pub id: JobId,
    /// `current-jobs-ready` of the tube right after the put (the job itself
    /// included when it was put without delay); `None` when the statistics
    /// reply did not arrive (the job is inserted all the same).
    pub ready: Option<u64>,
    /// True when the job was put without delay, so it counts among the ready jobs.
    pub is_ready: bool,
}

impl Position {
    /// Ready jobs in the tube other than this one: how many are in line with it.
    /// Ready jobs run by priority then age, so this is an upper bound on the
    /// jobs ahead when this job has the most urgent priority, and exact for a
    /// tube where every job has the same priority.
    pub fn ahead(&self) -> Option<u64> {
        self.ready
            .map(|r| r.saturating_sub(u64::from(self.is_ready)))
    }
}

/// How long a JetStream put whose outcome is unknown is re-sent with its
/// message id before the producer gives up (well inside the stream's default
/// 2-minute duplicate window, and past a leader election's 4 to 9 seconds).
pub const DEFAULT_RESOLVE_FOR: Duration = Duration::from_secs(30);

/// Settings for a [`Producer`]; `Producer::builder()` starts one.
#[derive(Debug, Clone, Default)]
pub struct Builder {
    pub(crate) cfg: ConnectionConfig,
    pub(crate) backoff: Backoff,
    pub(crate) retries: u32,
    pub(crate) tube: Option<String>,
    pub(crate) stream: Option<String>,
    pub(crate) replicas: Option<usize>,
    pub(crate) resolve_for: Option<Duration>,
    pub(crate) access: NatsAccess,
    pub(crate) keep_stream_config: bool,
}

impl Builder {
    /// Limit on each connect attempt (default 2 s).
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.cfg.connect_timeout = d;
        self
    }

    /// Limit on each whole reply and each write (default 1 s).
    pub fn io_timeout(mut self, d: Duration) -> Self {
        self.cfg.io_timeout = d;
        self
    }

    /// Largest body accepted; larger ones are refused before sending
    /// (default 65535, beanstalkd's default `-z`).
    pub fn max_job_size(mut self, bytes: usize) -> Self {
        self.cfg.limits.max_job_size = bytes;
        self
    }

    /// Waits between reconnect attempts.
    pub fn backoff(mut self, b: Backoff) -> Self {
        self.backoff = b;
        self
    }

    /// TCP keepalive idle time; `None` turns keepalive off (default 30 s).
    pub fn keepalive(mut self, idle: Option<Duration>) -> Self {
        self.cfg.keepalive = idle;
        self
    }

    /// At-least-once mode: a put whose outcome is unknown (or that was not sent)
    /// is sent again on a fresh connection, up to `retries` more times. A job
    /// may then be queued twice; the default, 0, never re-sends.
    pub fn at_least_once(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    /// The tube puts go to from the start (default `default`).
    pub fn tube(mut self, tube: &str) -> Self {
        self.tube = Some(tube.to_owned());
        self
    }

    /// JetStream: the stream (default `TASKQ`, capturing `taskq.>`; another
    /// name captures its lower-case self followed by `.>`).
    pub fn stream(mut self, name: &str) -> Self {
        self.stream = Some(name.to_owned());
        self
    }

    /// JetStream: replicas of the stream when the producer creates it
    /// (default: 3 on a cluster of 3 or more nodes, else 1). An existing
    /// stream is used as it is.
    pub fn replicas(mut self, n: usize) -> Self {
        self.replicas = Some(n);
        self
    }

    /// JetStream: how long a put whose PubAck did not come is re-sent, with
    /// the same message id, on fresh connections (default 30 s). The stream
    /// stores it once; past this time the put fails as unknown.
    pub fn resolve_for(mut self, d: Duration) -> Self {
        self.resolve_for = Some(d);
        self
    }

    /// JetStream: never change an existing stream's configuration (default
    /// false). On nats-server 2.12 and later a delayed job is held by the
    /// server (a message schedule) when the stream allows message
    /// schedules: a stream the producer creates does, and an existing
    /// stream without them is updated to allow them, a change the server
    /// cannot undo. With `true` such a stream is left as it is, and delayed
    /// jobs stay with the client (carried to the tube at once, given back
    /// by a worker handed them early), as on older servers.
    pub fn keep_stream_config(mut self, keep: bool) -> Self {
        self.keep_stream_config = keep;
        self
    }

    /// JetStream: credentials and TLS (the address's own user info, and
    /// `tls://`, take precedence). Not read from the environment: the
    /// commands do that.
    pub fn nats_access(mut self, access: NatsAccess) -> Self {
        self.access = access;
        self
    }

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
    pub fn connect(self, addr: impl IntoTarget) -> Result<Producer, Error> {
        let mut p = self.build(addr)?;
        p.open_first()?;
        Ok(p)
    }

    /// Resolves the address but connects on the first call.
    pub fn build(self, addr: impl IntoTarget) -> Result<Producer, Error> {
        let target = addr
            .into_target()
            .map_err(|e| Error::NotSent(NotSent::Io(e)))?;
        let nats = match target.engine() {
            taskq_proto::Engine::Beanstalkd => None,
            taskq_proto::Engine::Nats => Some(self.nats_setup(target.address())?),
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
            resolve_for: self.resolve_for.unwrap_or(DEFAULT_RESOLVE_FOR),
        })
    }
}

impl Builder {
    /// JetStream's layout, message ids, credentials and seeds for a
    /// producer of `address` (its user info and `tls://` win over the
    /// builder's access; `None` when given socket addresses).
    pub(crate) fn nats_setup(
        &self,
        address: Option<&taskq_proto::Address>,
    ) -> Result<NatsSetup, Error> {
        let stream = self
            .stream
            .as_deref()
            .unwrap_or(taskq_proto::DEFAULT_STREAM);
        let layout = taskq_proto::Layout::new(stream)
            .map_err(|e| Error::from(taskq_proto::EncodeError::BadTubeName(e)))?;
        let (access, seeds) = match address {
            Some(a) => (self.access.for_address(a), a.hosts().to_vec()),
            None => (self.access.clone(), Vec::new()),
        };
        Ok(NatsSetup::new(
            layout,
            self.replicas,
            access,
            seeds,
            self.keep_stream_config,
        ))
    }

    /// Refuses an empty address list or a bad tube name; the tube to restore
    /// on each connection (`None` for `default`, which a connection starts with).
    pub(crate) fn checked_tube(
        &self,
        addrs: &[SocketAddr],
        jetstream: bool,
    ) -> Result<Option<String>, Error> {
        if addrs.is_empty() {
            return Err(Error::NotSent(NotSent::NoAddress));
        }
        if let Some(t) = &self.tube {
            check_tube(t, jetstream)?;
        }
        Ok(self.tube.clone().filter(|t| t != "default"))
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
    resolve_for: Duration,
}

impl Producer {
    /// Connects with the default settings (see [`Builder::connect`] for the
    /// addresses taken).
    pub fn connect(addr: impl IntoTarget) -> Result<Producer, Error> {
        Builder::default().connect(addr)
    }

    /// Starts a [`Builder`] for non-default settings.
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

    /// Puts one job: one write, one read.
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
        let r = Err(e);
        if !matches!(r, Err(Error::Unknown(_) | Error::NotSent(_))) {
            return r;
        }
        if let Some(Link::Nats(n)) = &self.conn {
            let k = n.last();
            self.drop_if_broken();
            return self.resolve(k, body, opts, r);
        }
        self.drop_if_broken();
        self.put_again(body, opts, r)
    }

    /// JetStream: sends the put of counter `k` again, with the same message
    /// id, until the stream answers or `resolve_for` runs out. The stream
    /// stores it once however many copies reach it.
    #[cold]
    fn resolve(
        &mut self,
        k: u64,
        body: &[u8],
        opts: PutOptions,
        mut r: Result<JobId, Error>,
    ) -> Result<JobId, Error> {
        let until = Instant::now() + self.resolve_for;
        // Once a send may have reached the stream, the put stays unknown
        // however the later re-sends fail.
        let mut maybe_stored = false;
        while matches!(r, Err(Error::Unknown(_) | Error::NotSent(_))) && Instant::now() < until {
            maybe_stored |= matches!(r, Err(Error::Unknown(_)));
            if matches!(r, Err(Error::NotSent(NotSent::Unavailable))) {
                // Answered at once while a leader is elected: not a tight loop.
                std::thread::sleep(RESOLVE_PAUSE);
            }
            r = match self.connected(true) {
                Ok(Link::Nats(n)) => n.put_as(k, body, opts),
                Ok(Link::Beanstalkd(_)) => {
                    unreachable!("a JetStream producer opens JetStream links")
                }
                Err(e) => Err(e),
            };
            match &r {
                Ok(_) | Err(Error::Rejected(_)) => self.reconnects.progress(),
                Err(_) => self.drop_if_broken(),
            }
        }
        match r {
            Err(Error::NotSent(e)) if maybe_stored => Err(Error::Unknown(
                taskq_proto::ConnectionError::Io(std::io::Error::other(format!(
                    "sent earlier with no reply, and no re-send reached the stream ({e})"
                ))),
            )),
            r => r,
        }
    }

    /// A put that needs a connection first (or a body refused before that).
    #[cold]
    fn put_cold(&mut self, body: &[u8], opts: PutOptions) -> Result<JobId, Error> {
        let max = self.cfg.limits.max_job_size;
        if body.len() > max {
            return Err(too_big(body.len(), max));
        }
        if let Some(setup) = &self.nats {
            let k = setup.ids.take(1);
            return self.resolve(k, body, opts, Err(Error::NotSent(NotSent::Broken)));
        }
        let r = self.put_once(body, opts, true);
        self.put_again(body, opts, r)
    }

    /// At-least-once mode: sends again while the outcome is unknown or not sent.
    fn put_again(
        &mut self,
        body: &[u8],
        opts: PutOptions,
        mut r: Result<JobId, Error>,
    ) -> Result<JobId, Error> {
        let mut retries = self.retries;
        while retries > 0 && matches!(r, Err(Error::Unknown(_) | Error::NotSent(_))) {
            retries -= 1;
            r = self.put_once(body, opts, true);
        }
        r
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

    /// Puts many jobs with one write (per [`MAX_PIPELINE_JOBS`] jobs or
    /// [`MAX_PIPELINE_BYTES`] bytes) and reads the replies in order.
    ///
    /// `out[i]` receives the outcome of `bodies[i]`. `Ok` means every reply was
    /// read (some jobs may still be rejected: see the report); `Err` says where
    /// the batch broke off. Nothing is sent when a body is too big or `out` is
    /// too short. In at-least-once mode the jobs from the break on are sent again
    /// on a fresh connection.
    pub fn put_batch<B: AsRef<[u8]>>(
        &mut self,
        bodies: &[B],
        opts: PutOptions,
        out: &mut [PutOutcome],
    ) -> Result<BatchReport, BatchError> {
        let out = start_batch(bodies, out, self.cfg.limits.max_job_size)?;
        let mut report = BatchReport::default();
        let mut from = 0;
        // JetStream: the batch's message ids, fixed before the first send so
        // that a chunk sent again is stored once; and the re-sends are the
        // engine's own (within `resolve_for`), not only at-least-once mode's.
        let first = self
            .nats
            .as_ref()
            .map_or(0, |n| n.ids.take(bodies.len() as u64));
        let until = Instant::now() + self.resolve_for;
        let mut retries = self.retries;
        while from < bodies.len() {
            match self.batch_chunk(bodies, from, first, opts, out, &mut report) {
                Ok(next) => from = next,
                Err(e) if retries > 0 && !matches!(e.error, Error::Invalid(_)) => {
                    retries -= 1;
                    from = e.replied;
                    out[from..].fill(PutOutcome::NotSent);
                }
                Err(e)
                    if self.nats.is_some()
                        && matches!(e.error, Error::Unknown(_) | Error::NotSent(_))
                        && Instant::now() < until =>
                {
                    if matches!(e.error, Error::NotSent(NotSent::Unavailable)) {
                        std::thread::sleep(RESOLVE_PAUSE);
                    }
                    from = resend_from(&e, out);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(report)
    }

    /// Sends one write's worth of the batch starting at `from` and reads its
    /// replies; returns where the next chunk starts.
    fn batch_chunk<B: AsRef<[u8]>>(
        &mut self,
        bodies: &[B],
        from: usize,
        first: u64,
        opts: PutOptions,
        out: &mut [PutOutcome],
        report: &mut BatchReport,
    ) -> Result<usize, BatchError> {
        let link = self.connected(true).map_err(|error| BatchError {
            replied: from,
            error,
        })?;
        let end = chunk_end(bodies, from);
        if let Err(e) = link.put_chunk(bodies, (from, end), first, opts, out, report) {
            self.drop_if_broken();
            return Err(e);
        }
        self.reconnects.progress();
        Ok(end)
    }

    /// Puts a job and asks for its tube's statistics in the same write, giving
    /// the id and the number of ready jobs in line ("you are seventh").
    pub fn put_with_position(&mut self, body: &[u8], opts: PutOptions) -> Result<Position, Error> {
        if body.len() > self.cfg.limits.max_job_size {
            return Err(too_big(body.len(), self.cfg.limits.max_job_size));
        }
        self.connected(true)?;
        let tube = self.tube.as_deref().unwrap_or("default");
        let link = self.conn.as_mut().expect("connected above");
        let (id, ready) = link.put_with_ready(body, opts, tube);
        if link.is_broken() {
            self.drop_if_broken();
        } else {
            self.reconnects.progress();
        }
        Ok(Position {
            id: id?,
            ready,
            is_ready: opts.delay == 0,
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
        let until = Instant::now() + self.resolve_for;
        loop {
            let wait = self.reconnects.wait_left().unwrap_or_default();
            std::thread::sleep(wait.min(until.saturating_duration_since(Instant::now())));
            self.conn = None;
            let e = match self.open_link() {
                Ok(_) => return Ok(()),
                Err(e) => e,
            };
            let again = self.nats.is_some() && crate::nats::open_again(&e);
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
