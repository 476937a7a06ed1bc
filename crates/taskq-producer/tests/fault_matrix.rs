//! Rows of docs/reliability.md's fault matrix for the producer: a put (and a batch)
//! cut at every byte of its request and of its reply, classified against the
//! server's own record; every error reply and garbage line mapped to a typed
//! result; and normal operation through high latency and tiny segments.

use std::net::SocketAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use taskq_producer::{Error, Producer, PutOptions, PutOutcome, Rejection};
use taskq_proto::{Command, Connection, ConnectionConfig, Reply, ServerStats};
use taskq_testkit::{
    Beanstalkd, ChaosProxy, Direction, Fault, FaultPlan, ServerConfig, TestServer, Toxic,
};

/// Twelve bytes, so a put request is `put 1024 0 60 12\r\n` + body + CRLF: 32 bytes.
const BODY: &[u8] = b"cut-me-12byt";

fn request_len(body: &[u8]) -> usize {
    format!("put 1024 0 60 {}\r\n", body.len()).len() + body.len() + 2
}

fn producer(addr: SocketAddr) -> Producer {
    Producer::builder()
        .io_timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_secs(2))
        .connect(addr)
        .expect("connect")
}

fn direct(addr: SocketAddr) -> Connection {
    Connection::connect(addr, ConnectionConfig::default()).expect("connect")
}

/// beanstalkd's `total-jobs`: every job it ever inserted.
fn total_jobs(addr: SocketAddr) -> u64 {
    match direct(addr).request(&Command::Stats).unwrap() {
        Reply::Ok { yaml } => ServerStats::parse(yaml).unwrap().total_jobs,
        r => panic!("stats: {r:?}"),
    }
}

fn in_beanstalkd(addr: SocketAddr, id: u64) -> bool {
    match direct(addr).request(&Command::Peek { id }).unwrap() {
        Reply::Found { .. } => true,
        Reply::NotFound => false,
        r => panic!("peek: {r:?}"),
    }
}

/// What one trial came to, the client's word against the server's record.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    trials: u64,
    /// `Ok(id)`, and the server has it.
    inserted: u64,
    /// An error with `not_sent()`, and the server has nothing.
    not_sent: u64,
    /// `outcome_unknown()`, and the server has the job.
    unknown_queued: u64,
    /// `outcome_unknown()`, and the server has nothing.
    unknown_absent: u64,
    /// `Ok` that the server lacks, or not sent that the server has, or any other result.
    misclassified: u64,
}

impl Tally {
    /// Classifies one job: what the client was told against whether the server holds it.
    fn job(&mut self, told: Told, queued: bool) {
        self.trials += 1;
        match (told, queued) {
            (Told::Inserted, true) => self.inserted += 1,
            (Told::NotSent, false) => self.not_sent += 1,
            (Told::Unknown, true) => self.unknown_queued += 1,
            (Told::Unknown, false) => self.unknown_absent += 1,
            _ => self.misclassified += 1,
        }
    }

    fn add(&mut self, o: Tally) {
        self.trials += o.trials;
        self.inserted += o.inserted;
        self.not_sent += o.not_sent;
        self.unknown_queued += o.unknown_queued;
        self.unknown_absent += o.unknown_absent;
        self.misclassified += o.misclassified;
    }

    fn line(&self, what: &str) -> String {
        format!(
            "{what}: trials {}, inserted {}, not sent {}, unknown {} (queued {}, not queued {}), misclassified {}",
            self.trials,
            self.inserted,
            self.not_sent,
            self.unknown_queued + self.unknown_absent,
            self.unknown_queued,
            self.unknown_absent,
            self.misclassified
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Told {
    Inserted,
    NotSent,
    Unknown,
    /// A rejection or anything else: never right for a cut.
    Other,
}

fn told<T>(r: &Result<T, Error>) -> Told {
    match r {
        Ok(_) => Told::Inserted,
        Err(e) if e.not_sent() => Told::NotSent,
        Err(e) if e.outcome_unknown() => Told::Unknown,
        Err(_) => Told::Other,
    }
}

fn told_batch(o: PutOutcome) -> Told {
    match o {
        PutOutcome::Inserted(_) => Told::Inserted,
        PutOutcome::NotSent => Told::NotSent,
        PutOutcome::Unknown => Told::Unknown,
        PutOutcome::Rejected(_) => Told::Other,
    }
}

/// Waits until the proxy has closed every connection, so beanstalkd has
/// received all it ever will of the trial.
fn settle(proxy: &ChaosProxy) {
    assert!(
        proxy.wait_idle(Duration::from_secs(5)),
        "proxy connections stay open"
    );
    std::thread::sleep(Duration::from_millis(5));
}

#[test]
fn put_request_cut_at_every_byte_offset_is_never_misclassified() {
    let server = Beanstalkd::start().unwrap();
    let proxy = ChaosProxy::start(server.addr()).unwrap();
    let len = request_len(BODY);
    assert_eq!(len, 32);
    let t0 = Instant::now();
    let start_total = total_jobs(server.addr());
    let mut single = Tally::default();
    for k in 0..=len {
        proxy.clear();
        proxy.add(
            Toxic::LimitData { bytes: k as u64 },
            Direction::Upstream,
            1.0,
        );
        let before = total_jobs(server.addr());
        let mut p = producer(proxy.addr());
        let r = p.put(BODY, PutOptions::default());
        drop(p);
        settle(&proxy);
        let added = total_jobs(server.addr()) - before;
        let queued = match &r {
            Ok(id) => in_beanstalkd(server.addr(), id.get()),
            Err(_) => added == 1,
        };
        assert!(added <= 1);
        // The write itself succeeded (the cut is downstream of the socket), so
        // the client cannot know: unknown for every offset short of the whole
        // request. beanstalkd never runs a partial request. With the whole
        // request through, its reply may still race back before the close.
        if k < len {
            assert_eq!(told(&r), Told::Unknown, "offset {k}: {r:?}");
            assert_eq!(added, 0, "offset {k}: a partial put was carried out");
        } else {
            assert!(matches!(told(&r), Told::Unknown | Told::Inserted), "{r:?}");
        }
        single.job(told(&r), queued);
    }

    // The write fails: the peer reset the connection (RST) before the put
    // left. (The proxy's `Reset` toxic shuts its sockets down without closing
    // them, which sends FIN, not RST; so a bare listener resets here.) The peer
    // reads nothing, so nothing can be queued.
    let mut reset = Tally::default();
    for _ in 0..5 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut p = producer(addr);
        let (s, _) = listener.accept().unwrap();
        socket2::SockRef::from(&s)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(s);
        drop(listener);
        std::thread::sleep(Duration::from_millis(20));
        let r = p.put(BODY, PutOptions::default());
        assert!(r.as_ref().is_err_and(Error::not_sent), "{r:?}");
        assert!(!p.is_connected());
        reset.job(told(&r), false);
    }

    // A batch of three: every offset of the whole 96-byte write.
    let bodies = [BODY, BODY, BODY];
    let mut batch = Tally::default();
    for k in 0..=3 * len {
        proxy.clear();
        proxy.add(
            Toxic::LimitData { bytes: k as u64 },
            Direction::Upstream,
            1.0,
        );
        let before = total_jobs(server.addr());
        let mut p = producer(proxy.addr());
        let mut out = [PutOutcome::NotSent; 3];
        let r = p.put_batch(&bodies, PutOptions::default(), &mut out);
        drop(p);
        settle(&proxy);
        let added = (total_jobs(server.addr()) - before) as usize;
        // Short of the whole batch, at least one job cannot have been answered.
        assert!(k == 3 * len || r.is_err(), "offset {k}: {r:?}");
        // Whole requests before the cut are carried out, in order; no partial one is.
        assert!(added <= k / len, "offset {k}: {added} inserted");
        for (i, o) in out.iter().enumerate() {
            let queued = match o.id() {
                Some(id) => in_beanstalkd(server.addr(), id.get()),
                None => i < added,
            };
            batch.job(told_batch(*o), queued);
        }
    }
    let end_total = total_jobs(server.addr());
    let mut all = single;
    all.add(reset);
    all.add(batch);
    // Every job the trials found queued is accounted for in beanstalkd's count.
    assert_eq!(end_total - start_total, all.inserted + all.unknown_queued);
    eprintln!("{}", single.line("put, request cut at offsets 0..=32"));
    eprintln!("{}", reset.line("put, connection reset before the write"));
    eprintln!(
        "{}",
        batch.line("put_batch of 3, request cut at offsets 0..=96 (per job)")
    );
    eprintln!("{}  [{:?}]", all.line("request cuts, all"), t0.elapsed());
    assert_eq!(all.misclassified, 0);
    assert_eq!(reset.not_sent, 5);
}

#[test]
fn put_reply_cut_at_every_byte_offset_is_never_misclassified() {
    let t0 = Instant::now();
    // A fresh server each trial: the id is 1, so the reply is `INSERTED 1\r\n`.
    let reply_len = b"INSERTED 1\r\n".len();
    let mut single = Tally::default();
    for k in 0..=reply_len {
        let server = TestServer::start_with(
            ServerConfig::default()
                .faults(FaultPlan::nth(1, Fault::CutReply { after: 0, bytes: k })),
        )
        .unwrap();
        let ledger = server.ledger();
        let mut p = producer(server.addr());
        let r = p.put(BODY, PutOptions::default());
        let queued = match &r {
            Ok(id) => ledger.job(id.get()).is_some(),
            Err(_) => ledger.check().added == 1,
        };
        if k < reply_len {
            assert_eq!(told(&r), Told::Unknown, "offset {k}: {r:?}");
            assert!(queued, "the cut reply's put was carried out");
            assert!(!ledger.job(1).unwrap().acknowledged);
        } else {
            assert_eq!(r.as_ref().ok().map(|id| id.get()), Some(1), "{r:?}");
            assert!(ledger.job(1).unwrap().acknowledged);
        }
        single.job(told(&r), queued);
        // The producer goes on: the next put reconnects after a cut. After the
        // whole reply the server closed too, unseen by the client until its
        // next put reads the close: that put is unknown (and in fact absent).
        let mut next = p.put(b"next", PutOptions::default());
        if k == reply_len {
            let e = next.expect_err("the server had closed");
            assert!(e.outcome_unknown(), "{e:?}");
            assert_eq!(ledger.check().added, 1);
            next = p.put(b"next", PutOptions::default());
        }
        let id = next.expect("put after a cut");
        assert!(ledger.job(id.get()).is_some_and(|j| j.acknowledged));
    }

    // A batch of three (ids 1, 2, 3: replies of 12 bytes each): a cut at every
    // offset of the 36 bytes of replies. Job i, if carried out, has id i + 1.
    let mut batch = Tally::default();
    for k in 0..3 * reply_len {
        let (j, b) = (k / reply_len, k % reply_len);
        let server = TestServer::start_with(ServerConfig::default().faults(FaultPlan::nth(
            1,
            Fault::CutReply {
                after: j as u64,
                bytes: b,
            },
        )))
        .unwrap();
        let ledger = server.ledger();
        let mut p = producer(server.addr());
        let mut out = [PutOutcome::NotSent; 3];
        let e = p
            .put_batch(&[BODY, BODY, BODY], PutOptions::default(), &mut out)
            .unwrap_err();
        assert_eq!(e.replied, j, "offset {k}");
        assert!(e.error.outcome_unknown(), "offset {k}: {e}");
        for (i, o) in out.iter().enumerate() {
            let queued = ledger.job(i as u64 + 1).is_some();
            if let Some(id) = o.id() {
                assert_eq!(id.get(), i as u64 + 1);
            }
            batch.job(told_batch(*o), queued);
        }
        // Replies read before the cut are inserted; the cut one and the rest are unknown.
        assert!(
            out[..j]
                .iter()
                .all(|o| matches!(o, PutOutcome::Inserted(_))),
            "{out:?}"
        );
        assert!(
            out[j..].iter().all(|o| *o == PutOutcome::Unknown),
            "{out:?}"
        );
        assert_eq!(ledger.check().added, j as u64 + 1, "offset {k}");
    }
    let mut all = single;
    all.add(batch);
    eprintln!("{}", single.line("put, reply cut at offsets 0..=12"));
    eprintln!(
        "{}",
        batch.line("put_batch of 3, reply cut at offsets 0..36 (per job)")
    );
    eprintln!("{}  [{:?}]", all.line("reply cuts, all"), t0.elapsed());
    assert_eq!(all.misclassified, 0);
    assert_eq!(single.unknown_queued, reply_len as u64);
}

/// What the reference server holds as job `id`: its body, or `None`.
fn body_of(addr: SocketAddr, id: u64) -> Option<Vec<u8>> {
    match direct(addr).request(&Command::Peek { id }).unwrap() {
        Reply::Found { body, .. } => Some(body.to_vec()),
        Reply::NotFound => None,
        r => panic!("peek {id}: {r:?}"),
    }
}

#[test]
fn a_put_refused_at_its_line_in_a_batch_hands_no_later_put_another_reply() {
    // beanstalkd answers a put line it refuses with BAD_FORMAT before it
    // reads the body, then reads the body as a command (UNKNOWN_COMMAND),
    // then serves the next put: two replies where one was owed. The
    // reference server answers the batch's first put just so, and inserts
    // the other five (ids 1 to 5).
    let bodies: Vec<Vec<u8>> = (0..6).map(|i| format!("job-{i}").into_bytes()).collect();
    for refusal in [&b"BAD_FORMAT\r\n"[..], b"UNKNOWN_COMMAND\r\n"] {
        let mut bytes = refusal.to_vec();
        bytes.extend_from_slice(b"UNKNOWN_COMMAND\r\n");
        let server = TestServer::start_with(
            ServerConfig::default().faults(FaultPlan::nth(1, Fault::Replace { after: 0, bytes })),
        )
        .unwrap();
        let ledger = server.ledger();
        let mut p = producer(server.addr());
        let mut out = [PutOutcome::NotSent; 6];
        let r = p.put_batch(&bodies, PutOptions::default(), &mut out);
        let shown = String::from_utf8_lossy(refusal).trim_end().to_owned();
        eprintln!("{shown}, then UNKNOWN_COMMAND: {out:?} ({r:?})");
        assert!(
            matches!(out[0], PutOutcome::Rejected(_)),
            "{shown}: {out:?}"
        );
        let e = r.expect_err("the batch broke off where the stream went out of step");
        assert_eq!(e.replied, 1, "{shown}: {e}");
        assert!(e.error.outcome_unknown(), "{shown}: {e}");
        // No later put was handed a reply that was not its own: an id
        // holds its own caller's body, a rejected put queued nothing.
        for (i, o) in out.iter().enumerate() {
            match o {
                PutOutcome::Inserted(id) => {
                    assert_eq!(
                        body_of(server.addr(), id.get()),
                        Some(bodies[i].clone()),
                        "{i}"
                    )
                }
                PutOutcome::Rejected(_) => assert!(
                    (1..=5).all(|id| body_of(server.addr(), id) != Some(bodies[i].clone())),
                    "{shown}: put {i} said rejected, yet it is queued"
                ),
                PutOutcome::Unknown | PutOutcome::NotSent => {}
            }
        }
        // Each job queued and not acknowledged to its caller is an unknown.
        let unknown = out.iter().filter(|o| **o == PutOutcome::Unknown).count() as u64;
        assert_eq!(ledger.check().added, 5, "{shown}");
        assert!(unknown >= 5, "{shown}: {out:?}");
        // The next put opens a new connection and is its own.
        let id = p
            .put(b"after", PutOptions::default())
            .expect("put afterwards");
        assert_eq!(
            body_of(server.addr(), id.get()).as_deref(),
            Some(&b"after"[..])
        );
        assert_eq!(p.connects(), 2, "{shown}");
    }
}

/// One row of the reply table: what the server says, and what the client makes of it.
struct Case {
    reply: &'static str,
    fault: Fault,
    /// True when the connection stays usable (a rejection); false when the
    /// stream is out of step and the next put reconnects.
    keeps_connection: bool,
    /// Jobs the failing put leaves queued.
    queued: u64,
    check: fn(&Error) -> bool,
}

fn replace(bytes: &'static [u8]) -> Fault {
    Fault::Replace {
        after: 0,
        bytes: bytes.to_vec(),
    }
}

fn rejected(e: &Error, want: Rejection) -> bool {
    matches!(e, Error::Rejected(r) if *r == want)
}

#[test]
fn every_error_reply_and_garbage_line_gives_a_distinct_typed_result() {
    use taskq_proto::{ConnectionError as PE, ReplyError as RE};
    let long_line: &'static [u8] = Box::leak(vec![b'A'; 300].into_boxed_slice());
    let cases = [
        Case {
            reply: "OUT_OF_MEMORY",
            fault: replace(b"OUT_OF_MEMORY\r\n"),
            keeps_connection: true,
            queued: 0,
            check: |e| rejected(e, Rejection::OutOfMemory),
        },
        Case {
            reply: "INTERNAL_ERROR",
            fault: replace(b"INTERNAL_ERROR\r\n"),
            keeps_connection: true,
            queued: 0,
            check: |e| rejected(e, Rejection::InternalError),
        },
        Case {
            reply: "BAD_FORMAT",
            // Refused at the line, so the server reads the body as commands:
            // the stream is out of step (see the batch test below).
            fault: replace(b"BAD_FORMAT\r\n"),
            keeps_connection: false,
            queued: 0,
            check: |e| rejected(e, Rejection::BadFormat),
        },
        Case {
            reply: "UNKNOWN_COMMAND",
            // Refused at the line, so the server reads the body as commands:
            // the stream is out of step (see the batch test below).
            fault: replace(b"UNKNOWN_COMMAND\r\n"),
            keeps_connection: false,
            queued: 0,
            check: |e| rejected(e, Rejection::UnknownCommand),
        },
        Case {
            reply: "JOB_TOO_BIG",
            fault: replace(b"JOB_TOO_BIG\r\n"),
            keeps_connection: true,
            queued: 0,
            check: |e| rejected(e, Rejection::JobTooBig),
        },
        Case {
            reply: "EXPECTED_CRLF",
            fault: replace(b"EXPECTED_CRLF\r\n"),
            keeps_connection: true,
            queued: 0,
            check: |e| rejected(e, Rejection::ExpectedCrlf),
        },
        Case {
            reply: "DRAINING",
            fault: replace(b"DRAINING\r\n"),
            keeps_connection: true,
            queued: 0,
            check: |e| rejected(e, Rejection::Draining),
        },
        // The real thing: the server keeps the job, buried.
        Case {
            reply: "BURIED 1 (put buried)",
            fault: Fault::BuryPut { after: 0 },
            keeps_connection: true,
            queued: 1,
            check: |e| {
                matches!(e, Error::Rejected(Rejection::InsertedBuried { id }) if id.get() == 1)
                    && e.maybe_queued()
                    && e.buried_id().is_some_and(|id| id.get() == 1)
            },
        },
        Case {
            reply: "GARBAGE",
            fault: replace(b"GARBAGE\r\n"),
            keeps_connection: false,
            queued: 0,
            check: |e| matches!(e, Error::Unknown(PE::Protocol(RE::UnknownReply))),
        },
        Case {
            reply: "DELETED (unsolicited)",
            fault: replace(b"DELETED\r\n"),
            keeps_connection: false,
            queued: 0,
            check: |e| {
                matches!(
                    e,
                    Error::Unknown(PE::Protocol(RE::UnexpectedReply { word: "DELETED" }))
                )
            },
        },
        Case {
            reply: "RESERVED 1 1 x (unsolicited)",
            fault: replace(b"RESERVED 1 1\r\nx\r\n"),
            keeps_connection: false,
            queued: 0,
            check: |e| {
                matches!(
                    e,
                    Error::Unknown(PE::Protocol(RE::UnexpectedReply { word: "RESERVED" }))
                )
            },
        },
        Case {
            reply: "INSERTED x",
            fault: replace(b"INSERTED x\r\n"),
            keeps_connection: false,
            queued: 0,
            check: |e| {
                matches!(
                    e,
                    Error::Unknown(PE::Protocol(RE::BadNumber | RE::Malformed { .. }))
                )
            },
        },
        Case {
            reply: "INSERTED 1\\n (bare LF)",
            fault: replace(b"INSERTED 1\n"),
            keeps_connection: false,
            queued: 0,
            check: |e| matches!(e, Error::Unknown(PE::Protocol(RE::BadLineEnd))),
        },
        Case {
            reply: "300 bytes, no line end",
            fault: Fault::Replace {
                after: 0,
                bytes: long_line.to_vec(),
            },
            keeps_connection: false,
            queued: 0,
            check: |e| matches!(e, Error::Unknown(PE::Protocol(RE::LineTooLong))),
        },
        Case {
            reply: "empty line",
            fault: replace(b"\r\n"),
            keeps_connection: false,
            queued: 0,
            check: |e| matches!(e, Error::Unknown(PE::Protocol(_))),
        },
    ];
    let mut rows = Vec::new();
    let mut panics = 0;
    let mut mapped = 0;
    let mut rejections = std::collections::HashSet::new();
    for case in &cases {
        let server = TestServer::start_with(
            ServerConfig::default().faults(FaultPlan::nth(1, case.fault.clone())),
        )
        .unwrap();
        let ledger = server.ledger();
        let run = catch_unwind(AssertUnwindSafe(|| {
            let mut p = producer(server.addr());
            let e = p
                .put(BODY, PutOptions::default())
                .expect_err("not INSERTED");
            let shown = format!("{e:?}");
            let ok = (case.check)(&e) && !e.not_sent();
            let queued_after = ledger.check().added;
            // The producer goes on working: same connection after a rejection,
            // a new one after a reply out of step.
            let id = p
                .put(b"after", PutOptions::default())
                .expect("put afterwards");
            let next_ok = ledger.job(id.get()).is_some_and(|j| j.acknowledged);
            let conns = p.connects();
            (shown, ok, queued_after, next_ok, conns)
        }));
        match run {
            Ok((shown, ok, queued_after, next_ok, conns)) => {
                assert!(ok, "{}: got {shown}", case.reply);
                assert_eq!(
                    queued_after,
                    case.queued,
                    "{}: ledger {}",
                    case.reply,
                    ledger.check()
                );
                assert!(next_ok, "{}: the next put failed", case.reply);
                assert_eq!(
                    conns,
                    if case.keeps_connection { 1 } else { 2 },
                    "{}",
                    case.reply
                );
                mapped += 1;
                if shown.starts_with("Rejected(") {
                    rejections.insert(shown.clone());
                }
                rows.push(format!(
                    "  {:<30} -> {shown}{}",
                    case.reply,
                    if case.keeps_connection {
                        ""
                    } else {
                        "  [reconnected]"
                    }
                ));
            }
            Err(_) => {
                panics += 1;
                rows.push(format!("  {:<30} -> PANIC", case.reply));
            }
        }
    }
    eprintln!("reply to put -> typed result:\n{}", rows.join("\n"));
    eprintln!(
        "cases {}, mapped {mapped}, distinct rejections {}, panics {panics}",
        cases.len(),
        rejections.len()
    );
    assert_eq!(panics, 0);
    assert_eq!(mapped, cases.len());
    // The eight error replies each have their own rejection; garbage and
    // unsolicited lines are all "outcome unknown" (checked per case above).
    assert_eq!(rejections.len(), 8, "every error reply has its own result");
}

#[test]
fn latency_and_tiny_segments_within_the_deadline_are_normal_operation() {
    let server = Beanstalkd::start().unwrap();
    let proxy = ChaosProxy::start(server.addr()).unwrap();
    proxy.add_slow_network();
    let before = total_jobs(server.addr());
    let t0 = Instant::now();
    let mut p = producer(proxy.addr());
    let mut ids = Vec::new();
    for i in 0..10 {
        let id = p
            .put(format!("single-{i}").as_bytes(), PutOptions::default())
            .expect("single put");
        ids.push(id);
    }
    let bodies: Vec<String> = (0..200).map(|i| format!("batch-{i:04}")).collect();
    let mut out = vec![PutOutcome::NotSent; bodies.len()];
    let report = p
        .put_batch(&bodies, PutOptions::default(), &mut out)
        .expect("batch");
    ids.extend(out.iter().filter_map(|o| o.id()));
    let took = t0.elapsed();
    let added = total_jobs(server.addr()) - before;
    eprintln!(
        "producer through 50 ms ± 20 ms latency, 3-byte segments up, 1-byte down: \
         10 puts + batch of 200 in {took:?}; inserted {}, errors 0, connects {}, server total-jobs +{added}",
        ids.len(),
        p.connects()
    );
    assert_eq!(report.inserted, 200);
    assert_eq!(ids.len(), 210);
    assert_eq!(added, 210);
    assert_eq!(p.connects(), 1, "no reconnect");
    assert!(ids.iter().all(|id| in_beanstalkd(server.addr(), id.get())));
}
