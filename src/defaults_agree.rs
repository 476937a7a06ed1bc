//! Every part of taskq that connects starts from the one set of defaults in
//! `taskq_proto::defaults`: checked here, where all of them are in reach,
//! without a socket.

use clap::CommandFactory;
use taskq_connect::nats::NatsConfig;
use taskq_connect::Address;
use taskq_producer::{NatsAccess, Producer};
use taskq_proto::defaults::{
    API_PATIENCE, CONNECT_TIMEOUT, IO_TIMEOUT, KEEPALIVE, RECONNECT_BACKOFF,
};
use taskq_proto::{Backoff, ConnectionConfig};

#[test]
fn every_part_defaults_to_the_one_definition() {
    // The protocol core's two blocking connections.
    let c = ConnectionConfig::default();
    assert_eq!(
        (c.connect_timeout, c.io_timeout, c.keepalive),
        (CONNECT_TIMEOUT, IO_TIMEOUT, KEEPALIVE)
    );
    let n = NatsConfig::default();
    assert_eq!(
        (n.connect_timeout, n.io_timeout, n.keepalive, n.api_patience),
        (CONNECT_TIMEOUT, IO_TIMEOUT, KEEPALIVE, API_PATIENCE)
    );
    assert_eq!(n.access, NatsAccess::default());
    assert_eq!(
        (Backoff::RECONNECT, Backoff::default()),
        (RECONNECT_BACKOFF, RECONNECT_BACKOFF)
    );

    // The producers' builder (the blocking, async and shared producers all
    // start from it): its connection settings and backoff as shown by Debug;
    // its own unit test reads the API patience it hands JetStream.
    let b = format!("{:?}", Producer::builder());
    assert!(b.contains(&format!("cfg: {c:?}")), "{b}");
    assert!(
        b.contains(&format!("backoff: {RECONNECT_BACKOFF:?}")),
        "{b}"
    );
    assert!(
        b.contains(&format!("access: {:?}", NatsAccess::default())),
        "{b}"
    );

    // The worker library.
    let w = taskq_worker::Config::default();
    assert_eq!(
        (w.connect_timeout, w.io_timeout, w.reconnect_backoff),
        (CONNECT_TIMEOUT, IO_TIMEOUT, RECONNECT_BACKOFF)
    );
    assert_eq!(w.jetstream.access, NatsAccess::default());

    // The taskq command: every subcommand's --io-timeout (which bounds
    // connecting too), and the admin connection built from it.
    let ms = IO_TIMEOUT.as_millis().to_string();
    let mut seen = Vec::new();
    for sub in crate::Cli::command().get_subcommands() {
        let Some(arg) = sub.get_arguments().find(|a| a.get_id() == "io_timeout") else {
            continue;
        };
        let d: Vec<_> = arg
            .get_default_values()
            .iter()
            .map(|v| v.to_str())
            .collect();
        assert_eq!(
            d,
            [Some(ms.as_str())],
            "taskq {} --io-timeout",
            sub.get_name()
        );
        seen.push(sub.get_name().to_owned());
    }
    for sub in [
        "put", "stats", "tubes", "top", "exporter", "web", "bench", "demo",
    ] {
        assert!(
            seen.iter().any(|s| s == sub),
            "taskq {sub}: no --io-timeout in {seen:?}"
        );
    }
    let addr = Address::parse("nats://127.0.0.1:4222").unwrap();
    let js = crate::jetstream::Js::config(&addr, crate::server::IO_TIMEOUT_MS);
    assert_eq!(
        (
            js.connect_timeout,
            js.io_timeout,
            js.keepalive,
            js.api_patience
        ),
        (CONNECT_TIMEOUT, IO_TIMEOUT, KEEPALIVE, API_PATIENCE)
    );
}
