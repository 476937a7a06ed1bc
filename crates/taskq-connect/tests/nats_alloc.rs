//! The NATS hot paths in steady state, against a real nats-server: no
//! allocation per put, per batch, or per pull + ack cycle (a counting global
//! allocator proves it), and one write per put, per batch and per cycle step
//! (the connection's IoCounts prove it; a server PING answered on the way is
//! one more write, counted separately).

mod nats_common;

use std::time::Duration;

use nats_common::{ready, CONSUMER, STREAM, SUBJECT};
use taskq_connect::nats::NatsConnection;
use taskq_proto::nats::{AckKind, Delivery};
use taskq_testkit::alloc::{self, CountingAllocator};

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

const PUTS: u64 = 2000;

/// A message id for put `i`, written into a fixed buffer.
fn id(buf: &mut [u8; 24], i: u64) -> &[u8] {
    let mut b = itoa::Buffer::new();
    let s = b.format(i).as_bytes();
    buf[..s.len()].copy_from_slice(s);
    &buf[..s.len()]
}

fn puts(conn: &mut NatsConnection, from: u64, n: u64, body: &[u8]) {
    let mut buf = [0u8; 24];
    for i in from..from + n {
        let a = conn.publish(SUBJECT, id(&mut buf, i), body).unwrap();
        assert_eq!((a.stream_seq, a.duplicate), (i, false));
    }
}

fn cycles(conn: &mut NatsConnection, n: u64) {
    for _ in 0..n {
        conn.pull(STREAM, CONSUMER, 1, Duration::from_secs(1), None)
            .unwrap();
        let mut ack = [0u8; 128];
        let len = match conn.next_delivery().unwrap() {
            Delivery::Msg { reply, .. } => {
                ack[..reply.len()].copy_from_slice(reply);
                reply.len()
            }
            d => panic!("{d:?}"),
        };
        assert!(conn.ack(&ack[..len], AckKind::Ack, true).unwrap());
    }
}

#[test]
fn puts_and_pull_ack_cycles_allocate_nothing_and_write_once_each() {
    let (_c, mut conn) = ready(Duration::from_secs(30));
    let small = [b'j'; 64];
    let big = vec![b'k'; 16 * 1024];
    // Warm-up: buffers reach their working size.
    puts(&mut conn, 1, 100, &big);
    cycles(&mut conn, 100);

    let w0 = conn.io_counts().writes;
    let p0 = conn.pings_answered();
    let ((), allocs) = alloc::in_this_thread(|| puts(&mut conn, 101, PUTS, &small));
    assert_eq!(allocs, 0, "allocations in {PUTS} puts");
    let writes = conn.io_counts().writes - w0 - (conn.pings_answered() - p0);
    assert_eq!(writes, PUTS, "one write per put");
    let ((), allocs) = alloc::in_this_thread(|| puts(&mut conn, 101 + PUTS, 200, &big));
    assert_eq!(allocs, 0, "allocations in puts of 16 KiB");

    let w0 = conn.io_counts().writes;
    let p0 = conn.pings_answered();
    let ((), allocs) = alloc::in_this_thread(|| cycles(&mut conn, 500));
    assert_eq!(allocs, 0, "allocations in 500 pull + ack cycles");
    let writes = conn.io_counts().writes - w0 - (conn.pings_answered() - p0);
    assert_eq!(writes, 1000, "one write per pull and one per ack");

    // Batches: 100 queued puts, one write, PubAcks in order, no allocation.
    let mut next = 101 + PUTS + 200;
    let mut batch = |conn: &mut NatsConnection| {
        let mut buf = [0u8; 24];
        for i in next..next + 100 {
            conn.queue_publish(SUBJECT, id(&mut buf, i), &[], &small)
                .unwrap();
        }
        conn.flush().unwrap();
        for i in next..next + 100 {
            assert_eq!(conn.recv_puback().unwrap().stream_seq, i);
        }
        next += 100;
    };
    batch(&mut conn);
    let w0 = conn.io_counts().writes;
    let p0 = conn.pings_answered();
    let ((), allocs) = alloc::in_this_thread(|| {
        for _ in 0..10 {
            batch(&mut conn);
        }
    });
    assert_eq!(allocs, 0, "allocations in 10 batches of 100");
    let writes = conn.io_counts().writes - w0 - (conn.pings_answered() - p0);
    assert_eq!(writes, 10, "one write per batch");
}
