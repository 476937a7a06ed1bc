//! The shared producer on beanstalkd: many tasks on one connection, each
//! getting exactly its own reply, checked against the server's own record
//! (every job reserved back and compared with the body its caller put),
//! through broken connections, a stalled server, dropped futures and tube
//! changes while puts are in flight.
#![cfg(feature = "tokio")]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::mpsc;
use std::time::Duration;

use common::shared::{
    check_against_record, cut_run, drop_one_before_its_write_then_put, put_from_tasks, run,
    stalled_run, tube_of, Record,
};
use common::{Act, FakePeer};
use taskq_producer::{Error, PutOptions, PutOutcome, SharedProducer};
use taskq_testkit::{Beanstalkd, ChaosProxy, Direction, Toxic};

/// Every job of `tubes` tubes on the server, reserved and deleted.
fn server_record(addr: std::net::SocketAddr, tubes: usize) -> Record {
    let mut jobs = Record::new();
    for t in 0..tubes {
        let tube = tube_of(t, tubes);
        for (id, body) in common::drain(addr, &tube) {
            assert!(
                jobs.insert(id, (tube.clone(), body)).is_none(),
                "id {id} twice"
            );
        }
    }
    jobs
}

#[test]
fn two_hundred_fifty_six_tasks_each_get_their_own_ids_on_one_connection() {
    let server = Beanstalkd::start().unwrap();
    let addr = server.addr();
    let (outcomes, connects) = run(async {
        let p = SharedProducer::connect(&addr.to_string()).await.unwrap();
        let outcomes = put_from_tasks(&p, 256, 100, 4).await;
        (outcomes, p.connects())
    });
    assert_eq!(connects, 1, "one connection for every caller");
    let jobs = server_record(addr, 4);
    let (acked, unknown) = check_against_record(&outcomes, &jobs);
    assert_eq!((acked, unknown, jobs.len()), (25_600, 0, 25_600));
}

#[test]
fn tube_changes_in_flight_insert_a_use_only_where_the_tube_changes() {
    let peer = FakePeer::start(vec![Act::Serve]);
    let addr = peer.addr.to_string();
    let ids = run(async {
        let p = SharedProducer::connect(&addr).await.unwrap();
        // Handed in together, before the driver writes: one write, in order.
        let (a, b, c, d) = tokio::join!(
            p.put("a", b"1", PutOptions::default()),
            p.put("a", b"2", PutOptions::default()),
            p.put("b", b"3", PutOptions::default()),
            p.put("a", b"4", PutOptions::default()),
        );
        [a, b, c, d].map(|r| r.unwrap().get())
    });
    assert_eq!(ids, [1, 2, 3, 4], "each caller its own reply, in order");
    let cmds: Vec<String> = peer
        .commands(0)
        .into_iter()
        .filter(|l| l.starts_with("use") || l.starts_with("put"))
        .map(|l| l.split(' ').take(2).collect::<Vec<_>>().join(" "))
        .collect();
    assert_eq!(
        cmds,
        ["use a", "put 1024", "put 1024", "use b", "put 1024", "use a", "put 1024"]
    );
}

#[test]
fn replies_cut_off_mid_run_leave_every_acknowledged_job_its_callers() {
    replies_cut_off(Toxic::LimitData { bytes: 3_000 });
}

#[test]
fn replies_reset_mid_run_leave_every_acknowledged_job_its_callers() {
    replies_cut_off(Toxic::ResetAfterData { bytes: 3_000 });
}

fn replies_cut_off(cut: Toxic) {
    let server = Beanstalkd::start().unwrap();
    let proxy = ChaosProxy::start(server.addr()).unwrap();
    // Every connection closes (or is reset) after 3,000 bytes of replies
    // (about 230 `INSERTED`s): the puts then owed are unknown, the rest go
    // on anew.
    let url = proxy.addr().to_string();
    let (outcomes, connects) = cut_run(&proxy, &url, (Direction::Downstream, cut), 64, 60);
    let jobs = server_record(server.addr(), 2);
    let (acked, unknown) = check_against_record(&outcomes, &jobs);
    eprintln!(
        "acked {acked}, unknown {unknown}, connects {connects}, stored {}",
        jobs.len()
    );
    // Each connection passes at most 3,000 / 12 = 250 replies and leaves at
    // most 64 puts unknown: 3,840 puts need at least 13 connections.
    assert!(connects >= 12, "{connects} connects");
    assert!(acked > 0);
}

#[test]
fn requests_cut_off_mid_put_are_unknown_or_not_sent_never_misplaced() {
    requests_cut_off(Toxic::LimitData { bytes: 5_000 });
}

#[test]
fn requests_reset_mid_put_are_unknown_or_not_sent_never_misplaced() {
    requests_cut_off(Toxic::ResetAfterData { bytes: 5_000 });
}

fn requests_cut_off(cut: Toxic) {
    let server = Beanstalkd::start().unwrap();
    let proxy = ChaosProxy::start(server.addr()).unwrap();
    // Each connection forwards 5,000 bytes of requests, then closes (or is
    // reset): the last put is cut mid-line or mid-body.
    let url = proxy.addr().to_string();
    let (outcomes, connects) = cut_run(&proxy, &url, (Direction::Upstream, cut), 32, 50);
    let jobs = server_record(server.addr(), 2);
    let (acked, unknown) = check_against_record(&outcomes, &jobs);
    eprintln!("acked {acked}, unknown {unknown}, connects {connects}");
    // A connection carries at most 5,000 / 35 = 142 puts and leaves at most
    // 32 unknown: 1,600 puts need at least 10 connections.
    assert!(connects >= 10, "{connects} connects");
    assert!(acked > 0);
}

#[test]
fn a_stalled_server_holds_puts_back_within_the_bound_and_they_go_on_after() {
    let server = Beanstalkd::start().unwrap();
    let addr = server.addr();
    // SIGSTOP: the server reads nothing and answers nothing until SIGCONT.
    // Puts written wait for replies, the rest for room.
    let (outcomes, most_waiting) = stalled_run(
        &addr.to_string(),
        32,
        || server.signal("STOP").unwrap(),
        || server.signal("CONT").unwrap(),
    );
    assert_eq!(most_waiting, 32, "at most max_queued_puts wait");
    let mut jobs = server_record(addr, 1);
    jobs.retain(|_, (_, b)| b != b"before");
    let (acked, unknown) = check_against_record(&outcomes, &jobs);
    assert_eq!(
        (acked, unknown, jobs.len()),
        (400, 0, 400),
        "every put went on once the server did"
    );
}

#[test]
fn a_put_dropped_before_its_write_is_never_sent() {
    let server = Beanstalkd::start().unwrap();
    let kept = drop_one_before_its_write_then_put(&server.addr().to_string());
    let jobs = server_record(server.addr(), 1);
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[&kept].1, b"kept");
}

#[test]
fn a_put_dropped_after_its_write_keeps_its_reply_from_the_next_caller() {
    // A peer that holds the first put's reply until told, so the future is
    // surely dropped while its reply is owed.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (read_tx, read_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let peer = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut w = s.try_clone().unwrap();
        let mut r = BufReader::new(s);
        for id in 1..=2 {
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            let n: usize = line.trim_end().rsplit(' ').next().unwrap().parse().unwrap();
            let mut body = vec![0; n + 2];
            r.read_exact(&mut body).unwrap();
            if id == 1 {
                read_tx.send(()).unwrap();
                go_rx.recv_timeout(Duration::from_secs(20)).unwrap();
            }
            w.write_all(format!("INSERTED {id}\r\n").as_bytes())
                .unwrap();
        }
    });
    let second = run(async {
        let p = SharedProducer::connect(&addr).await.unwrap();
        {
            let first = tokio::spawn({
                let p = p.clone();
                async move { p.put("default", b"first", PutOptions::default()).await }
            });
            tokio::task::spawn_blocking(move || read_rx.recv_timeout(Duration::from_secs(20)))
                .await
                .unwrap()
                .expect("the peer read the first put");
            first.abort();
            assert!(first.await.unwrap_err().is_cancelled());
        }
        go_tx.send(()).unwrap();
        let second = p.put("default", b"second", PutOptions::default()).await;
        (second.map(|id| id.get()), p.waiting(), p.connects())
    });
    peer.join().unwrap();
    assert_eq!(
        second.0.unwrap(),
        2,
        "the dropped put's reply (1) went to nobody"
    );
    assert_eq!(
        (second.1, second.2),
        (0, 1),
        "nothing waits, one connection"
    );
}

#[test]
fn a_batch_gets_each_jobs_own_outcome() {
    let server = Beanstalkd::start().unwrap();
    let addr = server.addr();
    let out = run(async {
        let p = SharedProducer::connect(&addr.to_string()).await.unwrap();
        let bodies: Vec<Vec<u8>> = (0..300).map(|i| format!("b{i}").into_bytes()).collect();
        let mut out = vec![PutOutcome::NotSent; 300];
        let other = p.put_batch("tube0", &bodies, PutOptions::default(), &mut out);
        let alone = p.put("tube1", b"alone", PutOptions::default());
        let (r, alone) = tokio::join!(other, alone);
        assert_eq!(r.unwrap().inserted, 300);
        alone.unwrap();
        out
    });
    let jobs = server_record(addr, 2);
    for (i, o) in out.iter().enumerate() {
        let id = o.id().expect("inserted").get();
        assert_eq!(
            jobs[&id],
            ("tube0".to_owned(), format!("b{i}").into_bytes())
        );
    }
    assert_eq!(jobs.len(), 301);
}

/// beanstalkd answers a put line it refuses with `BAD_FORMAT` before it
/// reads the body, and then the body read as a command with
/// `UNKNOWN_COMMAND`: two replies where one was owed. With puts from many
/// callers in flight on the connection, no later put may take the body's
/// reply as its own, nor its neighbour's `INSERTED`.
#[test]
fn a_put_refused_at_its_line_hands_no_other_caller_a_reply() {
    use taskq_proto::{Command, Connection, ConnectionConfig, Reply};
    use taskq_testkit::{Fault, FaultPlan, ServerConfig, TestServer};
    let server = TestServer::start_with(ServerConfig::default().faults(FaultPlan::nth(
        1,
        Fault::Replace {
            after: 0,
            bytes: b"BAD_FORMAT\r\nUNKNOWN_COMMAND\r\n".to_vec(),
        },
    )))
    .unwrap();
    let ledger = server.ledger();
    let addr = server.addr();
    let bodies: Vec<Vec<u8>> = (0..6).map(|i| format!("job-{i}").into_bytes()).collect();
    let (out, r) = run(async {
        let p = SharedProducer::connect(&addr.to_string()).await.unwrap();
        let mut out = vec![PutOutcome::NotSent; bodies.len()];
        let r = p
            .put_batch("default", &bodies, PutOptions::default(), &mut out)
            .await;
        (out, r.map_err(|e| e.to_string()))
    });
    eprintln!("{out:?} {r:?}");
    assert_eq!(
        out[0],
        PutOutcome::Rejected(taskq_producer::Rejection::BadFormat)
    );
    let mut conn = Connection::connect(addr, ConnectionConfig::default()).unwrap();
    let mut held = std::collections::HashMap::new();
    for id in 1..=ledger.check().added {
        match conn.request(&Command::Peek { id }).unwrap() {
            Reply::Found { body, .. } => {
                held.insert(body.to_vec(), id);
            }
            r => panic!("peek {id}: {r:?}"),
        }
    }
    let mut unknown = 0;
    for (i, o) in out.iter().enumerate() {
        match o {
            PutOutcome::Inserted(id) => assert_eq!(held.get(&bodies[i]), Some(&id.get()), "{i}"),
            PutOutcome::Rejected(_) => assert!(
                !held.contains_key(&bodies[i]),
                "put {i} said rejected, yet it is queued"
            ),
            PutOutcome::Unknown => unknown += 1,
            PutOutcome::NotSent => assert!(!held.contains_key(&bodies[i]), "{i}"),
        }
    }
    let acknowledged = out.iter().filter(|o| o.id().is_some()).count();
    assert!(
        held.len() - acknowledged <= unknown,
        "queued but not acknowledged: {}, unknown: {unknown}",
        held.len() - acknowledged
    );
}

/// A bound smaller than a batch's window (8 puts, or bytes for three of
/// its bodies), and three batches at once each larger than the bound: a
/// batch never waits on room that only its own outcomes give back, so each
/// ends, and every job holds its own body in the server's record.
#[test]
fn batches_larger_than_the_bound_go_on_in_windows_that_fit_it() {
    let server = Beanstalkd::start().unwrap();
    let addr = server.addr();
    let outs = run(async {
        let p = taskq_producer::Producer::builder()
            .max_queued_puts(8)
            .connect_shared(&addr.to_string())
            .await
            .unwrap();
        let q = taskq_producer::Producer::builder()
            .max_queued_bytes(3 * 1200)
            .connect_shared(&addr.to_string())
            .await
            .unwrap();
        let batch = |p: SharedProducer, tube: &'static str, size: usize| async move {
            let bodies: Vec<Vec<u8>> = (0..100)
                .map(|i| format!("{tube}-{i:04}-{}", "x".repeat(size)).into_bytes())
                .collect();
            let mut out = vec![PutOutcome::NotSent; 100];
            let r = p
                .put_batch(tube, &bodies, PutOptions::default(), &mut out)
                .await;
            assert_eq!(r.unwrap().inserted, 100, "{tube}");
            (tube, bodies, out)
        };
        let all = async {
            tokio::join!(
                batch(p.clone(), "tube0", 10),
                batch(p.clone(), "tube1", 10),
                batch(q.clone(), "tube2", 1000),
            )
        };
        let (a, b, c) = tokio::time::timeout(Duration::from_secs(20), all)
            .await
            .expect("every batch ends: none waits on itself");
        vec![a, b, c]
    });
    let jobs = server_record(addr, 3);
    assert_eq!(jobs.len(), 300);
    for (tube, bodies, out) in outs {
        for (body, o) in bodies.iter().zip(&out) {
            let id = o.id().expect("inserted").get();
            assert_eq!(jobs[&id], (tube.to_owned(), body.clone()));
        }
    }
}

#[test]
fn bad_input_is_refused_before_anything_is_sent() {
    let server = Beanstalkd::start().unwrap();
    let addr = server.addr();
    run(async {
        let p = SharedProducer::connect(&addr.to_string()).await.unwrap();
        let r = p.put("bad tube", b"x", PutOptions::default()).await;
        assert!(matches!(r, Err(Error::Invalid(_))), "{r:?}");
        let big = vec![0; p.max_job_size() + 1];
        let r = p.put("t", &big, PutOptions::default()).await;
        assert!(matches!(r, Err(Error::Invalid(_))), "{r:?}");
        assert_eq!(p.waiting(), 0);
    });
    // The server's own count of what reached it: no put, and no use of
    // either tube, whichever tube the refused puts named.
    let mut c = taskq_proto::Connection::connect(addr, Default::default()).unwrap();
    let (puts, uses) = match c.request(&taskq_proto::Command::Stats).unwrap() {
        taskq_proto::Reply::Ok { yaml } => {
            let s = taskq_proto::ServerStats::parse(yaml).unwrap();
            (s.cmd_put, s.cmd_use)
        }
        r => panic!("stats: {r:?}"),
    };
    assert_eq!((puts, uses), (0, 0), "cmd-put and cmd-use");
}
