//! The ledger: exact counts on a clean run, and checks that fail when a job is
//! lost, done unexpectedly, or held by two connections at once.

use std::time::Duration;

use taskq_proto::{Command, Connection, ConnectionConfig, ConnectionError, Reply};
use taskq_testkit::{Defects, Fault, FaultPlan, ServerConfig, TestServer};

fn connect(server: &TestServer) -> Connection {
    Connection::connect(server.addr(), ConnectionConfig::default()).unwrap()
}

fn put(c: &mut Connection, body: &[u8], ttr: u32) -> u64 {
    match c
        .request(&Command::Put {
            pri: 0,
            delay: 0,
            ttr,
            body,
        })
        .unwrap()
    {
        Reply::Inserted { id } => id,
        r => panic!("{r:?}"),
    }
}

fn reserve(c: &mut Connection) -> u64 {
    match c
        .request(&Command::ReserveWithTimeout { timeout: 0 })
        .unwrap()
    {
        Reply::Reserved { id, .. } => id,
        r => panic!("{r:?}"),
    }
}

#[test]
fn clean_run_counts_exactly() {
    let server = TestServer::start().unwrap();
    let mut producer = connect(&server);
    let mut worker = connect(&server);
    for i in 0..50u32 {
        put(&mut producer, &i.to_le_bytes(), 60);
    }
    for _ in 0..50 {
        let id = reserve(&mut worker);
        assert_eq!(
            worker.request(&Command::Delete { id }).unwrap(),
            Reply::Deleted
        );
    }
    assert_eq!(
        worker.request(&Command::Delete { id: 1 }).unwrap(),
        Reply::NotFound
    );
    let r = server.ledger().check();
    assert!(r.is_clean(), "{r}");
    assert_eq!((r.added, r.acknowledged, r.done), (50, 50, 50));
    assert_eq!(r.handed_out_again, 0);
    let p = r.connections[&1];
    let w = r.connections[&2];
    assert_eq!((p.put, p.requests, p.reserved), (50, 50, 0));
    assert_eq!(
        (w.reserved, w.deleted, w.delete_not_found, w.cmd_delete),
        (50, 50, 1, 51)
    );
    assert_eq!(r.totals().unwrap().requests, 50 + 101);
    let h = server.ledger().job(1).unwrap();
    assert_eq!((h.put_by, h.acknowledged, h.handed_out), (1, true, 1));
    assert_eq!(h.deleted.map(|d| d.0), Some(2));
}

#[test]
fn a_job_nobody_finished_is_reported_lost() {
    let server = TestServer::start().unwrap();
    let mut c = connect(&server);
    let a = put(&mut c, b"a", 60);
    let b = put(&mut c, b"b", 60);
    assert_eq!(reserve(&mut c), a);
    assert_eq!(
        c.request(&Command::Delete { id: a }).unwrap(),
        Reply::Deleted
    );
    let r = server.ledger().check();
    assert_eq!(r.lost, vec![b]);
    assert!(!r.is_clean());
}

#[test]
fn a_server_that_drops_released_jobs_is_caught() {
    let cfg = ServerConfig::default().defects(Defects::none().lose_released_jobs());
    let server = TestServer::start_with(cfg).unwrap();
    let mut c = connect(&server);
    let id = put(&mut c, b"x", 60);
    assert_eq!(reserve(&mut c), id);
    let release = Command::Release {
        id,
        pri: 0,
        delay: 0,
    };
    assert_eq!(c.request(&release).unwrap(), Reply::Released);
    // The queue looks empty, as if the job were done...
    assert_eq!(
        c.request(&Command::ReserveWithTimeout { timeout: 0 })
            .unwrap(),
        Reply::TimedOut
    );
    // ...but the ledger knows it was never deleted.
    let r = server.ledger().check();
    assert_eq!(r.lost, vec![id]);
    assert_eq!(r.connections[&1].released, 1);
}

#[test]
fn a_job_held_by_two_connections_is_caught() {
    let cfg = ServerConfig::default().defects(Defects::none().hand_out_held_jobs());
    let server = TestServer::start_with(cfg).unwrap();
    let mut a = connect(&server);
    let mut b = connect(&server);
    let id = put(&mut a, b"x", 60);
    assert_eq!(reserve(&mut a), id);
    match b.request(&Command::ReserveJob { id }).unwrap() {
        Reply::Reserved { id: got, .. } => assert_eq!(got, id),
        r => panic!("{r:?}"),
    }
    let r = server.ledger().check();
    assert_eq!(r.double_held, vec![id]);
    assert!(!r.is_clean());

    // Without the defect the same requests hand out nothing twice.
    let server = TestServer::start().unwrap();
    let mut a = connect(&server);
    let mut b = connect(&server);
    let id = put(&mut a, b"x", 60);
    assert_eq!(reserve(&mut a), id);
    assert_eq!(
        b.request(&Command::ReserveJob { id }).unwrap(),
        Reply::NotFound
    );
    assert!(server.ledger().check().double_held.is_empty());
}

#[test]
fn a_job_done_that_the_ledger_never_saw_put_is_unexpected() {
    let server = TestServer::start().unwrap();
    let mut c = connect(&server);
    let id = put(&mut c, b"old", 60);
    server.ledger().clear();
    assert_eq!(c.request(&Command::Delete { id }).unwrap(), Reply::Deleted);
    let r = server.ledger().check();
    assert_eq!(r.unexpected, vec![id]);
    assert!(!r.is_clean());
}

#[test]
fn leases_expire_return_on_close_and_count_per_connection() {
    let server = TestServer::start().unwrap();
    let mut p = connect(&server);
    let short = put(&mut p, b"short", 1);
    let long = put(&mut p, b"long", 60);

    let mut w = connect(&server);
    assert_eq!(reserve(&mut w), short);
    assert_eq!(reserve(&mut w), long);
    assert_eq!(
        w.request(&Command::Touch { id: long }).unwrap(),
        Reply::Touched
    );
    std::thread::sleep(Duration::from_millis(1300));
    // The lease on `short` ran out: the job went back to ready.
    assert_eq!(
        w.request(&Command::Touch { id: short }).unwrap(),
        Reply::NotFound
    );
    // Another worker takes it; now the first one's delete finds nothing. (Had
    // nobody taken it, beanstalkd would delete the ready job: DELETED.)
    let mut w2 = connect(&server);
    assert_eq!(reserve(&mut w2), short);
    assert_eq!(
        w.request(&Command::Delete { id: short }).unwrap(),
        Reply::NotFound
    );
    drop(w); // `long` goes back when the connection closes.
    let until = std::time::Instant::now() + Duration::from_secs(2);
    while server.open_connections() > 2 && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(reserve(&mut w2), long);
    for id in [short, long] {
        assert_eq!(w2.request(&Command::Delete { id }).unwrap(), Reply::Deleted);
    }
    let r = server.ledger().check();
    assert!(r.is_clean(), "{r}");
    assert_eq!((r.expired, r.handed_out_again, r.done), (1, 2, 2));
    let w = r.connections[&2];
    assert!(w.closed);
    assert_eq!(
        (w.reserved, w.touched, w.touch_not_found, w.expired),
        (2, 1, 1, 1)
    );
    assert_eq!(
        (
            w.cmd_delete,
            w.deleted,
            w.delete_not_found,
            w.returned_on_close
        ),
        (1, 0, 1, 1)
    );
    assert_eq!(r.connections[&3].deleted, 2);
}

#[test]
fn a_put_whose_reply_was_cut_is_not_acknowledged() {
    let cfg =
        ServerConfig::default().faults(FaultPlan::nth(1, Fault::CutReply { after: 0, bytes: 4 }));
    let server = TestServer::start_with(cfg).unwrap();
    let mut c = connect(&server);
    let err = c
        .request(&Command::Put {
            pri: 0,
            delay: 0,
            ttr: 60,
            body: b"x",
        })
        .unwrap_err();
    assert!(matches!(err, ConnectionError::Closed), "{err:?}");
    assert!(err.outcome_unknown());
    let r = server.ledger().check();
    // The job is in the queue, but its producer never learned so.
    assert_eq!((r.added, r.acknowledged), (1, 0));
    assert_eq!(r.unacknowledged_left, vec![1]);
    assert!(r.lost.is_empty());
    assert_eq!(server.job_count(), 1);
}

/// A lease that ran out while nothing ran on the server is counted expired,
/// as beanstalkd's timer counts it, both when the record is read and when
/// its holder closes afterwards: never as given back by the close.
#[test]
fn a_lease_run_out_in_a_quiet_spell_is_counted_expired_not_returned_on_close() {
    let server = TestServer::start().unwrap();
    let mut c = connect(&server);
    let id = put(&mut c, b"a", 1);
    assert_eq!(reserve(&mut c), id);
    // No request of anyone's for longer than the 1 s TTR.
    std::thread::sleep(Duration::from_millis(1500));
    let r = server.ledger().check();
    assert_eq!(r.expired, 1, "{r:?}");
    let holder = server.ledger().job(id).unwrap().holder;
    assert!(holder.is_none(), "the lease ran out: {holder:?}");
    drop(c);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while server.open_connections() > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(server.open_connections(), 0);
    let r = server.ledger().check();
    let totals = r.totals().unwrap();
    assert_eq!((totals.expired, totals.returned_on_close), (1, 0), "{r:?}");
}

/// A client that hangs up while its reserve waits, after sending one more
/// command, is seen gone as beanstalkd sees it: its connection ends, and
/// no job is handed to it afterwards.
#[test]
fn a_peer_that_closes_behind_a_waiting_reserve_is_seen_gone() {
    use std::io::Write;
    let server = TestServer::start().unwrap();
    let waiting = || {
        let mut c = connect(&server);
        match c.request(&Command::Stats).unwrap() {
            Reply::Ok { yaml } => {
                taskq_proto::ServerStats::parse(yaml)
                    .unwrap()
                    .current_waiting
            }
            r => panic!("{r:?}"),
        }
    };
    let mut a = std::net::TcpStream::connect(server.addr()).unwrap();
    a.write_all(b"reserve\r\n").unwrap();
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while waiting() != 1 {
        assert!(
            std::time::Instant::now() < until,
            "the reserve never waited"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // A command behind the waiting reserve, then the hang-up.
    a.write_all(b"list-tube-used\r\n").unwrap();
    drop(a);
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while server.open_connections() > 0 {
        assert!(
            std::time::Instant::now() < until,
            "the closed peer still waits in its reserve"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // A job put now is not handed to it.
    let mut c = connect(&server);
    let id = put(&mut c, b"x", 60);
    assert_eq!(reserve(&mut c), id);
}
