//! The reference server: beanstalkd's protocol and semantics in memory, with a
//! ledger of every job and connection, and fault plans.
//!
//! One thread per connection and one lock over the whole state: simple to
//! reason about, and fast enough for tests and demos. Production uses beanstalkd.
//!
//! ```
//! use taskq_proto::{Command, ConnectionConfig, Connection, Reply};
//! use taskq_testkit::TestServer;
//!
//! let server = TestServer::start().unwrap();
//! let mut c = Connection::connect(server.addr(), ConnectionConfig::default()).unwrap();
//! let put = Command::Put { pri: 0, delay: 0, ttr: 10, body: b"job" };
//! assert!(matches!(c.request(&put).unwrap(), Reply::Inserted { .. }));
//! let report = server.ledger().check();
//! assert_eq!((report.added, report.acknowledged, report.done), (1, 1, 0));
//! assert_eq!(report.lost.len(), 1); // nobody did it
//! ```

mod commands;
mod config;
mod conn;
mod counters;
mod faults;
mod ledger;
mod shared;
mod state;
mod stats;

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use config::{Defects, ServerConfig};
pub use faults::{Fault, FaultPlan, RandomFaults, Rule, Target};
pub use ledger::{ConnCounts, JobHistory, LedgerReport};

use ledger::Book;
use shared::{lock, PlanSlot, Shared};
use state::State;

/// A beanstalkd-compatible server in this process, on a loopback port. Stopped on drop.
pub struct TestServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    accept: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for TestServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl TestServer {
    /// Starts a server with default settings on a free 127.0.0.1 port.
    pub fn start() -> io::Result<TestServer> {
        TestServer::start_with(ServerConfig::default())
    }

    /// Starts a server with these settings.
    pub fn start_with(cfg: ServerConfig) -> io::Result<TestServer> {
        let listener = TcpListener::bind(cfg.addr)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State::new(cfg.max_job_size, cfg.defects)),
            cond: Condvar::new(),
            stop: AtomicBool::new(false),
            plan: Mutex::new(PlanSlot {
                plan: cfg.faults,
                generation: 0,
                accepted: 0,
            }),
            plan_generation: AtomicU64::new(0),
            refuse_until: Mutex::new(None),
            refuse_marker: Mutex::new(None),
            socks: Mutex::new(HashMap::new()),
            threads: Mutex::new(Vec::new()),
            next_conn: AtomicU64::new(1),
            max_job_size: cfg.max_job_size,
        });
        let s = shared.clone();
        let accept = std::thread::Builder::new()
            .name("testkit-accept".into())
            .spawn(move || accept_loop(s, listener, addr))?;
        Ok(TestServer {
            shared,
            addr,
            accept: Some(accept),
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A handle on the ledger.
    pub fn ledger(&self) -> Ledger {
        Ledger {
            shared: self.shared.clone(),
        }
    }

    /// Installs a new fault plan. It applies at once to open connections
    /// (their request counts start again from 0) and to new ones (`Target::Nth`
    /// counts connections accepted from now on).
    pub fn set_faults(&self, plan: FaultPlan) {
        let mut slot = lock(&self.shared.plan);
        slot.plan = plan;
        slot.generation += 1;
        slot.accepted = 0;
        self.shared
            .plan_generation
            .store(slot.generation, Ordering::Release);
    }

    /// Removes every fault.
    pub fn clear_faults(&self) {
        self.set_faults(FaultPlan::none());
    }

    /// Refuses connections for `d`: the listening socket is closed, so connects
    /// fail with "connection refused", then opened again on the same port.
    /// Open connections are not touched.
    pub fn refuse_for(&self, d: Duration) {
        *lock(&self.shared.refuse_until) = Some(Instant::now() + d);
        {
            // Held while connecting, so the accept loop cannot see the marker
            // connection before it knows the marker's address.
            let mut marker = lock(&self.shared.refuse_marker);
            match TcpStream::connect_timeout(&self.addr, Duration::from_secs(1)) {
                Ok(s) => *marker = s.local_addr().ok(),
                Err(_) => return,
            }
        }
        // Wait until the listener is really closed, so the caller's next connect is refused.
        let until = Instant::now() + Duration::from_secs(2);
        while lock(&self.shared.refuse_until).is_some() && Instant::now() < until {
            if lock(&self.shared.refuse_marker).is_none() {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Drain mode: `put` is answered with `DRAINING`.
    pub fn set_draining(&self, on: bool) {
        self.shared.lock().draining = on;
    }

    /// Connections open now.
    pub fn open_connections(&self) -> usize {
        self.shared.lock().conns.len()
    }

    /// Jobs in the server now, in any state.
    pub fn job_count(&self) -> usize {
        self.shared.lock().jobs.len()
    }

    /// Closes every open connection abruptly (FIN), as a server restart would.
    pub fn close_connections(&self) {
        for s in lock(&self.shared.socks).values() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Stops the server: closes the listener and every connection, and waits for its threads.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn wake_accept(&self) {
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }

    fn shutdown(&mut self) {
        if self.shared.stop.swap(true, Ordering::SeqCst) {
            return;
        }
        self.wake_accept();
        self.close_connections();
        self.shared.cond.notify_all();
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
        let threads = std::mem::take(&mut *lock(&self.shared.threads));
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(seed) = self.shared.fault_seed() {
                eprintln!(
                    "taskq-testkit: the failing run used fault seed {seed} \
                     (replay: TASKQ_FAULT_SEED={seed})"
                );
            }
        }
        self.shutdown();
    }
}

/// A handle on a [`TestServer`]'s ledger; cheap to clone,
/// usable after the server stopped.
#[derive(Clone)]
pub struct Ledger {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger").finish_non_exhaustive()
    }
}

impl Ledger {
    /// Reads the record and reports on it.
    pub fn check(&self) -> LedgerReport {
        let seed = self.shared.fault_seed();
        let mut state = self.shared.lock();
        // The leases run out by now are counted as expired, as beanstalkd
        // would have them, before the record is read.
        if state.tick(Instant::now()) {
            self.shared.cond.notify_all();
        }
        state.book.report(seed)
    }

    /// Forgets every job and connection recorded so far. Jobs put before and
    /// deleted after count as `unexpected`.
    pub fn clear(&self) {
        let mut state = self.shared.lock();
        state.book = Book::default();
    }

    /// One job's history, if the ledger saw it put.
    pub fn job(&self, id: u64) -> Option<JobHistory> {
        self.shared.lock().book.history(id)
    }

    /// The counts of one connection.
    pub fn connection(&self, id: u64) -> Option<ConnCounts> {
        self.shared.lock().book.connection(id)
    }
}

fn accept_loop(shared: Arc<Shared>, mut listener: TcpListener, addr: SocketAddr) {
    loop {
        let accepted = listener.accept();
        if shared.stopped() {
            return;
        }
        let marker = *lock(&shared.refuse_marker);
        let is_marker = matches!((&accepted, marker), (Ok((_, peer)), Some(m)) if *peer == m);
        if is_marker {
            let until = lock(&shared.refuse_until).unwrap_or_else(Instant::now);
            drop(accepted);
            drop(listener);
            *lock(&shared.refuse_marker) = None;
            if !shared.sleep(until.saturating_duration_since(Instant::now())) {
                return;
            }
            *lock(&shared.refuse_until) = None;
            listener = match rebind(addr, &shared) {
                Some(l) => l,
                None => return,
            };
            continue;
        }
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(_) => {
                // Out of descriptors or a connection that died in the backlog: go on.
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
        };
        let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
        let Ok(clone) = stream.try_clone() else {
            continue;
        };
        lock(&shared.socks).insert(id, clone);
        shared.lock().open(id, peer);
        let s = shared.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("testkit-conn-{id}"))
            .spawn(move || conn::serve(s, id, stream));
        match spawned {
            Ok(h) => {
                let mut threads = lock(&shared.threads);
                threads.retain(|t| !t.is_finished());
                threads.push(h);
            }
            Err(_) => {
                shared.lock().close(id);
                shared.forget_sock(id);
            }
        }
    }
}

/// Opens the listening socket again on the same address after a refusal.
fn rebind(addr: SocketAddr, shared: &Shared) -> Option<TcpListener> {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let bound = (|| -> io::Result<TcpListener> {
            let s = socket2::Socket::new(
                socket2::Domain::for_address(addr),
                socket2::Type::STREAM,
                None,
            )?;
            s.set_reuse_address(true)?;
            s.bind(&addr.into())?;
            s.listen(1024)?;
            Ok(s.into())
        })();
        match bound {
            Ok(l) => return Some(l),
            Err(_) if Instant::now() < until && !shared.stopped() => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(_) => return None,
        }
    }
}
