//! `taskq bench`: the jobs reach the server, and the report has its figures.

mod cli_common;

use cli_common::ok;
use taskq_testkit::Beanstalkd;

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
    let server_stats: serde_json::Value =
        serde_json::from_str(&ok(&["stats", "--addr", &addr, "--json"], b"")).unwrap();
    assert!(
        server_stats["total-connections"].as_u64().unwrap() >= 3,
        "one connection per -c"
    );
}

#[test]
fn bench_without_an_address_measures_the_embedded_reference_server() {
    let report = ok(&["bench", "-n", "500", "--pipeline", "4"], b"");
    assert!(report.contains("embedded reference server"), "{report}");
    assert!(figure(&report, "throughput:") > 0.0);
}
