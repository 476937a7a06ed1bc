//! Weighted tubes against a real beanstalkd: shares while both tubes are busy,
//! strict mode for contrast, urgent priorities, and requests per job.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use taskq_proto::{Command as Cmd, Reply, ServerStats};
use taskq_testkit::Beanstalkd;
use taskq_worker::{Config, Job, Outcome, Snapshot, Worker};

const VIP: u8 = 0;
const STANDARD: u8 = 1;

/// Puts `n` jobs tagged `tag` into `tube` at priority `pri`.
fn put_tagged(addr: std::net::SocketAddr, tube: &str, tag: u8, n: usize, pri: u32) {
    let mut c = connect(addr);
    assert!(matches!(
        c.request(&Cmd::Use { tube }).unwrap(),
        Reply::Using { .. }
    ));
    for i in 0..n {
        let body = format!("{tag}-{i}");
        match c
            .request(&Cmd::Put {
                pri,
                delay: 0,
                ttr: 60,
                body: body.as_bytes(),
            })
            .unwrap()
        {
            Reply::Inserted { .. } => {}
            r => panic!("put: {r:?}"),
        }
    }
}

/// The commands the server counted so far: every `cmd-*` that a worker sends.
fn commands(addr: std::net::SocketAddr) -> u64 {
    let mut c = connect(addr);
    match c.request(&Cmd::Stats).unwrap() {
        Reply::Ok { yaml } => {
            let s = ServerStats::parse(yaml).unwrap();
            s.cmd_reserve_with_timeout
                + s.cmd_delete
                + s.cmd_watch
                + s.cmd_ignore
                + s.cmd_release
                + s.cmd_bury
                + s.cmd_touch
                + s.cmd_stats_job
        }
        r => panic!("stats: {r:?}"),
    }
}

struct Run {
    /// Tube tag of each job, in the order taken.
    order: Vec<u8>,
    counts: Snapshot,
    /// Commands the server received from the worker.
    commands: u64,
}

/// Drains both tubes with a worker on `tubes` (NAME or NAME:WEIGHT specs).
fn drain(server: &Beanstalkd, specs: &[&str], concurrency: usize, jobs: usize) -> Run {
    drain_window(server, specs, concurrency, jobs, 1)
}

/// [`drain`] with each connection holding up to `prefetch` jobs.
fn drain_window(
    server: &Beanstalkd,
    specs: &[&str],
    concurrency: usize,
    jobs: usize,
    prefetch: usize,
) -> Run {
    let order: Arc<Mutex<Vec<u8>>> = Arc::default();
    let order2 = order.clone();
    let mut cfg = Config {
        servers: vec![server.addr().to_string()],
        concurrency,
        max_jobs: Some(jobs as u64),
        io_timeout: Duration::from_secs(2),
        prefetch,
        ..Config::default()
    };
    cfg.set_tubes(specs).unwrap();
    let worker = Worker::new(cfg, move |job: &mut Job<'_>| {
        order2.lock().unwrap().push(job.body()[0] - b'0');
        Outcome::Done
    })
    .unwrap();
    let before = commands(server.addr());
    let counts = run_bounded(worker, Duration::from_secs(60));
    let after = commands(server.addr());
    let order = order.lock().unwrap().clone();
    assert_eq!(order.len(), jobs);
    assert_eq!(counts.deleted, jobs as u64);
    Run {
        order,
        counts,
        commands: after - before,
    }
}

/// Standard's share of the jobs taken while both tubes still had jobs: the
/// prefix of `order` that ends when one tube's last job is taken.
fn standard_share(order: &[u8], vip_total: usize, standard_total: usize) -> (f64, usize) {
    let (mut vip, mut std) = (0, 0);
    for &t in order {
        if t == VIP {
            vip += 1;
        } else {
            std += 1;
        }
        if vip == vip_total || std == standard_total {
            break;
        }
    }
    (std as f64 / (vip + std) as f64, vip + std)
}

/// Fills the two tubes, the `older` one first, drains them weighted and strict,
/// and checks the shares and the cost per job.
fn weighted_against_strict(older: u8, vip_pri: u32) {
    let n = 400;
    let fill = |server: &Beanstalkd| {
        let (first, second) = if older == VIP {
            (("vip", VIP, vip_pri), ("standard", STANDARD, 100))
        } else {
            (("standard", STANDARD, 100), ("vip", VIP, vip_pri))
        };
        put_tagged(server.addr(), first.0, first.1, n, first.2);
        put_tagged(server.addr(), second.0, second.1, n, second.2);
    };

    let server = Beanstalkd::start().unwrap();
    fill(&server);
    let weighted = drain(&server, &["vip:4", "standard:1"], 1, 2 * n);
    fill(&server);
    let strict = drain(&server, &["vip", "standard"], 1, 2 * n);

    let (share, prefix) = standard_share(&weighted.order, n, n);
    let (strict_share, strict_prefix) = standard_share(&strict.order, n, n);
    let jobs = (2 * n) as f64;
    let w_writes = weighted.counts.writes as f64 / jobs;
    let s_writes = strict.counts.writes as f64 / jobs;
    let w_cmds = weighted.commands as f64 / jobs;
    let s_cmds = strict.commands as f64 / jobs;
    eprintln!(
        "older {}, vip pri {vip_pri}: weighted 4:1 standard share {:.1}% over {prefix} jobs; strict {:.1}% over {strict_prefix}; \
         writes/job weighted {w_writes:.3} strict {s_writes:.3}; commands/job weighted {w_cmds:.3} strict {s_cmds:.3}",
        if older == VIP { "vip" } else { "standard" },
        share * 100.0,
        strict_share * 100.0,
    );
    assert!(
        (0.15..=0.25).contains(&share),
        "standard got {:.1}% of the first {prefix} jobs",
        share * 100.0
    );
    assert!(prefix >= n, "both tubes busy for {prefix} jobs");
    // Strict: the server's order, all of one tube first.
    let first = if vip_pri < 100 { VIP } else { older };
    assert!(
        strict.order[..n].iter().all(|&t| t == first),
        "strict mode mixed the tubes: {:?}",
        &strict.order[..n]
    );
    assert!(
        w_writes <= s_writes * 1.10,
        "writes per job: weighted {w_writes:.3}, strict {s_writes:.3}"
    );
    assert!(
        w_cmds <= s_cmds * 1.10,
        "commands per job: weighted {w_cmds:.3}, strict {s_cmds:.3}"
    );
}

#[test]
fn four_to_one_with_standard_jobs_older() {
    weighted_against_strict(STANDARD, 100);
}

#[test]
fn four_to_one_with_vip_jobs_older() {
    weighted_against_strict(VIP, 100);
}

#[test]
fn four_to_one_holds_with_urgent_vip_jobs() {
    // Urgent vip jobs put last: strict mode serves them all first anyway.
    weighted_against_strict(STANDARD, 0);
}

#[test]
fn several_threads_share_by_weight() {
    share_by_weight(3, 1);
}

#[test]
fn four_to_one_holds_with_a_window_of_16() {
    share_by_weight(1, 16);
    share_by_weight(3, 16);
}

/// Urgent vip jobs and standard ones, drained 4:1 by `threads` threads whose
/// connections each hold up to `prefetch` jobs: standard gets 15-25%.
fn share_by_weight(threads: usize, prefetch: usize) {
    let server = Beanstalkd::start().unwrap();
    let n = 600;
    put_tagged(server.addr(), "standard", STANDARD, n, 100);
    put_tagged(server.addr(), "vip", VIP, n, 0);
    let run = drain_window(&server, &["vip:4", "standard:1"], threads, 2 * n, prefetch);
    // The order is the order of handling. When vip's last ready job is
    // taken, up to a window a thread of vip jobs are still to be handled,
    // and the threads' fallback runs take standard jobs meanwhile: a thread
    // the machine holds back stretches that tail. So the share is counted
    // while vip surely still had ready jobs: until all but the jobs the
    // windows can hold were handled.
    let held = threads * (prefetch + 1);
    let (share, prefix) = standard_share(&run.order, n - held, n);
    eprintln!(
        "{threads} threads, prefetch {prefetch}: standard share {:.1}% over {prefix} jobs",
        share * 100.0
    );
    assert!((0.15..=0.25).contains(&share), "{:.1}%", share * 100.0);
}

#[test]
fn an_idle_tube_gives_its_share_away_and_an_empty_queue_costs_one_reserve_per_slice() {
    let server = Beanstalkd::start().unwrap();
    // Only standard has jobs: they are all done, at about strict mode's cost.
    put_tagged(server.addr(), "standard", STANDARD, 200, 100);
    let run = drain(&server, &["vip:4", "standard:1"], 1, 200);
    assert!(run.order.iter().all(|&t| t == STANDARD));
    let writes = run.counts.writes as f64 / 200.0;
    assert!(writes <= 1.15, "writes per job {writes:.3}");

    // Empty queue: blocking reserves, one per slice.
    let mut cfg = Config {
        servers: vec![server.addr().to_string()],
        exit_when_idle: Some(Duration::from_millis(3500)),
        ..Config::default()
    };
    cfg.set_tubes(&["vip:4", "standard:1"]).unwrap();
    let before = record(server.addr()).cmd_reserve_with_timeout;
    let counts = Worker::new(cfg, |_: &mut Job<'_>| Outcome::Done)
        .unwrap()
        .run();
    let reserves = record(server.addr()).cmd_reserve_with_timeout - before;
    eprintln!("idle 3.5 s weighted: {reserves} reserves; {counts}");
    // One immediate try of the first tube, then one blocking reserve per 1 s slice.
    assert!(reserves <= 1 + 4 + 1, "{reserves} reserves");
    assert_eq!(counts.reserved, 0);
}

#[test]
fn the_binary_takes_weighted_tubes_and_refuses_bad_weights() {
    let server = Beanstalkd::start().unwrap();
    let n = 100;
    put_tagged(server.addr(), "standard", STANDARD, n, 100);
    put_tagged(server.addr(), "vip", VIP, n, 100);
    let dir = TempDir::new("fair");
    let log = dir.0.join("order");
    let addr = server.addr().to_string();
    let mut w = WorkerProc::start(
        &[
            "--addr",
            &addr,
            "--tube",
            "vip:4",
            "--tube",
            "standard:1",
            "--max-jobs",
            &(2 * n).to_string(),
        ],
        &format!("head -c 1 >> {}", log.display()),
    );
    let st = w.wait(Duration::from_secs(30));
    assert!(st.success(), "{st}: {}", w.stderr());
    let order: Vec<u8> = std::fs::read(&log)
        .unwrap()
        .iter()
        .map(|b| b - b'0')
        .collect();
    assert_eq!(order.len(), 2 * n);
    let (share, prefix) = standard_share(&order, n, n);
    assert!(
        (0.15..=0.25).contains(&share),
        "binary: standard got {:.1}% of {prefix}",
        share * 100.0
    );

    for bad in ["vip:0", "vip:x", "bad name:2"] {
        let out = output_bounded(
            std::process::Command::new(env!("CARGO_BIN_EXE_taskq-worker")).args([
                "--addr", &addr, "--tube", bad, "--tube", "b:1", "--", "true",
            ]),
            Duration::from_secs(10),
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{bad}: {err}");
    }
}
