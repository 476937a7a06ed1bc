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

/// A server that lists more tubes than taskq reads at once (here a scripted
/// beanstalkd whose `list-tubes` names 100,001): `taskq tubes` says so, with
/// one line and a failing status, and asks for no tube's statistics.
#[test]
fn a_server_listing_more_tubes_than_taskq_reads_is_an_error_not_memory() {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (asked, commands) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let Ok((s, _)) = listener.accept() else {
            return;
        };
        let mut w = s.try_clone().unwrap();
        let mut names = String::from("---\n");
        for i in 0..=100_000 {
            names.push_str(&format!("- t{i}\n"));
        }
        for line in BufReader::new(s).lines() {
            let Ok(line) = line else { return };
            let reply = match line.as_str() {
                "stats" => "OK 4\r\n---\n\r\n".to_owned(),
                "list-tubes" => format!("OK {}\r\n{names}\r\n", names.len()),
                _ => "NOT_FOUND\r\n".to_owned(),
            };
            let _ = asked.send(line);
            if w.write_all(reply.as_bytes()).is_err() {
                return;
            }
        }
    });
    let (out, _) = cli_common::taskq(
        &["tubes", "--addr", &addr, "--io-timeout", "5000"],
        b"",
        std::time::Duration::from_secs(60),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("more than 100000 tubes"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let asked: Vec<String> = commands.try_iter().collect();
    assert_eq!(asked, ["stats", "list-tubes"]);
}
