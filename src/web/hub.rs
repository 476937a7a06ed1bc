//! The dashboard's view of its servers: one sampler thread per server reads
//! a snapshot at most once per [`PERIOD`], and only while some page asked
//! for the overview within [`DEMAND`]; every page shares what it read, so
//! open tabs cost the servers nothing more than one tab does.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::jetstream::StreamArgs;
use crate::server::{self, Conn};
use crate::snapshot::{self, History, Scope, Snapshot};

/// Time between two snapshots of a server.
pub const PERIOD: Duration = Duration::from_secs(1);
/// How long after the last request for the overview sampling goes on.
const DEMAND: Duration = Duration::from_secs(5);
/// Rates kept for the charts (two minutes at one a second).
pub const HISTORY: usize = 120;

/// What is known of one server.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The last snapshot read, if any.
    pub latest: Option<Arc<Snapshot>>,
    /// Rates over the snapshots read: shared by the pages that read it, and
    /// copied by the sampler only when a page still holds the last one.
    pub history: Arc<History>,
    /// The last reading's error, when it failed.
    pub error: Option<String>,
}

struct Slot {
    /// What is known, and when a page last asked for it.
    seen: Mutex<(Seen, Option<Instant>)>,
    changed: Condvar,
}

/// The servers the dashboard shows, each sampled on its own thread.
pub struct Hub {
    /// Each server's address, in `--addr` order.
    pub addrs: Vec<String>,
    slots: Vec<Arc<Slot>>,
}

impl Hub {
    /// Starts a sampler for each of `addrs`.
    pub fn start(addrs: Vec<String>, io_timeout: u64, stream: StreamArgs) -> Hub {
        let slots: Vec<Arc<Slot>> = addrs
            .iter()
            .map(|_| {
                Arc::new(Slot {
                    seen: Mutex::new((
                        Seen {
                            latest: None,
                            history: Arc::new(History::new(HISTORY)),
                            error: None,
                        },
                        None,
                    )),
                    changed: Condvar::new(),
                })
            })
            .collect();
        for (addr, slot) in addrs.iter().zip(&slots) {
            let (addr, slot, stream) = (addr.clone(), Arc::clone(slot), stream.clone());
            std::thread::spawn(move || sample(&addr, io_timeout, &stream, &slot));
        }
        Hub { addrs, slots }
    }

    /// What is known of every server, asking the samplers to go on; waits
    /// (up to `wait`) for a first reading of a server that has none yet.
    pub fn seen(&self, wait: Duration) -> Vec<Seen> {
        let until = Instant::now() + wait;
        self.slots
            .iter()
            .map(|slot| {
                let mut g = slot.seen.lock().unwrap_or_else(|e| e.into_inner());
                g.1 = Some(Instant::now());
                slot.changed.notify_all();
                while g.0.latest.is_none() && g.0.error.is_none() {
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    g = slot
                        .changed
                        .wait_timeout(g, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                g.0.clone()
            })
            .collect()
    }
}

/// The sampler of one server: a snapshot every [`PERIOD`] while there is
/// demand, on one connection made again after any error.
fn sample(addr: &str, io_timeout: u64, stream: &StreamArgs, slot: &Slot) {
    let mut conn: Option<Conn> = None;
    loop {
        {
            let mut g = slot.seen.lock().unwrap_or_else(|e| e.into_inner());
            while g.1.is_none_or(|t| t.elapsed() > DEMAND) {
                g = slot.changed.wait(g).unwrap_or_else(|e| e.into_inner());
            }
        }
        let started = Instant::now();
        let read = match conn
            .take()
            .map_or_else(|| server::open(addr, io_timeout, stream), Ok)
        {
            Ok(mut c) => {
                let r = snapshot::read(&mut c, Scope::everything());
                if r.is_ok() {
                    conn = Some(c);
                }
                r
            }
            Err(e) => Err(e),
        };
        {
            let mut g = slot.seen.lock().unwrap_or_else(|e| e.into_inner());
            match read {
                Ok(s) => {
                    Arc::make_mut(&mut g.0.history).add(&s);
                    g.0.latest = Some(Arc::new(s));
                    g.0.error = None;
                }
                Err(e) => g.0.error = Some(e),
            }
            slot.changed.notify_all();
        }
        std::thread::sleep(PERIOD.saturating_sub(started.elapsed()));
    }
}
