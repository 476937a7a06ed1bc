//! The async worker (feature `tokio`): handlers are async functions, run
//! as tasks of the program's own tokio runtime, and all the jobs in flight
//! share one connection per server.
//!
//! Each server has one driver task, which owns the connection and runs the
//! worker's rules through the sans-I/O machine (`crate::machine`), and
//! `concurrency` slot tasks, which run the handlers. Everything is made
//! once, when the worker starts: a job costs no task, no boxed future, and
//! no buffer of its own (its body's buffer goes back to its slot when the
//! job is dropped).

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::task::{Context, Poll};

use taskq_connect::{Address, Engine};
use tokio::sync::futures::Notified;
use tokio::time::Sleep;

use crate::config::{Config, ConfigError};
use crate::counters::Snapshot;
use crate::failure::Failure;
use crate::handler::Outcome;
use crate::machine::{Answered, Asked};
use crate::shared::Shared;
use crate::worker::Control;

mod conn;
mod driver;
mod js_driver;
mod slot;

pub use slot::AsyncJob;
use slot::{Inbox, SlotCell};

/// What a driver's machine is told by the slots (both machines).
trait Hands {
    /// The handler in `slot` ended with `outcome` (`failure`: how it failed).
    fn finished(&mut self, sh: &Shared, slot: usize, outcome: Outcome, failure: Option<Failure>);
    /// The handler of job `id` in `slot` asks `what` of it.
    fn ask(&mut self, slot: usize, id: u64, what: Asked);
    /// The next answer to what a handler asked.
    fn answered(&mut self) -> Option<(usize, u64, Answered)>;
    /// The next held job handed to a handler that came free.
    fn begun(&mut self) -> Option<crate::machine::Begin>;
    /// A handler thread runs job `id` of `slot` now (handed ahead).
    fn runs_now(&mut self, slot: usize, id: u64);
    /// The next handed job its thread must not run (its lease is gone).
    fn revoked(&mut self) -> Option<(usize, u64)>;
}

impl Hands for crate::machine::Machine {
    fn finished(&mut self, sh: &Shared, slot: usize, outcome: Outcome, failure: Option<Failure>) {
        crate::machine::Machine::finished(self, sh, slot, outcome, failure);
    }
    fn ask(&mut self, slot: usize, id: u64, what: Asked) {
        crate::machine::Machine::handler_asks(self, slot, id, what);
    }
    fn answered(&mut self) -> Option<(usize, u64, Answered)> {
        crate::machine::Machine::answered(self)
    }
    fn begun(&mut self) -> Option<crate::machine::Begin> {
        crate::machine::Machine::begun(self)
    }
    fn runs_now(&mut self, slot: usize, id: u64) {
        crate::machine::Machine::runs_now(self, slot, id);
    }
    fn revoked(&mut self) -> Option<(usize, u64)> {
        crate::machine::Machine::revoked(self)
    }
}

impl Hands for crate::machine::js::JsMachine {
    fn finished(&mut self, sh: &Shared, slot: usize, outcome: Outcome, failure: Option<Failure>) {
        crate::machine::js::JsMachine::finished(self, sh, slot, outcome, failure);
    }
    fn ask(&mut self, slot: usize, id: u64, what: Asked) {
        crate::machine::js::JsMachine::handler_asks(self, slot, id, what);
    }
    fn answered(&mut self) -> Option<(usize, u64, Answered)> {
        crate::machine::js::JsMachine::answered(self)
    }
    fn begun(&mut self) -> Option<crate::machine::Begin> {
        crate::machine::js::JsMachine::begun(self)
    }
    fn runs_now(&mut self, slot: usize, id: u64) {
        crate::machine::js::JsMachine::runs_now(self, slot, id);
    }
    fn revoked(&mut self) -> Option<(usize, u64)> {
        crate::machine::js::JsMachine::revoked(self)
    }
}

/// A driver's turn with its slots: a second stop drops the running
/// handlers' futures (once: `aborted`); the slots' messages go to the
/// machine, and the answers to what they asked to the slots.
fn hand_over(
    sh: &Shared,
    m: &mut impl Hands,
    cells: &[Arc<SlotCell>],
    inbox: &Inbox,
    aborted: &mut bool,
) {
    if sh.abort.load(std::sync::atomic::Ordering::SeqCst) && !*aborted {
        *aborted = true;
        for c in cells {
            c.abort();
        }
    }
    if sh.stop.load(std::sync::atomic::Ordering::SeqCst) {
        inbox.give_back_unstarted();
    }
    while let Some(msg) = inbox.take() {
        match msg {
            slot::Msg::Finished {
                slot,
                outcome,
                failure,
            } => m.finished(sh, slot, outcome, failure),
            slot::Msg::Ask { slot, id, what } => m.ask(slot, id, what),
            slot::Msg::Running { slot, id } => m.runs_now(slot, id),
        }
    }
    while let Some((slot, id, a)) = m.answered() {
        cells[slot].answer(id, a);
    }
    while let Some((slot, id)) = m.revoked() {
        cells[slot].revoke(id);
    }
    while let Some(b) = m.begun() {
        // A job looked up keeps the tube its lookup named; one not looked
        // up is of the tube its reserve watched (or not known yet: "").
        let tube = (!b.looked_up).then(|| b.tube.map_or("", |k| sh.cfg.tubes[k].as_str()));
        cells[b.slot].begin(b.id, b.attempt, tube);
    }
}

/// What woke a driver.
enum Woke<R> {
    /// The connection: bytes came (the session has them), or it failed.
    Read(R),
    /// A slot's message or a stop.
    Told,
    /// The deadline.
    Due,
}

/// A driver's one wait: for its connection (`read`), a slot's message, a
/// stop (`stopped`, registered before the driver read the flags), or the
/// deadline `due` (the driver's kept timer `sleep`, moved to it), whichever
/// comes first. Never a busy loop: with nothing to read and no deadline it
/// sleeps until told.
async fn wait<R>(
    inbox: &Inbox,
    mut stopped: Pin<&mut Notified<'_>>,
    mut sleep: Pin<&mut Sleep>,
    due: Option<std::time::Instant>,
    mut read: impl FnMut(&mut Context<'_>) -> Poll<R>,
) -> Woke<R> {
    if let Some(t) = due {
        sleep.as_mut().reset(tokio::time::Instant::from_std(t));
    }
    let mut told = pin!(inbox.notify.notified());
    poll_fn(|cx| {
        if let Poll::Ready(r) = read(cx) {
            return Poll::Ready(Woke::Read(r));
        }
        if told.as_mut().poll(cx).is_ready() || stopped.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Woke::Told);
        }
        if due.is_some() && sleep.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Woke::Due);
        }
        Poll::Pending
    })
    .await
}

/// The idle exit: server `server`'s machine says whether it is idle; the
/// worker stops once every server's says so.
fn idle_exit(sh: &Shared, idle: &[AtomicBool], server: usize, is_idle: bool) {
    use std::sync::atomic::Ordering;
    idle[server].store(is_idle, Ordering::SeqCst);
    if idle.iter().all(|i| i.load(Ordering::SeqCst)) && !sh.stop.load(Ordering::SeqCst) {
        tracing::debug!("idle: stopping");
        sh.shutdown();
    }
}

/// Starts what runs the handler for one slot of server `server`'s window:
/// a task whose futures live in it (the async worker's handler, whose type
/// is known here), or a thread (the blocking worker's).
pub(crate) trait Spawner: Send + Sync {
    fn spawn(
        &self,
        cell: Arc<SlotCell>,
        shared: Arc<Shared>,
        server: usize,
    ) -> tokio::task::JoinHandle<()>;
}

struct Handler<H>(Arc<H>);

impl<H, F> Spawner for Handler<H>
where
    H: Fn(AsyncJob) -> F + Send + Sync + 'static,
    F: Future<Output = Outcome> + Send + 'static,
{
    fn spawn(
        &self,
        cell: Arc<SlotCell>,
        shared: Arc<Shared>,
        _: usize,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(slot::serve(self.0.clone(), cell, shared))
    }
}

/// The blocking worker's handler: each slot's task hands its jobs to the
/// server's handler threads (`concurrency` of them, made with the first
/// slot), which call the handler with a [`Job`](crate::Job).
pub(crate) struct Blocking {
    handler: Arc<dyn crate::handler::Handler>,
    /// Each server's handler threads, by server.
    pools: std::sync::Mutex<Vec<Option<Arc<slot::Handlers>>>>,
}

impl Blocking {
    pub(crate) fn new(handler: Arc<dyn crate::handler::Handler>) -> Blocking {
        Blocking {
            handler,
            pools: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Waits for every server's handler threads to end (after
    /// [`run_machines`] closed the slots).
    pub(crate) fn join(&self) {
        let pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        for p in pools.iter().flatten() {
            p.join();
        }
    }
}

impl Spawner for Blocking {
    fn spawn(
        &self,
        cell: Arc<SlotCell>,
        shared: Arc<Shared>,
        server: usize,
    ) -> tokio::task::JoinHandle<()> {
        let pool = {
            let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
            if pools.len() <= server {
                pools.resize(server + 1, None);
            }
            pools[server]
                .get_or_insert_with(|| {
                    slot::Handlers::start(
                        self.handler.clone(),
                        shared.clone(),
                        server,
                        tokio::runtime::Handle::current(),
                    )
                })
                .clone()
        };
        tokio::spawn(slot::hand_to(pool, cell, shared))
    }
}

/// A worker whose handlers are async functions, on a tokio runtime.
///
/// `Config::concurrency` is the number of jobs in flight per server, all
/// on one connection to it: on beanstalkd the reserves and settles are
/// pipelined, their replies matched in order; on JetStream (a `nats://` or
/// `tls://` address) the jobs come from one pull consumer per tube, and each
/// ack is matched to its confirmation by reply subject. It keeps the rules
/// of [`Worker`](crate::Worker): a job is done only on the server's
/// confirmation (`DELETED`, or the ack's); a failure is released with the
/// retry backoff and buried after `max_attempts`; a handler's panic, in the
/// closure or in its future, is a failed attempt (counted `panicked`); a
/// job larger than `limits.max_job_size` is set aside unread (buried on
/// beanstalkd, `+TERM` on JetStream); every reply has a deadline, and a
/// silent or broken connection is replaced with the reconnect backoff;
/// [`Control::shutdown`] takes nothing more and lets the running jobs
/// finish, and [`Control::abort`] gives them back at once.
///
/// ```no_run
/// use taskq_worker::{AsyncJob, AsyncWorker, Config, Outcome};
///
/// # async fn f() -> Result<(), taskq_worker::ConfigError> {
/// let cfg = Config { concurrency: 100, ..Config::default() };
/// let worker = AsyncWorker::new(cfg, |job: AsyncJob| async move {
///     println!("job {} from {}: {} bytes", job.id(), job.tube(), job.body().len());
///     Outcome::Done
/// })?;
/// // Stops (as a first `Control::shutdown`) when `stop` is sent, or dropped.
/// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
/// # drop(stop);
/// let counts = worker.run_until(async { let _ = stopped.await; }).await;
/// println!("{counts}");
/// # Ok(()) }
/// ```
pub struct AsyncWorker {
    shared: Arc<Shared>,
    spawner: Box<dyn Spawner>,
}

impl std::fmt::Debug for AsyncWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncWorker")
            .field("cfg", &self.shared.cfg)
            .finish()
    }
}

impl AsyncWorker {
    /// Checks the settings and prepares a worker running `handler` on each
    /// job, on beanstalkd or, with `nats://` or `tls://` addresses, on
    /// JetStream.
    pub fn new<H, F>(mut cfg: Config, handler: H) -> Result<AsyncWorker, ConfigError>
    where
        H: Fn(AsyncJob) -> F + Send + Sync + 'static,
        F: Future<Output = Outcome> + Send + 'static,
    {
        cfg.validate()?;
        cfg.engine()?;
        // The addresses that reach logs and counters carry no secret.
        cfg.lift_credentials();
        Ok(AsyncWorker {
            shared: Arc::new(Shared::new(cfg, false)),
            spawner: Box::new(Handler(Arc::new(handler))),
        })
    }

    /// A handle to stop the worker or read its counters, from any thread.
    pub fn control(&self) -> Control {
        Control::of(self.shared.clone())
    }

    /// Runs until stopped (by a [`Control`], `max_jobs` or
    /// `exit_when_idle`) and returns the final counters. Must be awaited
    /// within a tokio runtime with its time and I/O drivers enabled.
    pub async fn run(self) -> Snapshot {
        self.run_until(std::future::pending()).await
    }

    /// [`run`](Self::run), stopping as a first [`Control::shutdown`] does
    /// once `shutdown` completes: nothing more is taken, and the running
    /// jobs finish and are settled.
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) -> Snapshot {
        run_machines(self.shared, &*self.spawner, shutdown).await
    }
}

/// Runs a driver and its window's slots for each server until the worker
/// stops (a [`Control`], `max_jobs`, `exit_when_idle`, or `shutdown`
/// completing) and every machine is done; returns the final counters.
/// Both workers' one loop: the async worker's slots are tasks that run the
/// handlers, the blocking worker's tasks that hand each job to the
/// server's handler threads (`spawner`).
pub(crate) async fn run_machines(
    sh: Arc<Shared>,
    spawner: &dyn Spawner,
    shutdown: impl Future<Output = ()>,
) -> Snapshot {
    // The window may hold more jobs than run (`prefetch`).
    let n = crate::machine::window(&sh.cfg);
    let mut drivers = Vec::with_capacity(sh.cfg.servers.len());
    let mut slots = Vec::with_capacity(n * sh.cfg.servers.len());
    let mut cells_all = Vec::with_capacity(n * sh.cfg.servers.len());
    let idle: Arc<[AtomicBool]> = (0..sh.cfg.servers.len())
        .map(|_| AtomicBool::new(false))
        .collect();
    for server in 0..sh.cfg.servers.len() {
        let jetstream =
            Address::parse(&sh.cfg.servers[server]).is_ok_and(|a| a.engine() == Engine::Nats);
        let inbox = Arc::new(Inbox::with_room(n));
        let cells: Vec<Arc<SlotCell>> = (0..n)
            .map(|i| Arc::new(SlotCell::new(i, inbox.clone())))
            .collect();
        for c in &cells {
            slots.push(spawner.spawn(c.clone(), sh.clone(), server));
            cells_all.push(c.clone());
        }
        drivers.push(if jetstream {
            tokio::spawn(js_driver::drive(
                sh.clone(),
                server,
                cells,
                inbox,
                idle.clone(),
            ))
        } else {
            tokio::spawn(driver::drive(
                sh.clone(),
                server,
                cells,
                inbox,
                idle.clone(),
            ))
        });
    }
    let mut shutdown = pin!(shutdown);
    let mut asked = false;
    let mut k = 0;
    // Waits for the drivers; a `shutdown` that completes stops the worker.
    poll_fn(|cx| {
        if !asked && shutdown.as_mut().poll(cx).is_ready() {
            asked = true;
            sh.shutdown();
        }
        while k < drivers.len() {
            match pin!(&mut drivers[k]).poll(cx) {
                Poll::Ready(r) => {
                    if r.is_err() {
                        tracing::error!("an async worker driver failed");
                    }
                    k += 1;
                }
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(())
    })
    .await;
    for c in &cells_all {
        c.close();
    }
    for s in slots {
        let _ = s.await;
    }
    sh.counters.snapshot()
}
