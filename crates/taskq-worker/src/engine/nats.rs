//! JetStream for the worker's machine (`machine::js`): how a connection to
//! a cluster is made (its seeds, its settings) and set up (the stream and
//! each tube's durable consumer `taskq-T`), and the parts of the engine's
//! rules (`parts`): pull expiries, what a delivery says of its job, delayed
//! jobs given back, the consumers' record.
//!
//! The lease is the consumer's ack wait, the same for every job of a tube;
//! it stands for beanstalkd's per-job TTR.

use taskq_connect::nats::{ApiLink, JetStream, NatsConfig, StreamSpec};
use taskq_connect::{Address, Layout};
use taskq_proto::nats::{NatsError, NatsLimits};
use taskq_proto::ConnectionError;

use crate::config::Config;
use parts::{connect_error, Tube};

pub(crate) mod parts;

/// The largest `max_payload` a nats-server accepts in its configuration
/// (64 MiB).
const MAX_SERVER_PAYLOAD: usize = 64 << 20;

/// The seeds a connection tries, in order: the address's nodes, started
/// `nth` further on; then the nodes the cluster announced (`connect_urls`),
/// so that a worker given one node goes on through the others when it
/// fails. The cluster's driver starts `nth` at its server's index (0: a
/// worker serves one cluster) and moves it one seed on after each failed
/// connect, so the next attempt starts on the next seed, not on the node
/// that just failed. A management connection opened again on its own
/// starts at the first seed.
pub(crate) fn seeds(addr: &Address, nth: usize, learned: &[String]) -> Vec<String> {
    let mut seeds = addr.hosts().to_vec();
    let n = seeds.len();
    seeds.rotate_left(nth % n.max(1));
    for a in learned {
        if !seeds.contains(a) {
            seeds.push(a.clone());
        }
    }
    seeds
}

/// A worker's connection settings for `addr`.
pub(crate) fn nats_config(cfg: &Config, addr: &Address) -> NatsConfig {
    NatsConfig {
        connect_timeout: cfg.connect_timeout,
        io_timeout: cfg.io_timeout,
        access: cfg.jetstream.access.for_address(addr),
        // Lowered to the server's `max_payload` at connect: whatever the
        // server stores, the worker reads whole (and terminates what is
        // over its own limit) rather than breaking on it.
        limits: NatsLimits {
            max_payload: MAX_SERVER_PAYLOAD,
            ..NatsLimits::default()
        },
        ..NatsConfig::default()
    }
}

/// Makes or looks up the stream (with message schedules where the server
/// holds them, as the producer makes it) and each tube's durable consumer,
/// with the settings a worker gives them, over either driver's link;
/// `nodes` is how many the cluster announced (the default replicas).
pub(crate) async fn set_up<L: ApiLink>(
    link: &mut L,
    cfg: &Config,
    server: &str,
    nodes: usize,
) -> Result<(Layout, Vec<Tube>), ConnectionError> {
    let layout = Layout::new(&cfg.jetstream.stream)
        .map_err(|e| ConnectionError::NotSent(std::io::Error::other(e.to_string())))?;
    let setup = |e: NatsError| {
        tracing::warn!(server, error = %e, "cannot set the JetStream stream or consumer up");
        connect_error(e)
    };
    let replicas = cfg
        .jetstream
        .replicas
        .unwrap_or(if nodes >= 3 { 3 } else { 1 });
    let mut js = JetStream(link);
    js.ensure_stream_with_schedules(&StreamSpec {
        name: layout.stream().to_owned(),
        subjects: vec![layout.capture()],
        replicas,
        duplicate_window: None,
    })
    .await
    .map_err(setup)?;
    let mut tubes = Vec::with_capacity(cfg.tubes.len());
    for name in &cfg.tubes {
        let spec = cfg.jetstream.consumer_spec(&layout, name);
        let consumer = Layout::consumer(name);
        let info = js
            .ensure_consumer(layout.stream(), &consumer, &spec)
            .await
            .map_err(setup)?;
        tubes.push(Tube {
            name: name.clone(),
            buried: layout.buried_subject(name),
            subject: spec.filter_subject,
            consumer,
            ack_wait: info.ack_wait,
        });
    }
    Ok((layout, tubes))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use taskq_connect::nats::{run_blocking, NatsConnection};
    use taskq_proto::nats::Delivery;

    use super::parts::jobs_out;
    use super::*;

    /// A consumer that gave up on a job (past its last delivery) counts it
    /// no more, but the stream still holds it: the idle check asks the
    /// stream too, and trusts it only where every stored job will be
    /// delivered again (no `max_deliver`).
    #[test]
    fn the_streams_record_keeps_a_worker_from_idling_on_a_consumer_that_counts_nothing() {
        let c = taskq_testkit::NatsCluster::start(1).unwrap();
        let mut p = taskq_producer::Producer::connect(c.url()).unwrap();
        p.put(b"job", taskq_producer::PutOptions::default())
            .unwrap();
        let cfg = Config {
            servers: vec![c.url()],
            ..Config::default()
        };
        let addr = Address::parse(&cfg.servers[0]).unwrap();
        let mut conn =
            NatsConnection::connect(&seeds(&addr, 0, &[]), nats_config(&cfg, &addr)).unwrap();
        let (layout, tubes) = run_blocking(set_up(&mut conn, &cfg, &cfg.servers[0], 1)).unwrap();
        let stream = layout.stream().to_owned();
        let out =
            |conn: &mut NatsConnection| run_blocking(jobs_out(conn, &stream, &tubes)).unwrap();
        assert!(out(&mut conn), "the consumer counts one pending");
        let limit = |conn: &mut NatsConnection, max_deliver: i64| {
            let info = conn.api_request(
                "$JS.API.CONSUMER.INFO.TASKQ.taskq-default",
                &serde_json::Value::Null,
            );
            let mut config = info.unwrap()["config"].clone();
            config["max_deliver"] = max_deliver.into();
            config["ack_wait"] = 1_000_000_000u64.into();
            let updated = conn.api_request(
                "$JS.API.CONSUMER.CREATE.TASKQ.taskq-default",
                &serde_json::json!({ "stream_name": "TASKQ", "config": config }),
            );
            assert!(updated.is_ok(), "{updated:?}");
        };
        limit(&mut conn, 1);
        // Its one delivery, never acknowledged: past its ack wait the
        // consumer gives up on it, when next asked for a job, and counts it
        // no more.
        conn.pull_no_wait("TASKQ", "taskq-default", 1).unwrap();
        assert!(matches!(
            conn.next_delivery().unwrap(),
            Delivery::Msg { .. }
        ));
        let given_up = Instant::now() + Duration::from_secs(20);
        loop {
            std::thread::sleep(Duration::from_millis(1100));
            conn.pull(
                "TASKQ",
                "taskq-default",
                1,
                Duration::from_millis(500),
                None,
            )
            .unwrap();
            let d = conn.next_delivery().unwrap();
            assert!(!matches!(d, Delivery::Msg { .. }), "delivered again");
            let info = conn.consumer_info("TASKQ", "taskq-default").unwrap();
            if (info.num_pending, info.num_ack_pending) == (0, 0) {
                break;
            }
            assert!(Instant::now() < given_up, "still counted: {info:?}");
        }
        let stored = conn.subject_counts("TASKQ", "taskq.>").unwrap();
        assert_eq!(stored.get("taskq.default"), Some(&1), "{stored:?}");
        assert!(!out(&mut conn), "a job past its last delivery");
        limit(&mut conn, -1);
        let info = conn.consumer_info("TASKQ", "taskq-default").unwrap();
        assert_eq!((info.num_pending, info.num_ack_pending), (0, 0));
        assert!(out(&mut conn), "the stream holds a job for it");
    }
}
