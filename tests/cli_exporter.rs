//! `taskq exporter` scraped for two real beanstalkd servers at once, its numbers
//! checked against each server's own `stats-tube` and `stats`.

mod cli_common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use cli_common::{ok, with_tube_stats};
use taskq_proto::{Command as Cmd, Connection, ConnectionConfig, Reply, ServerStats};
use taskq_testkit::{beanstalkd::free_port, Beanstalkd};

/// GET /metrics: each sample line as (name{labels}, value).
fn scrape(at: SocketAddr) -> Option<HashMap<String, f64>> {
    let mut s = TcpStream::connect_timeout(&at, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let body = text.split_once("\r\n\r\n")?.1;
    Some(
        body.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (k, v) = l.rsplit_once(' ')?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect(),
    )
}

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

    let port = free_port().unwrap();
    let listen = format!("127.0.0.1:{port}");
    let _exporter = cli_common::Reaped(
        std::process::Command::new(env!("CARGO_BIN_EXE_taskq"))
            .args([
                "exporter", "--listen", &listen, "--addr", &aa, "--addr", &ba,
            ])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let at: SocketAddr = listen.parse().unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    let m = loop {
        if let Some(m) = scrape(at) {
            break m;
        }
        assert!(Instant::now() < until, "exporter did not answer");
        std::thread::sleep(Duration::from_millis(50));
    };
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
