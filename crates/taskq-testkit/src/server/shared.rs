//! What the accept loop, the connection threads and the handles share: the
//! state under one lock, the fault plan, and the listener's and threads'
//! bookkeeping.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::faults::FaultPlan;
use super::state::State;

/// The fault plan in force and how many connections came since it was installed.
#[derive(Debug, Default)]
pub(crate) struct PlanSlot {
    pub(crate) plan: FaultPlan,
    pub(crate) generation: u64,
    pub(crate) accepted: u64,
}

pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
    pub(crate) cond: Condvar,
    pub(crate) stop: AtomicBool,
    pub(crate) plan: Mutex<PlanSlot>,
    pub(crate) plan_generation: AtomicU64,
    pub(crate) refuse_until: Mutex<Option<Instant>>,
    /// The local address of the connection that tells the accept loop to start
    /// refusing; connections queued before it are still served.
    pub(crate) refuse_marker: Mutex<Option<SocketAddr>>,
    pub(crate) socks: Mutex<HashMap<u64, TcpStream>>,
    pub(crate) threads: Mutex<Vec<JoinHandle<()>>>,
    pub(crate) next_conn: AtomicU64,
    pub(crate) max_job_size: usize,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking connection thread must not take the whole server down with it.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    pub(crate) fn fault_seed(&self) -> Option<u64> {
        lock(&self.plan).plan.seed()
    }

    /// Sleeps for `d`, waking early when the server stops. Returns false if it did.
    pub(crate) fn sleep(&self, d: Duration) -> bool {
        let until = Instant::now() + d;
        loop {
            if self.stopped() {
                return false;
            }
            let now = Instant::now();
            if now >= until {
                return true;
            }
            std::thread::sleep((until - now).min(Duration::from_millis(10)));
        }
    }

    pub(crate) fn forget_sock(&self, id: u64) {
        lock(&self.socks).remove(&id);
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
