//! The operators' commands against a real beanstalkd: buried jobs made by a
//! worker whose command fails, listed, peeked, kicked and then done; jobs
//! deleted and kicked by id; a pause observed by a reserve.

mod cli_common;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

use cli_common::{bin_dir, bounded, ids, ok, taskq};
use taskq_proto::{Command as Cmd, Connection, ConnectionConfig, Reply};
use taskq_testkit::Beanstalkd;

/// `taskq tubes --json`, parsed: the object of tube `name`, if listed.
fn find_tube(addr: &str, name: &str) -> Option<serde_json::Value> {
    let all: serde_json::Value =
        serde_json::from_str(&ok(&["tubes", "--addr", addr, "--json"], b"")).unwrap();
    let found = all
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name)?
        .clone();
    for key in [
        "ready", "urgent", "reserved", "delayed", "buried", "waiting", "paused",
    ] {
        assert!(found[key].is_u64(), "{key} in {found}");
    }
    Some(found)
}

/// The object of tube `name`, which must be listed.
fn tube(addr: &str, name: &str) -> serde_json::Value {
    find_tube(addr, name).unwrap_or_else(|| panic!("no tube {name} listed"))
}

/// Runs `taskq-worker ARGS` to its end (killed past 60 s); returns its stderr.
fn worker(addr: &str, args: &[&str]) -> String {
    let mut cmd = Command::new(bin_dir().join("taskq-worker"));
    cmd.args(["--addr", addr])
        .args(args)
        .env("NO_COLOR", "1")
        .env_remove("RUST_LOG");
    let (out, _) = bounded(cmd, b"", Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    err
}

/// Fails with exit 1 and one line on stderr containing `want`.
fn fails(args: &[&str], want: &str) {
    let (out, _) = taskq(args, b"", Duration::from_secs(20));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    assert!(err.starts_with("taskq: "), "{args:?}: {err}");
    assert!(err.contains(want), "{args:?}: {err}");
}

#[test]
fn buried_jobs_are_listed_peeked_kicked_and_then_done() {
    let server = Beanstalkd::start().unwrap();
    let addr = server.addr().to_string();
    let put = ok(
        &[
            "put",
            "--addr",
            &addr,
            "--tube",
            "work",
            "one",
            "two\n\x1b[31m",
            "three",
        ],
        b"",
    );
    let jobs = ids(&put);
    let dir = std::env::temp_dir().join(format!("taskq-admin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let env_file = dir.join("env");
    let script = format!(
        "echo \"$TASKQ_JOB_ID $TASKQ_TUBE $TASKQ_ATTEMPT\" >> {}; exit 3",
        env_file.display()
    );
    let log = worker(
        &addr,
        &[
            "--tube",
            "work",
            "--max-attempts",
            "2",
            "--exit-when-idle",
            "3",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    // The command saw its tube and attempt number: 1, then 2, for each job.
    let seen: BTreeSet<String> = std::fs::read_to_string(&env_file)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    let want: BTreeSet<String> = jobs
        .iter()
        .flat_map(|id| [format!("{id} work 1"), format!("{id} work 2")])
        .collect();
    assert_eq!(seen, want);
    // One warn line per buried job: its id, "buried", the attempts, the exit status.
    for id in &jobs {
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("WARN") && l.contains(&format!("job={id} ")))
            .collect();
        assert_eq!(lines.len(), 1, "{log}");
        assert!(lines[0].contains("buried"), "{}", lines[0]);
        assert!(lines[0].contains("attempts=2"), "{}", lines[0]);
        assert!(lines[0].contains("status=exit status 3"), "{}", lines[0]);
    }

    let t = tube(&addr, "work");
    assert_eq!(
        (t["buried"].as_u64(), t["ready"].as_u64()),
        (Some(3), Some(0))
    );

    // peek: the oldest buried job, its stats, its body escaped; --raw: the bytes.
    let shown = ok(
        &["peek", "--addr", &addr, "--tube", "work", "--buried"],
        b"",
    );
    let field = |k: &str| {
        shown
            .lines()
            .find_map(|l| l.strip_prefix(k).filter(|r| r.starts_with(' ')))
            .unwrap_or_else(|| panic!("no {k} in {shown}"))
            .trim()
            .to_string()
    };
    assert_eq!(field("id"), jobs[0].to_string());
    assert_eq!(field("state"), "buried");
    assert_eq!(field("buries"), "1");
    assert_eq!(field("releases"), "1");
    assert_eq!(field("body"), "\"one\"");
    ok(&["kick-job", "--addr", &addr, &jobs[0].to_string()], b"");
    ok(&["delete", "--addr", &addr, &jobs[0].to_string()], b"");
    let shown = ok(
        &["peek", "--addr", &addr, "--tube", "work", "--buried"],
        b"",
    );
    assert!(shown.contains("body      \"two\\n\\u{1b}[31m\""), "{shown}");
    assert!(
        !shown.contains('\x1b'),
        "no escape code reaches the terminal"
    );
    let raw = ok(
        &[
            "peek", "--addr", &addr, "--tube", "work", "--buried", "--raw",
        ],
        b"",
    );
    assert_eq!(raw, "two\n\x1b[31m");
    fails(
        &["peek", "--addr", &addr, "--tube", "work", "--ready"],
        "no ready job in tube work",
    );

    // kick: one, then the rest; then nothing is left to kick.
    assert_eq!(
        ok(
            &["kick", "--addr", &addr, "--tube", "work", "--count", "1"],
            b""
        ),
        "kicked 1\n"
    );
    let t = tube(&addr, "work");
    assert_eq!(
        (t["buried"].as_u64(), t["ready"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(
        ok(&["kick", "--addr", &addr, "--tube", "work"], b""),
        "kicked 1\n"
    );
    fails(
        &["kick", "--addr", &addr, "--tube", "work"],
        "no buried or delayed job to kick in tube work",
    );

    // Done: a worker whose command succeeds deletes both.
    worker(
        &addr,
        &["--tube", "work", "--exit-when-idle", "1", "--", "true"],
    );
    // beanstalkd drops a tube once it holds no job and nobody uses or watches it.
    assert_eq!(find_tube(&addr, "work"), None);
    assert!(cli_common::drain(server.addr(), "work").is_empty());
}

#[test]
fn kick_job_and_delete_by_id_and_say_which_ids_failed() {
    let server = Beanstalkd::start().unwrap();
    let addr = server.addr().to_string();
    let delayed = ids(&ok(
        &[
            "put", "--addr", &addr, "--tube", "d", "--delay", "3600", "a", "b",
        ],
        b"",
    ));
    let t = tube(&addr, "d");
    assert_eq!(
        (t["delayed"].as_u64(), t["ready"].as_u64()),
        (Some(2), Some(0))
    );
    let (a, b) = (delayed[0].to_string(), delayed[1].to_string());
    assert_eq!(
        ok(&["kick-job", "--addr", &addr, &a], b""),
        format!("kicked {a}\n")
    );
    let t = tube(&addr, "d");
    assert_eq!(
        (t["delayed"].as_u64(), t["ready"].as_u64()),
        (Some(1), Some(1))
    );
    // A ready job cannot be kicked: the good id is kicked, the bad one reported.
    let (out, _) = taskq(
        &["kick-job", "--addr", &addr, &a, &b],
        b"",
        Duration::from_secs(20),
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("kicked {b}\n")
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "job {a}: not found, or neither buried nor delayed"
        )),
        "{err}"
    );

    assert_eq!(
        ok(&["delete", "--addr", &addr, &a, &b], b""),
        format!("deleted {a}\ndeleted {b}\n")
    );
    assert_eq!(find_tube(&addr, "d"), None, "an empty tube is dropped");
    fails(
        &["delete", "--addr", &addr, &a],
        &format!("job {a}: not found"),
    );
    let (out, _) = taskq(
        &["delete", "--addr", &addr, "x1"],
        b"",
        Duration::from_secs(20),
    );
    assert_eq!(out.status.code(), Some(2), "a bad id is a usage error");
    fails(&["tubes", "--addr", "127.0.0.1:1"], "127.0.0.1:1");
}

#[test]
fn a_paused_tube_hands_out_no_job_until_the_pause_ends() {
    let server = Beanstalkd::start().unwrap();
    let addr = server.addr().to_string();
    ok(&["put", "--addr", &addr, "--tube", "p", "job"], b"");
    assert_eq!(
        ok(&["pause", "--addr", &addr, "--tube", "p", "30"], b""),
        "paused p for 30 s\n"
    );
    let left = tube(&addr, "p")["paused"].as_u64().unwrap();
    assert!((28..=30).contains(&left), "pause left {left}");

    let mut c = Connection::connect(server.addr(), ConnectionConfig::default()).unwrap();
    c.request(&Cmd::Watch { tube: "p" }).unwrap();
    let t = Instant::now();
    assert_eq!(
        c.request(&Cmd::ReserveWithTimeout { timeout: 1 }).unwrap(),
        Reply::TimedOut,
        "a paused tube hands out nothing"
    );
    assert!(t.elapsed() >= Duration::from_millis(900));
    ok(&["pause", "--addr", &addr, "--tube", "p", "0"], b"");
    // A zero pause ends at the server's next tick.
    let got = c.request(&Cmd::ReserveWithTimeout { timeout: 2 }).unwrap();
    assert!(
        matches!(got, Reply::Reserved { body: b"job", .. }),
        "{got:?}"
    );
    assert_eq!(tube(&addr, "p")["paused"], 0);
    fails(
        &["pause", "--addr", &addr, "--tube", "nosuch", "5"],
        "no tube named nosuch",
    );
}

/// The connection closes after the replies to two deletes (by byte count,
/// through the chaos proxy): the command fails on the third, and still
/// prints the two it did, which the server's record shows gone.
#[test]
fn a_delete_cut_off_mid_way_still_names_the_jobs_it_deleted() {
    use taskq_testkit::{ChaosProxy, Direction, Toxic};
    let server = Beanstalkd::start().unwrap();
    let addr = server.addr().to_string();
    let jobs = ids(&ok(
        &["put", "--addr", &addr, "--tube", "t", "a", "b", "c"],
        b"",
    ));
    let proxy = ChaosProxy::start(server.addr()).unwrap();
    // Two `DELETED\r\n` replies, 9 bytes each, then the connection closes.
    proxy.add(Toxic::LimitData { bytes: 18 }, Direction::Downstream, 1.0);
    let paddr = proxy.addr().to_string();
    let names: Vec<String> = jobs.iter().map(u64::to_string).collect();
    let mut args = vec!["delete", "--addr", &paddr];
    args.extend(names.iter().map(String::as_str));
    let (out, _) = taskq(&args, b"", Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("deleted {}\ndeleted {}\n", jobs[0], jobs[1])
    );
    proxy.clear();
    let mut c = Connection::connect(server.addr(), ConnectionConfig::default()).unwrap();
    for id in &jobs[..2] {
        let r = c.request(&Cmd::StatsJob { id: *id }).unwrap();
        assert_eq!(r, Reply::NotFound, "job {id} deleted");
    }
}
