//! The async producer on JetStream, on a current-thread runtime: zero heap
//! allocations and exactly one write per put in steady state (the server's
//! `PING`s answered on the way, one write of `PONG` each), proved by
//! counting: a counting global allocator and the driver's write counter.
#![cfg(feature = "tokio")]

use std::time::{Duration, Instant};

use taskq_producer::{Producer, PutOptions, PutOutcome};
use taskq_testkit::alloc::{self, CountingAllocator};
use taskq_testkit::NatsCluster;

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

#[test]
fn ten_thousand_jetstream_puts_allocate_nothing_and_write_once_each() {
    let cluster = NatsCluster::start(1).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let url = cluster.url();
    let small = [b'x'; 64];
    let bodies: Vec<&[u8]> = (0..64).map(|i| &small[..i]).collect();
    let mut out = [PutOutcome::NotSent; 64];
    let opts = PutOptions::default();
    let delayed = PutOptions { delay: 5, ..opts };
    let bounded = |d: u64| Duration::from_secs(d);

    let mut p = rt.block_on(async {
        tokio::time::timeout(bounded(20), async {
            let mut p = Producer::builder()
                .tube("counted")
                .connect_async(&url)
                .await
                .unwrap();
            // Warm up: buffers reach their steady-state sizes, the kept timer is armed.
            for _ in 0..100 {
                p.put(&small, opts).await.unwrap();
            }
            p.put(&small, delayed).await.unwrap();
            p.put(&vec![b'y'; 20_000], opts).await.unwrap();
            p.put_batch(&bodies, opts, &mut out).await.unwrap();
            p
        })
        .await
        .unwrap()
    });

    let before = p.io_counts().unwrap();
    let pings = p.pings_answered().unwrap();
    let started = Instant::now();
    let (puts, n) = alloc::in_this_thread(|| {
        rt.block_on(async {
            tokio::time::timeout(bounded(60), async {
                let mut puts = 0u64;
                // 10,000 puts, and on until the server's first PING (2 s
                // after connect) was met and answered on the way.
                while puts < 10_000
                    || (p.pings_answered() == Some(pings) && started.elapsed() < bounded(10))
                {
                    p.put(&small, opts).await.unwrap();
                    puts += 1;
                }
                puts
            })
            .await
            .unwrap()
        })
    });
    let after = p.io_counts().unwrap();
    let pongs = p.pings_answered().unwrap() - pings;
    eprintln!(
        "{puts} JetStream puts: {n} allocations, {} writes ({pongs} PONG), {} reads",
        after.writes - before.writes,
        after.reads - before.reads
    );
    assert_eq!(n, 0, "allocations in {puts} puts");
    assert!(pongs >= 1, "a server PING was answered during the puts");
    assert_eq!(
        after.writes - before.writes,
        puts + pongs,
        "one write per put"
    );
    assert!(
        after.reads - before.reads <= puts + pongs,
        "a read per PubAck"
    );

    let before = p.io_counts().unwrap();
    let ((), n) = alloc::in_this_thread(|| {
        rt.block_on(async {
            for _ in 0..100 {
                p.put(&small, delayed).await.unwrap();
            }
            for _ in 0..50 {
                let r = p.put_batch(&bodies, opts, &mut out).await.unwrap();
                assert_eq!(r.inserted, 64);
            }
        })
    });
    assert_eq!(n, 0, "allocations in 100 delayed puts and 50 batches of 64");
    assert_eq!(
        p.io_counts().unwrap().writes - before.writes,
        150,
        "one write per delayed put and per batch"
    );

    // A put's future is small enough that `block_on` does not box it.
    let ((), n) = alloc::in_this_thread(|| {
        for _ in 0..100 {
            rt.block_on(p.put(&small, opts)).unwrap();
        }
    });
    assert_eq!(n, 0, "allocations in 100 block_on(put)");
    assert!(alloc::in_this_thread(|| drop(std::hint::black_box(vec![1u8; 10]))).1 >= 1);
}
