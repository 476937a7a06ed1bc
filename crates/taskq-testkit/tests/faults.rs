//! Each fault plan of the reference server, and the symptom a client sees.

use std::io::ErrorKind;
use std::time::{Duration, Instant};

use taskq_proto::{Command, Connection, ConnectionConfig, ConnectionError, Reply, ReplyError};
use taskq_testkit::{Fault, FaultPlan, ServerConfig, Target, TestServer};

const PUT: Command<'static> = Command::Put {
    pri: 0,
    delay: 0,
    ttr: 60,
    body: b"job",
};
const POLL: Command<'static> = Command::ReserveWithTimeout { timeout: 0 };

fn server(plan: FaultPlan) -> TestServer {
    TestServer::start_with(ServerConfig::default().faults(plan)).unwrap()
}

fn connect(server: &TestServer, io_timeout: Duration) -> Connection {
    let cfg = ConnectionConfig {
        io_timeout,
        ..ConnectionConfig::default()
    };
    Connection::connect(server.addr(), cfg).unwrap()
}

fn inserted(r: Result<Reply<'_>, ConnectionError>) -> u64 {
    match r {
        Ok(Reply::Inserted { id }) => id,
        r => panic!("{r:?}"),
    }
}

#[test]
fn close_after_n_requests() {
    let s = server(FaultPlan::all(Fault::CloseAfter { after: 2 }));
    let mut c = connect(&s, Duration::from_secs(1));
    inserted(c.request(&PUT));
    inserted(c.request(&PUT));
    let e = c.request(&PUT).unwrap_err();
    assert!(matches!(e, ConnectionError::Closed), "{e:?}");
    assert!(e.outcome_unknown() && e.breaks_connection());
    // The third request was never carried out.
    assert_eq!(s.ledger().check().added, 2);
    assert!(matches!(c.request(&PUT), Err(ConnectionError::Broken)));
}

#[test]
fn reset_after_n_requests() {
    let s = server(FaultPlan::all(Fault::ResetAfter { after: 1 }));
    let mut c = connect(&s, Duration::from_secs(1));
    inserted(c.request(&PUT));
    let e = c.request(&PUT).unwrap_err();
    match &e {
        ConnectionError::Io(io) => assert_eq!(io.kind(), ErrorKind::ConnectionReset, "{e:?}"),
        e => panic!("expected a reset, got {e:?}"),
    }
    assert!(e.outcome_unknown());
    assert_eq!(s.ledger().check().added, 1);
}

#[test]
fn cut_reply_after_k_bytes() {
    // A reserve's reply cut inside its body: the job was handed out, the client
    // cannot know which one, and it comes back when the connection closes.
    let s = server(FaultPlan::nth(
        2,
        Fault::CutReply {
            after: 0,
            bytes: 15,
        },
    ));
    let mut p = connect(&s, Duration::from_secs(1));
    let id = inserted(p.request(&PUT));
    let mut w = connect(&s, Duration::from_secs(1));
    let e = w.request(&POLL).unwrap_err();
    assert!(matches!(e, ConnectionError::Closed), "{e:?}");
    assert!(e.outcome_unknown());
    let mut w2 = connect(&s, Duration::from_secs(1));
    let until = Instant::now() + Duration::from_secs(2);
    let got = loop {
        match w2
            .request(&Command::ReserveWithTimeout { timeout: 1 })
            .unwrap()
        {
            Reply::Reserved { id, .. } => break id,
            Reply::TimedOut if Instant::now() < until => {}
            r => panic!("{r:?}"),
        }
    };
    assert_eq!(got, id);
    let r = s.ledger().check();
    assert_eq!(
        (r.handed_out_again, r.connections[&2].returned_on_close),
        (1, 1)
    );
}

#[test]
fn process_but_never_reply() {
    let s = server(FaultPlan::nth(1, Fault::NoReply { after: 2 }));
    let mut c = connect(&s, Duration::from_millis(300));
    let id = inserted(c.request(&PUT));
    assert!(matches!(c.request(&POLL).unwrap(), Reply::Reserved { .. }));
    let started = Instant::now();
    let e = c.request(&Command::Delete { id }).unwrap_err();
    assert!(e.is_timeout(), "{e:?}");
    assert!(e.outcome_unknown());
    assert!(started.elapsed() < Duration::from_millis(900));
    // The delete did happen: the worker would count it ack_unknown, the server done.
    let r = s.ledger().check();
    assert_eq!((r.done, r.connections[&1].deleted), (1, 1));
}

#[test]
fn silence_for_a_while_then_carry_on() {
    let plan = FaultPlan::all(Fault::Silence {
        after: 1,
        duration: Duration::from_millis(600),
    });
    let s = server(plan);
    // A client with a short deadline gives up: the server looks dead.
    let mut c = connect(&s, Duration::from_millis(200));
    inserted(c.request(&PUT));
    let e = c.request(&PUT).unwrap_err();
    assert!(e.is_timeout(), "{e:?}");
    // A patient client gets its answer once the silence ends.
    let mut c = connect(&s, Duration::from_secs(2));
    inserted(c.request(&PUT));
    let started = Instant::now();
    inserted(c.request(&PUT));
    assert!(
        started.elapsed() >= Duration::from_millis(550),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn delayed_replies() {
    let s = server(FaultPlan::all(Fault::DelayReplies {
        delay: Duration::from_millis(150),
    }));
    let mut c = connect(&s, Duration::from_secs(1));
    let started = Instant::now();
    inserted(c.request(&PUT));
    assert!(started.elapsed() >= Duration::from_millis(140));
    let mut hasty = connect(&s, Duration::from_millis(50));
    assert!(hasty.request(&PUT).unwrap_err().is_timeout());
}

#[test]
fn trickled_reply_hits_the_whole_reply_deadline() {
    // "INSERTED 1\r\n" at 100 ms a byte takes 1.2 s: bytes keep coming, yet a
    // 300 ms deadline for the whole reply must fire long before the end.
    let s = server(FaultPlan::all(Fault::Trickle {
        after: 0,
        interval: Duration::from_millis(100),
    }));
    let mut c = connect(&s, Duration::from_millis(300));
    let started = Instant::now();
    let e = c.request(&PUT).unwrap_err();
    assert!(e.is_timeout(), "{e:?}");
    assert!(
        started.elapsed() < Duration::from_millis(1000),
        "{:?}",
        started.elapsed()
    );
    // With time enough, the trickled reply parses.
    let mut c = connect(&s, Duration::from_secs(3));
    inserted(c.request(&PUT));
    assert!(c.io_counts().reads >= 5);
}

#[test]
fn garbage_and_unsolicited_lines() {
    let plan = FaultPlan::nth(
        1,
        Fault::Inject {
            after: 0,
            bytes: b"HELLO THERE\r\n".to_vec(),
        },
    )
    .with(
        Target::Nth(2),
        Fault::Inject {
            after: 0,
            bytes: b"DELETED\r\n".to_vec(),
        },
    )
    .with(
        Target::Nth(3),
        Fault::Inject {
            after: 0,
            bytes: b"INSERTED 999\r\n".to_vec(),
        },
    );
    let s = server(plan);
    let mut c = connect(&s, Duration::from_secs(1));
    let e = c.request(&PUT).unwrap_err();
    assert!(
        matches!(e, ConnectionError::Protocol(ReplyError::UnknownReply)),
        "{e:?}"
    );
    let mut c = connect(&s, Duration::from_secs(1));
    let e = c.request(&PUT).unwrap_err();
    assert!(
        matches!(
            e,
            ConnectionError::Protocol(ReplyError::UnexpectedReply { word: "DELETED" })
        ),
        "{e:?}"
    );
    // A plausible unsolicited line is taken for the answer. The real reply
    // that follows is nobody's: if it came in the same read, the session
    // breaks at once and the next request is refused unsent (`Broken`); if
    // it comes later, the next request reads it and fails on it. Either
    // way the next request gets no answer of another's.
    let mut c = connect(&s, Duration::from_secs(1));
    assert_eq!(inserted(c.request(&PUT)), 999);
    let e = c.request(&POLL).unwrap_err();
    assert!(
        matches!(
            e,
            ConnectionError::Broken
                | ConnectionError::Protocol(ReplyError::UnexpectedReply { word: "INSERTED" })
        ),
        "{e:?}"
    );
}

#[test]
fn refuse_connections_for_a_while() {
    let s = TestServer::start().unwrap();
    let mut open = connect(&s, Duration::from_secs(1));
    s.refuse_for(Duration::from_millis(400));
    let cfg = ConnectionConfig {
        connect_timeout: Duration::from_millis(200),
        ..ConnectionConfig::default()
    };
    match Connection::connect(s.addr(), cfg) {
        Err(ConnectionError::NotSent(e)) => assert_eq!(e.kind(), ErrorKind::ConnectionRefused),
        r => panic!("{r:?}"),
    }
    // Open connections keep working.
    inserted(open.request(&PUT));
    let until = Instant::now() + Duration::from_secs(3);
    loop {
        match Connection::connect(s.addr(), cfg) {
            Ok(mut c) => {
                inserted(c.request(&PUT));
                break;
            }
            Err(_) if Instant::now() < until => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("still refused: {e}"),
        }
    }
}

#[test]
fn faults_switch_at_run_time_on_open_connections() {
    let s = TestServer::start().unwrap();
    let mut c = connect(&s, Duration::from_secs(1));
    inserted(c.request(&PUT));
    s.set_faults(FaultPlan::all(Fault::CloseAfter { after: 1 }));
    inserted(c.request(&PUT));
    assert!(matches!(c.request(&PUT), Err(ConnectionError::Closed)));
    s.clear_faults();
    let mut c = connect(&s, Duration::from_secs(1));
    for _ in 0..5 {
        inserted(c.request(&PUT));
    }
}

/// Runs a fixed request pattern over reconnecting clients; returns what happened.
fn random_run(seed: u64) -> Vec<String> {
    let s = server(FaultPlan::random(seed, 0.2));
    let mut log = Vec::new();
    let mut c = connect(&s, Duration::from_millis(1500));
    for _ in 0..40 {
        if c.is_broken() {
            c = connect(&s, Duration::from_millis(1500));
            log.push("reconnect".to_string());
        }
        log.push(match c.request(&Command::Stats) {
            Ok(_) => "ok".into(),
            Err(e) if e.is_timeout() => "timeout".into(),
            Err(ConnectionError::Closed) => "closed".into(),
            Err(ConnectionError::Io(e)) => format!("io {:?}", e.kind()),
            Err(ConnectionError::Protocol(e)) => format!("protocol {e}"),
            Err(e) => format!("other {e}"),
        });
    }
    assert_eq!(s.ledger().check().seed, Some(seed));
    log
}

#[test]
fn random_faults_replay_from_their_seed() {
    let seed = 0x5eed_0001;
    let first = random_run(seed);
    assert!(
        first.iter().any(|l| l != "ok" && l != "reconnect"),
        "{first:?}"
    );
    assert!(first.iter().any(|l| l == "ok"), "{first:?}");
    assert_eq!(first, random_run(seed), "seed {seed} did not replay");
}

/// A reconnecting producer and worker under random faults: whatever the faults
/// do to the connections, the server's own record stays whole (nothing lost
/// once drained, nothing done that was not put, nothing held twice).
#[test]
fn random_faults_leave_the_record_whole() {
    let plan = FaultPlan::random_from_env(0.05);
    let s = server(plan);
    let io = Duration::from_millis(800);
    let mut p = connect(&s, io);
    let mut put_ok = 0;
    while put_ok < 150 {
        if p.is_broken() {
            p = connect(&s, io);
        }
        if p.request(&PUT).is_ok() {
            put_ok += 1;
        }
    }
    let mut w = connect(&s, io);
    let mut idle = 0;
    while idle < 3 {
        if w.is_broken() {
            w = connect(&s, io);
        }
        let id = match w.request(&POLL) {
            Ok(Reply::Reserved { id, .. }) => id,
            Ok(Reply::TimedOut) => {
                idle += 1;
                continue;
            }
            _ => continue,
        };
        idle = 0;
        let _ = w.request(&Command::Delete { id });
    }
    // Drain without faults: jobs whose delete never reached the server, or
    // whose reserving connection died, come back here.
    s.clear_faults();
    drop((p, w));
    let mut w = connect(&s, Duration::from_secs(2));
    loop {
        match w
            .request(&Command::ReserveWithTimeout { timeout: 1 })
            .unwrap()
        {
            Reply::Reserved { id, .. } => {
                assert_eq!(w.request(&Command::Delete { id }).unwrap(), Reply::Deleted)
            }
            Reply::TimedOut => break,
            r => panic!("{r:?}"),
        }
    }
    let r = s.ledger().check();
    assert!(r.is_clean(), "{r}");
    assert!(r.acknowledged >= 150 && r.done == r.added, "{r}");
    assert_eq!(s.job_count(), 0);
}

/// A job of exactly the maximum size goes through; the server's buffer grows
/// to the limit and no further, and a bigger one is discarded unread.
#[test]
fn jobs_at_and_over_the_maximum_size() {
    let s = TestServer::start_with(ServerConfig::default().max_job_size(100_000)).unwrap();
    let cfg = ConnectionConfig {
        limits: taskq_proto::Limits {
            max_job_size: 300_000,
            ..taskq_proto::Limits::default()
        },
        ..ConnectionConfig::default()
    };
    let mut c = Connection::connect(s.addr(), cfg).unwrap();
    let body = vec![b'q'; 100_000];
    let put = |body| Command::Put {
        pri: 0,
        delay: 0,
        ttr: 60,
        body,
    };
    inserted(c.request(&put(&body)));
    let big = vec![b'q'; 250_000];
    assert_eq!(c.request(&put(&big)).unwrap(), Reply::JobTooBig);
    match c.request(&POLL).unwrap() {
        Reply::Reserved { body: got, .. } => assert_eq!(got.len(), 100_000),
        r => panic!("{r:?}"),
    }
}

#[test]
fn replace_answers_without_carrying_out() {
    // Request 2 (a put) gets `BURIED 99` instead of being run; request 3 (a
    // reserve) gets `DELETED`; the connection goes on as normal afterwards.
    let s = server(
        FaultPlan::none()
            .with(
                Target::All,
                Fault::Replace {
                    after: 1,
                    bytes: b"BURIED 99\r\n".to_vec(),
                },
            )
            .with(
                Target::All,
                Fault::Replace {
                    after: 2,
                    bytes: b"DELETED\r\n".to_vec(),
                },
            ),
    );
    let mut c = connect(&s, Duration::from_secs(1));
    let first = inserted(c.request(&PUT));
    match c.request(&PUT) {
        Ok(Reply::InsertedBuried { id: 99 }) => {}
        r => panic!("{r:?}"),
    }
    let e = c.request(&POLL).unwrap_err();
    assert!(
        matches!(
            e,
            ConnectionError::Protocol(ReplyError::UnexpectedReply { word: "DELETED" })
        ),
        "{e:?}"
    );
    // The replaced put queued nothing; the replaced reserve handed nothing out.
    let report = s.ledger().check();
    assert_eq!((report.added, report.acknowledged), (1, 1), "{report}");
    assert_eq!(s.job_count(), 1);
    let t = report.totals().unwrap();
    assert_eq!((t.requests, t.put, t.reserved), (3, 1, 0), "{report}");
    assert!(s.ledger().job(first).is_some());
    assert!(s.ledger().job(99).is_none());
    // A fresh connection is served normally.
    let mut c = connect(&s, Duration::from_secs(1));
    match c.request(&POLL) {
        Ok(Reply::Reserved { id, .. }) => assert_eq!(id, first),
        r => panic!("{r:?}"),
    }
}

#[test]
fn bury_put_keeps_the_job_buried_and_says_so() {
    let s = server(FaultPlan::all(Fault::BuryPut { after: 1 }));
    let mut c = connect(&s, Duration::from_secs(1));
    let first = inserted(c.request(&PUT));
    let buried = match c.request(&PUT) {
        Ok(Reply::InsertedBuried { id }) => id,
        r => panic!("{r:?}"),
    };
    assert_eq!(buried, first + 1);
    // The buried job is in the queue and acknowledged, but not ready.
    let report = s.ledger().check();
    assert_eq!((report.added, report.acknowledged), (2, 2), "{report}");
    assert_eq!(s.job_count(), 2);
    match c.request(&Command::StatsJob { id: buried }) {
        Ok(Reply::Ok { yaml }) => {
            let st = taskq_proto::JobStats::parse(yaml).unwrap();
            assert_eq!(st.state, "buried");
        }
        r => panic!("{r:?}"),
    }
    match c.request(&POLL) {
        Ok(Reply::Reserved { id, .. }) => assert_eq!(id, first),
        r => panic!("{r:?}"),
    }
    assert!(matches!(c.request(&POLL), Ok(Reply::TimedOut)));
    // Kicked, it runs like any other job.
    assert!(matches!(
        c.request(&Command::KickJob { id: buried }),
        Ok(Reply::KickedJob)
    ));
    match c.request(&POLL) {
        Ok(Reply::Reserved { id, .. }) => assert_eq!(id, buried),
        r => panic!("{r:?}"),
    }
}
