//! `taskq exporter` scraped for two real beanstalkd servers at once, its numbers
//! checked against each server's own `stats-tube` and `stats`; and for a
//! JetStream cluster beside a beanstalkd, checked against the stream's and the
//! consumer's own record.

mod cli_common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use cli_common::{count_on, ok, pull_one, scrape, with_tube_stats};
use taskq_connect::nats::{ConsumerSpec, NatsConfig, NatsConnection};
use taskq_proto::nats::AckKind;
use taskq_proto::{Command as Cmd, Connection, ConnectionConfig, Reply, ServerStats};
use taskq_testkit::{beanstalkd::free_port, Beanstalkd, NatsCluster};

fn tube_stats(addr: SocketAddr, tube: &str) -> (u64, u64, u64, u64, u64) {
    with_tube_stats(addr, tube, |s| {
        (
            s.current_jobs_ready,
            s.current_jobs_reserved,
            s.current_jobs_delayed,
            s.current_jobs_buried,
            s.total_jobs,
        )
    })
}

#[test]
fn two_servers_scraped_at_once_match_their_stats_tube() {
    let a = Beanstalkd::start().unwrap();
    let b = Beanstalkd::start().unwrap();
    let (aa, ba) = (a.addr().to_string(), b.addr().to_string());
    ok(
        &["put", "--addr", &aa, "--tube", "mail", "1", "2", "3"],
        b"",
    );
    ok(
        &[
            "put", "--addr", &aa, "--tube", "mail", "--delay", "600", "4",
        ],
        b"",
    );
    ok(&["put", "--addr", &ba, "--tube", "img", "x", "y"], b"");
    // On b: one job reserved and buried, and one reserved (held by `held`).
    let mut held = Connection::connect(b.addr(), ConnectionConfig::default()).unwrap();
    held.request(&Cmd::Watch { tube: "img" }).unwrap();
    let id = match held.request(&Cmd::Reserve).unwrap() {
        Reply::Reserved { id, .. } => id,
        r => panic!("{r:?}"),
    };
    assert_eq!(
        held.request(&Cmd::Bury { id, pri: 1 }).unwrap(),
        Reply::Buried
    );
    assert!(matches!(
        held.request(&Cmd::Reserve).unwrap(),
        Reply::Reserved { .. }
    ));

    let (_exporter, at) = exporter(&["--addr", &aa, "--addr", &ba]);
    let m = first_scrape(at);
    let get = |name: &str, labels: &str| -> u64 {
        let key = format!("{name}{{{labels}}}");
        *m.get(&key).unwrap_or_else(|| panic!("no {key} in {m:?}")) as u64
    };
    for (server, tube) in [(&a, "mail"), (&b, "img")] {
        let addr = server.addr().to_string();
        let (ready, reserved, delayed, buried, total) = tube_stats(server.addr(), tube);
        let l = |state: &str| format!("server=\"{addr}\",tube=\"{tube}\",state=\"{state}\"");
        assert_eq!(get("beanstalkd_tube_jobs", &l("ready")), ready);
        assert_eq!(get("beanstalkd_tube_jobs", &l("reserved")), reserved);
        assert_eq!(get("beanstalkd_tube_jobs", &l("delayed")), delayed);
        assert_eq!(get("beanstalkd_tube_jobs", &l("buried")), buried);
        let l = format!("server=\"{addr}\",tube=\"{tube}\"");
        assert_eq!(get("beanstalkd_tube_created_jobs_total", &l), total);
        assert_eq!(get("beanstalkd_up", &format!("server=\"{addr}\"")), 1);
        eprintln!("{addr} {tube}: ready {ready}, reserved {reserved}, delayed {delayed}, buried {buried}, total {total}");
    }
    assert_eq!(tube_stats(a.addr(), "mail"), (3, 0, 1, 0, 4));
    assert_eq!(tube_stats(b.addr(), "img"), (0, 1, 0, 1, 2));
    // Command counters, read at scrape time: cmd-put as the server counts it.
    let mut c = Connection::connect(a.addr(), ConnectionConfig::default()).unwrap();
    let puts = match c.request(&Cmd::Stats).unwrap() {
        Reply::Ok { yaml } => ServerStats::parse(yaml).unwrap().cmd_put,
        r => panic!("{r:?}"),
    };
    assert_eq!(
        get(
            "beanstalkd_server_total",
            &format!("server=\"{aa}\",counter=\"cmd-put\"")
        ),
        puts
    );
    // A fresh scrape sees a change at once.
    ok(&["put", "--addr", &aa, "--tube", "mail", "5"], b"");
    let m2 = scrape(at).unwrap();
    assert_eq!(
        m2[&format!("beanstalkd_tube_jobs{{server=\"{aa}\",tube=\"mail\",state=\"ready\"}}")],
        4.0
    );
}

/// Starts `taskq exporter ARGS` on a free port; the process and its address.
fn exporter(args: &[&str]) -> (cli_common::Reaped, SocketAddr) {
    let listen = format!("127.0.0.1:{}", free_port().unwrap());
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_taskq"))
        .args(["exporter", "--listen", &listen])
        .args(args)
        .env_remove("TASKQ_ADDR")
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    (cli_common::Reaped(child), listen.parse().unwrap())
}

/// The first scrape the exporter answers (within 10 s).
fn first_scrape(at: SocketAddr) -> std::collections::HashMap<String, f64> {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(m) = scrape(at) {
            return m;
        }
        assert!(Instant::now() < until, "exporter did not answer");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn jetstream_tubes_have_the_same_labels_and_match_the_streams_record() {
    let c = NatsCluster::start(1).unwrap();
    let url = c.url();
    let bs = Beanstalkd::start().unwrap();
    let bsa = bs.addr().to_string();
    ok(&["put", "--addr", &bsa, "--tube", "mail", "1"], b"");
    ok(
        &[
            "put", "--addr", &url, "--tube", "a", "1", "2", "3", "4", "5",
        ],
        b"",
    );
    ok(&["put", "--addr", &url, "--tube", "b", "x"], b"");
    // Tube a: two held (one nak'ed and handed out again), one on taskq.a.buried.
    let mut a = NatsConnection::connect(
        &[c.addr(0).to_string()],
        NatsConfig {
            io_timeout: Duration::from_secs(5),
            ..NatsConfig::default()
        },
    )
    .unwrap();
    let spec = ConsumerSpec {
        filter_subject: "taskq.a".into(),
        ack_wait: Duration::from_secs(60),
        max_deliver: -1,
        max_ack_pending: 1000,
        max_waiting: 512,
    };
    a.ensure_consumer("TASKQ", "taskq-a", &spec).unwrap();
    pull_one(&mut a, "a");
    let (ack, _) = pull_one(&mut a, "a");
    assert!(a.ack(&ack, AckKind::Nak { delay: None }, true).unwrap());
    pull_one(&mut a, "a");
    a.publish("taskq.a.buried", b"bury-copy-1", b"buried body")
        .unwrap();

    let (_exporter, at) = exporter(&["--addr", &url, "--addr", &bsa]);
    let m = first_scrape(at);
    let get =
        |key: String| -> u64 { *m.get(&key).unwrap_or_else(|| panic!("no {key} in {m:?}")) as u64 };
    // The cluster's own record.
    let ca = a.consumer_info("TASKQ", "taskq-a").unwrap();
    let s = a.stream_info("TASKQ").unwrap();
    let (stored_a, buried_a, stored_b) = (
        count_on(&mut a, "taskq.a"),
        count_on(&mut a, "taskq.a.buried"),
        count_on(&mut a, "taskq.b"),
    );
    assert_eq!(
        (ca.num_pending, ca.num_ack_pending, ca.num_redelivered),
        (3, 2, 1)
    );
    assert_eq!((stored_a, buried_a, stored_b), (5, 1, 1));
    let l = |tube: &str| format!("server=\"{url}\",tube=\"{tube}\"");
    let state = |tube: &str, st: &str| format!("taskq_tube_jobs{{{},state=\"{st}\"}}", l(tube));
    assert_eq!(get(format!("taskq_up{{server=\"{url}\"}}")), 1);
    assert_eq!(get(state("a", "ready")), ca.num_pending);
    assert_eq!(get(state("a", "reserved")), ca.num_ack_pending);
    assert_eq!(get(state("a", "buried")), buried_a);
    assert_eq!(get(state("a", "urgent")), 0);
    if c.version().unwrap() >= taskq_testkit::ServerVersion::new(2, 12, 0) {
        // The stream has message schedules: delayed jobs are held apart.
        assert_eq!(get(state("a", "delayed")), 0);
    } else {
        assert!(
            !m.contains_key(&state("a", "delayed")),
            "a delay the client holds is known only at delivery: no delayed series"
        );
    }
    assert_eq!(get(state("b", "ready")), stored_b, "no consumer yet");
    assert_eq!(get(format!("taskq_tube_stored{{{}}}", l("a"))), stored_a);
    assert_eq!(
        get(format!("taskq_tube_redelivered{{{}}}", l("a"))),
        ca.num_redelivered
    );
    assert_eq!(
        get(format!("taskq_tube_delivered_total{{{}}}", l("a"))),
        3,
        "three deliveries: two jobs, one of them twice"
    );
    assert_eq!(get(format!("taskq_tube_waiting{{{}}}", l("a"))), 0);
    assert_eq!(
        get(format!("taskq_tube_pause_left_seconds{{{}}}", l("a"))),
        0
    );
    assert!(m.contains_key(&format!(
        "taskq_tube_oldest_ready_age_seconds{{{}}}",
        l("a")
    )));
    let st = format!("server=\"{url}\",stream=\"TASKQ\"");
    assert_eq!(get(format!("taskq_stream_messages{{{st}}}")), s.messages);
    assert_eq!(get(format!("taskq_stream_last_seq{{{st}}}")), s.last_seq);
    // The beanstalkd beside it keeps its names.
    assert_eq!(get(format!("beanstalkd_up{{server=\"{bsa}\"}}")), 1);
    assert_eq!(
        get(format!(
            "beanstalkd_tube_jobs{{server=\"{bsa}\",tube=\"mail\",state=\"ready\"}}"
        )),
        1
    );
    assert!(
        !m.keys()
            .any(|k| k.starts_with("beanstalkd_") && k.contains(&url)),
        "JetStream's series are taskq_*"
    );
    // A fresh scrape follows a put.
    ok(&["put", "--addr", &url, "--tube", "a", "6"], b"");
    let m2 = scrape(at).unwrap();
    assert_eq!(m2[&state("a", "ready")], 4.0);
}

/// A tube name is whoever publishes it: one with a quote and a backslash
/// (`taskq.q"b\`, legal in a NATS subject) comes out escaped, so the scrape
/// stays valid text and the other tubes' series keep coming.
#[test]
fn a_tube_name_with_a_quote_and_a_backslash_is_escaped_in_its_labels() {
    let c = NatsCluster::start(1).unwrap();
    let url = c.url();
    ok(&["put", "--addr", &url, "--tube", "good", "1"], b"");
    let mut a = NatsConnection::connect(&[c.addr(0).to_string()], NatsConfig::default()).unwrap();
    a.publish("taskq.q\"b\\", b"odd-1", b"x").unwrap();
    let (_exporter, at) = exporter(&["--addr", &url]);
    let m = first_scrape(at);
    let l =
        |tube: &str| format!("taskq_tube_jobs{{server=\"{url}\",tube=\"{tube}\",state=\"ready\"}}");
    assert_eq!(m.get(&l("good")), Some(&1.0), "{m:?}");
    assert_eq!(m.get(&l("q\\\"b\\\\")), Some(&1.0), "{m:?}");
    assert!(
        !m.keys().any(|k| k.contains("tube=\"q\"b")),
        "an unescaped quote: {m:?}"
    );
}
