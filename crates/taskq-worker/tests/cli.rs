//! The `taskq-worker` binary against a real beanstalkd: exit statuses, flags,
//! touching, job timeout, signals in each phase, kill -9, and idling.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use taskq_testkit::Beanstalkd;

const BIN: &str = env!("CARGO_BIN_EXE_taskq-worker");

#[test]
fn bad_flag_and_missing_command_give_one_line_and_fail() {
    for args in [
        vec!["--no-such-flag", "--", "true"],
        vec!["--concurrency", "0", "--", "true"],
        vec!["--tube", "-bad", "--", "true"],
        vec!["--", "/no/such/program"],
        vec!["--", "no-such-program-taskq"],
    ] {
        let out = output_bounded(Command::new(BIN).args(&args), Duration::from_secs(10));
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        let first = err.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
        assert!(
            first.starts_with("error:") || first.starts_with("taskq-worker:"),
            "{args:?}: {err}"
        );
    }
    let out = output_bounded(
        Command::new(BIN).args(["--", "/no/such/program"]),
        Duration::from_secs(10),
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).lines().count(),
        1,
        "one line"
    );
}

#[test]
fn exit_statuses_decide_delete_release_and_bury() {
    let server = Beanstalkd::start().unwrap();
    let dir = TempDir::new("status");
    let bodies = [b"ok".to_vec(), b"temp".to_vec(), b"fail".to_vec()];
    let ids = put_all(server.addr(), "default", 60, &bodies);
    // "temp" exits 75 the first time; "fail" always exits 3. Each run logs its body.
    let script = format!(
        r#"b=$(cat); echo "$b $TASKQ_JOB_ID $TASKQ_ADDR" >> {d}/runs
case "$b" in
  ok) exit 0;;
  temp) if [ -e {d}/temp ]; then exit 0; fi; touch {d}/temp; exit 75;;
  *) exit 3;;
esac"#,
        d = dir.0.display()
    );
    let addr = server.addr().to_string();
    let mut w = WorkerProc::start(
        &[
            "--addr",
            &addr,
            "--max-attempts",
            "2",
            "--exit-when-idle",
            "2.5",
            "--json",
        ],
        &script,
    );
    let st = w.wait(Duration::from_secs(20));
    let err = w.stderr();
    assert!(st.success(), "{st}: {err}");
    let c = w.counters();
    for k in [
        "reserved",
        "deleted",
        "released",
        "buried",
        "lost_lease",
        "ack_unknown",
        "reconnects",
        "io_timeouts",
    ] {
        get(&c, k);
    }
    assert_eq!(get(&c, "deleted"), 2);
    assert_eq!(get(&c, "buried"), 1);
    assert_eq!(get(&c, "released"), 2, "temp once, fail once");
    assert!(
        err.trim_end().lines().last().unwrap().starts_with('{'),
        "--json summary: {err}"
    );
    let runs = lines(&dir.0.join("runs"));
    assert_eq!(
        runs.iter().filter(|l| l.starts_with("fail ")).count(),
        2,
        "{runs:?}"
    );
    assert!(runs.contains(&format!("ok {} {addr}", ids[0])), "{runs:?}");
    assert_eq!(job_state(server.addr(), ids[2]).unwrap().0, "buried");
    assert!(job_state(server.addr(), ids[1]).is_none());
}

#[test]
fn body_is_byte_exact_on_stdin() {
    let server = Beanstalkd::start_with(&["-z", "300000"]).unwrap();
    let dir = TempDir::new("body");
    let mut big = Vec::new();
    for i in 0..200_000u32 {
        big.push((i % 251) as u8);
    }
    let bodies = [b"a\r\nb\0c\r\n".to_vec(), Vec::new(), big];
    let ids = put_all(server.addr(), "default", 60, &bodies);
    let script = format!("cat > {}/$TASKQ_JOB_ID", dir.0.display());
    let addr = server.addr().to_string();
    let mut w = WorkerProc::start(&["--addr", &addr, "--max-jobs", "3"], &script);
    assert!(w.wait(Duration::from_secs(20)).success());
    for (id, body) in ids.iter().zip(&bodies) {
        assert_eq!(&std::fs::read(dir.0.join(id.to_string())).unwrap(), body);
    }
}

#[test]
fn long_job_is_touched_and_never_held_twice() {
    let server = Beanstalkd::start().unwrap();
    let dir = TempDir::new("touch");
    let ids = put_all(server.addr(), "default", 1, &[b"slow".to_vec()]);
    let script = format!("echo $$ >> {}/runs; sleep 3", dir.0.display());
    let addr = server.addr().to_string();
    let mut w = WorkerProc::start(
        &["--addr", &addr, "--concurrency", "3", "--max-jobs", "1"],
        &script,
    );
    assert!(w.wait(Duration::from_secs(15)).success());
    assert_eq!(lines(&dir.0.join("runs")).len(), 1, "run once");
    assert!(get(&w.counters(), "touched") >= 4);
    assert_eq!(record(server.addr()).job_timeouts, 0);
    assert!(job_state(server.addr(), ids[0]).is_none());
}

#[test]
fn job_timeout_kills_the_whole_group_and_counts_a_failure() {
    job_timeout_kills_the_group(&TempDir::new("jobtimeout"), &[]);
}

/// Runs a job whose command leaves a grandchild and outlasts the job
/// timeout, with `env` for the worker: the job is a failure (buried, with
/// one attempt) and the whole group is killed, the grandchild too.
fn job_timeout_kills_the_group(dir: &TempDir, env: &[(&str, &str)]) {
    let server = Beanstalkd::start().unwrap();
    let ids = put_all(server.addr(), "default", 60, &[b"hang".to_vec()]);
    // The grandchild would outlive a kill of the shell alone.
    let script = format!(
        "echo $$ > {d}/pgid; sleep 30 & echo $! > {d}/grandchild; wait",
        d = dir.0.display()
    );
    let addr = server.addr().to_string();
    let args = [
        "--addr",
        &addr,
        "--job-timeout",
        "0.5",
        "--max-attempts",
        "1",
        "--exit-when-idle",
        "1",
    ];
    let mut w = WorkerProc::start_program(&args, &["sh", "-c", &script], env);
    w.kill_groups_on_drop(dir.0.join("pgid"));
    let t = Instant::now();
    assert!(w.wait(Duration::from_secs(10)).success());
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_eq!(get(&w.counters(), "buried"), 1);
    assert_eq!(job_state(server.addr(), ids[0]).unwrap().0, "buried");
    let gc = lines(&dir.0.join("grandchild"))[0].clone();
    assert!(
        wait_until(Duration::from_secs(2), || !std::path::Path::new(&format!(
            "/proc/{gc}"
        ))
        .exists()
            || std::fs::read_to_string(format!("/proc/{gc}/stat"))
                .is_ok_and(|s| s.contains(") Z"))),
        "grandchild {gc} survived"
    );
}

#[test]
fn sigterm_while_waiting_exits_at_once() {
    let server = Beanstalkd::start().unwrap();
    let addr = server.addr().to_string();
    for sig in ["TERM", "INT"] {
        let mut w = WorkerProc::start(
            &[
                "--addr",
                &addr,
                "--concurrency",
                "2",
                "--reserve-timeout",
                "5",
            ],
            "exit 0",
        );
        let start = record(server.addr()).cmd_reserve_with_timeout;
        assert!(wait_until(Duration::from_secs(5), || {
            record(server.addr()).cmd_reserve_with_timeout >= start + 2
        }));
        let t = Instant::now();
        w.signal(sig);
        let st = w.wait(Duration::from_secs(5));
        assert!(st.success(), "{sig}: {st}");
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "{sig}: {:?}",
            t.elapsed()
        );
        assert_eq!(get(&w.counters(), "reserved"), 0);
        let before = record(server.addr()).cmd_reserve_with_timeout;
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(record(server.addr()).cmd_reserve_with_timeout, before);
    }
}

#[test]
fn sigterm_while_running_finishes_and_deletes_the_job() {
    let server = Beanstalkd::start().unwrap();
    let dir = TempDir::new("term");
    let addr = server.addr().to_string();
    for sig in ["TERM", "INT"] {
        let ids = put_all(server.addr(), "default", 60, &[sig.as_bytes().to_vec()]);
        let mark = dir.0.join(sig);
        // The command must not see the signal: it would die before writing the mark.
        let script = format!("sleep 1.5; echo done > {}", mark.display());
        let mut w = WorkerProc::start(&["--addr", &addr, "--concurrency", "2"], &script);
        assert!(wait_until(Duration::from_secs(5), || {
            job_state(server.addr(), ids[0]).is_some_and(|s| s.0 == "reserved")
        }));
        let t = Instant::now();
        w.signal(sig);
        let st = w.wait(Duration::from_secs(10));
        assert!(st.success(), "{sig}: {st}");
        assert!(
            t.elapsed() < Duration::from_millis(2500),
            "{sig}: {:?}",
            t.elapsed()
        );
        assert!(mark.exists(), "{sig}: the command ran to its end");
        assert!(job_state(server.addr(), ids[0]).is_none(), "{sig}: deleted");
        let c = w.counters();
        assert_eq!((get(&c, "reserved"), get(&c, "deleted")), (1, 1));
    }
}

#[test]
fn second_signal_releases_the_running_job_at_once() {
    let server = Beanstalkd::start().unwrap();
    let ids = put_all(server.addr(), "default", 60, &[b"long".to_vec()]);
    let addr = server.addr().to_string();
    let dir = TempDir::new("second");
    let pgid = dir.0.join("pgid");
    let mut w = WorkerProc::start(
        &["--addr", &addr],
        &format!("echo $$ > {}; sleep 30", pgid.display()),
    );
    w.kill_groups_on_drop(&pgid);
    assert!(wait_until(Duration::from_secs(5), || {
        job_state(server.addr(), ids[0]).is_some_and(|s| s.0 == "reserved")
    }));
    let t = Instant::now();
    w.signal("TERM");
    std::thread::sleep(Duration::from_millis(200));
    w.signal("TERM");
    let st = w.wait(Duration::from_secs(5));
    assert!(st.success(), "{st}");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    let s = job_state(server.addr(), ids[0]).unwrap();
    assert_eq!((s.0.as_str(), s.3), ("ready", 1), "released without delay");
    assert_eq!(get(&w.counters(), "released"), 1);
}

#[test]
fn kill_9_mid_job_the_job_comes_back_to_another_worker() {
    let server = Beanstalkd::start().unwrap();
    let dir = TempDir::new("kill9");
    let ids = put_all(server.addr(), "default", 60, &[b"precious".to_vec()]);
    let addr = server.addr().to_string();
    // The first run records its process group and hangs; a later run finishes.
    let script = format!(
        r#"if [ ! -e {d}/first ]; then echo $$ > {d}/first; sleep 30; exit 1; fi
cat > {d}/done"#,
        d = dir.0.display()
    );
    let mut a = WorkerProc::start(&["--addr", &addr], &script);
    a.kill_groups_on_drop(dir.0.join("first"));
    assert!(wait_until(Duration::from_secs(5), || dir
        .0
        .join("first")
        .exists()));
    let mut b = WorkerProc::start(&["--addr", &addr, "--max-jobs", "1"], &script);
    std::thread::sleep(Duration::from_millis(300));
    a.signal("KILL");
    let _ = a.wait(Duration::from_secs(5));
    let st = b.wait(Duration::from_secs(10));
    // The orphaned first command runs in its own group: end it.
    let pgid = lines(&dir.0.join("first"))[0].clone();
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .status();
    assert!(st.success());
    assert_eq!(std::fs::read(dir.0.join("done")).unwrap(), b"precious");
    assert!(job_state(server.addr(), ids[0]).is_none(), "lost 0");
    assert_eq!(get(&b.counters(), "deleted"), 1);
}

#[test]
fn idle_ten_seconds_few_requests_near_zero_cpu() {
    let server = Beanstalkd::start().unwrap();
    let addr = server.addr().to_string();
    let mut w = WorkerProc::start(
        &[
            "--addr",
            &addr,
            "--concurrency",
            "2",
            "--reserve-timeout",
            "1",
        ],
        "exit 0",
    );
    assert!(wait_until(Duration::from_secs(5), || record(server.addr())
        .cmd_reserve_with_timeout
        >= 1));
    let before = record(server.addr()).cmd_reserve_with_timeout;
    let cpu0 = proc_cpu_ticks(w.pid());
    std::thread::sleep(Duration::from_secs(10));
    let reserves = record(server.addr()).cmd_reserve_with_timeout - before;
    let cpu = proc_cpu_ticks(w.pid()) - cpu0;
    w.signal("TERM");
    assert!(w.wait(Duration::from_secs(5)).success());
    eprintln!("idle 10 s, 2 handler threads: {reserves} reserves, {cpu} CPU ticks");
    // The two handlers share one connection: one blocking reserve a second
    // on it, and one more in flight at each end.
    assert!(reserves <= 10 + 1, "{reserves} reserves in 10 s");
    assert!(reserves >= 8, "it kept reserving: {reserves}");
    assert!(cpu <= 10, "{cpu} ticks of CPU in 10 s idle");
}

#[test]
fn addr_defaults_to_taskq_addr() {
    let server = Beanstalkd::start().unwrap();
    let dir = TempDir::new("env");
    let ids = put_all(server.addr(), "default", 60, &[b"e".to_vec()]);
    let addr = server.addr().to_string();
    let script = format!("echo $TASKQ_ADDR > {}/addr", dir.0.display());
    // No --addr: the worker must find the server in $TASKQ_ADDR.
    let mut w = WorkerProc::start_program(
        &["--max-jobs", "1"],
        &["sh", "-c", &script],
        &[("TASKQ_ADDR", &addr)],
    );
    let st = w.wait(Duration::from_secs(20));
    let err = w.stderr();
    assert!(st.success(), "{st}: {err}");
    assert_eq!(lines(&dir.0.join("addr")), [addr]);
    assert!(err.contains("done 1"), "{err}");
    // Done on that server: the job is gone from it.
    assert!(job_state(server.addr(), ids[0]).is_none(), "not deleted");
    assert_eq!(get(&w.counters(), "deleted"), 1);
}

/// utime + stime of a process, in clock ticks.
fn proc_cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// `$TASKQ_ADDR` with a comma in its password is one address, refused
/// whole: no piece of the user or password is shown as an address of its
/// own (cut at the comma, `nats://alicex:Zq9` would be named in a port error).
#[test]
fn a_taskq_addr_whose_password_has_a_comma_is_refused_without_showing_it() {
    for addr in [
        "nats://alicex:Zq9,Xw7@127.0.0.1:4222",
        "127.0.0.1:11300,nats://alicex:Zq9,Xw7@127.0.0.1:4222",
    ] {
        let mut w =
            WorkerProc::start_program(&["--max-jobs", "1"], &["true"], &[("TASKQ_ADDR", addr)]);
        let st = w.wait(Duration::from_secs(20));
        let err = w.stderr();
        assert!(!st.success(), "{addr}: {err}");
        assert!(err.contains("taskq-worker"), "{err}");
        for piece in ["alicex", "Zq9", "Xw7"] {
            assert!(!err.contains(piece), "{addr}: {err}");
        }
    }
}

/// The worker's own NATS credentials, given in its environment as the
/// `nats` CLI reads them (and `taskq web`'s token), are not passed on to a
/// job's command (which may run what a body tells it to); the job's own
/// variables are.
#[test]
fn a_jobs_command_is_not_given_the_workers_nats_credentials() {
    let server = Beanstalkd::start().unwrap();
    let dir = TempDir::new("env");
    put_all(server.addr(), "default", 60, &[b"x".to_vec()]);
    let addr = server.addr().to_string();
    let script = format!("env > {}/env", dir.0.display());
    let contexts = dir.0.join("config/nats/context");
    std::fs::create_dir_all(&contexts).unwrap();
    std::fs::write(contexts.join("ctx-SECRET-7.json"), "{}").unwrap();
    let config = dir.0.join("config").display().to_string();
    let secrets = [
        ("NATS_USER", "user-SECRET-1"),
        ("NATS_PASSWORD", "pw-SECRET-2"),
        ("NATS_TOKEN", "tok-SECRET-3"),
        ("NATS_NKEY", "/keys/SECRET-4.nk"),
        ("NATS_CREDS", "/keys/SECRET-5.creds"),
        ("NATS_KEY", "/keys/SECRET-6.pem"),
        // A context (here one with nothing in it) may hold a password.
        ("NATS_CONTEXT", "ctx-SECRET-7"),
        // `taskq web`'s token, in an environment both were started from.
        ("TASKQ_WEB_TOKEN", "web-SECRET-8"),
        ("XDG_CONFIG_HOME", &config),
    ];
    let mut w = WorkerProc::start_program(
        &["--addr", &addr, "--max-jobs", "1"],
        &["sh", "-c", &script],
        &secrets,
    );
    assert!(w.wait(Duration::from_secs(20)).success());
    let env = std::fs::read_to_string(dir.0.join("env")).unwrap();
    assert!(!env.contains("SECRET"), "{env}");
    assert!(env.contains("TASKQ_JOB_ID="), "{env}");
}

/// A command that exits at once, leaving a child that holds its standard
/// input and never reads it, with a body larger than a pipe holds: the job
/// ends with the command (deleted, touched by no one after), and the worker
/// goes on to exit, whatever the child does.
#[test]
fn a_child_left_holding_the_commands_stdin_does_not_hold_the_worker() {
    let server = Beanstalkd::start_with(&["-z", "300000"]).unwrap();
    let dir = TempDir::new("stdin");
    let ids = put_all(server.addr(), "default", 60, &[vec![b'x'; 200_000]]);
    let gc = dir.0.join("gc");
    let pgid = dir.0.join("pgid");
    let script = format!(
        "echo $$ > {}; exec 3<&0; sleep 30 0<&3 3<&- & echo $! > {}; exit 0",
        pgid.display(),
        gc.display()
    );
    let addr = server.addr().to_string();
    let mut w = WorkerProc::start(&["--addr", &addr, "--max-jobs", "1"], &script);
    w.kill_groups_on_drop(&pgid);
    let ended = w.wait(Duration::from_secs(10));
    if let Some(pid) = lines(&gc).first() {
        let _ = Command::new("kill").args(["-KILL", pid]).status();
    }
    assert!(ended.success());
    assert!(job_state(server.addr(), ids[0]).is_none(), "deleted");
    assert_eq!(get(&w.counters(), "deleted"), 1);
}

/// A command that cannot be started (here it lost its execute bit after the
/// worker started) is no failed attempt of the job's: the job goes back with
/// the backoff, never buried unrun, even with `--max-attempts 1`.
#[test]
fn a_command_that_cannot_start_gives_the_job_back_never_buries_it() {
    use std::os::unix::fs::PermissionsExt;
    let server = Beanstalkd::start().unwrap();
    let dir = TempDir::new("nostart");
    let prog = dir.0.join("job.sh");
    std::fs::write(&prog, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
    let addr = server.addr().to_string();
    let prog_s = prog.display().to_string();
    let before = record(server.addr()).cmd_reserve_with_timeout;
    let mut w =
        WorkerProc::start_program(&["--addr", &addr, "--max-attempts", "1"], &[&prog_s], &[]);
    // Started (the program was checked then, before the first reserve);
    // now it cannot run.
    assert!(
        wait_until(Duration::from_secs(10), || {
            record(server.addr()).cmd_reserve_with_timeout > before
        }),
        "the worker never reserved"
    );
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o644)).unwrap();
    let ids = put_all(server.addr(), "default", 60, &[b"x".to_vec()]);
    // Released (not buried) by the server's own count.
    assert!(wait_until(Duration::from_secs(10), || job_state(
        server.addr(),
        ids[0]
    )
    .is_some_and(|(_, _, _, releases)| releases >= 1)));
    w.signal("TERM");
    assert!(w.wait(Duration::from_secs(10)).success());
    let (state, ..) = job_state(server.addr(), ids[0]).expect("still there");
    assert!(state == "ready" || state == "delayed", "{state}");
    assert_eq!(get(&w.counters(), "buried"), 0);
}

/// The job timeout kills the command's whole group with no `kill` program
/// to run: `PATH` here holds only `sh` and `sleep`.
#[test]
fn job_timeout_kills_the_whole_group_without_a_kill_program() {
    let dir = TempDir::new("nokill");
    let bin = dir.0.join("bin");
    std::fs::create_dir(&bin).unwrap();
    for p in ["sh", "sleep"] {
        let found = ["/bin", "/usr/bin"]
            .iter()
            .map(|d| std::path::Path::new(d).join(p))
            .find(|f| f.exists())
            .unwrap();
        std::os::unix::fs::symlink(found, bin.join(p)).unwrap();
    }
    let path = bin.display().to_string();
    job_timeout_kills_the_group(&dir, &[("PATH", &path)]);
}
