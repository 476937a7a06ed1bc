//! Shared by the NATS client tests: a single JetStream node, a connection to
//! it, and the work-queue stream and consumer the tests use.
#![allow(dead_code)] // not every test file uses every helper

use std::time::Duration;

use taskq_connect::nats::{ConsumerSpec, NatsConfig, NatsConnection, StreamSpec};
use taskq_testkit::NatsCluster;

/// The stream and its subject.
pub const STREAM: &str = "TASKQ";
/// The subject the tests publish to.
pub const SUBJECT: &str = "taskq.T";
/// The consumer the tests pull from.
pub const CONSUMER: &str = "taskq-T";

/// One JetStream node.
pub fn node() -> NatsCluster {
    NatsCluster::start(1).expect("nats-server starts")
}

/// A connection to node 0 with default settings.
pub fn connect(c: &NatsCluster) -> NatsConnection {
    NatsConnection::connect(&[c.addr(0).to_string()], NatsConfig::default()).expect("connect")
}

/// The work-queue stream capturing `taskq.>`.
pub fn stream_spec() -> StreamSpec {
    StreamSpec {
        name: STREAM.into(),
        subjects: vec!["taskq.>".into()],
        replicas: 1,
        duplicate_window: None,
    }
}

/// A consumer of `taskq.T` with this ack wait.
pub fn consumer_spec(ack_wait: Duration) -> ConsumerSpec {
    ConsumerSpec {
        filter_subject: SUBJECT.into(),
        ack_wait,
        max_deliver: -1,
        max_ack_pending: 1000,
        max_waiting: 64,
    }
}

/// A node with the stream and a consumer of `ack_wait`, and a connection.
pub fn ready(ack_wait: Duration) -> (NatsCluster, NatsConnection) {
    let c = node();
    let mut conn = connect(&c);
    conn.ensure_stream(&stream_spec()).expect("stream");
    conn.ensure_consumer(STREAM, CONSUMER, &consumer_spec(ack_wait))
        .expect("consumer");
    (c, conn)
}
