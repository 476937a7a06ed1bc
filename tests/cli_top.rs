//! `taskq top` against a real beanstalkd: `--once` parsed and checked against
//! `stats-tube`; the live view in a real terminal (a detached tmux session of
//! fixed size) checked against `stats-tube`, seen to follow new jobs, and quit
//! with q, Ctrl-C and SIGTERM, each time with the terminal seen restored;
//! and both on a 3-node JetStream cluster, checked against the stream's and
//! the consumers' own record.

mod cli_common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cli_common::{count_on, pull_one, taskq, with_tube_stats};
use taskq_connect::nats::{NatsConfig, NatsConnection};
use taskq_proto::nats::AckKind;
use taskq_proto::{Command as Cmd, Connection, ConnectionConfig, Reply, ServerStats};
use taskq_testkit::{Beanstalkd, NatsCluster};
use taskq_worker::{Config, Job, Outcome, Worker};

const HEADER: [&str; 10] = [
    "TUBE",
    "READY",
    "RESERVED",
    "DELAYED",
    "BURIED",
    "PUT/S",
    "DELETE/S",
    "READY-AGE",
    "PUT-TREND",
    "DELETE-TREND",
];

fn connect(addr: &str) -> Connection {
    Connection::connect(addr, ConnectionConfig::default()).unwrap()
}

/// `stats-tube`: ready, reserved, delayed, buried.
fn counts(addr: &str, tube: &str) -> [u64; 4] {
    with_tube_stats(addr, tube, |s| {
        [
            s.current_jobs_ready,
            s.current_jobs_reserved,
            s.current_jobs_delayed,
            s.current_jobs_buried,
        ]
    })
}

fn tube_names(addr: &str) -> Vec<String> {
    let mut c = connect(addr);
    match c.request(&Cmd::ListTubes).unwrap() {
        Reply::Ok { yaml } => taskq_proto::yaml::items(yaml)
            .unwrap()
            .map(|i| i.unwrap().to_owned())
            .collect(),
        r => panic!("list-tubes: {r:?}"),
    }
}

/// The tubes' table of a frame: tube name to its cells (the name left out).
/// Panics unless the heading is exactly [`HEADER`].
fn tube_table(frame: &str) -> BTreeMap<String, Vec<String>> {
    table_under(frame, &HEADER)
}

/// The table under the heading `header` in a frame: first cell to the others.
fn table_under(frame: &str, header: &[&str]) -> BTreeMap<String, Vec<String>> {
    let mut lines = frame.lines().skip_while(|l| !l.starts_with("TUBE "));
    let seen: Vec<&str> = lines
        .next()
        .unwrap_or_else(|| panic!("no heading in:\n{frame}"))
        .split_whitespace()
        .collect();
    assert_eq!(seen, header, "{frame}");
    lines
        .take_while(|l| !l.trim().is_empty())
        .map(|l| {
            let cells: Vec<String> = l.split_whitespace().map(str::to_owned).collect();
            assert_eq!(cells.len(), header.len(), "row {l:?} in:\n{frame}");
            (cells[0].clone(), cells[1..].to_vec())
        })
        .collect()
}

/// The four counts of a row, as numbers.
fn row_counts(cells: &[String]) -> [u64; 4] {
    [0, 1, 2, 3].map(|i| cells[i].parse().unwrap())
}

/// The value after `label` on the totals line starting with `line`.
fn total(frame: &str, line: &str, label: &str) -> u64 {
    let words: Vec<&str> = frame
        .lines()
        .find(|l| l.starts_with(line))
        .unwrap_or_else(|| panic!("no {line} line in:\n{frame}"))
        .split_whitespace()
        .collect();
    let i = words.iter().position(|w| *w == label).unwrap();
    words[i + 1].parse().unwrap()
}

/// `12s` as 12 (the view writes ages under a minute that way).
fn secs(cell: &str) -> u64 {
    cell.strip_suffix('s').unwrap().parse().unwrap()
}

/// Puts a job; its id.
fn put(c: &mut Connection, delay: u32, body: &[u8]) -> u64 {
    match c
        .request(&Cmd::Put {
            pri: 100,
            delay,
            ttr: 600,
            body,
        })
        .unwrap()
    {
        Reply::Inserted { id } => id,
        r => panic!("put: {r:?}"),
    }
}

fn reserve(c: &mut Connection) -> u64 {
    match c.request(&Cmd::ReserveWithTimeout { timeout: 0 }).unwrap() {
        Reply::Reserved { id, .. } => id,
        r => panic!("reserve: {r:?}"),
    }
}

/// Makes `tube` hold one buried job, `ready` ready and `delayed` delayed ones,
/// and, when `holder` is given, one job reserved by it (kept while it lives).
fn fill(
    addr: &str,
    tube: &str,
    ready: usize,
    delayed: usize,
    holder: Option<&mut Connection>,
) -> Instant {
    let mut c = connect(addr);
    c.request(&Cmd::Use { tube }).unwrap();
    c.request(&Cmd::Watch { tube }).unwrap();
    c.request(&Cmd::Ignore { tube: "default" }).unwrap();
    put(&mut c, 0, b"to bury");
    let id = reserve(&mut c);
    assert_eq!(
        c.request(&Cmd::Bury { id, pri: 100 }).unwrap(),
        Reply::Buried
    );
    if let Some(h) = holder {
        h.request(&Cmd::Watch { tube }).unwrap();
        h.request(&Cmd::Ignore { tube: "default" }).unwrap();
        put(&mut c, 0, b"to hold");
        reserve(h);
    }
    let first_ready = Instant::now();
    for i in 0..ready {
        put(&mut c, 0, format!("ready {i}").as_bytes());
    }
    for i in 0..delayed {
        put(&mut c, 3600, format!("later {i}").as_bytes());
    }
    first_ready
}

#[test]
fn once_prints_plain_text_that_matches_stats_tube() {
    let server = Beanstalkd::start().unwrap();
    let addr = server.addr().to_string();
    let mut holder = connect(&addr);
    let since = fill(&addr, "alpha", 3, 2, Some(&mut holder));
    fill(&addr, "beta", 2, 1, None);

    let (out, took) = taskq(
        &["top", "--once", "--addr", &addr],
        b"",
        Duration::from_secs(20),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        !out.stdout.contains(&0x1b),
        "an escape byte in --once output"
    );
    // Two samples a second apart.
    assert!(took >= Duration::from_secs(1), "{took:?}");
    let frame = String::from_utf8(out.stdout).unwrap();
    println!("{frame}");
    let table = tube_table(&frame);
    let names = tube_names(&addr);
    assert_eq!(
        table.keys().cloned().collect::<Vec<_>>(),
        {
            let mut n = names.clone();
            n.sort();
            n
        },
        "{frame}"
    );
    for name in &names {
        let cells = &table[name];
        assert_eq!(
            row_counts(cells),
            counts(&addr, name),
            "{name} in:\n{frame}"
        );
        // Nothing was put or deleted between the two samples.
        assert_eq!(cells[4..6], ["0.0", "0.0"], "{name} in:\n{frame}");
    }
    assert_eq!(row_counts(&table["alpha"]), [3, 1, 2, 1]);
    assert_eq!(row_counts(&table["beta"]), [2, 0, 1, 1]);
    assert_eq!(table["default"][6], "-");
    let age = secs(&table["alpha"][6]);
    assert!(age <= since.elapsed().as_secs() + 1, "age {age}");
    // The totals on top are the server's.
    let mut c = connect(&addr);
    let Reply::Ok { yaml } = c.request(&Cmd::Stats).unwrap() else {
        panic!("stats")
    };
    let s = ServerStats::parse(yaml).unwrap();
    assert_eq!(total(&frame, "jobs", "ready"), s.current_jobs_ready);
    assert_eq!(total(&frame, "jobs", "reserved"), s.current_jobs_reserved);
    assert_eq!(total(&frame, "jobs", "delayed"), s.current_jobs_delayed);
    assert_eq!(total(&frame, "jobs", "buried"), s.current_jobs_buried);
    assert_eq!(total(&frame, "commands", "cmd-put"), s.cmd_put);
    assert_eq!(total(&frame, "commands", "cmd-delete"), s.cmd_delete);
    drop(c);

    // --tube limits the table to the tubes named; one the server lacks shows 0.
    let (out, _) = taskq(
        &[
            "top", "--once", "--addr", &addr, "--tube", "beta", "--tube", "nosuch",
        ],
        b"",
        Duration::from_secs(20),
    );
    assert!(out.status.success());
    let only = tube_table(&String::from_utf8(out.stdout).unwrap());
    assert_eq!(only.keys().collect::<Vec<_>>(), ["beta", "nosuch"]);
    assert_eq!(row_counts(&only["beta"]), [2, 0, 1, 1]);
    assert_eq!(row_counts(&only["nosuch"]), [0, 0, 0, 0]);

    // A bad tube name, and a server that is not there: a message and exit 1.
    for (all, want) in [
        (
            ["top", "--once", "--addr", &addr, "--tube", "no spaces"],
            "--tube",
        ),
        (
            ["top", "--once", "--addr", "127.0.0.1:1", "--tube", "beta"],
            "127.0.0.1:1",
        ),
    ] {
        let (out, _) = taskq(&all, b"", Duration::from_secs(20));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{all:?}: {err}");
        assert!(err.starts_with("taskq: ") && err.contains(want), "{err}");
        assert!(out.stdout.is_empty());
    }
}

/// A tmux server on its own socket, killed on drop (also when a check fails).
struct Tmux {
    socket: String,
    dir: PathBuf,
}

impl Tmux {
    fn start(width: u16, height: u16) -> Tmux {
        // One socket per session: the tests of this file run in parallel.
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let socket = format!("taskq-top-{}-{n}", std::process::id());
        let dir = std::env::temp_dir().join(&socket);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let t = Tmux { socket, dir };
        t.run(&[
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-x",
            &width.to_string(),
            "-y",
            &height.to_string(),
            "-s",
            "top",
            "env PS1='$ ' sh",
        ]);
        t
    }

    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Types `line` and Enter in the pane.
    fn type_line(&self, line: &str) {
        self.run(&["send-keys", "-t", "top", "-l", line]);
        self.run(&["send-keys", "-t", "top", "Enter"]);
    }

    fn pane(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "top"])
    }

    /// `#{alternate_on} #{cursor_flag}`: whether the alternate screen is on, the cursor shown.
    fn screen_state(&self) -> String {
        self.run(&[
            "display",
            "-p",
            "-t",
            "top",
            "#{alternate_on} #{cursor_flag}",
        ])
        .trim()
        .to_owned()
    }

    /// Waits (up to `limit`) for a pane for which `ok` holds; returns it.
    fn wait_for(&self, limit: Duration, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let until = Instant::now() + limit;
        loop {
            let pane = self.pane();
            if ok(&pane) {
                return pane;
            }
            assert!(
                Instant::now() < until,
                "waited {limit:?} for {what}:\n{pane}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Starts `taskq top` in the pane under a shell line that, after it exits,
/// prints its status and writes `stty -a` (before and after) to files.
fn start_top(t: &Tmux, round: &str, addr: &str) {
    let d = t.dir.display();
    t.type_line(&format!(
        "stty -a > {d}/before-{round}; sh -c 'echo $$ > {d}/pid-{round}; exec {} top --addr {addr}'; echo exit-{round}=$?; stty -a > {d}/after-{round}; echo done-{round}",
        env!("CARGO_BIN_EXE_taskq"),
    ));
    t.wait_for(Duration::from_secs(15), "the view", |p| {
        p.lines().any(|l| l.starts_with("TUBE "))
    });
    assert_eq!(
        t.screen_state(),
        "1 0",
        "alternate screen on, cursor hidden"
    );
}

/// Waits for `taskq top` to end, then checks its status and the terminal:
/// the normal screen with the shell's lines, the cursor shown, and terminal
/// modes as before (canonical input and echo on: raw mode off).
fn check_restored(t: &Tmux, round: &str, status: i32) {
    let done = format!("done-{round}");
    let pane = t.wait_for(Duration::from_secs(10), &done, |p| {
        p.lines().any(|l| l == done)
    });
    assert!(
        pane.lines().any(|l| l == format!("exit-{round}={status}")),
        "{pane}"
    );
    assert!(
        !pane.contains("TUBE"),
        "the view is still on screen:\n{pane}"
    );
    assert_eq!(t.screen_state(), "0 1", "normal screen, cursor shown");
    let before = read(&t.dir.join(format!("before-{round}")));
    let after = read(&t.dir.join(format!("after-{round}")));
    assert_eq!(before, after, "terminal modes changed");
    let words: Vec<&str> = after.split([' ', ';', '\n']).collect();
    assert!(
        words.contains(&"icanon") && words.contains(&"echo"),
        "{after}"
    );
}

/// The `taskq top` processes whose command line names `addr`.
fn top_pids(addr: &str) -> Vec<String> {
    let out = Command::new("pgrep")
        .args(["-f", &format!("taskq top --addr {addr}")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

#[test]
fn a_closed_terminal_ends_the_live_view() {
    // Closing the terminal under the view (here: killing its tmux server) must
    // end the process, not leave it spinning on end-of-file from standard input.
    let server = Beanstalkd::start().unwrap();
    let addr = server.addr().to_string();
    let t = Tmux::start(100, 20);
    t.wait_for(Duration::from_secs(10), "the shell", |p| p.starts_with('$'));
    t.type_line(&format!(
        "exec {} top --addr {addr}",
        env!("CARGO_BIN_EXE_taskq")
    ));
    t.wait_for(Duration::from_secs(10), "the view", |p| p.contains("TUBE"));
    assert_eq!(top_pids(&addr).len(), 1, "one view running");
    drop(t);
    let until = Instant::now() + Duration::from_secs(3);
    while !top_pids(&addr).is_empty() {
        if Instant::now() > until {
            for pid in top_pids(&addr) {
                let _ = Command::new("kill").args(["-9", &pid]).status();
            }
            panic!("taskq top still running 3 s after its terminal closed");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn live_view_in_a_terminal_follows_the_server_and_restores_the_terminal() {
    let server = Beanstalkd::start().unwrap();
    let addr = server.addr().to_string();
    let mut holder = connect(&addr);
    fill(&addr, "alpha", 3, 2, Some(&mut holder));
    fill(&addr, "beta", 2, 1, None);
    let t = Tmux::start(120, 30);
    t.wait_for(Duration::from_secs(10), "the shell", |p| p.starts_with('$'));

    // Round 1: the numbers, an update, then q.
    start_top(&t, "q", &addr);
    let pane = t.wait_for(Duration::from_secs(5), "counts as stats-tube", |p| {
        let table = tube_table(p);
        ["alpha", "beta", "default"].iter().all(|n| {
            table
                .get(*n)
                .is_some_and(|c| row_counts(c) == counts(&addr, n))
        })
    });
    println!("{pane}");
    let table = tube_table(&pane);
    assert_eq!(row_counts(&table["alpha"]), [3, 1, 2, 1]);
    assert_eq!(row_counts(&table["beta"]), [2, 0, 1, 1]);
    assert_eq!(
        total(&pane, "jobs", "ready"),
        5,
        "server totals on top:\n{pane}"
    );
    // Jobs put at about 20 a second for a few seconds: the view shows a put
    // rate above 0 and, once they stop, the new ready count.
    let stop = Arc::new(AtomicBool::new(false));
    let putter = {
        let (addr, stop) = (addr.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut c = connect(&addr);
            c.request(&Cmd::Use { tube: "alpha" }).unwrap();
            let mut n = 0;
            let until = Instant::now() + Duration::from_secs(8);
            while !stop.load(Ordering::SeqCst) && Instant::now() < until {
                put(&mut c, 0, b"more");
                n += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            n
        })
    };
    let pane = t.wait_for(Duration::from_secs(6), "a put rate", |p| {
        let rate: f64 = tube_table(p)["alpha"][4].parse().unwrap_or(0.0);
        rate > 0.0
    });
    println!("{pane}");
    stop.store(true, Ordering::SeqCst);
    let added = putter.join().unwrap();
    let pane = t.wait_for(Duration::from_secs(5), "the new ready count", |p| {
        row_counts(&tube_table(p)["alpha"])[0] == 3 + added
    });
    println!("{pane}");
    assert_eq!(counts(&addr, "alpha")[0], 3 + added);
    t.run(&["send-keys", "-t", "top", "q"]);
    check_restored(&t, "q", 0);

    // Round 2: Ctrl-C, which arrives as a key in raw mode.
    start_top(&t, "ctrl-c", &addr);
    t.run(&["send-keys", "-t", "top", "C-c"]);
    check_restored(&t, "ctrl-c", 0);

    // Round 3: SIGTERM to the taskq process: status 128 + 15.
    start_top(&t, "term", &addr);
    let pid = read(&t.dir.join("pid-term")).trim().to_owned();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    check_restored(&t, "term", 143);

    // Round 4: the server goes away: the view says so and keeps going; q still quits.
    start_top(&t, "gone", &addr);
    drop(holder);
    drop(server);
    t.wait_for(Duration::from_secs(10), "the error", |p| {
        p.contains("error, retrying every second: 127.0.0.1:")
    });
    t.run(&["send-keys", "-t", "top", "q"]);
    check_restored(&t, "gone", 0);
}

/// JetStream's own columns after [`HEADER`].
const NATS_HEADER: [&str; 4] = ["REDELIVERED", "STORED", "DELIVER/S", "DELIVER-TREND"];

/// A JetStream frame's tubes' table: tube name to its cells (the name left out).
fn nats_table(frame: &str) -> BTreeMap<String, Vec<String>> {
    let header: Vec<&str> = HEADER.iter().chain(&NATS_HEADER).copied().collect();
    table_under(frame, &header)
}

/// What the cluster records for tube `tube` in the columns of the view:
/// READY RESERVED DELAYED BURIED, then REDELIVERED STORED. Delayed: the
/// schedules the server holds, on a stream with message schedules; else
/// unknown.
fn nats_record(a: &mut NatsConnection, tube: &str) -> Vec<String> {
    let stored = count_on(a, &format!("taskq.{tube}"));
    let buried = count_on(a, &format!("taskq.{tube}.buried"));
    let delayed = if a.stream_info("TASKQ").unwrap().allow_msg_schedules {
        count_on(a, &format!("taskq.{tube}.delayed.>")).to_string()
    } else {
        "-".to_string()
    };
    let (ready, reserved, redelivered) = match a.consumer_info("TASKQ", &format!("taskq-{tube}")) {
        Ok(c) => (c.num_pending, c.num_ack_pending, c.num_redelivered),
        Err(_) => (stored, 0, 0),
    };
    [ready, reserved]
        .map(|n| n.to_string())
        .into_iter()
        .chain([delayed, buried.to_string()])
        .chain([redelivered.to_string(), stored.to_string()])
        .collect()
}

/// The columns of [`nats_record`] out of a row of the view.
fn nats_cells(row: &[String]) -> Vec<String> {
    [0, 1, 2, 3, 9, 10]
        .iter()
        .map(|&i| row[i].clone())
        .collect()
}

#[test]
fn on_a_jetstream_cluster_once_and_the_live_view_match_the_streams_record() {
    let c = NatsCluster::start(3).unwrap();
    let url = c.url();
    let io = ["--io-timeout", "5000"];
    let put = |tube: &str, bodies: &[&str]| {
        let mut args = vec!["put", "--addr", &url, "--tube", tube];
        args.extend(io);
        args.extend(bodies);
        let (out, _) = taskq(&args, b"", Duration::from_secs(30));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    // Tube a: one job buried by a worker, then of six more two held (one of
    // them nak'ed and handed out again: redelivered) and four never delivered.
    put("a", &["0"]);
    let worker = Worker::new(
        Config {
            servers: vec![url.clone()],
            tubes: vec!["a".into()],
            io_timeout: Duration::from_secs(5),
            exit_when_idle: Some(Duration::from_millis(500)),
            ..Config::default()
        },
        |_: &mut Job<'_>| Outcome::Bury,
    )
    .unwrap()
    .run();
    assert_eq!(worker.buried, 1);
    put("a", &["1", "2", "3", "4", "5", "6"]);
    put("b", &["x", "y"]);
    let mut a = NatsConnection::connect(
        &(0..3).map(|i| c.addr(i).to_string()).collect::<Vec<_>>(),
        NatsConfig {
            io_timeout: Duration::from_secs(5),
            ..NatsConfig::default()
        },
    )
    .unwrap();
    pull_one(&mut a, "a");
    let (ack, _) = pull_one(&mut a, "a");
    assert!(a.ack(&ack, AckKind::Nak { delay: None }, true).unwrap());
    pull_one(&mut a, "a");
    let want_a = nats_record(&mut a, "a");
    let none_delayed = if a.stream_info("TASKQ").unwrap().allow_msg_schedules {
        "0"
    } else {
        "-"
    };
    assert_eq!(
        want_a,
        ["4", "2", none_delayed, "1", "1", "6"],
        "the cluster's own record"
    );

    let mut args = vec!["top", "--once", "--addr", &url];
    args.extend(io);
    let (out, _) = taskq(&args, b"", Duration::from_secs(30));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let frame = String::from_utf8(out.stdout).unwrap();
    println!("{frame}");
    let table = nats_table(&frame);
    assert_eq!(table.keys().collect::<Vec<_>>(), ["a", "b"]);
    assert_eq!(nats_cells(&table["a"]), want_a);
    assert_eq!(nats_cells(&table["b"]), nats_record(&mut a, "b"));
    // No publishes or acks are counted per subject: no put or delete rate.
    assert_eq!(table["a"][4..6], ["-", "-"]);
    assert_eq!(table["a"][11], "0.0", "no delivery between the samples");
    assert_ne!(table["a"][6], "-", "tube a has a ready job, so an age");
    let s = a.stream_info("TASKQ").unwrap();
    assert_eq!(total(&frame, "stream", "messages"), s.messages);
    assert_eq!(total(&frame, "stream", "last-seq"), s.last_seq);
    assert_eq!(total(&frame, "jobs", "ready"), 4 + 2);
    assert_eq!(total(&frame, "jobs", "reserved"), 2);

    // The live view in a terminal follows new jobs; q quits and restores it.
    let t = Tmux::start(160, 30);
    t.wait_for(Duration::from_secs(10), "the shell", |p| p.starts_with('$'));
    start_top(&t, "nats", &format!("{url} --io-timeout 5000"));
    t.wait_for(Duration::from_secs(10), "a's record", |p| {
        nats_table(p)
            .get("a")
            .is_some_and(|r| nats_cells(r) == want_a)
    });
    put("a", &["7", "8", "9"]);
    let pane = t.wait_for(Duration::from_secs(10), "three more ready", |p| {
        nats_table(p).get("a").is_some_and(|r| r[0] == "7")
    });
    println!("{pane}");
    assert_eq!(nats_record(&mut a, "a")[0], "7");
    t.run(&["send-keys", "-t", "top", "q"]);
    check_restored(&t, "nats", 0);
}
