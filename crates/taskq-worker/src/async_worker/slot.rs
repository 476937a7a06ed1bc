//! The slots of the window: one long-lived task each, which takes the jobs
//! its driver hands it, runs the handler's future (held in the task itself:
//! no allocation per job), catches a panic in the closure or in the
//! future, and tells the driver the outcome. The job the handler gets
//! ([`AsyncJob`]) owns its body, in a buffer that goes back to its slot
//! when the job is dropped, for the next job to reuse.

use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;
use std::time::Duration;

use taskq_proto::nats::HeaderBlock;
use taskq_proto::JobId;
use tokio::sync::Notify;

use crate::counters::Counters;
use crate::engine::{Fault, JobLink};
use crate::failure::Failure;
use crate::handler::{handle_guarded, panic_message, Handler, Outcome};
use crate::job::{Job, JobError};
use crate::job_info::JobInfo;
use crate::machine::{Answered, Asked};
use crate::shared::Shared;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a slot tells its driver.
#[derive(Debug, Clone, Copy)]
pub(super) enum Msg {
    /// The handler in `slot` ended with `outcome` (`failure`: how it
    /// failed, a panic or its command's end, for the bury warning).
    Finished {
        slot: usize,
        outcome: Outcome,
        failure: Option<Failure>,
    },
    /// The handler of job `id` in `slot` asks `what` of it.
    Ask { slot: usize, id: u64, what: Asked },
    /// A handler thread runs job `id` of `slot` now: the machine keeps its
    /// lease no more (the blocking worker's jobs are handed ahead).
    Running { slot: usize, id: u64 },
}

/// A driver's inbox: its slots' messages, and the wake-up for them.
#[derive(Debug, Default)]
pub(super) struct Inbox {
    q: Mutex<VecDeque<Msg>>,
    pub(super) notify: Notify,
    /// The node the driver's connection reached last (for `Job::peer_addr`).
    peer: Mutex<Option<SocketAddr>>,
    /// The blocking worker's handler threads for this server, whose queue
    /// a stop empties at once ([`give_back_unstarted`](Self::give_back_unstarted)).
    pool: std::sync::OnceLock<Arc<Handlers>>,
}

impl Inbox {
    pub(super) fn with_room(n: usize) -> Inbox {
        Inbox {
            q: Mutex::new(VecDeque::with_capacity(2 * n + 4)),
            notify: Notify::new(),
            peer: Mutex::new(None),
            pool: std::sync::OnceLock::new(),
        }
    }

    /// At a stop: the jobs handed to the handler threads that no thread
    /// has started go back unrun at once, as the machine gives back the
    /// jobs it holds, not when a thread comes free (the blocking worker's).
    pub(super) fn give_back_unstarted(&self) {
        let Some(pool) = self.pool.get() else {
            return;
        };
        loop {
            let Some(job) = lock(&pool.jobs).q.pop_front() else {
                return;
            };
            let slot = job.cell.index;
            // A revoke for it is done with (it never runs).
            job.cell.take_revoked(job.id);
            drop(job);
            self.tell(Msg::Finished {
                slot,
                outcome: crate::machine::UNSTARTED,
                failure: None,
            });
        }
    }

    /// The driver's connection reached `peer`.
    pub(super) fn connected_to(&self, peer: Option<SocketAddr>) {
        *lock(&self.peer) = peer;
    }

    fn send(&self, m: Msg) {
        lock(&self.q).push_back(m);
        // A permit is kept when the driver is not waiting: no wake-up lost.
        self.notify.notify_one();
    }

    /// Queues `m` for the driver's next turn without waking it: for news
    /// that can wait that long (a job's lease is next looked at no sooner
    /// than the driver's next deadline, which wakes it anyway).
    fn tell(&self, m: Msg) {
        lock(&self.q).push_back(m);
    }

    /// The next message, if any.
    pub(super) fn take(&self) -> Option<Msg> {
        lock(&self.q).pop_front()
    }
}

/// A job handed to a slot.
#[derive(Debug)]
struct Given {
    id: u64,
    attempt: u32,
}

/// What a slot, its driver and its job share.
#[derive(Debug, Default)]
struct SlotState {
    /// The next job to run.
    given: Option<Given>,
    /// The body of the job held (filled by the driver), or a spare buffer.
    body: Vec<u8>,
    /// Its header block on JetStream (empty when it has none), or a spare
    /// buffer.
    headers: Vec<u8>,
    /// The tube of the job held, or a spare string.
    tube: String,
    /// The tube a lookup its handler asked for named (the blocking
    /// worker's handler asks for a job's tube when it wants it).
    told: String,
    /// Answers to what handlers asked: the job's id, and the answer (few:
    /// the running job's, and those of a job its handler kept past its
    /// end).
    answers: Vec<(u64, Answered)>,
    /// The jobs of this slot not dropped yet: the running one, and any its
    /// handler kept past its end. Answers come only for them.
    live: Vec<u64>,
    /// The worker is over: the slot's task ends.
    closed: bool,
    /// Jobs handed to a handler thread that it must not run: their leases
    /// are gone (the blocking worker's, handed ahead).
    revoked: Vec<u64>,
}

/// One slot of a driver's window.
#[derive(Debug)]
pub(crate) struct SlotCell {
    index: usize,
    inbox: Arc<Inbox>,
    state: Mutex<SlotState>,
    /// Wakes the slot's task: a job to run, the end.
    wake: Notify,
    /// Wakes the jobs waiting for an answer (the running job's, and a job
    /// its handler kept past its end): each looks for its own.
    answered: Notify,
    /// Wakes a running handler's task to drop its future (a second stop).
    abort: Notify,
    aborted: AtomicBool,
}

impl SlotCell {
    pub(super) fn new(index: usize, inbox: Arc<Inbox>) -> SlotCell {
        SlotCell {
            index,
            inbox,
            state: Mutex::new(SlotState {
                body: Vec::with_capacity(crate::engine::BODY_ROOM),
                answers: Vec::with_capacity(2),
                live: Vec::with_capacity(2),
                ..SlotState::default()
            }),
            wake: Notify::new(),
            answered: Notify::new(),
            abort: Notify::new(),
            aborted: AtomicBool::new(false),
        }
    }

    /// The driver keeps the body (and, on JetStream, the header block) of
    /// the job just taken into this slot.
    pub(super) fn hold(&self, body: &[u8], headers: &[u8]) {
        let mut st = lock(&self.state);
        st.body.clear();
        st.body.extend_from_slice(body);
        st.headers.clear();
        st.headers.extend_from_slice(headers);
    }

    /// The driver starts the job held, of tube `tube`, on its `attempt`.
    pub(super) fn run(&self, id: u64, attempt: u32, tube: &str) {
        self.begin(id, attempt, Some(tube));
    }

    /// The job held in this slot, looked up, waits for a handler: its
    /// tube's name (the lookup's) is kept until it [`begin`](Self::begin)s.
    pub(super) fn keep_tube(&self, tube: &str) {
        let mut st = lock(&self.state);
        st.tube.clear();
        st.tube.push_str(tube);
    }

    /// A lookup the handler of this slot's job asked for named `tube`.
    pub(super) fn tell_tube(&self, tube: &str) {
        let mut st = lock(&self.state);
        st.told.clear();
        st.told.push_str(tube);
    }

    /// The driver starts the job held here, on its `attempt`, of `tube`
    /// (`None`: the one kept by [`keep_tube`](Self::keep_tube)).
    pub(super) fn begin(&self, id: u64, attempt: u32, tube: Option<&str>) {
        let mut st = lock(&self.state);
        if let Some(t) = tube {
            st.tube.clear();
            st.tube.push_str(t);
        }
        st.given = Some(Given { id, attempt });
        drop(st);
        self.wake.notify_one();
    }

    /// The answer to what job `id`'s handler asked.
    pub(super) fn answer(&self, id: u64, a: Answered) {
        let mut st = lock(&self.state);
        if !st.live.contains(&id) {
            // Its job was dropped (and the future that asked with it).
            return;
        }
        st.answers.push((id, a));
        drop(st);
        self.answered.notify_waiters();
    }

    /// Job `id`, handed to a handler thread, must not run: its lease is gone.
    pub(super) fn revoke(&self, id: u64) {
        lock(&self.state).revoked.push(id);
    }

    /// Whether job `id` was revoked (and forgets it).
    fn take_revoked(&self, id: u64) -> bool {
        let mut st = lock(&self.state);
        match st.revoked.iter().position(|&r| r == id) {
            Some(k) => {
                st.revoked.swap_remove(k);
                true
            }
            None => false,
        }
    }

    /// A second stop: the running handler's future is dropped at once.
    pub(super) fn abort(&self) {
        self.aborted.store(true, Ordering::SeqCst);
        self.abort.notify_one();
    }

    /// The worker is over: the slot's task ends once idle.
    pub(super) fn close(&self) {
        lock(&self.state).closed = true;
        self.wake.notify_one();
    }

    /// Waits for the next job; `None` once closed.
    async fn next(&self) -> Option<(Given, [Vec<u8>; 2], String)> {
        loop {
            {
                let mut st = lock(&self.state);
                if let Some(g) = st.given.take() {
                    st.live.push(g.id);
                    let body = std::mem::take(&mut st.body);
                    let headers = std::mem::take(&mut st.headers);
                    let tube = std::mem::take(&mut st.tube);
                    return Some((g, [body, headers], tube));
                }
                if st.closed {
                    return None;
                }
            }
            self.wake.notified().await;
        }
    }
}

/// A reserved job, owned by the handler of an
/// [`AsyncWorker`](crate::AsyncWorker).
///
/// Its body is a buffer of the worker's, given back for the next job when
/// the job is dropped. [`touch`](AsyncJob::touch) restarts its lease on the
/// connection it came on.
pub struct AsyncJob {
    id: u64,
    attempt: u32,
    body: Vec<u8>,
    headers: Vec<u8>,
    tube: String,
    cell: Arc<SlotCell>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for AsyncJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncJob")
            .field("id", &self.id)
            .field("len", &self.body.len())
            .field("tube", &self.tube)
            .field("attempt", &self.attempt)
            .finish()
    }
}

impl AsyncJob {
    /// The job's id on its server.
    pub fn id(&self) -> JobId {
        JobId::new(self.id)
    }

    /// The job body, exactly as put.
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// The name of the tube the job was put in (looked up with the job,
    /// before the handler runs: no request here). With
    /// [`Config::job_lookup`](crate::Config::job_lookup) off, on
    /// beanstalkd: the tube its reserve watched (a job reserved while
    /// several were watched is still looked up first, for its tube).
    pub fn tube(&self) -> &str {
        &self.tube
    }

    /// This run's attempt number, counted as
    /// [`Config::max_attempts`](crate::Config::max_attempts) counts: 1 on
    /// the first run; on a failure the job is buried when it equals
    /// `max_attempts`. 0 (not known) for a job not looked up
    /// ([`Config::job_lookup`](crate::Config::job_lookup) off, on
    /// beanstalkd); [`stats`](Self::stats) asks.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The headers the job was put with, on JetStream (as delivered: no
    /// request here); always `None` on beanstalkd, which has none.
    pub fn headers(&self) -> Option<HeaderBlock<'_>> {
        if self.headers.is_empty() {
            return None;
        }
        HeaderBlock::parse(&self.headers).ok()
    }

    /// True once the worker was told to stop taking jobs.
    pub fn stopping(&self) -> bool {
        self.shared.stop.load(Ordering::Relaxed)
    }

    /// The body decoded from JSON as a `T` (feature `serde`); a body that
    /// does not decode is a [`DecodeError`](crate::DecodeError), never a panic.
    #[cfg(feature = "serde")]
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, crate::DecodeError> {
        crate::json::decode(self.id, &self.body)
    }

    /// Restarts the job's lease (its TTR), on the connection it came on.
    /// [`JobError::LeaseLost`] when the server no longer counts it as ours;
    /// [`JobError::Connection`] when that connection broke (the server has
    /// the job back).
    pub async fn touch(&self) -> Result<(), JobError> {
        match self.ask(Asked::Touch).await {
            Answered::Touch(r) => r,
            Answered::Stats(_) => unreachable!("a touch is answered as one"),
        }
    }

    /// The job's numbers as the server keeps them: its priority, time to
    /// run, lease left, reserves, timeouts, releases and buries. On
    /// beanstalkd one `stats-job`, sent with the driver's next write (with
    /// [`Config::job_lookup`](crate::Config::job_lookup) off, the way to
    /// learn a job's releases when a handler needs them; the settle then
    /// uses these numbers and asks no more). On JetStream what the
    /// delivery said (its delivery count; the lease left from the ack
    /// wait), without a request. [`JobError::LeaseLost`] when the server no
    /// longer counts the job as ours; [`JobError::Connection`] when its
    /// connection broke.
    pub async fn stats(&self) -> Result<JobInfo, JobError> {
        match self.ask(Asked::Stats).await {
            Answered::Stats(r) => r,
            Answered::Touch(_) => unreachable!("a lookup is answered as one"),
        }
    }

    /// Asks `what` of the job's server through the slot's driver, and waits
    /// for the answer.
    async fn ask(&self, what: Asked) -> Answered {
        self.cell.inbox.send(Msg::Ask {
            slot: self.cell.index,
            id: self.id,
            what,
        });
        loop {
            // Registered before the answers are looked at: an answer that
            // comes in between wakes it.
            let mut answered = pin!(self.cell.answered.notified());
            answered.as_mut().enable();
            {
                let mut st = lock(&self.cell.state);
                // A job kept past its handler's end shares the slot with
                // the next job: each takes only its own answer, and only
                // to what it asked (a touch and a lookup may be owed at
                // once: both take `&self`).
                let mine = st.answers.iter().position(|(id, a)| {
                    *id == self.id
                        && matches!(
                            (a, what),
                            (Answered::Touch(_), Asked::Touch) | (Answered::Stats(_), Asked::Stats)
                        )
                });
                if let Some(k) = mine {
                    return st.answers.swap_remove(k).1;
                }
            }
            answered.await;
        }
    }
}

impl Drop for AsyncJob {
    fn drop(&mut self) {
        // The buffers go back for the slot's next job, but only into
        // room that is empty: a job kept past its handler's end may be
        // dropped after the slot took the next job's body and tube.
        let mut st = lock(&self.cell.state);
        // Answers to what this job asked that no one took (a touch whose
        // future was dropped).
        st.answers.retain(|(id, _)| *id != self.id);
        if let Some(k) = st.live.iter().position(|&id| id == self.id) {
            st.live.swap_remove(k);
        }
        // The room is taken when empty (the next job's not held yet) and
        // smaller than this job's.
        let fits = |len: usize, room: usize, mine: usize| len == 0 && room < mine;
        if fits(st.body.len(), st.body.capacity(), self.body.capacity()) {
            self.body.clear();
            st.body = std::mem::take(&mut self.body);
        }
        if fits(
            st.headers.len(),
            st.headers.capacity(),
            self.headers.capacity(),
        ) {
            self.headers.clear();
            st.headers = std::mem::take(&mut self.headers);
        }
        if fits(st.tube.len(), st.tube.capacity(), self.tube.capacity()) {
            self.tube.clear();
            st.tube = std::mem::take(&mut self.tube);
        }
    }
}

/// The slot's next job, its body and tube in the slot's buffers; `None`
/// once the slot is closed.
async fn next_job(cell: &Arc<SlotCell>, shared: &Arc<Shared>) -> Option<AsyncJob> {
    let (given, [body, headers], tube) = cell.next().await?;
    Some(AsyncJob {
        id: given.id,
        attempt: given.attempt,
        body,
        headers,
        tube,
        cell: cell.clone(),
        shared: shared.clone(),
    })
}

/// A slot's task: runs the jobs its driver hands it until closed.
pub(super) async fn serve<H, F>(handler: Arc<H>, cell: Arc<SlotCell>, shared: Arc<Shared>)
where
    H: Fn(AsyncJob) -> F + Send + Sync + 'static,
    F: Future<Output = Outcome> + Send + 'static,
{
    while let Some(job) = next_job(&cell, &shared).await {
        let (outcome, panicked) = run_guarded(&*handler, job, &cell).await;
        if panicked {
            Counters::add(&shared.counters.panicked);
        }
        cell.inbox.send(Msg::Finished {
            slot: cell.index,
            outcome,
            failure: panicked.then_some(Failure::Panicked),
        });
    }
}

/// The blocking worker's handler threads for one server: `concurrency` of
/// them, taking the jobs its slots' tasks hand over, in the order given.
/// Every job of the window is handed over as soon as it is taken
/// ([`Shared::hand_ahead`]), so a thread goes from one job to the next
/// without waiting for the driver; the machine keeps a job's lease while
/// it waits here, until its thread says it runs it (`Msg::Running`). At a
/// stop the driver gives back, unrun, every job no thread has started
/// ([`Inbox::give_back_unstarted`]), and a thread runs no job it had not
/// started.
pub(crate) struct Handlers {
    jobs: Mutex<HandedOver>,
    ready: std::sync::Condvar,
    /// The threads, joined at the worker's end.
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for Handlers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handlers")
            .field("waiting", &lock(&self.jobs).q.len())
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct HandedOver {
    q: VecDeque<AsyncJob>,
    /// Slots whose tasks still hand jobs over: the threads end when none
    /// is left.
    slots: usize,
}

impl Handlers {
    /// Starts server `server`'s handler threads.
    pub(super) fn start(
        handler: Arc<dyn Handler>,
        shared: Arc<Shared>,
        server: usize,
        rt: tokio::runtime::Handle,
    ) -> Arc<Handlers> {
        let window = crate::machine::window(&shared.cfg);
        let h = Arc::new(Handlers {
            jobs: Mutex::new(HandedOver {
                q: VecDeque::with_capacity(window),
                // Each of the server's slots hands over until it is closed.
                slots: window,
            }),
            ready: std::sync::Condvar::new(),
            threads: Mutex::new(Vec::new()),
        });
        for k in 0..shared.cfg.concurrency {
            let (h2, handler, shared, rt) =
                (h.clone(), handler.clone(), shared.clone(), rt.clone());
            let t = std::thread::Builder::new()
                .name(format!("taskq-worker-{server}-{k}"))
                .spawn(move || h2.serve(&*handler, &shared, server, &rt))
                .expect("spawning a worker thread");
            lock(&h.threads).push(t);
        }
        h
    }

    /// Waits for the threads to end (once every slot is closed), so that
    /// nothing of the handler's outlives the worker.
    pub(crate) fn join(&self) {
        let threads = std::mem::take(&mut *lock(&self.threads));
        for t in threads {
            if t.join().is_err() {
                tracing::error!("a worker thread panicked");
            }
        }
    }

    /// A handler thread: runs the jobs handed over until no slot is left.
    fn serve(
        &self,
        handler: &dyn Handler,
        shared: &Shared,
        server: usize,
        rt: &tokio::runtime::Handle,
    ) {
        let name = shared.cfg.servers[server].as_str();
        loop {
            let job = {
                let mut st = lock(&self.jobs);
                loop {
                    if let Some(job) = st.q.pop_front() {
                        break job;
                    }
                    if st.slots == 0 {
                        return;
                    }
                    st = self.ready.wait(st).unwrap_or_else(|e| e.into_inner());
                }
            };
            run_blocking(handler, job, shared, (server, name), rt);
        }
    }
}

/// A blocking slot's task: hands each job its driver gives it to the
/// server's handler threads, until closed.
pub(super) async fn hand_to(pool: Arc<Handlers>, cell: Arc<SlotCell>, shared: Arc<Shared>) {
    cell.inbox.pool.get_or_init(|| pool.clone());
    while let Some(job) = next_job(&cell, &shared).await {
        lock(&pool.jobs).q.push_back(job);
        pool.ready.notify_one();
        if shared.stop.load(Ordering::SeqCst) {
            // Handed over as the worker stopped: the driver gives it back.
            cell.inbox.notify.notify_one();
        }
    }
    lock(&pool.jobs).slots -= 1;
    pool.ready.notify_all();
}

/// Runs the blocking handler on `job`, on a handler thread: a [`Job`]
/// whose touches and lookups go through the driver (waited for here). A
/// panic is a failed attempt (`handle_guarded`), and how the handler
/// failed (a panic, its command's end) goes to the settle.
fn run_blocking(
    handler: &dyn Handler,
    job: AsyncJob,
    shared: &Shared,
    (server, name): (usize, &str),
    rt: &tokio::runtime::Handle,
) {
    let cell = job.cell.clone();
    if cell.take_revoked(job.id) || shared.stop.load(Ordering::SeqCst) {
        // Handed over before the stop, not started, or its lease gone
        // while it waited: back unrun.
        drop(job);
        cell.inbox.send(Msg::Finished {
            slot: cell.index,
            outcome: crate::machine::UNSTARTED,
            failure: None,
        });
        return;
    }
    cell.inbox.tell(Msg::Running {
        slot: cell.index,
        id: job.id,
    });
    // The node its connection reached (as configured, resolved, if none
    // was recorded).
    let peer = lock(&cell.inbox.peer).unwrap_or_else(|| resolve(name));
    let mut link = SlotLink {
        job: &job,
        rt,
        peer,
    };
    let mut j = Job {
        id: job.id,
        body: &job.body,
        headers: &job.headers,
        link: &mut link,
        server: name,
        server_index: server,
        shared,
        tube: &job.tube,
        attempt: (job.attempt > 0).then_some(job.attempt),
        asked: None,
    };
    let outcome = handle_guarded(handler, &mut j);
    let failure = crate::failure::take_failure();
    // A revoke that came after the job started is for nothing now: it must
    // not stop a later delivery of the same job in this slot.
    cell.take_revoked(job.id);
    drop(job);
    cell.inbox.send(Msg::Finished {
        slot: cell.index,
        outcome,
        failure,
    });
}

/// The address a configured server resolves to first (what
/// [`Job::peer_addr`] tells); `0.0.0.0:0` when it resolves to none now.
fn resolve(server: &str) -> SocketAddr {
    use std::net::ToSocketAddrs;
    let host = taskq_connect::Address::parse(server)
        .ok()
        .and_then(|a| a.hosts().first().cloned())
        .unwrap_or_else(|| server.to_owned());
    host.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)))
}

/// A blocking handler's way to its job's server: through the slot's
/// driver, as an async handler's, waited for on the handler's thread.
struct SlotLink<'j> {
    job: &'j AsyncJob,
    rt: &'j tokio::runtime::Handle,
    peer: SocketAddr,
}

impl SlotLink<'_> {
    fn fault(e: JobError) -> Result<bool, Fault> {
        match e {
            JobError::LeaseLost => Ok(false),
            JobError::Connection(e) => Err(Fault::Conn(e)),
            JobError::Unexpected { word } => Err(Fault::Unexpected(word)),
        }
    }
}

impl JobLink for SlotLink<'_> {
    fn addr(&self) -> SocketAddr {
        self.peer
    }

    /// The driver gives the connection up itself when it must.
    fn mark_broken(&mut self) {}

    fn touch(&mut self, _: u64) -> Result<bool, Fault> {
        match self.rt.block_on(self.job.touch()) {
            Ok(()) => Ok(true),
            Err(e) => Self::fault(e),
        }
    }

    fn info(&mut self, _: u64, tube: Option<&mut String>) -> Result<Option<JobInfo>, Fault> {
        let info = match self.rt.block_on(self.job.stats()) {
            Ok(info) => info,
            Err(e) => return Self::fault(e).map(|_| None),
        };
        if let Some(t) = tube {
            // The job's own, or (not known when it started) the one the
            // lookup just made named.
            t.clear();
            if self.job.tube.is_empty() {
                t.push_str(&lock(&self.job.cell.state).told);
            } else {
                t.push_str(&self.job.tube);
            }
        }
        Ok(Some(info))
    }
}

/// Runs the handler on `job`: a panic in the closure, while its future
/// is polled or while it is dropped is a failed attempt (`Outcome::Fail`,
/// and `true`); an abort drops the future and gives the job back at once.
async fn run_guarded<H, F>(handler: &H, job: AsyncJob, cell: &SlotCell) -> (Outcome, bool)
where
    H: Fn(AsyncJob) -> F,
    F: Future<Output = Outcome>,
{
    let id = job.id;
    let fut = match catch_unwind(AssertUnwindSafe(|| handler(job))) {
        Ok(fut) => fut,
        Err(payload) => return (panicked(id, payload), true),
    };
    // Held in an `Option` so that it is dropped here, guarded, in place
    // (no allocation): a panic in its drop would end the slot's task, and
    // the job it held would never be settled.
    let mut fut = pin!(Some(fut));
    let mut abort = pin!(cell.abort.notified());
    let mut aborted = false;
    let ended = poll_fn(|cx| {
        if cell.aborted.load(Ordering::SeqCst) || abort.as_mut().poll(cx).is_ready() {
            aborted = true;
            return Poll::Ready((
                Outcome::Retry {
                    delay: Duration::ZERO,
                },
                false,
            ));
        }
        let Some(f) = fut.as_mut().as_pin_mut() else {
            // Never: it is dropped only after this poll_fn ends.
            return Poll::Ready((Outcome::Fail, false));
        };
        match catch_unwind(AssertUnwindSafe(|| f.poll(cx))) {
            Ok(Poll::Ready(outcome)) => Poll::Ready((outcome, false)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(payload) => Poll::Ready((panicked(id, payload), true)),
        }
    })
    .await;
    match catch_unwind(AssertUnwindSafe(|| fut.as_mut().set(None))) {
        Ok(()) => ended,
        // The attempt's failure, unless it failed by a panic already or
        // was given back by an abort (which stands): then only logged.
        Err(payload) if !ended.1 && !aborted => (panicked(id, payload), true),
        Err(payload) => {
            let _ = panicked(id, payload);
            ended
        }
    }
}

/// Logs a handler's panic once, with the job's id: a failed attempt.
fn panicked(id: u64, payload: Box<dyn std::any::Any + Send>) -> Outcome {
    tracing::error!(
        job = id,
        panic = panic_message(&*payload),
        "handler panicked: a failed attempt"
    );
    // A payload whose drop panics too must not end the task either.
    let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
    Outcome::Fail
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::task::{Context, Waker};

    use super::*;
    use crate::config::Config;

    fn cell() -> (Arc<Shared>, Arc<SlotCell>) {
        let sh = Arc::new(Shared::new(Config::default(), false));
        (
            sh,
            Arc::new(SlotCell::new(0, Arc::new(Inbox::with_room(1)))),
        )
    }

    /// The slot's task takes its next job, as `serve` does.
    fn next_job(sh: &Arc<Shared>, cell: &Arc<SlotCell>) -> AsyncJob {
        let mut next = pin!(cell.next());
        let Poll::Ready(Some((g, [body, headers], tube))) =
            next.as_mut().poll(&mut Context::from_waker(Waker::noop()))
        else {
            panic!("a job was given");
        };
        AsyncJob {
            id: g.id,
            attempt: g.attempt,
            body,
            headers,
            tube,
            cell: cell.clone(),
            shared: sh.clone(),
        }
    }

    /// What the inbox holds, in order.
    fn told(cell: &SlotCell) -> Vec<String> {
        std::iter::from_fn(|| cell.inbox.take())
            .map(|m| format!("{m:?}"))
            .collect()
    }

    #[test]
    fn a_handler_thread_runs_no_revoked_job_and_none_after_a_stop() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let (sh, cell) = cell();
        let runs = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = runs.clone();
        // Job 8's first run is revoked while it runs (the revoke came late).
        let late = cell.clone();
        let handler = move |job: &mut Job<'_>| {
            if counted.fetch_add(1, Ordering::SeqCst) == 0 {
                late.revoke(job.id().get());
            }
            Outcome::Done
        };
        let server = (0, "127.0.0.1:1");
        let unstarted = format!(
            "{:?}",
            Msg::Finished {
                slot: 0,
                outcome: crate::machine::UNSTARTED,
                failure: None
            }
        );
        // Revoked while it waited (its lease is gone): given back unrun.
        cell.hold(b"x", b"");
        cell.run(7, 1, "t");
        let job = next_job(&sh, &cell);
        cell.revoke(7);
        run_blocking(&handler, job, &sh, server, rt.handle());
        assert_eq!(runs.load(Ordering::SeqCst), 0);
        assert_eq!(told(&cell), std::slice::from_ref(&unstarted));
        // The next job runs: the thread says so first, then how it ended.
        cell.hold(b"y", b"");
        cell.run(8, 1, "t");
        let job = next_job(&sh, &cell);
        run_blocking(&handler, job, &sh, server, rt.handle());
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        let done = format!(
            "{:?}",
            Msg::Finished {
                slot: 0,
                outcome: Outcome::Done,
                failure: None
            }
        );
        let running = format!("{:?}", Msg::Running { slot: 0, id: 8 });
        assert_eq!(told(&cell), [running, done]);
        // That revoke came once job 8 had started: it stops no later
        // delivery of job 8 in this slot.
        cell.hold(b"z", b"");
        cell.run(8, 2, "t");
        let job = next_job(&sh, &cell);
        run_blocking(&handler, job, &sh, server, rt.handle());
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        told(&cell);
        // Handed over, not started, and the worker stops: given back unrun.
        cell.hold(b"w", b"");
        cell.run(9, 1, "t");
        let job = next_job(&sh, &cell);
        sh.shutdown();
        run_blocking(&handler, job, &sh, server, rt.handle());
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        assert_eq!(told(&cell), [unstarted]);
    }

    #[test]
    fn a_job_kept_past_its_handlers_end_and_dropped_late_leaves_the_next_jobs_body_and_tube() {
        let (sh, cell) = cell();
        cell.hold(&[b'a'; 3000], b"");
        cell.run(1, 1, "a-long-tube-name");
        let kept = next_job(&sh, &cell);
        // The slot takes job 2 while job 1 is still held by a task its
        // handler spawned, which lets it go only now.
        cell.hold(b"two", b"");
        cell.run(2, 1, "b");
        drop(kept);
        let job = next_job(&sh, &cell);
        assert_eq!(
            (job.id().get(), job.body(), job.tube()),
            (2, &b"two"[..], "b")
        );
    }

    #[test]
    fn a_kept_jobs_touch_and_the_slots_next_job_each_get_their_own_wake_up() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let (sh, cell) = cell();
            cell.hold(b"one", b"");
            cell.run(1, 1, "t");
            let kept = next_job(&sh, &cell);
            // Job 1's handler ended; a task it spawned keeps job 1 and
            // touches it.
            let toucher = tokio::spawn(async move { kept.touch().await.is_ok() });
            tokio::task::yield_now().await;
            // The slot's task waits for its next job.
            let c = cell.clone();
            let next = tokio::spawn(async move { c.next().await.map(|(g, ..)| g.id) });
            tokio::task::yield_now().await;
            // The touch is answered, then job 2 is handed to the slot.
            cell.answer(1, Answered::Touch(Ok(())));
            cell.hold(b"two", b"");
            cell.run(2, 1, "t");
            let limit = Duration::from_secs(5);
            let got = tokio::time::timeout(limit, next).await;
            assert!(matches!(got, Ok(Ok(Some(2)))), "{got:?}");
            let touched = tokio::time::timeout(limit, toucher).await;
            assert!(matches!(touched, Ok(Ok(true))), "{touched:?}");
            // An answer for a job dropped is not kept.
            cell.answer(1, Answered::Touch(Ok(())));
            assert!(lock(&cell.state).answers.is_empty());
        });
    }

    /// A handler's future that ends `Done` at once, and panics when
    /// dropped.
    struct DoneThenPanicsOnDrop;

    impl Future for DoneThenPanicsOnDrop {
        type Output = Outcome;

        fn poll(self: std::pin::Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Outcome> {
            Poll::Ready(Outcome::Done)
        }
    }

    impl Drop for DoneThenPanicsOnDrop {
        fn drop(&mut self) {
            panic!("poison in a drop");
        }
    }

    #[test]
    fn a_panic_while_a_handlers_future_is_dropped_is_a_failed_attempt_not_the_slots_end() {
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let (sh, cell) = cell();
        cell.hold(b"one", b"");
        cell.run(1, 1, "t");
        let job = next_job(&sh, &cell);
        let handler = |_job: AsyncJob| DoneThenPanicsOnDrop;
        let mut run = pin!(run_guarded(&handler, job, &cell));
        let ended = run.as_mut().poll(&mut Context::from_waker(Waker::noop()));
        std::panic::set_hook(hook);
        assert!(
            matches!(ended, Poll::Ready((Outcome::Fail, true))),
            "{ended:?}"
        );
    }
}
