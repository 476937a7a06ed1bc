//! The YAML documents of `stats`, `stats-job`, `stats-tube` and `list-tubes*`,
//! with the keys beanstalkd 1.12 emits, in its order.

use std::fmt::Write;
use std::time::Instant;

use super::counters::CMD_NAMES;
use super::state::{Job, JobState, Name, State, Tube};

fn secs_until(until: Instant, now: Instant) -> u64 {
    until.saturating_duration_since(now).as_secs()
}

pub(crate) fn job_yaml(j: &Job, now: Instant) -> String {
    let (state, left) = match j.state {
        JobState::Ready => ("ready", 0),
        JobState::Delayed { until } => ("delayed", secs_until(until, now)),
        JobState::Reserved { until, .. } => ("reserved", secs_until(until, now)),
        JobState::Buried { .. } => ("buried", 0),
    };
    let mut s = String::with_capacity(200);
    let _ = write!(
        s,
        "---\nid: {}\ntube: {}\nstate: {}\npri: {}\nage: {}\ndelay: {}\nttr: {}\ntime-left: {}\n\
         file: 0\nreserves: {}\ntimeouts: {}\nreleases: {}\nburies: {}\nkicks: {}\n",
        j.id,
        j.tube,
        state,
        j.pri,
        now.saturating_duration_since(j.created).as_secs(),
        j.delay,
        j.ttr,
        left,
        j.reserves,
        j.timeouts,
        j.releases,
        j.buries,
        j.kicks
    );
    s
}

pub(crate) fn tube_yaml(name: &str, t: &Tube, now: Instant) -> String {
    let (pause, left) = match t.pause {
        Some((secs, until)) => (u64::from(secs), secs_until(until, now)),
        None => (0, 0),
    };
    let mut s = String::with_capacity(300);
    let _ = write!(
        s,
        "---\nname: {}\ncurrent-jobs-urgent: {}\ncurrent-jobs-ready: {}\ncurrent-jobs-reserved: {}\n\
         current-jobs-delayed: {}\ncurrent-jobs-buried: {}\ntotal-jobs: {}\ncurrent-using: {}\n\
         current-watching: {}\ncurrent-waiting: {}\ncmd-delete: {}\ncmd-pause-tube: {}\npause: {}\n\
         pause-time-left: {}\n",
        name,
        t.urgent,
        t.ready.len(),
        t.reserved,
        t.delayed.len(),
        t.buried.len(),
        t.total_jobs,
        t.using,
        t.watching,
        t.waiting,
        t.cmd_delete,
        t.cmd_pause,
        pause,
        left
    );
    s
}

pub(crate) fn server_yaml(st: &State, now: Instant) -> String {
    let mut urgent = 0;
    let mut ready = 0;
    let mut delayed = 0;
    let mut buried = 0;
    for t in st.tubes.values() {
        urgent += t.urgent;
        ready += t.ready.len();
        delayed += t.delayed.len();
        buried += t.buried.len();
    }
    let mut s = String::with_capacity(1100);
    let _ = write!(
        s,
        "---\ncurrent-jobs-urgent: {urgent}\ncurrent-jobs-ready: {ready}\n\
         current-jobs-reserved: {}\ncurrent-jobs-delayed: {delayed}\ncurrent-jobs-buried: {buried}\n",
        st.stats.reserved
    );
    for (name, n) in CMD_NAMES.iter().zip(st.stats.cmd) {
        let _ = writeln!(s, "{name}: {n}");
    }
    let producers = st.conns.values().filter(|c| c.producer).count();
    let workers = st.conns.values().filter(|c| c.worker).count();
    let _ = write!(
        s,
        "job-timeouts: {}\ntotal-jobs: {}\nmax-job-size: {}\ncurrent-tubes: {}\n\
         current-connections: {}\ncurrent-producers: {producers}\ncurrent-workers: {workers}\n\
         current-waiting: {}\ntotal-connections: {}\npid: {}\nversion: \"taskq-testkit {}\"\n\
         rusage-utime: 0.000000\nrusage-stime: 0.000000\nuptime: {}\nbinlog-oldest-index: 0\n\
         binlog-current-index: 0\nbinlog-records-migrated: 0\nbinlog-records-written: 0\n\
         binlog-max-size: 10485760\ndraining: {}\nid: {:016x}\nhostname: localhost\n\
         os: taskq-testkit\nplatform: {}\n",
        st.stats.job_timeouts,
        st.stats.total_jobs,
        st.max_job_size,
        st.tubes.len(),
        st.conns.len(),
        st.stats.waiting,
        st.stats.total_connections,
        std::process::id(),
        env!("CARGO_PKG_VERSION"),
        now.saturating_duration_since(st.started).as_secs(),
        st.draining,
        st.server_id,
        std::env::consts::ARCH,
    );
    s
}

pub(crate) fn list_yaml(names: &[Name]) -> String {
    let mut s = String::from("---\n");
    for n in names {
        let _ = writeln!(s, "- {n}");
    }
    s
}
