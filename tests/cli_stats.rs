//! `taskq stats`: the server's and a tube's statistics, as a table and as JSON.

mod cli_common;

use cli_common::ok;
use taskq_testkit::Beanstalkd;

#[test]
fn server_and_tube_statistics_as_table_and_json() {
    let server = Beanstalkd::start().unwrap();
    let addr = server.addr().to_string();
    ok(&["put", "--addr", &addr, "--tube", "s", "a", "b"], b"");

    let table = ok(&["stats", "--addr", &addr], b"");
    let line = table.lines().find(|l| l.starts_with("cmd-put ")).unwrap();
    assert_eq!(
        line.split_whitespace().collect::<Vec<_>>(),
        ["cmd-put", "2"]
    );

    let json: serde_json::Value =
        serde_json::from_str(&ok(&["stats", "--addr", &addr, "--json"], b"")).unwrap();
    assert_eq!(json["cmd-put"], 2);
    assert_eq!(json["current-jobs-ready"], 2);
    assert_eq!(json["draining"], false);
    assert!(json["version"].is_string());
    assert!(json["rusage-utime"].is_number());
    assert_eq!(json["pid"], u64::from(server.pid()));

    let tube: serde_json::Value = serde_json::from_str(&ok(
        &["stats", "--addr", &addr, "--tube", "s", "--json"],
        b"",
    ))
    .unwrap();
    assert_eq!(tube["name"], "s");
    assert_eq!(tube["current-jobs-ready"], 2);
    assert_eq!(tube["total-jobs"], 2);
    let table = ok(&["stats", "--addr", &addr, "--tube", "s"], b"");
    assert!(table
        .lines()
        .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["current-jobs-ready", "2"]));
}
