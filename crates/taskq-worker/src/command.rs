//! Running an external command per job: what `taskq-worker` does.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::failure::{self, Failure};
use crate::handler::{Handler, Outcome};
use crate::job::Job;

/// Exit status meaning "try again later" (`EX_TEMPFAIL` from sysexits.h).
pub const EX_TEMPFAIL: i32 = 75;

/// Bodies up to this size are written to the command's standard input
/// directly: they fit in a pipe's buffer (a page at the least, on a system
/// short of pipe pages), so the write cannot block.
const DIRECT_WRITE: usize = 4096;

/// The worker's own credentials, from the `nats` CLI's environment: never
/// passed on to a job's command, which may run what a body tells it to.
/// `NATS_CONTEXT` names a context file that may hold a password or token;
/// `TASKQ_WEB_TOKEN` is `taskq web`'s, found in an environment both share.
const SECRET_ENV: [&str; 8] = [
    "NATS_USER",
    "NATS_PASSWORD",
    "NATS_TOKEN",
    "NATS_NKEY",
    "NATS_CREDS",
    "NATS_KEY",
    "NATS_CONTEXT",
    "TASKQ_WEB_TOKEN",
];

/// When the TTR of a running job is first looked up; most commands end sooner.
const FIRST_LOOK: Duration = Duration::from_millis(200);

/// A handler that runs `program args...` for each job, with the body on its
/// standard input and `TASKQ_JOB_ID`, `TASKQ_ADDR`, `TASKQ_TUBE` and
/// `TASKQ_ATTEMPT` (1 on the first run, counted as `--max-attempts` counts) in
/// its environment, and without the worker's own NATS credentials
/// (`NATS_USER`, `NATS_PASSWORD`, `NATS_TOKEN`, `NATS_NKEY`, `NATS_CREDS`,
/// `NATS_KEY`, `NATS_CONTEXT`).
///
/// Exit status 0 deletes the job; 75 releases it without counting an attempt;
/// anything else (or death by a signal, or the job timeout) is a failed
/// attempt. The command runs in its own process group, so a terminal's Ctrl-C
/// and the worker's first signal do not reach it; a job timeout or a second
/// signal kills the whole group. While it runs, the job is touched at half its
/// TTR so that no other worker gets it.
#[derive(Debug, Clone)]
pub struct CommandHandler {
    program: OsString,
    args: Vec<OsString>,
    job_timeout: Option<Duration>,
}

impl CommandHandler {
    /// A handler for `program args...`, killed after `job_timeout` if given.
    pub fn new(program: OsString, args: Vec<OsString>, job_timeout: Option<Duration>) -> Self {
        CommandHandler {
            program,
            args,
            job_timeout,
        }
    }

    fn spawn(&self, job: &mut Job<'_>) -> std::io::Result<Child> {
        let mut cmd = std::process::Command::new(&self.program);
        for k in SECRET_ENV {
            cmd.env_remove(k);
        }
        cmd.args(&self.args)
            .env("TASKQ_JOB_ID", job.id().to_string())
            .env("TASKQ_ADDR", job.server());
        // 0: the lookup failed (and was logged), which the settle that
        // follows will meet too.
        match job.attempt() {
            0 => {
                cmd.env_remove("TASKQ_TUBE").env_remove("TASKQ_ATTEMPT");
            }
            attempt => {
                cmd.env("TASKQ_TUBE", job.tube())
                    .env("TASKQ_ATTEMPT", attempt.to_string());
            }
        }
        cmd.stdin(Stdio::piped()).process_group(0).spawn()
    }
}

fn failed(f: Failure) -> Outcome {
    failure::note(f);
    Outcome::Fail
}

impl Handler for CommandHandler {
    fn handle(&self, job: &mut Job<'_>) -> Outcome {
        failure::clear();
        let mut child = match self.spawn(job) {
            Ok(c) => c,
            Err(e) => {
                // Not the job's failure (the program replaced mid-deploy,
                // out of processes or descriptors): it goes back with the
                // backoff and no attempt counted, never buried unrun.
                tracing::error!(job = job.id().get(), error = %e, "cannot run the command");
                return Outcome::TempFail;
            }
        };
        if let Some(mut stdin) = child.stdin.take() {
            let body = job.body();
            if body.len() <= DIRECT_WRITE {
                // A command that exits without reading gives EPIPE: not our failure.
                let _ = stdin.write_all(body);
            } else {
                // On a thread of its own, not waited for: a command that
                // left a child holding its standard input unread must not
                // hold this job's end (the thread ends when that pipe does).
                let body = body.to_vec();
                let spawned = std::thread::Builder::new()
                    .name("taskq-job-stdin".into())
                    .spawn(move || {
                        let _ = stdin.write_all(&body);
                    });
                if let Err(e) = spawned {
                    tracing::error!(job = job.id().get(), error = %e, "cannot feed the command");
                }
            }
        }
        let status = self.supervise(&mut child, job);
        match status {
            Ended::Exit(0) => Outcome::Done,
            Ended::Exit(EX_TEMPFAIL) => Outcome::TempFail,
            Ended::Exit(code) => {
                tracing::info!(job = job.id().get(), code, "command failed");
                failed(Failure::Exit(code))
            }
            Ended::Signal(sig) => {
                tracing::info!(
                    job = job.id().get(),
                    signal = sig,
                    "command killed by a signal"
                );
                failed(Failure::Signal(sig))
            }
            Ended::TimedOut => {
                tracing::warn!(
                    job = job.id().get(),
                    "command ran past --job-timeout; killed"
                );
                failed(Failure::TimedOut)
            }
            Ended::Aborted => Outcome::Retry {
                delay: Duration::ZERO,
            },
            Ended::Lost => failed(Failure::Lost),
        }
    }
}

enum Ended {
    Exit(i32),
    Signal(i32),
    TimedOut,
    Aborted,
    Lost,
}

impl CommandHandler {
    /// Waits for the command, touching the job in time and killing the command
    /// on timeout or abort.
    fn supervise(&self, child: &mut Child, job: &mut Job<'_>) -> Ended {
        let started = Instant::now();
        let mut next_touch = started + FIRST_LOOK;
        let mut touch_every: Option<Duration> = None;
        let mut nap = Duration::from_millis(1);
        loop {
            match child.try_wait() {
                Ok(Some(st)) => {
                    return match (st.code(), st.signal()) {
                        (Some(c), _) => Ended::Exit(c),
                        (None, Some(s)) => Ended::Signal(s),
                        _ => Ended::Lost,
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(job = job.id().get(), error = %e, "cannot wait for the command");
                    kill_group(child);
                    return Ended::Lost;
                }
            }
            let now = Instant::now();
            if self.job_timeout.is_some_and(|t| now - started >= t) {
                kill_group(child);
                return Ended::TimedOut;
            }
            if job.aborting() {
                kill_group(child);
                return Ended::Aborted;
            }
            if now >= next_touch {
                let every = match touch_every {
                    Some(d) => {
                        if let Err(e) = job.touch() {
                            tracing::warn!(job = job.id().get(), error = %e, "touch failed");
                        }
                        d
                    }
                    None => match job.stats() {
                        // Half the TTR leaves the other half for the touch to arrive.
                        Ok(info) => {
                            let d = Duration::from_millis(info.ttr.max(1) * 500);
                            // The first look may come late for a one-second TTR: touch now.
                            if info.time_left <= 1 {
                                let _ = job.touch();
                            }
                            touch_every = Some(d);
                            d
                        }
                        Err(e) => {
                            tracing::warn!(job = job.id().get(), error = %e, "stats-job failed");
                            Duration::from_secs(3600)
                        }
                    },
                };
                next_touch = Instant::now() + every;
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(20));
        }
    }
}

/// Kills the command's whole process group (its own: the command leads it,
/// and is not reaped yet), then reaps the command.
fn kill_group(child: &mut Child) {
    let group = i32::try_from(child.id())
        .ok()
        .and_then(rustix::process::Pid::from_raw);
    let killed = group.is_some_and(|g| {
        rustix::process::kill_process_group(g, rustix::process::Signal::KILL).is_ok()
    });
    if !killed {
        let _ = child.kill();
    }
    let _ = child.wait();
}

/// Finds `program` as the shell would: a path with a `/` as is, otherwise the
/// first executable file of that name in `$PATH`.
pub fn resolve_program(program: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.as_os_str().is_empty() {
        return None;
    }
    if program.to_string_lossy().contains('/') {
        return runnable(program).then(|| program.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| runnable(p))
}
