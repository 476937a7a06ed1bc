//! `taskq-worker --metrics-addr`: the counters scraped over HTTP mid-run, in the
//! Prometheus text format; and the counter table printed at exit.

mod common;

use std::net::TcpStream;
use std::time::Duration;

use common::*;
use taskq_testkit::Beanstalkd;

#[test]
fn counters_are_scraped_mid_run_and_a_table_printed_at_exit() {
    let server = Beanstalkd::start().unwrap();
    let bodies: Vec<Vec<u8>> = (0..6).map(|i| format!("{i}").into_bytes()).collect();
    put_all(server.addr(), "default", 60, &bodies);
    let port = taskq_testkit::beanstalkd::free_port().unwrap();
    let maddr = format!("127.0.0.1:{port}");
    let dir = TempDir::new("metrics");
    let (runs, go) = (dir.0.join("runs"), dir.0.join("go"));
    let pgids = dir.0.join("pgids");
    // Jobs 0-4 end at once; job 5 waits for the test's go (its group is
    // killed with the worker if the test fails first).
    let script = format!(
        "echo $$ >> {pgids}; b=$(cat); echo $b >> {runs}; if [ \"$b\" = 5 ]; then while [ ! -e {go} ]; do sleep 0.02; done; fi",
        pgids = pgids.display(),
        runs = runs.display(),
        go = go.display()
    );
    let addr = server.addr().to_string();
    let mut w = WorkerProc::start(
        &["--addr", &addr, "--max-jobs", "6", "--metrics-addr", &maddr],
        &script,
    );
    w.kill_groups_on_drop(&pgids);
    assert!(wait_until(Duration::from_secs(10), || lines(&runs).len() == 6));
    let (head, body) = scrape(&maddr, "/metrics");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("openmetrics-text"), "{head}");
    assert_eq!(value(&body, "reserved"), 6, "{body}");
    assert_eq!(value(&body, "deleted"), 5, "{body}");
    assert_eq!(value(&body, "lost_lease"), 0);
    assert_eq!(value(&body, "ack_unknown"), 0);
    assert!(value(&body, "writes") >= 6);
    assert!(
        body.contains("# TYPE taskq_worker_deleted counter"),
        "{body}"
    );
    assert!(
        body.contains("# HELP taskq_worker_deleted Jobs deleted"),
        "{body}"
    );
    assert!(body.trim_end().ends_with("# EOF"));
    let (head, _) = scrape(&maddr, "/nothing");
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");

    std::fs::write(&go, b"").unwrap();
    let st = w.wait(Duration::from_secs(10));
    let err = w.stderr();
    assert!(st.success(), "{st}: {err}");
    // The table: one counter a line, name then value.
    let row = err
        .lines()
        .find(|l| l.starts_with("deleted "))
        .unwrap_or_else(|| panic!("no table: {err}"));
    assert_eq!(row.split_whitespace().collect::<Vec<_>>(), ["deleted", "6"]);
    assert!(err
        .lines()
        .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["lost_lease", "0"]));
    assert!(err.contains("taskq-worker: done 6"), "{err}");
    // The endpoint is gone with the process.
    assert!(TcpStream::connect(&maddr).is_err());
}

#[test]
fn an_unusable_metrics_address_is_one_clear_line() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = output_bounded(
        std::process::Command::new(env!("CARGO_BIN_EXE_taskq-worker")).args([
            "--addr",
            "127.0.0.1:1",
            "--metrics-addr",
            &addr,
            "--",
            "true",
        ]),
        Duration::from_secs(10),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("metrics"), "{err}");
}

/// A client that sends its request a byte at a time, slower than anyone
/// scrapes, holds up no other scrape: each connection is answered on its
/// own, and its request has one deadline in all.
#[cfg(feature = "metrics")]
#[test]
fn a_client_that_sends_slowly_holds_up_no_other_scrape() {
    use std::io::{Read, Write};
    use std::time::Instant;
    let server =
        taskq_worker::metrics::MetricsServer::serve("127.0.0.1:0", || "x 1\n".to_owned()).unwrap();
    let at = server.addr();
    let mut slow = TcpStream::connect(at).unwrap();
    slow.write_all(b"G").unwrap();
    let dribble = std::thread::spawn(move || {
        // One byte every 200 ms: the server gives up on it after its
        // deadline, and a write then fails.
        for _ in 0..40 {
            std::thread::sleep(Duration::from_millis(200));
            if slow.write_all(b"E").is_err() {
                return true;
            }
        }
        false
    });
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    let mut s = TcpStream::connect(at).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    assert!(text.ends_with("x 1\n"), "{text}");
    // Held behind the slow client, it would wait out the whole dribble (8 s).
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    assert!(dribble.join().unwrap(), "the slow client was cut off");
}

/// A client that takes its answer a little at a time, each part within any
/// one write's wait, is cut off once the answer's whole time is up: it
/// cannot hold one of the server's few threads for as long as it likes.
#[cfg(feature = "metrics")]
#[test]
fn a_client_that_reads_slowly_is_cut_off_when_the_answers_time_is_up() {
    use std::io::{Read, Write};
    use std::time::Instant;
    use taskq_worker::metrics::{MetricsServer, RESPONSE_TIME};
    // Far more than the sockets' buffers hold between them.
    let body = "x".repeat(32 << 20);
    let server = MetricsServer::serve("127.0.0.1:0", move || body.clone()).unwrap();
    let mut s = TcpStream::connect(server.addr()).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let t = Instant::now();
    let mut chunk = vec![0u8; 64 << 10];
    let mut got = 0usize;
    // 64 kB a second, for at most the answer's time and 10 s more (what
    // the client's buffer holds at the cut may still be read first).
    let ended = loop {
        if t.elapsed() > RESPONSE_TIME + Duration::from_secs(10) {
            break false;
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => break true,
            Ok(n) => got += n,
        }
        std::thread::sleep(Duration::from_secs(1));
    };
    let took = t.elapsed();
    eprintln!("cut off: {ended} after {took:?}, {got} bytes read");
    assert!(ended, "still answering after {took:?} ({got} bytes read)");
    assert!(got < 32 << 20, "{got}");
    assert!(took >= RESPONSE_TIME - Duration::from_secs(1), "{took:?}");
}
