//! A [`TestServer`](super::TestServer)'s settings: where it listens, the
//! largest job, faults from the start, and deliberate defects.

use std::net::SocketAddr;

use super::faults::FaultPlan;

/// Deliberate defects, so that tests can prove the ledger catches a server that
/// loses or double-hands jobs. All off by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Defects {
    /// `reserve-job` hands out a job another connection holds.
    pub hand_out_held_jobs: bool,
    /// `release` answers `RELEASED` and then drops the job.
    pub lose_released_jobs: bool,
}

impl Defects {
    /// No defects.
    pub fn none() -> Defects {
        Defects::default()
    }

    /// `reserve-job` hands out held jobs.
    pub fn hand_out_held_jobs(mut self) -> Defects {
        self.hand_out_held_jobs = true;
        self
    }

    /// `release` loses the job.
    pub fn lose_released_jobs(mut self) -> Defects {
        self.lose_released_jobs = true;
        self
    }
}

/// Settings of a [`TestServer`](super::TestServer).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServerConfig {
    /// Where to listen; port 0 picks a free one. Default `127.0.0.1:0`.
    pub addr: SocketAddr,
    /// Largest job body accepted (beanstalkd's `-z`). Default 65535.
    pub max_job_size: usize,
    /// Faults from the start.
    pub faults: FaultPlan,
    /// Deliberate defects (for tests of the ledger).
    pub defects: Defects,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            max_job_size: taskq_proto::DEFAULT_MAX_JOB_SIZE,
            faults: FaultPlan::none(),
            defects: Defects::none(),
        }
    }
}

impl ServerConfig {
    /// Sets the address.
    pub fn addr(mut self, addr: SocketAddr) -> Self {
        self.addr = addr;
        self
    }

    /// Sets the largest job body.
    pub fn max_job_size(mut self, bytes: usize) -> Self {
        self.max_job_size = bytes;
        self
    }

    /// Sets the fault plan.
    pub fn faults(mut self, plan: FaultPlan) -> Self {
        self.faults = plan;
        self
    }

    /// Sets deliberate defects.
    pub fn defects(mut self, defects: Defects) -> Self {
        self.defects = defects;
        self
    }
}
