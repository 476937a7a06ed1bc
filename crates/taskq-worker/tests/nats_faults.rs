//! The worker on JetStream under faults, against real nats-server clusters on
//! loopback: the stream's leader killed mid-run, a node frozen under a
//! connected worker, a worker killed mid-job, random resets, signals,
//! touches and temporary failures. Every acknowledged put must be done.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use taskq_testkit::NatsCluster;
use taskq_worker::{Backoff, Config, JetStreamConfig, Snapshot, Worker};

/// What a drain left behind.
#[derive(Debug, Default)]
struct Drained {
    duplicates: u64,
    /// Messages the stream kept although the consumer had acked them.
    stranded: u64,
}

/// The checks every drain ends with: each acknowledged put done at least
/// once, nothing done that was not put, and nothing left on the stream or
/// the consumer. With `after_election` on nats-server before 2.10, the
/// stream may keep messages the consumer acked (those releases can strand
/// acks that reach the consumer's leader while the stream has none), but
/// each of them must lie at or below the consumer's ack floor and have been
/// done; on later releases nothing may be left.
fn check_drained(
    c: &NatsCluster,
    tube: &str,
    (bodies, acked): (&[Vec<u8>], &[Vec<u8>]),
    runs: &Runs,
    counts: &Snapshot,
    after_election: bool,
) -> Drained {
    let lost: Vec<_> = acked
        .iter()
        .filter(|b| !runs.count.contains_key(*b))
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .collect();
    if !lost.is_empty() {
        let mut a = js_admin(c);
        eprintln!(
            "left: {:?}\n{:?}",
            a.stream_info("TASKQ"),
            a.consumer_info("TASKQ", &format!("taskq-{tube}"))
        );
    }
    assert!(
        lost.is_empty(),
        "lost {}, first {:?}; {counts}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    let put: std::collections::HashSet<&[u8]> = bodies.iter().map(Vec::as_slice).collect();
    assert!(
        runs.count.keys().all(|b| put.contains(b.as_slice())),
        "a body that was never put"
    );
    let mut out = Drained {
        duplicates: runs.count.values().map(|&k| u64::from(k - 1)).sum(),
        stranded: 0,
    };
    let ci = js_consumer(c, tube);
    assert_eq!(
        (ci.num_pending, ci.num_ack_pending),
        (0, 0),
        "the consumer owes nothing"
    );
    let mut a = js_admin(c);
    let s = a.stream_info("TASKQ").unwrap();
    if after_election {
        // One subject on the stream: acked through its last message.
        let floor = ack_floor(&mut a, tube);
        assert_eq!(floor, s.last_seq, "the consumer's ack floor");
    }
    let strands = after_election && nats_version(c) < (2, 10, 0);
    if s.messages > 0 && strands {
        let floor = s.last_seq;
        for seq in s.first_seq..=s.last_seq {
            let Ok(m) = a.msg_get("TASKQ", taskq_connect::nats::MsgSelect::Seq(seq)) else {
                continue;
            };
            assert!(
                seq <= floor,
                "message {seq} left above the ack floor {floor}"
            );
            assert!(
                runs.count.contains_key(&m.data),
                "message {seq} left undone"
            );
            out.stranded += 1;
        }
        assert_eq!(out.stranded, s.messages);
        eprintln!(
            "the stream kept {} messages the consumer had acked (ack floor {floor})",
            out.stranded
        );
    } else {
        assert_eq!(s.messages, 0, "nothing left in the stream; {counts}");
    }
    out
}

/// The stream sequence of consumer `taskq-TUBE`'s ack floor.
fn ack_floor(a: &mut taskq_connect::nats::NatsConnection, tube: &str) -> u64 {
    let subject = format!("$JS.API.CONSUMER.INFO.TASKQ.taskq-{tube}");
    let reply = a.request(&subject, b"", Duration::from_secs(5)).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&reply).unwrap();
    v["ack_floor"]["stream_seq"]
        .as_u64()
        .unwrap_or_else(|| panic!("no ack floor in {v}"))
}

/// The longest time between two runs of the handler.
fn longest_gap(times: &[Instant]) -> Duration {
    let mut t = times.to_vec();
    t.sort();
    t.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default()
}

#[test]
fn the_stream_leader_killed_with_the_consumer_leader_loses_no_acknowledged_put() {
    leader_killed("elect1", true, 1);
}

#[test]
fn the_stream_leader_killed_under_a_consumer_led_elsewhere_loses_no_acknowledged_put() {
    leader_killed("elect2", false, 1);
}

#[test]
fn the_stream_leader_killed_under_a_pull_batch_of_16_loses_no_acknowledged_put() {
    leader_killed("elect16", true, 16);
}

/// A producer thread puts 3,000 jobs over about 10 s while three worker
/// threads (each connection holding up to `prefetch`) drain them; the
/// stream's leader (leading the consumer too when `together`) is killed with
/// SIGKILL after 300 are done and restarted 3 s later. The worker must ride
/// out the election (not idle: its pulls and lookups go unanswered), send
/// again every ack whose confirmation the election swallowed, and exit by
/// itself once nothing is left. The ack wait (20 s) outlasts the election
/// (4 to 9 s) and the reconnects, so no ack may end unknown.
fn leader_killed(tube: &str, together: bool, prefetch: usize) {
    let _one = heavy();
    log_from_env();
    let mut c = NatsCluster::start(3).unwrap();
    let tube: &'static str = Box::leak(tube.to_owned().into_boxed_str());
    js_setup(&c, tube, None);
    let n = 3000;
    let bodies: Vec<Vec<u8>> = (0..n)
        .map(|i| format!("job-{i}\r\n\0").into_bytes())
        .collect();
    let runs = SharedRuns::default();
    let worker = Worker::new(
        Config {
            concurrency: 3,
            prefetch,
            jetstream: JetStreamConfig {
                ack_wait: Duration::from_secs(20),
                ..JetStreamConfig::default()
            },
            ..js_cfg(&c.url(), tube)
        },
        recording(&runs),
    )
    .unwrap();
    let started = Instant::now();
    let w = std::thread::spawn(move || run_bounded(worker, Duration::from_secs(150)));
    let p = {
        let (url, bodies) = (c.url(), bodies.clone());
        std::thread::spawn(move || produce(&url, tube, &bodies, Duration::from_millis(3)))
    };
    assert!(wait_until(Duration::from_secs(30), || runs_done(&runs) >= 300));
    let (leader, consumer_leader, meta) =
        place_consumer_leader(&c, &format!("taskq-{tube}"), |s, k, _| (s == k) == together);
    let done_at_kill = runs_done(&runs);
    let killed = Instant::now();
    c.kill(leader).unwrap();
    let mut restarted = false;
    let mut elected = None;
    while elected.is_none() && killed.elapsed() < Duration::from_secs(30) {
        if !restarted && killed.elapsed() >= Duration::from_secs(3) {
            c.restart(leader).unwrap();
            restarted = true;
        }
        // The survivors name the dead leader for a while; once it is back it
        // may win again.
        if c.stream_leader("TASKQ")
            .is_some_and(|l| l != leader || restarted)
        {
            elected = Some(killed.elapsed());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if !restarted {
        let wait = Duration::from_secs(3).saturating_sub(killed.elapsed());
        std::thread::sleep(wait);
        c.restart(leader).unwrap();
    }
    let produced = p.join().unwrap();
    let counts = w.join().unwrap();
    let runs = runs.lock().unwrap();
    let gap = longest_gap(&runs.times);
    eprintln!(
        "nats-server {:?}, prefetch {prefetch}: killed n{} (stream leader; consumer leader n{}, meta leader n{}) after {done_at_kill} jobs; \
         a new stream leader after {elected:?}; longest pause between jobs {gap:?}; \
         {} puts acked, {} failed; worker ran {:?}: {counts}",
        nats_version(&c),
        leader + 1,
        consumer_leader + 1,
        meta + 1,
        produced.acked.len(),
        produced.failed,
        started.elapsed(),
    );
    let drained = check_drained(&c, tube, (&bodies, &produced.acked), &runs, &counts, true);
    let duplicates = drained.duplicates;
    eprintln!("{drained:?}");
    assert!(elected.is_some(), "no new stream leader within 30 s");
    assert_eq!(
        counts.ack_unknown, 0,
        "every ack confirmed within the ack wait, sent again if need be: {counts}"
    );
    assert!(
        duplicates <= counts.lease_dropped + counts.reconnects,
        "{duplicates} duplicates beyond the faults: {counts}"
    );
}

#[test]
fn a_frozen_follower_under_the_worker_is_detected_and_work_goes_on_through_another_node() {
    follower_lost("frozen", false);
}

#[test]
fn a_worker_given_one_node_goes_on_through_the_nodes_it_was_told_of_when_that_one_dies() {
    follower_lost("learned", true);
}

/// A worker's one thread is connected to a node that leads nothing, which
/// then fails: frozen (SIGSTOP) with every node among the worker's seeds, it
/// first, or killed (SIGKILL) when the worker was given that node alone and
/// knows the others only from what the cluster announced. The failure must be
/// noticed by the time the pull under way was due, and a job published
/// meanwhile through another node done through another node.
fn follower_lost(tube: &str, killed: bool) {
    let _one = heavy();
    log_from_env();
    let mut c = NatsCluster::start(3).unwrap();
    let consumer = format!("taskq-{tube}");
    js_setup(&c, tube, Some(Duration::from_secs(3)));
    let produced = produce(&c.url(), tube, &[b"before".to_vec()], Duration::ZERO);
    assert_eq!(produced.acked.len(), 1);
    // A node that leads nothing: not the stream, not the consumer, not the
    // cluster's metadata.
    let (s, k, m) = place_consumer_leader(&c, &consumer, |s, k, m| {
        (0..3).any(|i| i != s && i != k && i != m)
    });
    let victim = (0..3).find(|&i| i != s && i != k && i != m).unwrap();
    let others: Vec<usize> = (0..3).filter(|&i| i != victim).collect();
    // The failing node first: the worker's one thread connects there.
    let addr = if killed {
        c.node_url(victim)
    } else {
        format!(
            "nats://{},{},{}",
            c.addr(victim),
            c.addr(others[0]),
            c.addr(others[1])
        )
    };
    let peers: Arc<Mutex<Vec<Peer>>> = Arc::default();
    let config = Config {
        exit_when_idle: None,
        ..js_cfg(&addr, tube)
    };
    let (slice, io) = (config.reserve_timeout, config.io_timeout);
    let worker = Worker::new(config, peer_recording(&peers)).unwrap();
    let control = worker.control();
    let running = worker.start();
    assert!(wait_until(Duration::from_secs(15), || control
        .counters()
        .deleted
        == 1));
    assert_eq!(
        peers.lock().unwrap()[0].1,
        c.addr(victim),
        "connected to the node that fails"
    );
    // Waiting in a pull on the node, which goes silent or dies.
    std::thread::sleep(Duration::from_millis(300));
    let frozen = Instant::now();
    if killed {
        c.kill(victim).unwrap();
    } else {
        c.stop(victim).unwrap();
    }
    let detected = wait_until(Duration::from_secs(10), || {
        let n = control.counters();
        n.io_timeouts >= 1 || n.reconnects >= 1
    })
    .then(|| frozen.elapsed());
    // Published meanwhile through another node.
    let after = produce(
        &c.node_url(others[0]),
        tube,
        &[b"after".to_vec()],
        Duration::ZERO,
    );
    let done = wait_until(Duration::from_secs(15), || control.counters().deleted == 2)
        .then(|| frozen.elapsed());
    if !killed {
        c.cont(victim).unwrap();
    }
    control.shutdown();
    let counts = join_bounded(running, Duration::from_secs(30));
    let peers = peers.lock().unwrap();
    eprintln!(
        "{} n{} (leaders: stream n{}, consumer n{}, meta n{}): detected after {detected:?}, \
         the job published meanwhile done after {done:?}, through {:?}; {counts}",
        if killed { "killed" } else { "froze" },
        victim + 1,
        s + 1,
        k + 1,
        m + 1,
        peers.get(1).map(|p| p.1)
    );
    let due = slice + io + Duration::from_millis(500);
    let detected = detected.expect("the failure was never detected");
    assert!(
        detected <= due,
        "detected after {detected:?}, due by {due:?}"
    );
    assert_eq!(after.acked.len(), 1);
    assert!(
        done.is_some(),
        "the job published meanwhile was not done: {counts}"
    );
    assert_eq!(peers.len(), 2, "each job once: {peers:?}");
    assert_eq!(peers[1].0, b"after");
    assert_ne!(peers[1].1, c.addr(victim), "went on through another node");
    assert!(counts.reconnects >= 1, "{counts}");
    assert_eq!(js_admin(&c).stream_info("TASKQ").unwrap().messages, 0);
}

/// `taskq-worker` on tube `tube` of `c`, with `extra` flags.
fn worker_proc(c: &NatsCluster, tube: &str, extra: &[&str], script: &str) -> WorkerProc {
    let url = c.url();
    let mut args = vec!["--addr", &url, "--tube", tube];
    args.extend_from_slice(extra);
    WorkerProc::start(&args, script)
}

#[test]
fn kill_9_mid_job_the_job_comes_back_after_the_ack_wait_to_another_worker() {
    let _one = heavy();
    let tube = "kill9";
    // The operator's consumer, with a 2 s ack wait, before any worker.
    let c = one_job(tube, b"precious", Some(Duration::from_secs(2)));
    let dir = TempDir::new("nats-kill9");
    // The first run records its process group and hangs; a later run finishes.
    let script = format!(
        r#"if [ ! -e {d}/first ]; then echo $$ > {d}/first; sleep 30; exit 1; fi
cat > {d}/done"#,
        d = dir.0.display()
    );
    let mut a = worker_proc(&c, tube, &[], &script);
    a.kill_groups_on_drop(dir.0.join("first"));
    assert!(wait_until(Duration::from_secs(10), || dir
        .0
        .join("first")
        .exists()));
    let held = Instant::now();
    let mut b = worker_proc(&c, tube, &["--max-jobs", "1"], &script);
    std::thread::sleep(Duration::from_millis(300));
    a.signal("KILL");
    let _ = a.wait(Duration::from_secs(5));
    let st = b.wait(Duration::from_secs(20));
    let redone = held.elapsed();
    // The orphaned first command runs in its own group: end it.
    let pgid = lines(&dir.0.join("first"))[0].clone();
    let _ = std::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .status();
    eprintln!("the job came back and was done {redone:?} after the first run took it");
    assert!(st.success(), "{st}: {}", b.stderr());
    assert_eq!(std::fs::read(dir.0.join("done")).unwrap(), b"precious");
    // JetStream does not take a job back when a connection closes: only the
    // ack wait ends the lease.
    assert!(redone >= Duration::from_millis(1500), "{redone:?}");
    let counts = b.counters();
    assert_eq!((get(&counts, "reserved"), get(&counts, "deleted")), (1, 1));
    assert_eq!(
        js_admin(&c).stream_info("TASKQ").unwrap().messages,
        0,
        "lost 0, done"
    );
    let ci = js_consumer(&c, tube);
    assert_eq!((ci.num_pending, ci.num_ack_pending), (0, 0));
    assert_eq!(
        ci.ack_wait,
        Duration::from_secs(2),
        "the operator's ack wait kept"
    );
}

#[test]
fn sigterm_while_a_jetstream_job_runs_finishes_and_acks_it() {
    let _one = heavy();
    let c = NatsCluster::start(1).unwrap();
    let tube = "term";
    js_setup(&c, tube, Some(Duration::from_secs(60)));
    let dir = TempDir::new("nats-term");
    for sig in ["TERM", "INT"] {
        let put = produce(&c.url(), tube, &[sig.as_bytes().to_vec()], Duration::ZERO);
        assert_eq!(put.acked.len(), 1);
        let mark = dir.0.join(sig);
        // The command must not see the signal: it would die before writing the mark.
        let script = format!("sleep 1.5; echo done > {}", mark.display());
        let mut w = worker_proc(&c, tube, &["--concurrency", "2"], &script);
        assert!(
            wait_until(Duration::from_secs(10), || js_consumer(&c, tube)
                .num_ack_pending
                == 1),
            "{sig}: the job is held"
        );
        let t = Instant::now();
        w.signal(sig);
        let st = w.wait(Duration::from_secs(10));
        let took = t.elapsed();
        assert!(st.success(), "{sig}: {st}: {}", w.stderr());
        assert!(took < Duration::from_millis(2500), "{sig}: {took:?}");
        assert!(mark.exists(), "{sig}: the command ran to its end");
        let counts = w.counters();
        assert_eq!(
            (get(&counts, "reserved"), get(&counts, "deleted")),
            (1, 1),
            "{sig}"
        );
        assert_eq!(
            js_admin(&c).stream_info("TASKQ").unwrap().messages,
            0,
            "{sig}: acked"
        );
        let ci = js_consumer(&c, tube);
        assert_eq!((ci.num_pending, ci.num_ack_pending), (0, 0), "{sig}");
    }
}

#[test]
fn a_job_longer_than_the_ack_wait_is_touched_and_never_redelivered() {
    let _one = heavy();
    let tube = "touch";
    let c = one_job(tube, b"slow", None);
    let dir = TempDir::new("nats-touch");
    let script = format!("echo $$ >> {}/runs; sleep 5", dir.0.display());
    // Three threads: a redelivery would find one waiting in a pull.
    let mut w = worker_proc(
        &c,
        tube,
        &[
            "--ack-wait",
            "2",
            "--concurrency",
            "3",
            "--exit-when-idle",
            "3",
        ],
        &script,
    );
    let st = w.wait(Duration::from_secs(30));
    assert!(st.success(), "{st}: {}", w.stderr());
    let counts = w.counters();
    eprintln!(
        "5 s job under a 2 s ack wait: touched {}",
        get(&counts, "touched")
    );
    assert_eq!(lines(&dir.0.join("runs")).len(), 1, "run once");
    assert_eq!((get(&counts, "reserved"), get(&counts, "deleted")), (1, 1));
    // Every second (half the ack wait) for 5 s.
    assert!(get(&counts, "touched") >= 4, "{counts:?}");
    let ci = js_consumer(&c, tube);
    assert_eq!(
        ci.ack_wait,
        Duration::from_secs(2),
        "--ack-wait made the consumer"
    );
    assert_eq!(
        (ci.num_pending, ci.num_ack_pending, ci.num_redelivered),
        (0, 0, 0)
    );
    assert_eq!(js_admin(&c).stream_info("TASKQ").unwrap().messages, 0);
}

#[test]
fn exit_75_releases_a_jetstream_job_without_counting_an_attempt() {
    let _one = heavy();
    let tube = "tempfail";
    let c = one_job(tube, b"temp", None);
    let dir = TempDir::new("nats-tempfail");
    // Exits 75 on its first three runs, then 0; each run logs its attempt.
    let script = format!(
        r#"echo "$TASKQ_ATTEMPT" >> {d}/runs; n=$(wc -l < {d}/runs)
if [ "$n" -le 3 ]; then exit 75; fi; exit 0"#,
        d = dir.0.display()
    );
    // The releases wait 1, 2 and 4 s (the retry backoff): idle for longer.
    let mut w = worker_proc(
        &c,
        tube,
        &["--max-attempts", "2", "--exit-when-idle", "6"],
        &script,
    );
    let st = w.wait(Duration::from_secs(40));
    assert!(st.success(), "{st}: {}", w.stderr());
    let counts = w.counters();
    let runs = lines(&dir.0.join("runs"));
    assert_eq!(
        runs,
        ["1", "1", "1", "1"],
        "temporary failures are not attempts"
    );
    assert_eq!(
        (
            get(&counts, "released"),
            get(&counts, "deleted"),
            get(&counts, "buried")
        ),
        (3, 1, 0)
    );
    // Not buried: nothing on taskq.tempfail.buried, nothing left at all.
    assert_eq!(js_admin(&c).stream_info("TASKQ").unwrap().messages, 0);
}

#[test]
fn random_resets_lose_nothing_and_counts_bracket_the_streams_record() {
    random_resets("resets1", 1);
}

#[test]
fn random_resets_with_a_pull_batch_of_16_lose_nothing_and_counts_bracket_the_streams_record() {
    random_resets("resets16", 16);
}

/// Four threads, each connection holding up to `prefetch` jobs, drain 2,000
/// jobs from one node through the chaos proxy while resets hit about a
/// third of the connections every 40 ms (the connects, stream and consumer
/// lookups and acks too).
fn random_resets(tube: &'static str, prefetch: usize) {
    let _one = heavy();
    log_from_env();
    let c = NatsCluster::start(1).unwrap();
    js_setup(&c, tube, Some(Duration::from_secs(5)));
    let n = 2000;
    let bodies: Vec<Vec<u8>> = (0..n).map(|i| format!("r-{i}").into_bytes()).collect();
    let produced = produce(&c.url(), tube, &bodies, Duration::ZERO);
    assert_eq!(produced.acked.len(), n);
    let seed = std::env::var("TASKQ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand_seed() % 1_000_000);
    eprintln!("chaos seed {seed} (replay with TASKQ_SEED={seed})");
    let proxy = taskq_testkit::ChaosProxy::start_seeded(c.addr(0), seed).unwrap();
    let runs = SharedRuns::default();
    let worker = Worker::new(
        Config {
            concurrency: 4,
            prefetch,
            io_timeout: Duration::from_millis(500),
            reconnect_backoff: Backoff {
                initial: Duration::from_millis(5),
                max: Duration::from_millis(100),
                jitter: taskq_worker::Jitter::Full,
            },
            ..js_cfg(&format!("nats://{}", proxy.addr()), tube)
        },
        recording(&runs),
    )
    .unwrap();
    let w = std::thread::spawn(move || run_bounded(worker, Duration::from_secs(150)));
    let stop = std::sync::atomic::AtomicBool::new(false);
    let drained = std::thread::scope(|s| {
        s.spawn(|| {
            let mut rng = seed;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                rng = rng
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                proxy.clear();
                proxy.add(
                    taskq_testkit::Toxic::Reset {
                        after: Duration::from_millis((rng >> 33) % 20),
                    },
                    taskq_testkit::Direction::Both,
                    0.35,
                );
                std::thread::sleep(Duration::from_millis(40));
            }
            proxy.clear();
        });
        let mut admin = js_admin(&c);
        let drained = wait_until(Duration::from_secs(90), || {
            admin.stream_info("TASKQ").is_ok_and(|s| s.messages == 0)
        });
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        drained
    });
    let counts = w.join().unwrap();
    let runs = runs.lock().unwrap();
    let duplicates = runs.count.values().map(|&k| u64::from(k - 1)).sum::<u64>();
    eprintln!(
        "prefetch {prefetch}, seed {seed}: {} connections through the proxy; duplicates {duplicates}; {counts}",
        proxy.opened()
    );
    assert!(drained, "not drained; seed {seed}: {counts}");
    check_drained(&c, tube, (&bodies, &produced.acked), &runs, &counts, false);
    assert!(counts.reconnects >= 20, "the resets hit: {counts}");
    // Resets that cut a connect (its handshake, or the stream's or the
    // consumer's lookup) are failed connects, retried with backoff.
    assert!(
        counts.connect_failures > 0,
        "the resets hit connects: {counts}"
    );
    // A fault repeats at most a job its connection held.
    assert!(
        duplicates <= counts.ack_unknown + counts.lease_dropped + counts.lost_lease,
        "duplicates {duplicates} beyond the faults that hit a held job: {counts}"
    );
    // An ack a reset cut off from its confirmation is sent again on the next
    // connection, a few milliseconds later: none waits out the 5 s ack wait,
    // so none is unknown, and each job is counted done exactly once.
    assert!(counts.acks_resent > 0, "the resets cut acks off: {counts}");
    assert_eq!(counts.ack_unknown, 0, "seed {seed}: {counts}");
    assert_eq!(counts.deleted, n as u64, "seed {seed}: {counts}");
}

fn fastrand_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

#[test]
fn a_silent_server_is_not_idle_time() {
    silent_is_not_idle("quiet1", 1);
}

#[test]
fn a_silent_server_is_not_idle_time_under_a_pull_batch_of_16() {
    silent_is_not_idle("quiet16", 16);
}

/// A worker that exits after 2.5 s idle, through the chaos proxy to one
/// node: the node goes silent for 5 s right after a job. The pull then
/// under way is not answered (its deadline is 2 s off), nor are the
/// reconnects: none of that is idle time, and the worker is still there to
/// do the job put once the node speaks again.
fn silent_is_not_idle(tube: &'static str, prefetch: usize) {
    let _one = heavy();
    log_from_env();
    let c = one_job(tube, b"first", None);
    let proxy = taskq_testkit::ChaosProxy::start(c.addr(0)).unwrap();
    let runs = SharedRuns::default();
    let worker = Worker::new(
        Config {
            prefetch,
            exit_when_idle: Some(Duration::from_millis(2500)),
            ..js_cfg(&format!("nats://{}", proxy.addr()), tube)
        },
        recording(&runs),
    )
    .unwrap();
    let control = worker.control();
    let w = std::thread::spawn(move || run_bounded(worker, Duration::from_secs(60)));
    assert!(wait_until(Duration::from_secs(10), || runs_done(&runs) == 1));
    // Back in a pull, then nothing more comes back.
    std::thread::sleep(Duration::from_millis(300));
    proxy.add(
        taskq_testkit::Toxic::Silence,
        taskq_testkit::Direction::Downstream,
        1.0,
    );
    std::thread::sleep(Duration::from_secs(5));
    let stopped_while_silent = control.is_stopping();
    proxy.clear();
    let put = produce(&c.url(), tube, &[b"second".to_vec()], Duration::ZERO);
    assert_eq!(put.acked.len(), 1);
    let counts = w.join().unwrap();
    eprintln!("prefetch {prefetch}: silent 5 s; {counts}");
    assert!(
        !stopped_while_silent,
        "idle exit while the server was silent: {counts}"
    );
    assert_eq!(
        runs_done(&runs),
        2,
        "the job put after the silence was done: {counts}"
    );
    assert!(counts.io_timeouts >= 1, "{counts}");
    assert_eq!(js_admin(&c).stream_info("TASKQ").unwrap().messages, 0);
}
