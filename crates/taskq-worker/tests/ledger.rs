//! The worker against the reference server, whose ledger records every job and
//! connection: counts equal the server's, no job held twice, and SIGTERM while
//! a delete is in flight.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use taskq_testkit::{Fault, FaultPlan, Target, TestServer};
use taskq_worker::{Config, Job, Outcome, Worker};

fn cfg(server: &TestServer) -> Config {
    Config {
        servers: vec![server.addr().to_string()],
        io_timeout: Duration::from_secs(2),
        ..Config::default()
    }
}

#[test]
fn ten_thousand_jobs_four_threads_counts_equal_the_ledger_and_stats() {
    ten_thousand_jobs_four_threads(1);
}

#[test]
fn a_job_longer_than_its_ttr_with_touching_is_never_held_twice() {
    let server = TestServer::start().unwrap();
    let ids = put_all(server.addr(), "default", 1, &[b"slow".to_vec()]);
    let runs = Arc::new(AtomicU64::new(0));
    let runs2 = runs.clone();
    let worker = Worker::new(
        Config {
            concurrency: 3,
            exit_when_idle: Some(Duration::from_millis(1500)),
            ..cfg(&server)
        },
        move |job: &mut Job<'_>| {
            runs2.fetch_add(1, Ordering::SeqCst);
            // 3.2 s of work on a 1 s TTR, touched every 400 ms.
            for _ in 0..8 {
                std::thread::sleep(Duration::from_millis(400));
                job.touch().expect("touch in time");
            }
            Outcome::Done
        },
    )
    .unwrap();
    let counts = worker.run();
    let report = server.ledger().check();
    eprintln!("{report}; worker {counts}");
    assert!(report.double_held.is_empty(), "{report}");
    assert_eq!(report.expired, 0, "{report}");
    assert_eq!(report.done, 1);
    let history = server.ledger().job(ids[0]).unwrap();
    assert_eq!(history.handed_out, 1);
    assert!(history.deleted.is_some());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(counts.touched, 8);
    let touched: u64 = report.connections.values().map(|c| c.touched).sum();
    assert_eq!(touched, 8);
    assert_eq!(counts.deleted, 1);
}

#[test]
fn sigterm_while_a_delete_is_in_flight_finishes_it_and_exits_0() {
    // The binary's first connection: `watch default`, the reserve, the
    // `stats-job` that gives the command TASKQ_TUBE and TASKQ_ATTEMPT, then the
    // delete, which the server carries out (the ledger records it, and when)
    // and answers a byte at a time, 100 ms apart: its 9 bytes (`DELETED\r\n`)
    // take 800 ms, so the worker's delete is in flight for 800 ms at least
    // from the moment the ledger shows the job deleted.
    let hold = Duration::from_millis(800);
    let server = TestServer::start_with(taskq_testkit::ServerConfig::default().faults(
        FaultPlan::none().with(
            Target::Nth(2),
            Fault::Trickle {
                after: 3,
                interval: hold / 8,
            },
        ),
    ))
    .unwrap();
    // Connection 1 puts.
    let ids = put_all(server.addr(), "default", 60, &[b"one".to_vec()]);
    let dir = TempDir::new("term-delete");
    let marker = dir.0.join("ran");
    let addr = server.addr().to_string();
    let mut w = WorkerProc::start(
        &["--addr", &addr, "--io-timeout", "3000"],
        &format!("cat > /dev/null; touch {}", marker.display()),
    );
    assert!(wait_until(Duration::from_secs(10), || marker.exists()));
    // The server has the delete: its reply is being held back.
    let mut deleted_at = None;
    assert!(
        wait_until(Duration::from_secs(5), || {
            deleted_at = server.ledger().job(ids[0]).and_then(|j| j.deleted);
            deleted_at.is_some()
        }),
        "the delete never came"
    );
    let (conn, deleted_at) = deleted_at.unwrap();
    let on_conn = server.ledger().connection(conn).unwrap();
    assert_eq!(
        (on_conn.cmd_delete, on_conn.requests),
        (1, 4),
        "the worker's fourth request, the delete, is the one held: {on_conn:?}"
    );
    // The TERM lands well before the reply's last byte can.
    let t = Instant::now();
    assert!(
        t - deleted_at < hold / 2,
        "too late to signal while the delete is in flight: {:?}",
        t - deleted_at
    );
    w.signal("TERM");
    let st = w.wait(Duration::from_secs(5));
    let took = t.elapsed();
    let exited = deleted_at.elapsed();
    let err = w.stderr();
    assert!(st.success(), "{st}: {err}");
    // It waited for the whole reply, and no longer than that takes.
    assert!(
        exited >= hold,
        "exit {exited:?} after the delete reached the server"
    );
    assert!(took <= Duration::from_millis(1000), "exit after {took:?}");
    let c = w.counters();
    assert_eq!(get(&c, "deleted"), 1, "{c:?}");
    assert_eq!(get(&c, "ack_unknown"), 0, "{c:?}");
    let report = server.ledger().check();
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.done, 1);
    assert!(server.ledger().job(ids[0]).unwrap().deleted.is_some());
    eprintln!("SIGTERM during delete: exit 0 after {took:?}, {exited:?} after the delete arrived");
}
