//! The async producer on a current-thread runtime: zero heap allocations and
//! exactly one write per put in steady state, proved by counting (a counting
//! global allocator and the driver's write counter).
#![cfg(feature = "tokio")]

use std::time::Duration;

use taskq_producer::{AsyncProducer, PutOptions, PutOutcome};
use taskq_testkit::alloc::{self, CountingAllocator};
use taskq_testkit::Beanstalkd;

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

#[test]
fn ten_thousand_puts_allocate_nothing_and_write_once_each() {
    let server = Beanstalkd::start().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let addr = server.addr().to_string();
    let small = [b'x'; 64];
    let large = vec![b'y'; 20_000]; // past the inline buffer: a vectored write
    let bodies: Vec<&[u8]> = (0..64).map(|i| &small[..i]).collect();
    let mut out = [PutOutcome::NotSent; 64];
    let opts = PutOptions::default();
    let bounded = |d: u64| Duration::from_secs(d);

    let mut p = rt.block_on(async {
        tokio::time::timeout(bounded(10), async {
            let mut p = AsyncProducer::connect(&addr).await.unwrap();
            p.use_tube("counted").await.unwrap();
            // Warm up: buffers reach their steady-state sizes, the kept timer is armed.
            for _ in 0..100 {
                p.put(&small, opts).await.unwrap();
            }
            p.put(&large, opts).await.unwrap();
            p.put_batch(&bodies, opts, &mut out).await.unwrap();
            p
        })
        .await
        .unwrap()
    });

    let before = p.io_counts().unwrap();
    let ((), n) = alloc::in_this_thread(|| {
        rt.block_on(async {
            tokio::time::timeout(bounded(60), async {
                for _ in 0..10_000 {
                    p.put(&small, opts).await.unwrap();
                }
            })
            .await
            .unwrap()
        })
    });
    let after = p.io_counts().unwrap();
    eprintln!(
        "10000 puts: {n} allocations, {} writes, {} reads",
        after.writes - before.writes,
        after.reads - before.reads
    );
    assert_eq!(n, 0, "allocations in 10,000 puts");
    assert_eq!(after.writes - before.writes, 10_000, "one write per put");
    assert_eq!(
        after.reads - before.reads,
        10_000,
        "one read per put on loopback"
    );

    let before = p.io_counts().unwrap();
    let ((), n) = alloc::in_this_thread(|| {
        rt.block_on(async {
            for _ in 0..100 {
                p.put(&large, opts).await.unwrap();
            }
            for _ in 0..50 {
                let r = p.put_batch(&bodies, opts, &mut out).await.unwrap();
                assert_eq!(r.inserted, 64);
            }
        })
    });
    assert_eq!(n, 0, "allocations in 100 large puts and 50 batches of 64");
    assert_eq!(
        p.io_counts().unwrap().writes - before.writes,
        150,
        "one write per large put and per batch"
    );

    // A put's future is small (its cold paths are boxed): tokio boxes a
    // future over 2 KiB (16 KiB in release builds) given to `block_on` or
    // `spawn`, which a put with its reconnect path inlined (3.6 KiB) was.
    let ((), n) = alloc::in_this_thread(|| {
        for _ in 0..100 {
            rt.block_on(p.put(&small, opts)).unwrap();
        }
    });
    assert_eq!(n, 0, "allocations in 100 block_on(put)");

    // The counter itself works: an allocation is seen.
    assert!(alloc::in_this_thread(|| drop(std::hint::black_box(vec![1u8; 10]))).1 >= 1);
}
