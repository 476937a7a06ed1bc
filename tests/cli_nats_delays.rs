//! Delayed jobs as the operators' commands see them on a current nats-server
//! (2.12+, message schedules): `tubes`, `stats` and `peek --delayed` count
//! and show the schedules the server holds for a tube, `delete` cancels one,
//! and `taskq put --keep-stream-config` leaves an existing stream as it is
//! (delays then stay with the client, as on nats-server 2.9.10, where
//! tests/cli_nats.rs shows `delayed` null and `peek --delayed` refused).

mod cli_common;

use std::time::Duration;

use cli_common::{current_node, ok, taskq};
use serde_json::Value;
use taskq_connect::nats::{NatsConfig, NatsConnection, StreamSpec};
use taskq_testkit::NatsCluster;

/// `taskq ARGS --addr URL`, expected to succeed; its stdout.
fn run(c: &NatsCluster, args: &[&str]) -> String {
    let url = c.url();
    let mut all = args.to_vec();
    all.extend(["--addr", &url, "--io-timeout", "5000"]);
    ok(&all, b"")
}

/// `taskq ARGS --addr URL`, expected to fail with exit status 1 and `want`
/// in its error.
fn fails(c: &NatsCluster, args: &[&str], want: &str) {
    let url = c.url();
    let mut all = args.to_vec();
    all.extend(["--addr", &url, "--io-timeout", "5000"]);
    let (out, _) = taskq(&all, b"", Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{all:?}: {err}");
    assert!(err.contains(want), "{all:?}: {err}");
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// The tube named `name` of `taskq tubes --json`.
fn tube(c: &NatsCluster, name: &str) -> Value {
    let tubes = json(&run(c, &["tubes", "--json"]));
    tubes
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no tube {name} in {tubes}"))
}

fn admin(c: &NatsCluster) -> NatsConnection {
    NatsConnection::connect(&[c.addr(0).to_string()], NatsConfig::default()).unwrap()
}

/// The stream's configuration as the server gives it.
fn stream_config(c: &NatsCluster) -> Value {
    let raw = admin(c)
        .request("$JS.API.STREAM.INFO.TASKQ", b"", Duration::from_secs(2))
        .unwrap();
    json(std::str::from_utf8(&raw).unwrap())["config"].clone()
}

#[test]
fn scheduled_jobs_count_as_delayed_and_peek_delayed_shows_the_first_due() {
    let Some(c) = current_node() else { return };
    run(&c, &["put", "--tube", "d", "--delay", "90", "last"]);
    run(&c, &["put", "--tube", "d", "--delay", "30", "first"]);
    run(&c, &["put", "--tube", "d", "now"]);
    run(&c, &["put", "--tube", "e", "--delay", "60", "x", "y"]);
    let d = tube(&c, "d");
    assert_eq!(
        (&d["delayed"], &d["ready"], &d["stored"]),
        (&2.into(), &1.into(), &1.into()),
        "{d}"
    );
    let e = tube(&c, "e");
    assert_eq!((&e["delayed"], &e["ready"]), (&2.into(), &0.into()), "{e}");
    let st = json(&run(&c, &["stats", "--json"]));
    assert_eq!(st["current-jobs-delayed"], 4, "{st}");
    assert_eq!(st["allow-msg-schedules"], true, "{st}");
    let sd = json(&run(&c, &["stats", "--tube", "d", "--json"]));
    assert_eq!(sd["current-jobs-delayed"], 2, "{sd}");
    let table = run(&c, &["tubes"]);
    assert!(
        table
            .lines()
            .any(|l| l.split_whitespace().take(5).collect::<Vec<_>>() == ["d", "1", "0", "0", "2"]),
        "{table}"
    );

    // The next delayed job: the one the server makes ready first.
    assert_eq!(
        run(&c, &["peek", "--tube", "d", "--delayed", "--raw"]),
        "first"
    );
    let shown = run(&c, &["peek", "--tube", "d", "--delayed"]);
    let row = |k: &str| {
        shown
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .map(|v| v.trim().to_owned())
            .unwrap_or_else(|| panic!("no {k} in {shown}"))
    };
    assert_eq!(row("state"), "delayed");
    assert!(row("subject").starts_with("taskq.d.delayed."), "{shown}");
    assert!(row("ready at").ends_with('Z'), "{shown}");
    assert!(shown.contains("Nats-Schedule-Target: taskq.d"), "{shown}");
    let id = row("id");
    // Deleting its schedule cancels a delayed job.
    assert_eq!(run(&c, &["delete", &id]), format!("deleted {id}\n"));
    assert_eq!(tube(&c, "d")["delayed"], 1);
    assert_eq!(
        run(&c, &["peek", "--tube", "d", "--delayed", "--raw"]),
        "last"
    );
    fails(
        &c,
        &["peek", "--tube", "e", "--ready"],
        "no ready job in tube e",
    );
}

#[test]
fn put_keep_stream_config_leaves_the_stream_as_it_is_and_delays_stay_with_the_client() {
    let Some(c) = current_node() else { return };
    // The operator's stream, made without message schedules.
    admin(&c)
        .ensure_stream(&StreamSpec {
            name: "TASKQ".into(),
            subjects: vec!["taskq.>".into()],
            replicas: 1,
            duplicate_window: None,
        })
        .unwrap();
    let before = stream_config(&c);
    run(
        &c,
        &[
            "put",
            "--keep-stream-config",
            "--tube",
            "d",
            "--delay",
            "30",
            "kept",
        ],
    );
    assert_eq!(stream_config(&c), before, "the stream is untouched");
    let d = tube(&c, "d");
    assert_eq!(
        (&d["delayed"], &d["ready"]),
        (&Value::Null, &1.into()),
        "{d}"
    );
    assert_eq!(
        json(&run(&c, &["stats", "--json"]))["allow-msg-schedules"],
        false
    );
    fails(
        &c,
        &["peek", "--tube", "d", "--delayed"],
        "peek --delayed is not supported on nats (JetStream): this stream has no message schedules",
    );
    // Without the flag the stream is made to allow them.
    run(&c, &["put", "--tube", "d", "--delay", "30", "held"]);
    assert_eq!(stream_config(&c)["allow_msg_schedules"], true);
    let d = tube(&c, "d");
    assert_eq!((&d["delayed"], &d["ready"]), (&1.into(), &1.into()), "{d}");
    assert_eq!(
        run(&c, &["peek", "--tube", "d", "--delayed", "--raw"]),
        "held"
    );
}
