//! The producer against a real beanstalkd: bodies round-trip byte-exact, each
//! server answer maps to its own outcome, batches and queue position work.

mod common;

use std::time::{Duration, Instant};

use taskq_producer::{Error, Invalid, Producer, PutOptions, PutOutcome, Rejection};
use taskq_testkit::beanstalkd::free_port;
use taskq_testkit::Beanstalkd;

fn producer(server: &Beanstalkd, tube: &str) -> Producer {
    Producer::builder()
        .max_job_size(1 << 20)
        .tube(tube)
        .connect(server.addr())
        .unwrap()
}

#[test]
fn empty_binary_and_max_size_bodies_come_back_byte_exact() {
    let server = Beanstalkd::start().unwrap();
    let mut p = Producer::connect(server.addr()).unwrap();
    p.use_tube("exact").unwrap();
    let mut binary: Vec<u8> = (0..=255u8).collect();
    binary.extend_from_slice(b"\r\n\0\r\n\r\nput 1 2 3 4\r\n\0");
    let max = vec![0xA5u8; 65535];
    let crlf_only = b"\r\n".to_vec();
    let bodies: Vec<&[u8]> = vec![b"", &binary, &max, &crlf_only, b"\0"];
    let mut ids = Vec::new();
    for b in &bodies {
        ids.push(p.put(b, PutOptions::default()).unwrap().get());
    }
    let got = common::drain(server.addr(), "exact");
    assert_eq!(got.len(), bodies.len());
    for ((id, body), (want_id, want)) in got.iter().zip(ids.iter().zip(&bodies)) {
        assert_eq!(id, want_id);
        assert_eq!(&body[..], *want, "job {id}");
    }
}

#[test]
fn job_too_big_for_the_server_is_rejected_and_the_connection_goes_on() {
    let server = Beanstalkd::start_with(&["-z", "1024"]).unwrap();
    let mut p = Producer::connect(server.addr()).unwrap();
    let before = p.connects();
    match p.put(&[1u8; 1025], PutOptions::default()) {
        Err(Error::Rejected(Rejection::JobTooBig)) => {}
        other => panic!("expected JOB_TOO_BIG, got {other:?}"),
    }
    // A rejection leaves the stream in step: the same connection serves the next put.
    let id = p.put(&[1u8; 1024], PutOptions::default()).unwrap();
    assert!(id.get() >= 1);
    assert_eq!(p.connects(), before);
}

#[test]
fn body_over_the_client_limit_is_refused_before_sending() {
    let server = Beanstalkd::start().unwrap();
    let mut p = Producer::builder()
        .max_job_size(100)
        .connect(server.addr())
        .unwrap();
    let writes = p.io_counts().unwrap().writes;
    let e = p.put(&[0u8; 101], PutOptions::default()).unwrap_err();
    assert!(matches!(e, Error::Invalid(Invalid::Encode(_))), "{e:?}");
    assert!(e.not_sent() && !e.maybe_queued());
    assert_eq!(
        p.io_counts().unwrap().writes,
        writes,
        "nothing may be written"
    );
    assert!(matches!(
        p.use_tube("-bad").unwrap_err(),
        Error::Invalid(Invalid::Encode(_))
    ));
    assert_eq!(p.io_counts().unwrap().writes, writes);
}

#[test]
fn draining_server_rejects_with_draining() {
    let server = Beanstalkd::start().unwrap();
    let mut p = Producer::connect(server.addr()).unwrap();
    p.put(b"before", PutOptions::default()).unwrap();
    server.drain().unwrap();
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        match p.put(b"during", PutOptions::default()) {
            Err(Error::Rejected(Rejection::Draining)) => break,
            // The signal may take a moment to land.
            Ok(_) if Instant::now() < until => std::thread::sleep(Duration::from_millis(20)),
            other => panic!("expected DRAINING, got {other:?}"),
        }
    }
    let e = p.put(b"again", PutOptions::default()).unwrap_err();
    assert!(!e.maybe_queued() && !e.outcome_unknown());
}

#[test]
fn server_not_listening_is_not_sent() {
    let port = free_port().unwrap();
    let e = Producer::builder()
        .connect_timeout(Duration::from_millis(500))
        .connect(("127.0.0.1", port))
        .unwrap_err();
    assert!(matches!(e, Error::NotSent(_)), "{e:?}");
    assert!(e.not_sent() && !e.maybe_queued());
}

#[test]
fn server_killed_between_write_and_reply_is_outcome_unknown() {
    let mut server = Beanstalkd::start().unwrap();
    let addr = server.addr();
    let mut p = Producer::builder()
        .io_timeout(Duration::from_secs(5))
        .connect(addr)
        .unwrap();
    p.put(b"warm", PutOptions::default()).unwrap();
    // Stopped, the server reads nothing: the write lands in its socket buffer, no reply comes.
    server.signal("STOP").unwrap();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        server.kill().unwrap();
    });
    let started = Instant::now();
    let e = p.put(b"in flight", PutOptions::default()).unwrap_err();
    killer.join().unwrap();
    assert!(matches!(e, Error::Unknown(_)), "{e:?}");
    assert!(e.outcome_unknown() && e.maybe_queued() && !e.not_sent());
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "must not wait out the timeout"
    );
    // The next call reconnects, finds nobody, and says not sent.
    let e = p.put(b"after", PutOptions::default()).unwrap_err();
    assert!(matches!(e, Error::NotSent(_)), "{e:?}");
}

#[test]
fn queue_position_counts_the_ready_jobs_in_line() {
    let server = Beanstalkd::start().unwrap();
    let mut p = producer(&server, "line");
    for _ in 0..6 {
        p.put(b"earlier", PutOptions::default()).unwrap();
    }
    // A job in another tube does not count.
    let mut other = producer(&server, "elsewhere");
    other.put(b"x", PutOptions::default()).unwrap();
    let pos = p.put_with_position(b"me", PutOptions::default()).unwrap();
    assert_eq!(pos.ready, Some(7));
    assert_eq!(pos.ahead(), Some(6), "seventh in line: six ahead");
    let writes = p.io_counts().unwrap().writes;
    let delayed = p
        .put_with_position(
            b"later",
            PutOptions {
                delay: 100,
                ..PutOptions::default()
            },
        )
        .unwrap();
    assert_eq!(
        p.io_counts().unwrap().writes,
        writes + 1,
        "put and stats-tube in one write"
    );
    assert!(delayed.id > pos.id);
    assert_eq!(delayed.ready, Some(7));
    assert_eq!(delayed.ahead(), Some(7));
    let got = common::drain(server.addr(), "line");
    assert_eq!(got.len(), 7);
    assert_eq!(got.last().unwrap(), &(pos.id.get(), b"me".to_vec()));
}

#[test]
fn batches_of_1_2_64_and_1000_each_go_out_in_one_write_and_come_back_in_order() {
    let server = Beanstalkd::start().unwrap();
    let mut p = producer(&server, "batch");
    for n in [1usize, 2, 64, 1000] {
        let bodies: Vec<Vec<u8>> = (0..n)
            .map(|i| format!("job {i} of {n}\r\n\0").into_bytes())
            .collect();
        let mut out = vec![PutOutcome::NotSent; n];
        let writes = p.io_counts().unwrap().writes;
        let report = p
            .put_batch(&bodies, PutOptions::default(), &mut out)
            .unwrap();
        assert_eq!(p.io_counts().unwrap().writes, writes + 1, "batch of {n}");
        assert_eq!(report.inserted, n);
        assert_eq!(report.rejected, 0);
        let ids: Vec<u64> = out.iter().map(|o| o.id().unwrap().get()).collect();
        assert!(
            ids.windows(2).all(|w| w[1] == w[0] + 1),
            "ids in input order"
        );
        let got = common::drain(server.addr(), "batch");
        assert_eq!(got.len(), n);
        for ((id, body), (want_id, want)) in got.iter().zip(ids.iter().zip(&bodies)) {
            assert_eq!((id, body), (want_id, want));
        }
    }
}

#[test]
fn a_rejection_inside_a_batch_is_reported_for_that_job_only() {
    let server = Beanstalkd::start_with(&["-z", "100"]).unwrap();
    let mut p = producer(&server, "mixed");
    let big = vec![7u8; 101];
    let bodies: [&[u8]; 3] = [b"a", &big, b"c"];
    let mut out = [PutOutcome::NotSent; 3];
    let report = p
        .put_batch(&bodies, PutOptions::default(), &mut out)
        .unwrap();
    assert_eq!((report.inserted, report.rejected), (2, 1));
    assert!(matches!(out[0], PutOutcome::Inserted(_)));
    assert_eq!(out[1], PutOutcome::Rejected(Rejection::JobTooBig));
    assert!(matches!(out[2], PutOutcome::Inserted(_)));
    let got = common::drain(server.addr(), "mixed");
    assert_eq!(
        got.iter().map(|(_, b)| b.as_slice()).collect::<Vec<_>>(),
        [b"a", b"c"]
    );
}

#[test]
fn batch_with_a_short_outcome_slice_or_a_big_body_sends_nothing() {
    let server = Beanstalkd::start().unwrap();
    let mut p = Producer::builder()
        .max_job_size(10)
        .connect(server.addr())
        .unwrap();
    let writes = p.io_counts().unwrap().writes;
    let mut out = [PutOutcome::Unknown; 1];
    let e = p
        .put_batch(&[b"a", b"b"], PutOptions::default(), &mut out)
        .unwrap_err();
    assert!(matches!(
        e.error,
        Error::Invalid(Invalid::OutcomesTooShort { jobs: 2, slots: 1 })
    ));
    let mut out = [PutOutcome::Unknown; 2];
    let e = p
        .put_batch(
            &[&b"ok"[..], &[0u8; 11][..]],
            PutOptions::default(),
            &mut out,
        )
        .unwrap_err();
    assert_eq!(e.replied, 0);
    assert!(e.error.not_sent());
    assert_eq!(out, [PutOutcome::NotSent; 2]);
    assert_eq!(p.io_counts().unwrap().writes, writes);
}

#[test]
fn options_reach_the_server() {
    let server = Beanstalkd::start().unwrap();
    let mut p = producer(&server, "opts");
    let id = p
        .put(
            b"x",
            PutOptions {
                pri: 7,
                delay: 30,
                ttr: 9,
            },
        )
        .unwrap();
    let mut c = taskq_proto::Connection::connect(server.addr(), Default::default()).unwrap();
    match c
        .request(&taskq_proto::Command::StatsJob { id: id.get() })
        .unwrap()
    {
        taskq_proto::Reply::Ok { yaml } => {
            let s = taskq_proto::JobStats::parse(yaml).unwrap();
            assert_eq!(
                (s.pri, s.delay, s.ttr, s.tube, s.state),
                (7, 30, 9, "opts", "delayed")
            );
        }
        r => panic!("{r:?}"),
    }
}

#[test]
fn changing_options_and_sizes_between_puts_reaches_the_server_each_time() {
    // The connection reuses an encoded put line while the numbers stay the same:
    // every change of priority, delay, ttr or length must show.
    let server = Beanstalkd::start().unwrap();
    let mut p = producer(&server, "vary");
    let cases = [
        (
            PutOptions {
                pri: 1,
                delay: 0,
                ttr: 5,
            },
            &b"aaaa"[..],
        ),
        (
            PutOptions {
                pri: 1,
                delay: 0,
                ttr: 5,
            },
            &b"bbbb"[..],
        ),
        (
            PutOptions {
                pri: 2,
                delay: 0,
                ttr: 5,
            },
            &b"cccc"[..],
        ),
        (
            PutOptions {
                pri: 2,
                delay: 0,
                ttr: 6,
            },
            &b"dddd"[..],
        ),
        (
            PutOptions {
                pri: 2,
                delay: 0,
                ttr: 6,
            },
            &b"eeeeeeeeee"[..],
        ),
        (
            PutOptions {
                pri: 2,
                delay: 0,
                ttr: 6,
            },
            &b""[..],
        ),
        (
            PutOptions {
                pri: 1,
                delay: 0,
                ttr: 5,
            },
            &b"ffff"[..],
        ),
    ];
    let mut ids = Vec::new();
    for (i, (opts, body)) in cases.iter().enumerate() {
        ids.push(p.put(body, *opts).unwrap());
        if i == 3 {
            // Another command in between must not disturb the reuse either.
            p.put_with_position(b"zz", *opts).unwrap();
        }
    }
    let mut c = taskq_proto::Connection::connect(server.addr(), Default::default()).unwrap();
    for (id, (opts, _)) in ids.iter().zip(&cases) {
        match c
            .request(&taskq_proto::Command::StatsJob { id: id.get() })
            .unwrap()
        {
            taskq_proto::Reply::Ok { yaml } => {
                let s = taskq_proto::JobStats::parse(yaml).unwrap();
                assert_eq!((s.pri, s.ttr), (u64::from(opts.pri), u64::from(opts.ttr)));
            }
            r => panic!("{r:?}"),
        }
    }
    // Reserved by priority; compare in put order.
    let mut jobs = common::drain(server.addr(), "vary");
    jobs.sort();
    let bodies: Vec<Vec<u8>> = jobs.into_iter().map(|(_, b)| b).collect();
    let mut want: Vec<&[u8]> = cases.iter().map(|(_, b)| *b).collect();
    want.insert(4, b"zz");
    assert_eq!(bodies, want);
}

#[test]
fn urgent_jobs_go_ahead_of_older_plain_ones() {
    let server = Beanstalkd::start().unwrap();
    let mut p = Producer::connect(server.addr()).unwrap();
    let plain = p.put(b"plain", PutOptions::default()).unwrap();
    let urgent = p.put(b"urgent", PutOptions::default().urgent()).unwrap();
    let mut c =
        taskq_proto::Connection::connect(server.addr(), taskq_proto::ConnectionConfig::default())
            .unwrap();
    for want in [urgent, plain] {
        match c
            .request(&taskq_proto::Command::ReserveWithTimeout { timeout: 0 })
            .unwrap()
        {
            taskq_proto::Reply::Reserved { id, .. } => assert_eq!(id, want.get()),
            r => panic!("{r:?}"),
        }
    }
}
