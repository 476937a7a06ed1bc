//! The shared producer's tokio driver: one task that owns the connection
//! (the async producer's engine, with its connect and reconnect rule) and
//! moves puts between the [`Pipeline`] and the socket. It writes whatever
//! is queued in one write as soon as the connection can take it, and reads
//! replies meanwhile; every decision about a put is the pipeline's.
//!
//! The reply deadline is the protocol session's: on beanstalkd from the
//! moment a read first had to wait since the last reply, on JetStream the
//! I/O timeout after the oldest owed PubAck's write. Either is kept across
//! the reads that new work interrupts, so a silent server is caught one I/O
//! timeout after it went silent however many puts keep coming.

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::Instant;

use taskq_connect::Layout;
use taskq_proto::{Command, ConnectionError, Reply};

use crate::async_producer::{AsyncBeanstalkd, AsyncJetStream};
use crate::builder::Builder;
use crate::classify::unexpected;
use crate::delays::{Delays, Put, Route, Stamp};
use crate::error::{Error, NotSent};
use crate::nats::{from_nats, IdBuf, MsgIds};
use crate::outcome::{MAX_PIPELINE_BYTES, MAX_PIPELINE_JOBS};
use crate::JobId;

use super::pipeline::{Owed, Pipeline};
use super::{wake_all, Inner};

/// Tubes whose JetStream routes are kept (past that the cache starts over).
const ROUTES_KEPT: usize = 256;

/// The connection side: an engine of the async producer, and what the
/// driver keeps beside it.
// One link per producer: its size does not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Link {
    Beanstalkd {
        engine: AsyncBeanstalkd,
        /// The tube the connection is in, as of the last `use` written.
        tube: String,
    },
    JetStream {
        engine: AsyncJetStream,
        ids: MsgIds,
        layout: Layout,
        /// Each tube's route, for the delays they were made with.
        routes: Vec<(String, Route)>,
        delays: Option<Delays>,
    },
}

/// A reply read, before the pipeline places it.
enum Heard {
    /// beanstalkd, the oldest owed reply: `INSERTED`.
    Inserted(u64),
    /// beanstalkd: `USING`.
    Using,
    /// beanstalkd: any other reply (a rejection, or one out of step).
    Other(Error),
    /// JetStream: the reply to `token`.
    Token(u64, Result<JobId, Error>),
}

impl Link {
    /// Connects with the settings of `b`, the engine chosen by `addr` as
    /// [`Builder::connect_async`] chooses it.
    pub(crate) async fn connect(b: Builder, addr: &str) -> Result<Link, Error> {
        match taskq_connect::Address::parse(addr) {
            Ok(a) if a.is_nats() => {
                let engine = AsyncJetStream::connect(b, a).await?;
                let (ids, layout, _) = engine.naming();
                let (ids, layout) = (ids.clone(), layout.clone());
                Ok(Link::JetStream {
                    engine,
                    ids,
                    layout,
                    routes: Vec::new(),
                    delays: None,
                })
            }
            _ => {
                let engine = AsyncBeanstalkd::connect(b, addr).await?;
                let tube = engine.tube().to_owned();
                Ok(Link::Beanstalkd { engine, tube })
            }
        }
    }

    /// JetStream: how long an unknown put is re-sent with its id
    /// (`resolve_for`, within the stream's duplicate window).
    pub(crate) fn resolve_for(&self) -> Option<std::time::Duration> {
        match self {
            Link::Beanstalkd { .. } => None,
            Link::JetStream { engine, .. } => Some(engine.resolve_for()),
        }
    }

    pub(crate) fn is_jetstream(&self) -> bool {
        matches!(self, Link::JetStream { .. })
    }

    fn is_up(&mut self) -> bool {
        match self {
            Link::Beanstalkd { engine, .. } => engine.conn_mut().is_some(),
            Link::JetStream { engine, .. } => engine.conn_mut().is_some(),
        }
    }

    fn connects(&self) -> u64 {
        match self {
            Link::Beanstalkd { engine, .. } => engine.connects(),
            Link::JetStream { engine, .. } => engine.connects(),
        }
    }

    /// Opens a connection (after the reconnect backoff); on beanstalkd it
    /// starts in the tube the last `use` written named.
    async fn open(&mut self) -> Result<(), Error> {
        match self {
            Link::Beanstalkd { engine, tube } => {
                engine.set_tube(tube);
                engine.link().await.map(|_| ())
            }
            Link::JetStream { engine, .. } => engine.link().await.map(|_| ()),
        }
    }

    fn progress(&mut self) {
        match self {
            Link::Beanstalkd { engine, .. } => engine.progress(),
            Link::JetStream { engine, .. } => engine.progress(),
        }
    }

    fn lost(&mut self) {
        match self {
            Link::Beanstalkd { engine, .. } => engine.lost(),
            Link::JetStream { engine, .. } => engine.lost(),
        }
    }

    /// Encodes the queued puts for one write; returns how many replies
    /// that write will owe (0: nothing to write).
    fn gather(&mut self, p: &mut Pipeline, wake: &mut Vec<Waker>) -> usize {
        let mut owed = 0;
        let mut bytes = 0;
        match self {
            Link::Beanstalkd { engine, tube } => {
                let Some(conn) = engine.conn_mut() else {
                    return 0;
                };
                for _ in 0..MAX_PIPELINE_JOBS {
                    let Some(t) = p.next_queued(bytes, MAX_PIPELINE_BYTES, Instant::now) else {
                        break;
                    };
                    let s = p.queued_put(t);
                    bytes += s.body.len();
                    if s.tube != *tube {
                        // Tube names were checked when the puts were handed in.
                        if conn.queue(&Command::Use { tube: &s.tube }).is_err() {
                            conn.mark_broken();
                            break;
                        }
                        tube.clone_from(&s.tube);
                        p.wrote_use();
                        owed += 1;
                    }
                    let s = p.queued_put(t);
                    match conn.queue(&s.opts.command(&s.body)) {
                        Ok(()) => {
                            p.wrote(t, 0);
                            owed += 1;
                        }
                        Err(ConnectionError::Invalid(e)) => p.refused(t, Error::from(e), wake),
                        Err(_) => {
                            conn.mark_broken();
                            break;
                        }
                    }
                }
            }
            Link::JetStream {
                engine,
                ids,
                layout,
                routes,
                delays,
            } => {
                let now_delays = engine.naming().2;
                if *delays != Some(now_delays) {
                    routes.clear();
                    *delays = Some(now_delays);
                }
                let Some(conn) = engine.conn_mut() else {
                    return 0;
                };
                let mut id = IdBuf::new();
                for _ in 0..MAX_PIPELINE_JOBS {
                    let Some(t) = p.next_queued(bytes, MAX_PIPELINE_BYTES, Instant::now) else {
                        break;
                    };
                    let s = p.queued_put(t);
                    bytes += s.body.len();
                    if s.msg == 0 {
                        s.msg = ids.take(1);
                    }
                    let msg_id = ids.id(s.msg, &mut id);
                    let at = match routes.iter().position(|(name, _)| *name == s.tube) {
                        Some(at) => at,
                        None => {
                            if routes.len() >= ROUTES_KEPT {
                                routes.clear();
                            }
                            let route = Route::new(layout, &s.tube, now_delays);
                            routes.push((s.tube.clone(), route));
                            routes.len() - 1
                        }
                    };
                    let stamp = Stamp::now(s.opts.delay);
                    let put = Put::new(&mut routes[at].1, stamp.as_ref(), msg_id);
                    let queued =
                        conn.queue_publish(put.subject().as_bytes(), msg_id, put.extra(), &s.body);
                    match queued {
                        Ok(token) => {
                            p.wrote(t, token);
                            owed += 1;
                        }
                        Err(e) => match from_nats(e) {
                            e @ Error::Invalid(_) => p.refused(t, e, wake),
                            _ => {
                                conn.mark_broken();
                                break;
                            }
                        },
                    }
                }
            }
        }
        owed
    }

    /// Writes what [`gather`](Self::gather) encoded, in one write.
    async fn flush(&mut self) -> Result<(), Error> {
        match self {
            Link::Beanstalkd { engine, .. } => match engine.conn_mut() {
                Some(conn) => conn.flush().await.map_err(Error::from_conn),
                None => Err(Error::NotSent(NotSent::Broken)),
            },
            Link::JetStream { engine, .. } => match engine.conn_mut() {
                Some(conn) => conn.flush().await.map_err(from_nats),
                None => Err(Error::NotSent(NotSent::Broken)),
            },
        }
    }

    /// Reads the next reply: with the session's reply deadline while one
    /// is owed; on JetStream with none while idle (answering the server's
    /// `PING`s, so an idle connection stays open).
    async fn hear(&mut self) -> Result<Heard, Error> {
        match self {
            Link::Beanstalkd { engine, .. } => {
                let conn = engine.conn_mut().ok_or(Error::NotSent(NotSent::Broken))?;
                // The reply deadline is the session's own.
                match conn.recv().await {
                    Ok(Reply::Inserted { id }) => Ok(Heard::Inserted(id)),
                    Ok(Reply::Using { .. }) => Ok(Heard::Using),
                    Ok(other) => Ok(Heard::Other(unexpected(&other))),
                    Err(e) => Err(Error::from_conn(e)),
                }
            }
            Link::JetStream { engine, .. } => {
                let conn = engine.conn_mut().ok_or(Error::NotSent(NotSent::Broken))?;
                // The PubAcks' deadline is the session's; with none owed
                // the read waits as long as it takes.
                let (token, r) = conn.recv_any_puback().await.map_err(from_nats)?;
                let r = r.map(|a| JobId::new(a.stream_seq)).map_err(from_nats);
                Ok(Heard::Token(token, r))
            }
        }
    }
}

/// What the driver does next.
enum Next {
    /// Every handle is gone and nothing is owed.
    Stop,
    /// Sends are paused (the stream had no leader) until then, and nothing
    /// else is to be done.
    Pause(Instant),
    /// Something is queued or owed.
    Go,
}

/// Fails every waiting put if the driver ends (its runtime shut down, or it
/// finished), so no caller waits for a driver that is gone.
struct Gone<'a>(&'a Inner);

impl Drop for Gone<'_> {
    fn drop(&mut self) {
        let mut wake = Vec::new();
        self.0.lock().kill(&mut wake);
        self.0.slots.close();
        self.0.bytes.close();
        wake_all(&mut wake);
    }
}

/// One step under the lock: `f` with the pipeline and the wakers it
/// gathers; then the room of freed slots is given back and the callers
/// woken, with the lock let go.
fn step<R>(
    inner: &Inner,
    wake: &mut Vec<Waker>,
    f: impl FnOnce(&mut Pipeline, &mut Vec<Waker>) -> R,
) -> R {
    let (r, freed) = {
        let mut p = inner.lock();
        let r = f(&mut p, wake);
        (r, p.take_freed())
    };
    inner.give_back(freed.0, freed.1);
    wake_all(wake);
    r
}

/// The connection error that `e` stands for, for the puts it left unknown.
fn as_conn_error(e: &Error) -> ConnectionError {
    match e {
        Error::Unknown(ConnectionError::Timeout { waited }) => {
            ConnectionError::Timeout { waited: *waited }
        }
        Error::Unknown(ConnectionError::Closed) => ConnectionError::Closed,
        other => ConnectionError::Io(std::io::Error::other(other.to_string())),
    }
}

/// The driver task: runs until every handle is dropped and nothing is owed.
pub(crate) async fn drive(inner: Arc<Inner>, mut link: Link) {
    let inner = &*inner;
    let _gone = Gone(inner);
    let mut wake: Vec<Waker> = Vec::with_capacity(64);
    loop {
        let next = poll_fn(|cx| {
            let mut p = inner.lock();
            if p.finished() {
                return Poll::Ready(Next::Stop);
            }
            if p.has_queued(Instant::now) || p.owes() {
                return Poll::Ready(Next::Go);
            }
            if let Some(until) = p.paused(Instant::now) {
                return Poll::Ready(Next::Pause(until));
            }
            if link_is_idle_reader(&link) && p.handles > 0 {
                // JetStream: read while idle, to answer PINGs (below).
                return Poll::Ready(Next::Go);
            }
            keep_waker(&mut p.driver, cx.waker());
            Poll::Pending
        })
        .await;
        match next {
            Next::Stop => break,
            Next::Pause(until) => {
                tokio::time::sleep_until(until.into()).await;
                inner.lock().pause_until = None;
                continue;
            }
            Next::Go => {}
        }
        let wants_link = {
            let p = inner.lock();
            p.has_queued(Instant::now) || p.owes()
        };
        if !link.is_up() {
            if inner.lock().owes() {
                // The connection went without an error reported here (a
                // read dropped for new work while it wrote a `PONG` leaves
                // it unusable): what it owed is settled as at any break
                // (unknown, or sent again by the rule) before another
                // opens. Left owed, those puts would wait for replies no
                // connection owes, and the new session's PubAck tokens,
                // which start again at 1, would be matched to them.
                step(inner, &mut wake, |p, w| {
                    p.broke(&ConnectionError::Closed, Instant::now(), w)
                });
                link.lost();
                continue;
            }
            if !wants_link {
                // Idle, with no connection: wait for work.
                wait_for_work(inner).await;
                continue;
            }
            let r = link.open().await;
            inner
                .connects
                .store(link.connects(), std::sync::atomic::Ordering::Relaxed);
            if let Err(e) = r {
                step(inner, &mut wake, |p, w| {
                    p.connect_failed(&e, Instant::now(), w)
                });
                continue;
            }
        }
        let owed = step(inner, &mut wake, |p, w| link.gather(p, w));
        if owed > 0 {
            if let Err(e) = link.flush().await {
                step(inner, &mut wake, |p, w| {
                    if e.not_sent() {
                        p.unwrite(owed);
                    }
                    p.broke(&as_conn_error(&e), Instant::now(), w);
                });
                link.lost();
                continue;
            }
        }
        let owes = inner.lock().owes();
        if !owes && !link.is_jetstream() {
            continue;
        }
        let heard = {
            let mut hear = pin!(link.hear());
            // Puts held by a pause (JetStream, a stream without a leader)
            // go out at its end, whether or not a reply comes first: a
            // timer only then, none per put.
            let until = inner.lock().paused(Instant::now);
            let mut resume = pin!(until.map(|u| tokio::time::sleep_until(u.into())));
            poll_fn(|cx| {
                if let Poll::Ready(r) = hear.as_mut().poll(cx) {
                    return Poll::Ready(Some(r));
                }
                if let Some(end) = resume.as_mut().as_pin_mut() {
                    if end.poll(cx).is_ready() {
                        return Poll::Ready(None);
                    }
                }
                let mut p = inner.lock();
                if p.has_queued(Instant::now) || p.finished() {
                    return Poll::Ready(None);
                }
                keep_waker(&mut p.driver, cx.waker());
                Poll::Pending
            })
            .await
        };
        match heard {
            // New work: written next. The deadline of what is owed is the
            // session's, kept across the reads new work interrupts.
            None => {}
            Some(Ok(heard)) => {
                link.progress();
                let out_of_step = step(inner, &mut wake, |p, w| place(p, heard, w));
                // A reply out of step, or one that broke the session (a
                // JetStream reply it could not read): the rest owed is lost
                // with the connection.
                let why = match out_of_step {
                    Some(e) => Some(as_conn_error(&e)),
                    None => (!link.is_up()).then_some(ConnectionError::Closed),
                };
                if let Some(why) = why {
                    step(inner, &mut wake, |p, w| p.broke(&why, Instant::now(), w));
                    link.lost();
                }
            }
            Some(Err(e)) => {
                step(inner, &mut wake, |p, w| {
                    p.broke(&as_conn_error(&e), Instant::now(), w)
                });
                link.lost();
            }
        }
    }
}

/// True for a link that reads while idle (JetStream's `PING`s).
fn link_is_idle_reader(link: &Link) -> bool {
    matches!(link, Link::JetStream { .. })
}

/// Waits until a put is handed in (or the last handle is dropped).
async fn wait_for_work(inner: &Inner) {
    poll_fn(|cx| {
        let mut p = inner.lock();
        if p.has_queued(Instant::now) || p.finished() || p.owes() {
            return Poll::Ready(());
        }
        keep_waker(&mut p.driver, cx.waker());
        Poll::Pending
    })
    .await;
}

fn keep_waker(slot: &mut Option<Waker>, w: &Waker) {
    match slot {
        Some(old) if old.will_wake(w) => {}
        _ => *slot = Some(w.clone()),
    }
}

/// Hands a reply to the put it answers; `Some` when the reply shows the
/// connection out of step (it must be replaced).
fn place(p: &mut Pipeline, heard: Heard, wake: &mut Vec<Waker>) -> Option<Error> {
    let now = Instant::now;
    match heard {
        Heard::Token(token, r) => {
            // A token nothing owes is a stale reply: read and dropped.
            if let Some(t) = p.take_token(token) {
                p.answered(t, r, now, wake);
            }
            None
        }
        heard => match (p.pop_owed(), heard) {
            (Some(Owed::Use), Heard::Using) => None,
            (Some(Owed::Put { ticket, .. }), Heard::Inserted(id)) => {
                p.answered(ticket, Ok(JobId::new(id)), now, wake);
                None
            }
            (Some(Owed::Put { ticket, .. }), Heard::Other(e @ Error::Rejected(_))) => {
                p.answered(ticket, Err(e), now, wake);
                None
            }
            (owed, heard) => {
                if let Some(o) = owed {
                    p.owe_again(o);
                }
                Some(match heard {
                    Heard::Other(e) => e,
                    _ => Error::Unknown(ConnectionError::Io(std::io::Error::other(
                        "a reply out of step with the requests",
                    ))),
                })
            }
        },
    }
}
