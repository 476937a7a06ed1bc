//! The shared producer: one connection per server, any number of callers.
//!
//! Callers hand their puts to the [`Pipeline`] (a slot each, bounded in
//! number and bytes); one driver task per producer owns the connection,
//! writes whatever is queued whenever the connection can take it (one write
//! for all of it, no timer), and hands each reply to the put it answers: in
//! order on beanstalkd (a `use` inserted where the tube changes), by reply
//! subject on JetStream. See [`SharedProducer`].

use std::future::poll_fn;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};

use tokio::sync::{Semaphore, SemaphorePermit, TryAcquireError};

use crate::builder::Builder;
use crate::classify::{check_tube, record, start_batch, too_big};
use crate::error::{Error, NotSent};
use crate::outcome::{BatchError, BatchReport, PutOutcome};
use crate::{JobId, PutOptions};

mod driver;
mod pipeline;

use pipeline::{Pipeline, Rule, Ticket};

/// Puts waiting per connection by default (handed in, written or not,
/// their outcome not yet taken).
pub const DEFAULT_MAX_QUEUED_PUTS: usize = 4096;

/// Bytes of puts waiting per connection by default.
pub const DEFAULT_MAX_QUEUED_BYTES: usize = 16 << 20;

/// The most puts that may wait per connection, whatever is asked: room
/// for each is made when the producer connects, so a larger setting
/// (`usize::MAX` meant as "no bound") would try to allocate it all.
pub const MAX_QUEUED_PUTS: usize = 1 << 16;

/// What a put holds against the byte limit beyond its body and tube: the
/// command line or headers around it.
const PUT_OVERHEAD: usize = 64;

/// Jobs of a batch handed in before their outcomes are awaited.
const BATCH_WINDOW: usize = 64;

/// A producer many tasks share, on one connection per server.
///
/// `put` takes `&self`: clone the producer (cheap: one reference count) into
/// every task, or keep it in an `Arc`'d state. Concurrent puts from any
/// number of tasks go out together, whatever is queued when the connection
/// can write in one write, and a lone put is written at once (there is no
/// batching timer). Each put's outcome is the one
/// [`Producer::put`](crate::Producer::put) would give it: an id,
/// [`Error::Rejected`], [`Error::Unknown`] (sent, no reply: it may be
/// queued) or [`Error::NotSent`]. When the connection breaks, only the puts
/// whose replies were owed are unknown (on JetStream they are first sent
/// again with their `Nats-Msg-Id` within
/// [`resolve_for`](Builder::resolve_for), and stored once); puts not yet
/// written go out on the next connection. A reply only ever reaches the put
/// it answers.
///
/// Memory is bounded: at most [`max_queued_puts`](Builder::max_queued_puts)
/// puts and [`max_queued_bytes`](Builder::max_queued_bytes) bytes wait per
/// connection; past that a put waits for room (back-pressure).
///
/// Dropping a put's future before its bytes were written takes the put
/// back: it is never sent. Dropped after, its reply is still read and
/// handed to nobody.
///
/// In steady state a put allocates nothing and registers no timer: its
/// slot, tube and body buffers are made once and reused, and the reply
/// deadline is the driver's one kept timer.
///
/// The driver is a task on the tokio runtime `connect` ran on (which needs
/// its I/O and time drivers); it ends, closing the connection, once every
/// clone is dropped and every owed reply was read. If the runtime shuts
/// down first, every put still waiting fails at once.
///
/// ```no_run
/// use taskq_producer::{PutOptions, SharedProducer};
///
/// # async fn run() -> Result<(), taskq_producer::Error> {
/// let producer = SharedProducer::connect("127.0.0.1:11300").await?;
/// let mut tasks = Vec::new();
/// for n in 0..100 {
///     let p = producer.clone();
///     tasks.push(tokio::spawn(async move {
///         p.put("emails", format!("welcome {n}").as_bytes(), PutOptions::default())
///             .await
///     }));
/// }
/// for t in tasks {
///     println!("queued as {}", t.await.expect("task")?);
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct SharedProducer {
    inner: Arc<Inner>,
}

/// What the callers and the driver share.
#[derive(Debug)]
pub(crate) struct Inner {
    pipe: Mutex<Pipeline>,
    /// A permit a slot.
    slots: Semaphore,
    /// A permit a byte.
    bytes: Semaphore,
    max_bytes: usize,
    max_job_size: usize,
    jetstream: bool,
    connects: AtomicU64,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Pipeline> {
        // A panic while holding the lock leaves the pipeline as it was
        // between two whole steps: every step is made under one lock.
        self.pipe.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The bytes of room a put of a `len`-byte body into `tube` takes: at
    /// most the whole bound, so that any put fits once the rest is free.
    fn weight(&self, tube: &str, len: usize) -> u32 {
        (len + tube.len() + PUT_OVERHEAD).min(self.max_bytes) as u32
    }

    /// Gives back the room of freed slots.
    fn give_back(&self, slots: usize, bytes: usize) {
        if slots > 0 {
            self.slots.add_permits(slots);
        }
        if bytes > 0 {
            self.bytes.add_permits(bytes);
        }
    }
}

/// The puts and bytes that may wait per connection: as set (else the
/// defaults), each within what can be held.
fn bounds((puts, bytes): (Option<usize>, Option<usize>)) -> (usize, usize) {
    (
        puts.unwrap_or(DEFAULT_MAX_QUEUED_PUTS)
            .clamp(1, MAX_QUEUED_PUTS),
        bytes
            .unwrap_or(DEFAULT_MAX_QUEUED_BYTES)
            .clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize)),
    )
}

impl Builder {
    /// [`SharedProducer`]: most puts waiting per connection, written or
    /// not, their outcome not yet taken (default
    /// [`DEFAULT_MAX_QUEUED_PUTS`], at most [`MAX_QUEUED_PUTS`]); a put
    /// past that waits for room.
    pub fn max_queued_puts(mut self, n: usize) -> Self {
        self.max_queued.0 = Some(n);
        self
    }

    /// [`SharedProducer`]: most bytes of puts waiting per connection
    /// (bodies, tube names and a little more each; default
    /// [`DEFAULT_MAX_QUEUED_BYTES`]); a put past that waits for room.
    pub fn max_queued_bytes(mut self, n: usize) -> Self {
        self.max_queued.1 = Some(n);
        self
    }

    /// Connects a [`SharedProducer`] with these settings: the address picks
    /// the engine as for [`connect_async`](Builder::connect_async). Must be
    /// called within a tokio runtime with its I/O and time drivers, where
    /// the producer's driver task is spawned.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), taskq_producer::Error> {
    /// use std::time::Duration;
    /// use taskq_producer::Producer;
    ///
    /// let p = Producer::builder()
    ///     .io_timeout(Duration::from_millis(500))
    ///     .max_queued_puts(1024)
    ///     .connect_shared("nats://127.0.0.1:4222")
    ///     .await?;
    /// p.put("emails", b"hello", Default::default()).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect_shared(self, addr: &str) -> Result<SharedProducer, Error> {
        let (max_puts, max_bytes) = bounds(self.max_queued);
        let max_job_size = self.cfg.limits.max_job_size;
        let retries = self.retries;
        let link = driver::Link::connect(self, addr).await?;
        let jetstream = link.is_jetstream();
        let rule = match link.resolve_for() {
            Some(within) => Rule::Resolve(within),
            None => Rule::Retries(retries),
        };
        let inner = Arc::new(Inner {
            pipe: Mutex::new(Pipeline::new(max_puts, rule)),
            slots: Semaphore::new(max_puts),
            bytes: Semaphore::new(max_bytes),
            max_bytes,
            max_job_size,
            jetstream,
            connects: AtomicU64::new(1),
        });
        tokio::spawn(driver::drive(inner.clone(), link));
        Ok(SharedProducer { inner })
    }
}

impl SharedProducer {
    /// Connects with the default settings (see [`Builder::connect_shared`]).
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), taskq_producer::Error> {
    /// let p = taskq_producer::SharedProducer::connect("127.0.0.1:11300").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect(addr: &str) -> Result<SharedProducer, Error> {
        Builder::default().connect_shared(addr).await
    }

    /// Puts one job into `tube`; concurrent puts share the connection and
    /// its writes. Refused before sending when the tube name is invalid or
    /// the body is over the maximum job size. On JetStream the id is the
    /// job's stream sequence.
    ///
    /// ```no_run
    /// # async fn run(p: taskq_producer::SharedProducer) -> Result<(), taskq_producer::Error> {
    /// use taskq_producer::PutOptions;
    /// let id = p.put("emails", b"send welcome to 42", PutOptions { ttr: 30, ..PutOptions::default() }).await?;
    /// println!("queued as {id}");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn put(&self, tube: &str, body: &[u8], opts: PutOptions) -> Result<JobId, Error> {
        self.check(tube, body)?;
        let ticket = self.hand_in(tube, body, opts).await?;
        ticket.outcome().await
    }

    /// Puts many jobs into `tube`, their outcomes in `out` (`out[i]` for
    /// `bodies[i]`). The jobs go through the same pipeline as concurrent
    /// puts, many to a write. `Err` names the first job that was neither
    /// inserted nor rejected and why; the jobs after it are not handed in
    /// (`NotSent`), while those already in flight with it keep their own
    /// outcomes in `out`.
    ///
    /// ```no_run
    /// # async fn run(p: taskq_producer::SharedProducer) -> Result<(), taskq_producer::BatchError> {
    /// use taskq_producer::{PutOptions, PutOutcome};
    /// let bodies = [b"a".as_slice(), b"b", b"c"];
    /// let mut out = [PutOutcome::NotSent; 3];
    /// let report = p.put_batch("emails", &bodies, PutOptions::default(), &mut out).await?;
    /// assert_eq!(report.inserted, 3);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn put_batch<B: AsRef<[u8]>>(
        &self,
        tube: &str,
        bodies: &[B],
        opts: PutOptions,
        out: &mut [PutOutcome],
    ) -> Result<BatchReport, BatchError> {
        let out = start_batch(bodies, out, self.inner.max_job_size)?;
        check_tube(tube, self.inner.jetstream).map_err(|error| BatchError { replied: 0, error })?;
        let mut report = BatchReport::default();
        let mut first_error: Option<BatchError> = None;
        let mut from = 0;
        while from < bodies.len() && first_error.is_none() {
            let mut end = bodies.len().min(from + BATCH_WINDOW);
            let mut tickets: [Option<Handed<'_>>; BATCH_WINDOW] = std::array::from_fn(|_| None);
            for (i, body) in bodies[from..end].iter().enumerate() {
                // Only the window's first put waits for room: the batch then
                // holds no put whose outcome it has not taken, so it never
                // waits on room that only its own outcomes give back (a
                // bound smaller than the window, or other batches holding
                // the rest). The others go in while there is room; the
                // window ends where there is none.
                let body = body.as_ref();
                let handed = if i == 0 {
                    self.hand_in(tube, body, opts).await.map(Some)
                } else {
                    self.hand_in_now(tube, body, opts)
                };
                match handed {
                    Ok(Some(t)) => tickets[i] = Some(t),
                    Ok(None) => {
                        end = from + i;
                        break;
                    }
                    Err(error) => {
                        first_error = Some(BatchError {
                            replied: from + i,
                            error,
                        });
                        break;
                    }
                }
            }
            for (i, t) in tickets.iter_mut().enumerate() {
                let Some(t) = t.take() else { break };
                let at = from + i;
                if let Err(error) = record(t.outcome().await, &mut out[at], &mut report) {
                    out[at] = match &error {
                        Error::Unknown(_) => PutOutcome::Unknown,
                        _ => PutOutcome::NotSent,
                    };
                    if first_error.as_ref().is_none_or(|e| e.replied > at) {
                        first_error = Some(BatchError { replied: at, error });
                    }
                }
            }
            from = end;
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }

    /// Connections opened so far (1 after `connect`, more after reconnects).
    pub fn connects(&self) -> u64 {
        self.inner.connects.load(Ordering::Relaxed)
    }

    /// Puts waiting now: handed in (written or not) and their outcome not
    /// yet taken; at most [`max_queued_puts`](Builder::max_queued_puts).
    pub fn waiting(&self) -> usize {
        self.inner.lock().in_use()
    }

    /// The largest body this producer sends.
    pub fn max_job_size(&self) -> usize {
        self.inner.max_job_size
    }

    fn check(&self, tube: &str, body: &[u8]) -> Result<(), Error> {
        check_tube(tube, self.inner.jetstream)?;
        if body.len() > self.inner.max_job_size {
            return Err(too_big(body.len(), self.inner.max_job_size));
        }
        Ok(())
    }

    /// Puts `value` into `tube` as its JSON (feature `serde`), serialized
    /// straight into the put's own reused buffer (its size counted first,
    /// for the byte bound), so a value whose serialization allocates
    /// nothing is put without allocating. A value that does not serialize
    /// is [`Invalid::Unserializable`](crate::Invalid::Unserializable), and
    /// nothing is sent.
    ///
    /// ```no_run
    /// # async fn run(p: taskq_producer::SharedProducer) -> Result<(), taskq_producer::Error> {
    /// p.put_json("emails", &serde_json::json!({"user": 42}), Default::default()).await?;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "serde")]
    pub async fn put_json<T: serde::Serialize + ?Sized>(
        &self,
        tube: &str,
        value: &T,
        opts: PutOptions,
    ) -> Result<JobId, Error> {
        check_tube(tube, self.inner.jetstream)?;
        let len = crate::json::encoded_len(value)?;
        if len > self.inner.max_job_size {
            return Err(too_big(len, self.inner.max_job_size));
        }
        let ticket = self
            .hand_in_with(tube, len, opts, |b| crate::json::encode(b, value))
            .await?;
        ticket.outcome().await
    }

    /// Hands a put to the driver once there is room (waiting for it
    /// otherwise), and wakes the driver.
    async fn hand_in(
        &self,
        tube: &str,
        body: &[u8],
        opts: PutOptions,
    ) -> Result<Handed<'_>, Error> {
        self.hand_in_with(tube, body.len(), opts, |b| {
            b.extend_from_slice(body);
            Ok(())
        })
        .await
    }

    /// [`hand_in`](Self::hand_in) if there is room now, without waiting:
    /// `Ok(None)` when there is none.
    fn hand_in_now(
        &self,
        tube: &str,
        body: &[u8],
        opts: PutOptions,
    ) -> Result<Option<Handed<'_>>, Error> {
        let inner = &*self.inner;
        let weight = inner.weight(tube, body.len());
        let gone = Error::NotSent(NotSent::Broken);
        let slot = match inner.slots.try_acquire() {
            Ok(p) => p,
            Err(TryAcquireError::NoPermits) => return Ok(None),
            Err(TryAcquireError::Closed) => return Err(gone),
        };
        let bytes = match inner.bytes.try_acquire_many(weight) {
            Ok(p) => p,
            Err(TryAcquireError::NoPermits) => return Ok(None),
            Err(TryAcquireError::Closed) => return Err(gone),
        };
        self.handed(tube, opts, weight, (slot, bytes), |b| {
            b.extend_from_slice(body);
            Ok(())
        })
        .map(Some)
    }

    /// [`hand_in`](Self::hand_in) of a body of `len` bytes that `fill`
    /// writes into the put's buffer.
    async fn hand_in_with(
        &self,
        tube: &str,
        len: usize,
        opts: PutOptions,
        fill: impl FnOnce(&mut Vec<u8>) -> Result<(), Error>,
    ) -> Result<Handed<'_>, Error> {
        let inner = &*self.inner;
        let weight = inner.weight(tube, len);
        let gone = |_| Error::NotSent(NotSent::Broken);
        let slot = inner.slots.acquire().await.map_err(gone)?;
        let bytes = inner.bytes.acquire_many(weight).await.map_err(gone)?;
        self.handed(tube, opts, weight, (slot, bytes), fill)
    }

    /// Hands a put to the driver with the room taken for it (a slot and
    /// `weight` bytes), and wakes the driver.
    fn handed(
        &self,
        tube: &str,
        opts: PutOptions,
        weight: u32,
        (slot, bytes): (SemaphorePermit<'_>, SemaphorePermit<'_>),
        fill: impl FnOnce(&mut Vec<u8>) -> Result<(), Error>,
    ) -> Result<Handed<'_>, Error> {
        let inner = &*self.inner;
        let (ticket, driver) = {
            let mut p = inner.lock();
            let t = p.hand_in_with(tube, opts, weight, fill);
            let driver = if matches!(t, Some(Ok(_))) {
                p.driver.take()
            } else {
                None
            };
            (t, driver)
        };
        let ticket = ticket.ok_or(Error::NotSent(NotSent::Broken))??;
        slot.forget();
        bytes.forget();
        if let Some(w) = driver {
            w.wake();
        }
        Ok(Handed {
            inner,
            ticket,
            done: false,
        })
    }
}

impl Clone for SharedProducer {
    fn clone(&self) -> Self {
        self.inner.lock().handles += 1;
        SharedProducer {
            inner: self.inner.clone(),
        }
    }
}

impl Drop for SharedProducer {
    fn drop(&mut self) {
        let driver = {
            let mut p = self.inner.lock();
            p.handles -= 1;
            (p.handles == 0).then(|| p.driver.take()).flatten()
        };
        if let Some(w) = driver {
            w.wake();
        }
    }
}

/// A put handed in, until its outcome is taken.
struct Handed<'p> {
    inner: &'p Inner,
    ticket: Ticket,
    done: bool,
}

impl Handed<'_> {
    async fn outcome(mut self) -> Result<JobId, Error> {
        poll_fn(|cx| {
            let got = self.inner.lock().poll_outcome(self.ticket, cx.waker());
            match got {
                Some((r, weight)) => {
                    self.done = true;
                    self.inner.give_back(1, weight as usize);
                    Poll::Ready(r)
                }
                None => Poll::Pending,
            }
        })
        .await
    }
}

impl Drop for Handed<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let freed = self.inner.lock().abandon(self.ticket);
        if let Some(weight) = freed {
            self.inner.give_back(1, weight as usize);
        }
    }
}

/// Wakes every waker gathered under the lock, after it was let go.
fn wake_all(wake: &mut Vec<Waker>) {
    for w in wake.drain(..) {
        w.wake();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_bounds_asked_are_kept_within_what_can_be_held() {
        use super::{bounds, DEFAULT_MAX_QUEUED_BYTES, DEFAULT_MAX_QUEUED_PUTS, MAX_QUEUED_PUTS};
        assert_eq!(
            bounds((None, None)),
            (DEFAULT_MAX_QUEUED_PUTS, DEFAULT_MAX_QUEUED_BYTES)
        );
        assert_eq!(bounds((Some(10), Some(1000))), (10, 1000));
        assert_eq!(bounds((Some(0), Some(0))), (1, 1));
        // "No bound" is the most that can be held, not an allocation of
        // usize::MAX slots at connect.
        let (puts, bytes) = bounds((Some(usize::MAX), Some(usize::MAX)));
        assert_eq!(puts, MAX_QUEUED_PUTS);
        assert!(bytes <= u32::MAX as usize);
    }

    use super::*;

    fn assert_send_sync<T: Send + Sync + Clone>() {}

    // Compiled only if the futures are `Send`.
    fn put_is_send(p: &SharedProducer) -> impl std::future::Future + Send + '_ {
        p.put("t", b"x", PutOptions::default())
    }

    fn batch_is_send<'a>(
        p: &'a SharedProducer,
        bodies: &'a [&'a [u8]],
        out: &'a mut [PutOutcome],
    ) -> impl std::future::Future + Send + 'a {
        p.put_batch("t", bodies, PutOptions::default(), out)
    }

    #[test]
    fn the_producer_and_its_futures_can_cross_threads() {
        assert_send_sync::<SharedProducer>();
        let _ = (put_is_send, batch_is_send);
    }
}
