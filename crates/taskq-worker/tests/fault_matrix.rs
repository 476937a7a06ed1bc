//! Rows of docs/reliability.md's fault matrix for the worker: a delete cut at every
//! byte of its reply (and of its request), every error reply and garbage line
//! in answer to a reserve and to a delete, and normal operation through high
//! latency and tiny segments. Counts are checked against the server's record.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use taskq_testkit::{
    Beanstalkd, ChaosProxy, Direction, Fault, FaultPlan, LedgerReport, TestServer, Toxic,
};
use taskq_worker::{Backoff, Config, Job, Outcome, Snapshot, Worker};

fn cfg(addr: SocketAddr) -> Config {
    Config {
        servers: vec![addr.to_string()],
        io_timeout: Duration::from_secs(1),
        reserve_timeout: Duration::from_secs(1),
        reconnect_backoff: Backoff {
            initial: Duration::from_millis(5),
            max: Duration::from_millis(50),
            jitter: taskq_worker::Jitter::Full,
        },
        ..Config::default()
    }
}

/// The ledger's delete counts summed over every connection: (cmd-delete, DELETED).
fn deletes(report: &LedgerReport) -> (u64, u64) {
    let t = report.totals().unwrap();
    (t.cmd_delete, t.deleted)
}

/// True when the worker's counts fit the server's: `deleted` counted only for
/// a delete the server carried out, and `deleted + lost_lease <= cmd-delete <=
/// deleted + lost_lease + ack_unknown`.
fn consistent(c: &Snapshot, report: &LedgerReport) -> bool {
    let (cmd, done) = deletes(report);
    c.deleted <= done
        && c.deleted + c.lost_lease <= cmd
        && cmd <= c.deleted + c.lost_lease + c.ack_unknown
}

#[test]
fn delete_reply_cut_at_every_byte_offset_counts_ack_unknown_never_deleted() {
    // The worker's connection: 1 `watch default`, 2 the reserve, 3 the delete.
    let reply = b"DELETED\r\n".len();
    let t0 = Instant::now();
    let results: Vec<(usize, Snapshot, LedgerReport)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..=reply)
            .map(|k| {
                s.spawn(move || {
                    let server = TestServer::start().unwrap();
                    put_all(server.addr(), "default", 60, &[b"one".to_vec()]);
                    server.set_faults(FaultPlan::nth(1, Fault::CutReply { after: 2, bytes: k }));
                    let worker = Worker::new(
                        Config {
                            exit_when_idle: Some(Duration::from_millis(1500)),
                            ..cfg(server.addr())
                        },
                        |_: &mut Job<'_>| Outcome::Done,
                    )
                    .unwrap();
                    let c = run_bounded(worker, Duration::from_secs(20));
                    (k, c, server.ledger().check())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut misclassified = 0;
    for (k, c, report) in &results {
        eprintln!(
            "  DELETED cut after {k} bytes: deleted {} ack_unknown {} reconnects {}; ledger done {} lost {}",
            c.deleted,
            c.ack_unknown,
            c.reconnects,
            report.done,
            report.lost.len()
        );
        if !consistent(c, report) {
            misclassified += 1;
        }
        assert!(report.is_clean(), "{report}");
        assert_eq!(report.done, 1, "offset {k}: the delete was carried out");
        if *k < reply {
            assert_eq!((c.deleted, c.ack_unknown), (0, 1), "offset {k}: {c}");
            assert_eq!(c.reconnects, 1, "offset {k}: {c}");
        } else {
            assert_eq!((c.deleted, c.ack_unknown), (1, 0), "offset {k}: {c}");
        }
    }
    eprintln!(
        "delete reply cut at offsets 0..={reply}: trials {}, misclassified {misclassified} [{:?}]",
        results.len(),
        t0.elapsed()
    );
    assert_eq!(misclassified, 0);
}

#[test]
fn delete_request_cut_at_every_byte_offset_keeps_counts_honest() {
    // The delete goes out as `delete 1\r\n` followed by the next reserve in the
    // same write; the handler arms the cut just before, so it counts from the
    // delete's first byte.
    let len = b"delete 1\r\n".len();
    let t0 = Instant::now();
    let results: Vec<(usize, Snapshot, LedgerReport)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..=len)
            .map(|k| {
                s.spawn(move || {
                    let server = TestServer::start().unwrap();
                    let ids = put_all(server.addr(), "default", 60, &[b"one".to_vec()]);
                    assert_eq!(ids, [1]);
                    let proxy = Arc::new(ChaosProxy::start(server.addr()).unwrap());
                    let armed = Arc::new(AtomicBool::new(false));
                    let (p2, a2) = (proxy.clone(), armed.clone());
                    let worker = Worker::new(
                        Config {
                            exit_when_idle: Some(Duration::from_millis(1500)),
                            ..cfg(proxy.addr())
                        },
                        move |_: &mut Job<'_>| {
                            if !a2.swap(true, Ordering::SeqCst) {
                                p2.add(
                                    Toxic::LimitData { bytes: k as u64 },
                                    Direction::Upstream,
                                    1.0,
                                );
                            }
                            Outcome::Done
                        },
                    )
                    .unwrap();
                    // Disarm once the cut connection is gone, so the reconnect is clean.
                    let watcher = {
                        let proxy = proxy.clone();
                        std::thread::spawn(move || {
                            let until = Instant::now() + Duration::from_secs(10);
                            while proxy.closed() == 0 && Instant::now() < until {
                                std::thread::sleep(Duration::from_millis(1));
                            }
                            proxy.clear();
                        })
                    };
                    let c = run_bounded(worker, Duration::from_secs(20));
                    watcher.join().unwrap();
                    (k, c, server.ledger().check())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut misclassified = 0;
    for (k, c, report) in &results {
        let (cmd, _) = deletes(report);
        eprintln!(
            "  delete cut after {k} bytes: deleted {} ack_unknown {} reconnects {}; ledger cmd-delete {cmd} done {} lost {}",
            c.deleted,
            c.ack_unknown,
            c.reconnects,
            report.done,
            report.lost.len()
        );
        if !consistent(c, report) {
            misclassified += 1;
        }
        assert!(report.is_clean(), "{report}");
        assert_eq!(report.done, 1, "offset {k}");
        assert!(
            c.ack_unknown >= 1,
            "offset {k}: the cut delete is unknown: {c}"
        );
        if *k < len {
            // A partial delete never reaches the server: the job came back and
            // was done on the next connection.
            assert_eq!(cmd, 1, "offset {k}");
            assert_eq!(c.deleted, 1, "offset {k}: {c}");
        }
    }
    eprintln!(
        "delete request cut at offsets 0..={len}: trials {}, misclassified {misclassified} [{:?}]",
        results.len(),
        t0.elapsed()
    );
    assert_eq!(misclassified, 0);
}

const ERROR_REPLIES: [&[u8]; 8] = [
    b"OUT_OF_MEMORY\r\n",
    b"INTERNAL_ERROR\r\n",
    b"BAD_FORMAT\r\n",
    b"UNKNOWN_COMMAND\r\n",
    b"JOB_TOO_BIG\r\n",
    b"EXPECTED_CRLF\r\n",
    b"DRAINING\r\n",
    b"BURIED 1\r\n",
];

#[test]
fn error_replies_and_garbage_to_reserve_and_delete_are_counted_and_lose_nothing() {
    let mut cases: Vec<(&str, &[u8])> = Vec::new();
    for r in ERROR_REPLIES {
        cases.push(("reserve", r));
        cases.push(("delete", r));
    }
    cases.push(("reserve", b"GARBAGE\r\n"));
    cases.push(("delete", b"GARBAGE\r\n"));
    cases.push(("reserve", b"DELETED\r\n"));
    cases.push(("delete", b"RESERVED 1 1\r\nx\r\n"));
    let n = 3usize;
    let t0 = Instant::now();
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = cases
            .iter()
            .map(|&(to, bytes)| {
                s.spawn(move || {
                    let server = TestServer::start().unwrap();
                    let bodies: Vec<Vec<u8>> =
                        (0..n).map(|i| format!("job-{i}").into_bytes()).collect();
                    let before = record(server.addr());
                    put_all(server.addr(), "default", 60, &bodies);
                    // Requests on the worker's first connection: 1 watch, 2 reserve, 3 delete.
                    let after = if to == "reserve" { 1 } else { 2 };
                    server.set_faults(FaultPlan::nth(
                        1,
                        Fault::Replace {
                            after,
                            bytes: bytes.to_vec(),
                        },
                    ));
                    let worker = Worker::new(
                        Config {
                            max_jobs: Some(n as u64),
                            ..cfg(server.addr())
                        },
                        |_: &mut Job<'_>| Outcome::Done,
                    )
                    .unwrap();
                    let c = run_bounded(worker, Duration::from_secs(20));
                    server.clear_faults();
                    let stats = record(server.addr());
                    (
                        to,
                        bytes,
                        c,
                        server.ledger().check(),
                        stats.cmd_delete - before.cmd_delete,
                    )
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    eprintln!("reply to the worker -> counters (jobs {n} each):");
    for (to, bytes, c, report, cmd_delete) in &results {
        let shown = String::from_utf8_lossy(bytes).replace("\r\n", " ");
        eprintln!(
            "  {:<28} to {to:<7} -> unexpected_replies {} ack_unknown {} reconnects {} deleted {} reserved {}; \
             ledger done {} lost {}, cmd-delete {cmd_delete}",
            shown.trim_end(),
            c.unexpected_replies,
            c.ack_unknown,
            c.reconnects,
            c.deleted,
            c.reserved,
            report.done,
            report.lost.len()
        );
        assert!(report.is_clean(), "{to} {shown}: {report}");
        assert_eq!(report.done, n as u64, "{to} {shown}: {report}");
        assert!(report.lost.is_empty());
        assert_eq!(c.deleted, n as u64, "{to} {shown}: {c}");
        assert_eq!(c.unexpected_replies, 1, "{to} {shown}: {c}");
        assert_eq!(c.reconnects, 1, "{to} {shown}: {c}");
        assert_eq!(c.io_timeouts, 0, "{to} {shown}: {c}");
        assert!(consistent(c, report), "{to} {shown}: {c} / {report}");
        if *to == "reserve" {
            assert_eq!(c.ack_unknown, 0, "{to} {shown}: {c}");
            assert_eq!(c.reserved, n as u64, "{to} {shown}: {c}");
        } else {
            // The replaced delete was not carried out: counted unknown, and the
            // job came back and was done again.
            assert_eq!(c.ack_unknown, 1, "{to} {shown}: {c}");
            assert_eq!(c.reserved, n as u64 + 1, "{to} {shown}: {c}");
        }
        assert_eq!(*cmd_delete, c.deleted, "{to} {shown}");
    }
    eprintln!(
        "cases {}, all counted, lost 0, exits normal [{:?}]",
        results.len(),
        t0.elapsed()
    );
}

#[test]
fn latency_and_tiny_segments_within_the_deadline_are_normal_operation() {
    let server = Beanstalkd::start().unwrap();
    let proxy = ChaosProxy::start(server.addr()).unwrap();
    let n = 300usize;
    let bodies: Vec<Vec<u8>> = (0..n).map(|i| format!("job-{i:04}").into_bytes()).collect();
    put_all(server.addr(), "default", 60, &bodies);
    let before = record(server.addr());
    proxy.add_slow_network();
    let worker = Worker::new(
        Config {
            concurrency: 8,
            max_jobs: Some(n as u64),
            io_timeout: Duration::from_secs(2),
            ..cfg(proxy.addr())
        },
        |_: &mut Job<'_>| Outcome::Done,
    )
    .unwrap();
    let t0 = Instant::now();
    let c = run_bounded(worker, Duration::from_secs(60));
    let took = t0.elapsed();
    let after = record(server.addr());
    eprintln!(
        "worker x8 through 50 ms ± 20 ms latency, 3-byte segments up, 1-byte down: {n} jobs in {took:?}; \
         deleted {} io_timeouts {} unexpected_replies {} reconnects {} ack_unknown {}; \
         beanstalkd cmd-delete +{}, ready {}",
        c.deleted,
        c.io_timeouts,
        c.unexpected_replies,
        c.reconnects,
        c.ack_unknown,
        after.cmd_delete - before.cmd_delete,
        after.ready
    );
    assert_eq!(c.deleted, n as u64);
    assert_eq!(c.reserved, n as u64);
    assert_eq!(c.io_timeouts, 0, "false timeouts");
    assert_eq!(c.unexpected_replies, 0, "parse errors");
    assert_eq!(c.reconnects, 0);
    assert_eq!(c.ack_unknown + c.lost_lease + c.lease_dropped, 0);
    assert_eq!(after.cmd_delete - before.cmd_delete, c.deleted);
    assert_eq!((after.ready, after.reserved), (0, 0));
}
