//! A chaos proxy: a TCP proxy on loopback with toxics in the manner of
//! toxiproxy, switchable at run time, to put in front of any server.
//!
//! ```
//! use std::time::Duration;
//! use taskq_testkit::{ChaosProxy, Direction, TestServer, Toxic};
//!
//! let server = TestServer::start().unwrap();
//! let proxy = ChaosProxy::start(server.addr()).unwrap();
//! proxy.add(Toxic::Latency { delay: Duration::from_millis(5), jitter: Duration::ZERO }, Direction::Downstream, 1.0);
//! // ... connect clients to proxy.addr() ...
//! proxy.clear();
//! ```

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often a pump looks at the toxics and the stop flag while no data flows.
const POLL: Duration = Duration::from_millis(20);

/// How many of the last bytes dropped by silence each direction keeps.
const SILENCED_KEPT: usize = 64 * 1024;

/// Which way data flows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Client to server (requests).
    Upstream,
    /// Server to client (replies).
    Downstream,
    /// Both ways.
    Both,
}

impl Direction {
    fn covers(self, d: Direction) -> bool {
        self == Direction::Both || self == d
    }
}

/// A way of spoiling a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Toxic {
    /// Hold each chunk back for `delay` plus up to `jitter` more.
    Latency {
        /// Fixed delay.
        delay: Duration,
        /// Random extra delay, up to this much.
        jitter: Duration,
    },
    /// Reset both sides of the connection (RST) once the toxic has been active
    /// on it for `after` (zero: at once).
    Reset {
        /// Time from activation to reset.
        after: Duration,
    },
    /// Forward nothing (the bytes are dropped) and keep both sockets open.
    Silence,
    /// Forward `bytes` bytes in this direction, then close both sides.
    /// Nothing either direction reads after those bytes is passed on: not
    /// even the answer to them, whatever the threads' timing.
    LimitData {
        /// Bytes let through before the close.
        bytes: u64,
    },
    /// Forward `bytes` bytes in this direction, then reset both sides (RST):
    /// a reset at a point in the stream, not in time, so that it hits a
    /// client that sends more than `bytes` however fast it goes.
    ResetAfterData {
        /// Bytes let through before the reset.
        bytes: u64,
    },
    /// Forward in segments of at most `max_segment` bytes, `delay` apart.
    Slicer {
        /// Largest segment, at least 1.
        max_segment: usize,
        /// Pause between segments.
        delay: Duration,
    },
}

#[derive(Debug, Clone, Copy)]
struct Rule {
    /// Its own number: a connection draws and anchors it once.
    id: u64,
    toxic: Toxic,
    direction: Direction,
    probability: f64,
}

struct Shared {
    upstream: SocketAddr,
    rules: Mutex<Vec<Rule>>,
    next_rule: AtomicU64,
    generation: AtomicU64,
    stop: AtomicBool,
    opened: AtomicU64,
    closed: AtomicU64,
    /// The last bytes the Silence toxic dropped, upstream and downstream.
    silenced: Mutex<[Vec<u8>; 2]>,
    seed: u64,
    /// Every link, to shut down at drop; weak, so that a link's sockets close
    /// (with RST after a reset toxic) as soon as its pumps are done with it.
    links: Mutex<Vec<Weak<Link>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A fault-injecting TCP proxy on 127.0.0.1. Stopped on drop.
pub struct ChaosProxy {
    shared: Arc<Shared>,
    addr: SocketAddr,
    accept: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for ChaosProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChaosProxy")
            .field("addr", &self.addr)
            .field("upstream", &self.shared.upstream)
            .finish_non_exhaustive()
    }
}

impl ChaosProxy {
    /// Starts a proxy to `upstream` on a free loopback port, with no toxics.
    pub fn start(upstream: SocketAddr) -> io::Result<ChaosProxy> {
        let seed = fastrand::u64(..);
        ChaosProxy::start_seeded(upstream, seed)
    }

    /// As [`start`](Self::start), drawing the toxics' chances from `seed`.
    pub fn start_seeded(upstream: SocketAddr, seed: u64) -> io::Result<ChaosProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstream,
            rules: Mutex::new(Vec::new()),
            next_rule: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            opened: AtomicU64::new(0),
            closed: AtomicU64::new(0),
            silenced: Mutex::new([Vec::new(), Vec::new()]),
            seed,
            links: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
        });
        let s = shared.clone();
        let accept = std::thread::Builder::new()
            .name("chaos-accept".into())
            .spawn(move || accept_loop(s, listener))?;
        Ok(ChaosProxy {
            shared,
            addr,
            accept: Some(accept),
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server behind the proxy.
    pub fn upstream(&self) -> SocketAddr {
        self.shared.upstream
    }

    /// The seed the toxics' chances are drawn from.
    pub fn seed(&self) -> u64 {
        self.shared.seed
    }

    /// A slow, fragmenting network that stays within a 1 s deadline: 50 ms
    /// latency with 20 ms jitter both ways, requests forwarded in segments of at
    /// most 3 bytes and replies in single bytes, 200 us apart.
    pub fn add_slow_network(&self) {
        self.add(
            Toxic::Latency {
                delay: Duration::from_millis(50),
                jitter: Duration::from_millis(20),
            },
            Direction::Both,
            1.0,
        );
        for (max_segment, direction) in [(3, Direction::Upstream), (1, Direction::Downstream)] {
            self.add(
                Toxic::Slicer {
                    max_segment,
                    delay: Duration::from_micros(200),
                },
                direction,
                1.0,
            );
        }
    }

    /// Adds a toxic in `direction`, active on each connection with `probability`
    /// (drawn once per connection and direction, when the connection first
    /// sees the toxic). Applies at once to open connections, from where each
    /// stands then (a [`Toxic::Reset`]'s time and a [`Toxic::LimitData`]'s
    /// bytes count from then); toxics added or cleared later leave it as
    /// drawn.
    pub fn add(&self, toxic: Toxic, direction: Direction, probability: f64) {
        let id = self.shared.next_rule.fetch_add(1, Ordering::Relaxed);
        lock(&self.shared.rules).push(Rule {
            id,
            toxic,
            direction,
            probability,
        });
        self.shared.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Removes every toxic; data flows freely again.
    pub fn clear(&self) {
        lock(&self.shared.rules).clear();
        self.shared.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// The last bytes (up to 64 KiB a direction) the [`Toxic::Silence`]
    /// dropped going `dir`, over every connection; both directions'
    /// (upstream first) for [`Direction::Both`]. A test that silences a
    /// connection to lose a message waits until the message is in here: data
    /// the proxy has not read yet when the toxic is cleared still goes through.
    pub fn silenced(&self, dir: Direction) -> Vec<u8> {
        let kept = lock(&self.shared.silenced);
        match dir {
            Direction::Upstream => kept[0].clone(),
            Direction::Downstream => kept[1].clone(),
            Direction::Both => [kept[0].as_slice(), kept[1].as_slice()].concat(),
        }
    }

    /// Connections accepted so far.
    pub fn opened(&self) -> u64 {
        self.shared.opened.load(Ordering::Acquire)
    }

    /// Connections closed so far (both directions finished).
    pub fn closed(&self) -> u64 {
        self.shared.closed.load(Ordering::Acquire)
    }

    /// Waits up to `limit` until every opened connection has closed.
    pub fn wait_idle(&self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if self.opened() == self.closed() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.opened() == self.closed()
    }
}

impl Drop for ChaosProxy {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("taskq-testkit: chaos proxy seed {}", self.shared.seed);
        }
        self.shared.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        for link in lock(&self.shared.links).iter().filter_map(Weak::upgrade) {
            link.kill(false);
        }
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
        let threads = std::mem::take(&mut *lock(&self.shared.threads));
        for t in threads {
            let _ = t.join();
        }
    }
}

fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    let mut n = 0u64;
    for client in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        n += 1;
        shared.opened.fetch_add(1, Ordering::AcqRel);
        let server = match TcpStream::connect_timeout(&shared.upstream, Duration::from_secs(2)) {
            Ok(s) => s,
            Err(_) => {
                // The upstream is down: the client sees its connection closed.
                drop(client);
                shared.closed.fetch_add(1, Ordering::AcqRel);
                continue;
            }
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let link = match Link::new(client, server) {
            Ok(l) => Arc::new(l),
            Err(_) => {
                shared.closed.fetch_add(1, Ordering::AcqRel);
                continue;
            }
        };
        {
            let mut links = lock(&shared.links);
            links.retain(|l| l.strong_count() > 0);
            links.push(Arc::downgrade(&link));
        }
        let mut handles = Vec::new();
        for dir in [Direction::Upstream, Direction::Downstream] {
            let (s, l) = (shared.clone(), link.clone());
            let seed = shared.seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (dir as u64);
            let spawned = std::thread::Builder::new()
                .name("chaos-pump".into())
                .spawn(move || pump(s, l, dir, seed));
            if let Ok(h) = spawned {
                handles.push(h);
            } else {
                link.kill(false);
            }
        }
        let mut threads = lock(&shared.threads);
        threads.retain(|t| !t.is_finished());
        threads.extend(handles);
    }
}

/// Both sockets of one proxied connection.
struct Link {
    client: TcpStream,
    server: TcpStream,
    /// Pumps still running; the last one out counts the connection closed.
    running: AtomicU64,
    dead: AtomicBool,
    /// Set when a data limit is reached, before its last bytes go out:
    /// nothing either pump reads after it is passed on. So no answer to the
    /// last bytes, nor anything sent after them, crosses, however the
    /// pumps' threads are scheduled between those bytes and the close.
    sealed: AtomicBool,
}

impl Link {
    fn new(client: TcpStream, server: TcpStream) -> io::Result<Link> {
        client.set_read_timeout(Some(POLL))?;
        server.set_read_timeout(Some(POLL))?;
        Ok(Link {
            client,
            server,
            running: AtomicU64::new(2),
            dead: AtomicBool::new(false),
            sealed: AtomicBool::new(false),
        })
    }

    /// Closes both sides: with FIN (shutdown) now, or, when `reset`, with RST
    /// when the pumps let go of the link and its sockets close with a zero linger
    /// (a shutdown would send FIN first, and the peer would see a clean close).
    fn kill(&self, reset: bool) {
        if self.dead.swap(true, Ordering::SeqCst) {
            return;
        }
        if reset {
            let _ = socket2::SockRef::from(&self.client).set_linger(Some(Duration::ZERO));
            let _ = socket2::SockRef::from(&self.server).set_linger(Some(Duration::ZERO));
            return;
        }
        let _ = self.client.shutdown(Shutdown::Both);
        let _ = self.server.shutdown(Shutdown::Both);
    }
}

/// The toxics active on one direction of one connection.
#[derive(Default)]
struct Active {
    latency: Option<(Duration, Duration)>,
    reset_at: Option<Instant>,
    silence: bool,
    /// Where the data stops (bytes sent in this direction), and whether the
    /// connection is then reset rather than closed.
    limit: Option<(u64, bool)>,
    slicer: Option<(usize, Duration)>,
}

/// One toxic as a connection's direction drew it: where it was anchored
/// (the time a reset counts from, the bytes a limit counts from).
#[derive(Clone, Copy)]
struct Drawn {
    rule: u64,
    /// `None`: not drawn in (its probability).
    on: Option<(Toxic, Instant, u64)>,
}

/// The toxics in force on one direction of a connection that has sent
/// `sent` bytes: each rule drawn and anchored the first time this
/// direction sees it (kept in `drawn`), as drawn since.
fn draw(
    shared: &Shared,
    dir: Direction,
    rng: &mut fastrand::Rng,
    sent: u64,
    drawn: &mut Vec<Drawn>,
) -> Active {
    let now = Instant::now();
    let rules = lock(&shared.rules);
    let mut next = Vec::with_capacity(rules.len());
    for r in rules.iter().filter(|r| r.direction.covers(dir)) {
        let on = match drawn.iter().find(|d| d.rule == r.id) {
            Some(d) => d.on,
            None => (rng.f64() < r.probability).then_some((r.toxic, now, sent)),
        };
        next.push(Drawn { rule: r.id, on });
    }
    drop(rules);
    *drawn = next;
    let mut a = Active::default();
    for (toxic, at, from) in drawn.iter().filter_map(|d| d.on) {
        match toxic {
            Toxic::Latency { delay, jitter } => a.latency = Some((delay, jitter)),
            Toxic::Reset { after } => a.reset_at = Some(at + after),
            Toxic::Silence => a.silence = true,
            Toxic::LimitData { bytes } => a.limit = Some((from + bytes, false)),
            Toxic::ResetAfterData { bytes } => a.limit = Some((from + bytes, true)),
            Toxic::Slicer { max_segment, delay } => a.slicer = Some((max_segment.max(1), delay)),
        }
    }
    a
}

fn pump(shared: Arc<Shared>, link: Arc<Link>, dir: Direction, seed: u64) {
    let (mut from, mut to) = match dir {
        Direction::Upstream => (&link.client, &link.server),
        _ => (&link.server, &link.client),
    };
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut generation = u64::MAX;
    let mut active = Active::default();
    let mut drawn = Vec::new();
    let mut sent: u64 = 0;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if shared.stop.load(Ordering::Relaxed) || link.dead.load(Ordering::SeqCst) {
            break;
        }
        let g = shared.generation.load(Ordering::Acquire);
        if g != generation {
            generation = g;
            active = draw(&shared, dir, &mut rng, sent, &mut drawn);
        }
        if active.reset_at.is_some_and(|t| Instant::now() >= t) {
            link.kill(true);
            break;
        }
        let n = match from.read(&mut buf) {
            Ok(0) => {
                // Pass the half-close on; the other pump ends when its side closes.
                let _ = to.shutdown(Shutdown::Write);
                break;
            }
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                continue
            }
            Err(_) => {
                link.kill(false);
                break;
            }
        };
        // The toxics may have changed while the read waited: data goes out under
        // the toxics in force when it arrived.
        let g = shared.generation.load(Ordering::Acquire);
        if g != generation {
            generation = g;
            active = draw(&shared, dir, &mut rng, sent, &mut drawn);
        }
        if active.reset_at.is_some_and(|t| Instant::now() >= t) {
            link.kill(true);
            break;
        }
        if active.silence {
            let mut kept = lock(&shared.silenced);
            let kept = &mut kept[usize::from(dir == Direction::Downstream)];
            kept.extend_from_slice(&buf[..n]);
            let over = kept.len().saturating_sub(SILENCED_KEPT);
            kept.drain(..over);
            continue;
        }
        if link.sealed.load(Ordering::SeqCst) {
            // A limit was reached (in either direction): read after it, these
            // bytes never cross. The pump that reached it closes the link.
            break;
        }
        let mut chunk = &buf[..n];
        let mut over = None;
        if let Some((limit, reset)) = active.limit {
            let room = limit.saturating_sub(sent);
            if (chunk.len() as u64) >= room {
                chunk = &chunk[..room as usize];
                over = Some(reset);
                link.sealed.store(true, Ordering::SeqCst);
            }
        }
        if let Some((delay, jitter)) = active.latency {
            let extra = if jitter.is_zero() {
                Duration::ZERO
            } else {
                jitter.mul_f64(rng.f64())
            };
            std::thread::sleep(delay + extra);
        }
        let ok = match active.slicer {
            Some((seg, delay)) => chunk.chunks(seg).enumerate().all(|(i, s)| {
                if i > 0 && !delay.is_zero() {
                    std::thread::sleep(delay);
                }
                to.write_all(s).is_ok()
            }),
            None => to.write_all(chunk).is_ok(),
        };
        sent += chunk.len() as u64;
        if over.is_some() || !ok {
            link.kill(ok && over == Some(true));
            break;
        }
        let _ = &mut to;
    }
    if link.running.fetch_sub(1, Ordering::AcqRel) == 1 {
        link.kill(false);
        shared.closed.fetch_add(1, Ordering::AcqRel);
    }
}
