//! The server-wide counters beanstalkd reports in `stats`: `cmd-*` by
//! command, jobs, timeouts, connections. Kept in the state; the YAML that
//! shows them is in `stats`.

use taskq_proto::{Command, CommandKind};

/// The `cmd-*` counters beanstalkd reports, in its order.
pub(crate) const CMD_NAMES: [&str; 22] = [
    "cmd-put",
    "cmd-peek",
    "cmd-peek-ready",
    "cmd-peek-delayed",
    "cmd-peek-buried",
    "cmd-reserve",
    "cmd-reserve-with-timeout",
    "cmd-delete",
    "cmd-release",
    "cmd-use",
    "cmd-watch",
    "cmd-ignore",
    "cmd-bury",
    "cmd-kick",
    "cmd-touch",
    "cmd-stats",
    "cmd-stats-job",
    "cmd-stats-tube",
    "cmd-list-tubes",
    "cmd-list-tube-used",
    "cmd-list-tubes-watched",
    "cmd-pause-tube",
];
pub(crate) const CMD_RESERVE: usize = 5;
pub(crate) const CMD_RESERVE_WITH_TIMEOUT: usize = 6;

/// Server-wide counters.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) cmd: [u64; CMD_NAMES.len()],
    pub(crate) total_jobs: u64,
    pub(crate) job_timeouts: u64,
    pub(crate) total_connections: u64,
    pub(crate) reserved: u64,
    pub(crate) waiting: u64,
}

impl Stats {
    /// Counts a command under its `cmd-*` key, as beanstalkd does.
    pub(crate) fn count(&mut self, cmd: &Command<'_>) {
        self.count_kind(cmd.kind());
    }

    /// Counts a command kind; beanstalkd counts reserve-job, kick-job and quit under no key.
    pub(crate) fn count_kind(&mut self, kind: CommandKind) {
        use CommandKind as K;
        let i = match kind {
            K::Put => 0,
            K::Peek => 1,
            K::PeekReady => 2,
            K::PeekDelayed => 3,
            K::PeekBuried => 4,
            K::Reserve => 5,
            K::ReserveWithTimeout { .. } => 6,
            K::Delete => 7,
            K::Release => 8,
            K::Use => 9,
            K::Watch => 10,
            K::Ignore => 11,
            K::Bury => 12,
            K::Kick => 13,
            K::Touch => 14,
            K::Stats => 15,
            K::StatsJob => 16,
            K::StatsTube => 17,
            K::ListTubes => 18,
            K::ListTubeUsed => 19,
            K::ListTubesWatched => 20,
            K::PauseTube => 21,
            _ => return,
        };
        self.cmd[i] += 1;
    }
}
