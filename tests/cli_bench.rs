//! `taskq bench`: the jobs reach the server, and the report has its figures.

mod cli_common;

use cli_common::ok;
use taskq_proto::{Command, Connection, ConnectionConfig, Reply, ServerStats};
use taskq_testkit::Beanstalkd;

/// The server's `total-connections`, read on a connection of its own (which
/// that figure counts).
fn total_connections(addr: &str) -> u64 {
    let mut c = Connection::connect(addr, ConnectionConfig::default()).unwrap();
    match c.request(&Command::Stats).unwrap() {
        Reply::Ok { yaml } => ServerStats::parse(yaml).unwrap().total_connections,
        r => panic!("stats: {r:?}"),
    }
}

fn figure(report: &str, name: &str) -> f64 {
    let line = report
        .lines()
        .find(|l| l.trim_start().starts_with(name))
        .unwrap_or_else(|| panic!("no {name} in\n{report}"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn bench_against_beanstalkd_puts_every_job_and_reports_latency() {
    let server = Beanstalkd::start().unwrap();
    let addr = server.addr().to_string();
    let before = total_connections(&addr);
    let report = ok(
        &[
            "bench",
            "--addr",
            &addr,
            "-n",
            "3001",
            "-c",
            "3",
            "--pipeline",
            "16",
            "--size",
            "100",
        ],
        b"",
    );
    // Read right after the bench: only the bench and this reading connected.
    let after = total_connections(&addr);
    assert_eq!(after - before - 1, 3, "one connection per -c");
    assert!(figure(&report, "throughput:") > 0.0, "{report}");
    let p50 = figure(&report, "p50");
    let p99 = figure(&report, "p99 ");
    let max = figure(&report, "max");
    assert!(p50 > 0.0 && p50 <= p99 && p99 <= max, "{report}");
    for q in ["p90", "p99.9"] {
        figure(&report, q);
    }
    let stats: serde_json::Value = serde_json::from_str(&ok(
        &["stats", "--addr", &addr, "--tube", "taskq-bench", "--json"],
        b"",
    ))
    .unwrap();
    assert_eq!(stats["total-jobs"], 3001);
}

#[test]
fn bench_without_an_address_measures_the_embedded_reference_server() {
    let report = ok(&["bench", "-n", "500", "--pipeline", "4"], b"");
    assert!(report.contains("embedded reference server"), "{report}");
    assert!(figure(&report, "throughput:") > 0.0);
}
