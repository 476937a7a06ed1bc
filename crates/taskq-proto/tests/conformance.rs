//! Conformance: every command against a real beanstalkd on a free loopback port,
//! and every reply kind the server can be made to produce, decoded.
//!
//! Not produced here, because no client can force them: `BURIED <id>` to a put
//! and bare `BURIED` to a release (the server must be short of memory),
//! `OUT_OF_MEMORY` and `INTERNAL_ERROR`. The codec tests cover their decoding.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use taskq_proto::yaml::items;
use taskq_proto::{
    Command as C, CommandKind as K, Connection, ConnectionConfig, ConnectionError, EncodeError,
    JobStats, Limits, Reply as R, ServerStats, TubeStats,
};
use taskq_testkit::Beanstalkd;

const BODY: &[u8] = b"job\r\nwith\0binary\r\n";
const MISSING: u64 = 999_999;

fn connect(server: &Beanstalkd) -> Connection {
    Connection::connect(server.addr(), ConnectionConfig::default()).expect("connect")
}

fn put(c: &mut Connection, pri: u32, delay: u32, ttr: u32, body: &[u8]) -> u64 {
    match c
        .request(&C::Put {
            pri,
            delay,
            ttr,
            body,
        })
        .unwrap()
    {
        R::Inserted { id } => id,
        r => panic!("put: {r:?}"),
    }
}

fn yaml(c: &mut Connection, cmd: C<'_>) -> Vec<u8> {
    match c.request(&cmd).unwrap() {
        R::Ok { yaml } => yaml.to_vec(),
        r => panic!("{cmd:?}: {r:?}"),
    }
}

fn list(c: &mut Connection, cmd: C<'_>) -> Vec<String> {
    let doc = yaml(c, cmd);
    items(&doc)
        .unwrap()
        .map(|i| i.unwrap().to_string())
        .collect()
}

#[test]
fn every_command_and_its_replies() {
    let server = Beanstalkd::start().expect("start beanstalkd");
    let mut c = connect(&server);

    // Tubes.
    assert_eq!(
        c.request(&C::Use { tube: "conf" }).unwrap(),
        R::Using { tube: "conf" }
    );
    assert_eq!(
        c.request(&C::ListTubeUsed).unwrap(),
        R::Using { tube: "conf" }
    );
    assert_eq!(
        c.request(&C::Watch { tube: "conf" }).unwrap(),
        R::Watching { count: 2 }
    );
    assert_eq!(
        c.request(&C::Ignore { tube: "default" }).unwrap(),
        R::Watching { count: 1 }
    );
    assert_eq!(
        c.request(&C::Ignore { tube: "conf" }).unwrap(),
        R::NotIgnored
    );
    assert_eq!(list(&mut c, C::ListTubesWatched), ["conf"]);
    let mut tubes = list(&mut c, C::ListTubes);
    tubes.sort();
    assert_eq!(tubes, ["conf", "default"]);

    // Put, peek, stats of a ready job.
    let id1 = put(&mut c, 5, 0, 60, BODY);
    assert_eq!(
        c.request(&C::PeekReady).unwrap(),
        R::Found {
            id: id1,
            body: BODY
        }
    );
    assert_eq!(
        c.request(&C::Peek { id: id1 }).unwrap(),
        R::Found {
            id: id1,
            body: BODY
        }
    );
    assert_eq!(c.request(&C::Peek { id: MISSING }).unwrap(), R::NotFound);
    let doc = yaml(&mut c, C::StatsJob { id: id1 });
    let j = JobStats::parse(&doc).unwrap();
    assert_eq!(
        (j.id, j.tube, j.state, j.pri, j.ttr, j.reserves),
        (id1, "conf", "ready", 5, 60, 0)
    );
    assert_eq!(
        c.request(&C::StatsJob { id: MISSING }).unwrap(),
        R::NotFound
    );
    let doc = yaml(&mut c, C::StatsTube { tube: "conf" });
    let t = TubeStats::parse(&doc).unwrap();
    assert_eq!(t.name, "conf");
    assert_eq!(
        (t.current_jobs_ready, t.current_jobs_urgent, t.total_jobs),
        (1, 1, 1)
    );
    assert_eq!((t.current_using, t.current_watching), (1, 1));
    assert_eq!(
        c.request(&C::StatsTube { tube: "nope" }).unwrap(),
        R::NotFound
    );

    // Reserve, touch, release, bury, kick.
    assert_eq!(
        c.request(&C::Reserve).unwrap(),
        R::Reserved {
            id: id1,
            body: BODY
        }
    );
    assert_eq!(c.request(&C::Touch { id: id1 }).unwrap(), R::Touched);
    assert_eq!(c.request(&C::Touch { id: MISSING }).unwrap(), R::NotFound);
    assert_eq!(
        c.request(&C::Release {
            id: id1,
            pri: 7,
            delay: 0
        })
        .unwrap(),
        R::Released
    );
    assert_eq!(
        c.request(&C::Release {
            id: MISSING,
            pri: 7,
            delay: 0
        })
        .unwrap(),
        R::NotFound
    );
    assert_eq!(
        c.request(&C::ReserveWithTimeout { timeout: 0 }).unwrap(),
        R::Reserved {
            id: id1,
            body: BODY
        }
    );
    assert_eq!(c.request(&C::Bury { id: id1, pri: 3 }).unwrap(), R::Buried);
    assert_eq!(
        c.request(&C::Bury {
            id: MISSING,
            pri: 3
        })
        .unwrap(),
        R::NotFound
    );
    assert_eq!(
        c.request(&C::PeekBuried).unwrap(),
        R::Found {
            id: id1,
            body: BODY
        }
    );
    let doc = yaml(&mut c, C::StatsJob { id: id1 });
    let j = JobStats::parse(&doc).unwrap();
    assert_eq!(
        (j.state, j.pri, j.buries, j.releases, j.reserves),
        ("buried", 3, 1, 1, 2)
    );
    assert_eq!(
        c.request(&C::Kick { bound: 10 }).unwrap(),
        R::Kicked { count: 1 }
    );
    assert_eq!(
        c.request(&C::Kick { bound: 10 }).unwrap(),
        R::Kicked { count: 0 }
    );
    assert_eq!(c.request(&C::PeekBuried).unwrap(), R::NotFound);
    assert!(matches!(
        c.request(&C::ReserveWithTimeout { timeout: 0 }).unwrap(),
        R::Reserved { .. }
    ));
    assert_eq!(c.request(&C::Bury { id: id1, pri: 3 }).unwrap(), R::Buried);
    assert_eq!(c.request(&C::KickJob { id: id1 }).unwrap(), R::KickedJob);
    assert_eq!(c.request(&C::KickJob { id: MISSING }).unwrap(), R::NotFound);

    // A delayed job: peek-delayed, kick-job, reserve-job.
    let id2 = put(&mut c, 1, 100, 60, b"later");
    assert_eq!(
        c.request(&C::PeekDelayed).unwrap(),
        R::Found {
            id: id2,
            body: b"later"
        }
    );
    let doc = yaml(&mut c, C::StatsJob { id: id2 });
    let j = JobStats::parse(&doc).unwrap();
    assert_eq!((j.state, j.delay), ("delayed", 100));
    assert!(j.time_left > 90 && j.time_left <= 100, "{}", j.time_left);
    assert_eq!(c.request(&C::KickJob { id: id2 }).unwrap(), R::KickedJob);
    assert_eq!(c.request(&C::PeekDelayed).unwrap(), R::NotFound);
    assert_eq!(
        c.request(&C::ReserveJob { id: id2 }).unwrap(),
        R::Reserved {
            id: id2,
            body: b"later"
        }
    );
    assert_eq!(
        c.request(&C::ReserveJob { id: MISSING }).unwrap(),
        R::NotFound
    );
    assert_eq!(c.request(&C::Delete { id: id2 }).unwrap(), R::Deleted);
    assert_eq!(c.request(&C::Delete { id: id2 }).unwrap(), R::NotFound);
    assert!(
        matches!(c.request(&C::ReserveWithTimeout { timeout: 0 }).unwrap(), R::Reserved { id, .. } if id == id1)
    );
    assert_eq!(c.request(&C::Delete { id: id1 }).unwrap(), R::Deleted);

    // Nothing left: an immediate poll, then a real server-side wait of 1 s,
    // which the reply deadline (I/O timeout 1 s + 1 s) must allow.
    assert_eq!(
        c.request(&C::ReserveWithTimeout { timeout: 0 }).unwrap(),
        R::TimedOut
    );
    let t = Instant::now();
    assert_eq!(
        c.request(&C::ReserveWithTimeout { timeout: 1 }).unwrap(),
        R::TimedOut
    );
    assert!(
        t.elapsed() >= Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(c.request(&C::PeekReady).unwrap(), R::NotFound);

    // Pause.
    assert_eq!(
        c.request(&C::PauseTube {
            tube: "conf",
            delay: 30
        })
        .unwrap(),
        R::Paused
    );
    assert_eq!(
        c.request(&C::PauseTube {
            tube: "nope",
            delay: 1
        })
        .unwrap(),
        R::NotFound
    );
    let doc = yaml(&mut c, C::StatsTube { tube: "conf" });
    let t = TubeStats::parse(&doc).unwrap();
    assert_eq!(
        (t.pause, t.cmd_pause_tube, t.total_jobs, t.cmd_delete),
        (30, 1, 2, 2)
    );
    assert!(
        t.pause_time_left > 25 && t.pause_time_left <= 30,
        "{}",
        t.pause_time_left
    );
    assert_eq!(
        c.request(&C::PauseTube {
            tube: "conf",
            delay: 0
        })
        .unwrap(),
        R::Paused
    );

    // The server's own record.
    let doc = yaml(&mut c, C::Stats);
    let s = ServerStats::parse(&doc).unwrap();
    assert_eq!(s.pid, u64::from(server.pid()));
    assert_eq!(
        (s.cmd_put, s.cmd_delete, s.cmd_reserve, s.cmd_kick),
        (2, 3, 1, 2)
    );
    assert_eq!(
        (s.cmd_use, s.cmd_watch, s.cmd_ignore, s.cmd_touch),
        (1, 1, 2, 2)
    );
    // cmd-stats: this one, and the harness's check at start that the port is served by its own child.
    assert_eq!(
        (s.cmd_bury, s.cmd_release, s.cmd_pause_tube, s.cmd_stats),
        (3, 2, 3, 2)
    );
    assert_eq!(
        (
            s.cmd_peek,
            s.cmd_peek_ready,
            s.cmd_peek_delayed,
            s.cmd_peek_buried
        ),
        (2, 2, 2, 2)
    );
    assert_eq!(
        (
            s.cmd_list_tubes,
            s.cmd_list_tube_used,
            s.cmd_list_tubes_watched
        ),
        (1, 1, 1)
    );
    assert_eq!(s.cmd_reserve_with_timeout, 5);
    assert_eq!(
        (s.total_jobs, s.max_job_size, s.current_tubes),
        (2, 65535, 2)
    );
    assert_eq!(
        (
            s.current_jobs_ready,
            s.current_jobs_reserved,
            s.current_connections
        ),
        (0, 0, 1)
    );
    assert_eq!((s.current_producers, s.current_workers), (1, 1));
    assert!(!s.version.is_empty() && !s.id.is_empty() && !s.hostname.is_empty());
    assert!(!s.draining);
    assert!(s.uptime < 120 && s.rusage_utime >= 0.0);

    // Quit: the server closes the connection.
    let e = c.request(&C::Quit).unwrap_err();
    assert!(matches!(e, ConnectionError::Closed), "{e:?}");
}

#[test]
fn deadline_soon_and_ttr_expiry() {
    let server = Beanstalkd::start().expect("start beanstalkd");
    let mut c = connect(&server);
    let id = put(&mut c, 0, 0, 1, b"short ttr");
    assert!(matches!(c.request(&C::Reserve).unwrap(), R::Reserved { id: got, .. } if got == id));
    // The job is within a second of its TTR: any reserve now says so.
    assert_eq!(c.request(&C::Reserve).unwrap(), R::DeadlineSoon);
    assert_eq!(
        c.request(&C::ReserveWithTimeout { timeout: 5 }).unwrap(),
        R::DeadlineSoon
    );
    // Once the TTR runs out the job is ready again and a reserve gets it.
    let t = Instant::now();
    loop {
        match c.request(&C::ReserveWithTimeout { timeout: 2 }).unwrap() {
            R::Reserved { id: got, .. } => {
                assert_eq!(got, id);
                break;
            }
            R::DeadlineSoon => std::thread::sleep(Duration::from_millis(50)),
            r => panic!("{r:?}"),
        }
        assert!(t.elapsed() < Duration::from_secs(5), "job never came back");
    }
    let doc = yaml(&mut c, C::StatsJob { id });
    let j = JobStats::parse(&doc).unwrap();
    assert_eq!((j.timeouts, j.reserves, j.ttr), (1, 2, 1));
}

#[test]
fn job_too_big_raw_and_refused_by_the_encoder() {
    let server = Beanstalkd::start_with(&["-z", "1024"]).expect("start beanstalkd -z 1024");
    let mut c = connect(&server);
    assert_eq!(
        ServerStats::parse(&yaml(&mut c, C::Stats))
            .unwrap()
            .max_job_size,
        1024
    );
    // The server reads and drops the whole body before it answers.
    let mut raw = b"put 0 0 10 2000\r\n".to_vec();
    raw.extend_from_slice(&[b'z'; 2000]);
    raw.extend_from_slice(b"\r\n");
    c.send_raw(&raw, K::Put).unwrap();
    assert_eq!(c.recv().unwrap(), R::JobTooBig);
    // Still in step.
    assert!(matches!(
        c.request(&C::Put {
            pri: 0,
            delay: 0,
            ttr: 1,
            body: &[1; 1024]
        })
        .unwrap(),
        R::Inserted { .. }
    ));
    // A client configured with the server's limit refuses to send it at all.
    let limits = Limits {
        max_job_size: 1024,
        ..Limits::default()
    };
    let mut small = Connection::connect(
        server.addr(),
        ConnectionConfig {
            limits,
            ..ConnectionConfig::default()
        },
    )
    .unwrap();
    let e = small
        .request(&C::Put {
            pri: 0,
            delay: 0,
            ttr: 1,
            body: &[1; 1025],
        })
        .unwrap_err();
    assert!(
        matches!(
            e,
            ConnectionError::Invalid(EncodeError::JobTooBig {
                size: 1025,
                max: 1024
            })
        ),
        "{e:?}"
    );
    assert_eq!(small.io_counts().writes, 0);
}

#[test]
fn raw_errors_bad_format_unknown_command_expected_crlf() {
    let server = Beanstalkd::start().expect("start beanstalkd");
    let mut c = connect(&server);
    // The two put lines refused here carry no body, so the server stays in
    // step; they are expected as a request without one (`stats`'s kind),
    // since a session that sent a real put marks itself out of step on
    // such a refusal (the next test shows why).
    #[rustfmt::skip]
    let cases: &[(&[u8], K, R<'static>)] = &[
        (b"put 1 0 1\r\n", K::Stats, R::BadFormat),
        (b"bury 1 4294967296\r\n", K::Bury, R::BadFormat),
        (b"delete x\r\n", K::Delete, R::BadFormat),
        (b"use -dash\r\n", K::Use, R::BadFormat),
        (b"reserve now\r\n", K::Reserve, R::BadFormat),
        (b"frobnicate\r\n", K::Stats, R::UnknownCommand),
        (b"PUT 1 0 1 1\r\n", K::Stats, R::UnknownCommand),
        (b"put 1 0 1 2\r\nabXY", K::Put, R::ExpectedCrlf),
    ];
    for (raw, kind, want) in cases {
        c.send_raw(raw, *kind).unwrap();
        assert_eq!(
            c.recv().unwrap(),
            *want,
            "{:?}",
            String::from_utf8_lossy(raw)
        );
        // Each error leaves the connection in step.
        assert_eq!(
            c.request(&C::ListTubeUsed).unwrap(),
            R::Using { tube: "default" }
        );
    }
}

#[test]
fn a_put_refused_at_its_line_has_its_body_read_as_a_command() {
    let server = Beanstalkd::start().expect("start beanstalkd");
    // The server's side: the refusal comes before the body is read, and the
    // body then gets a reply of its own.
    let mut raw = std::net::TcpStream::connect(server.addr()).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    raw.write_all(b"put 1 0 10 5 x\r\nhello\r\n").unwrap();
    let want = b"BAD_FORMAT\r\nUNKNOWN_COMMAND\r\n";
    let mut got = vec![0; want.len()];
    raw.read_exact(&mut got).unwrap();
    assert_eq!(got, want, "{}", String::from_utf8_lossy(&got));
    // The client's side: the put's refusal is its reply, and the connection
    // is out of step from then on, so the body's reply can answer nobody.
    let mut c = connect(&server);
    c.send_raw(b"put 1 0 10 5 x\r\nhello\r\n", K::Put).unwrap();
    assert_eq!(c.recv().unwrap(), R::BadFormat);
    assert!(c.is_broken());
    assert!(matches!(
        c.request(&C::ListTubeUsed),
        Err(ConnectionError::Broken)
    ));
}

#[test]
fn draining_after_sigusr1() {
    let server = Beanstalkd::start().expect("start beanstalkd");
    let mut c = connect(&server);
    put(&mut c, 0, 0, 10, b"before");
    server.drain().unwrap();
    // The signal is handled asynchronously: poll briefly.
    let t = Instant::now();
    loop {
        match c
            .request(&C::Put {
                pri: 0,
                delay: 0,
                ttr: 10,
                body: b"after",
            })
            .unwrap()
        {
            R::Draining => break,
            R::Inserted { .. } => assert!(t.elapsed() < Duration::from_secs(3), "never drained"),
            r => panic!("{r:?}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        ServerStats::parse(&yaml(&mut c, C::Stats))
            .unwrap()
            .draining
    );
    // Draining refuses new jobs only: existing ones are still served.
    assert!(matches!(
        c.request(&C::ReserveWithTimeout { timeout: 0 }).unwrap(),
        R::Reserved { .. }
    ));
}

#[test]
fn reserve_blocks_until_another_connection_puts() {
    let server = Beanstalkd::start().expect("start beanstalkd");
    let mut worker = connect(&server);
    let mut producer = connect(&server);
    worker.send(&C::ReserveWithTimeout { timeout: 5 }).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let id = put(&mut producer, 0, 0, 10, BODY);
    assert_eq!(worker.recv().unwrap(), R::Reserved { id, body: BODY });
}
