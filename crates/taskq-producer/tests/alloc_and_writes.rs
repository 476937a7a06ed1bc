//! Zero heap allocations and exactly one write per put, proved by counting: a
//! counting global allocator and the connection's write counter.

use taskq_producer::{Producer, PutOptions, PutOutcome};
use taskq_testkit::alloc::{self, CountingAllocator};
use taskq_testkit::Beanstalkd;

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// Allocations made by `f` (the producer does all its work on the caller's
/// thread). The count adds up every counting thread's allocations: one test
/// measures at a time.
fn allocations(f: impl FnOnce()) -> u64 {
    alloc::in_this_thread(f).1
}

static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn put_put_batch_and_position_allocate_nothing_and_write_once() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let server = Beanstalkd::start().unwrap();
    let mut p = Producer::builder()
        .tube("counted")
        .connect(server.addr())
        .unwrap();
    let small = [b'x'; 100];
    let large = vec![b'y'; 20_000]; // past the inline buffer: a vectored write
    let bodies: Vec<&[u8]> = (0..64).map(|i| &small[..i]).collect();
    let mut out = [PutOutcome::NotSent; 64];
    let opts = PutOptions::default();
    // Warm up: buffers reach their steady-state sizes.
    p.put(&small, opts).unwrap();
    p.put(&large, opts).unwrap();
    p.put_batch(&bodies, opts, &mut out).unwrap();
    p.put_with_position(&small, opts).unwrap();

    let before = p.io_counts().unwrap();
    let n = allocations(|| {
        for _ in 0..1000 {
            p.put(&small, opts).unwrap();
        }
    });
    assert_eq!(n, 0, "allocations in 1000 small puts");
    let after = p.io_counts().unwrap();
    assert_eq!(after.writes - before.writes, 1000, "one write per put");
    assert_eq!(
        after.reads - before.reads,
        1000,
        "one read per put on loopback"
    );

    let before = p.io_counts().unwrap();
    let n = allocations(|| {
        for _ in 0..100 {
            p.put(&large, opts).unwrap();
        }
    });
    assert_eq!(n, 0, "allocations in 100 large puts");
    assert_eq!(p.io_counts().unwrap().writes - before.writes, 100);

    let before = p.io_counts().unwrap();
    let n = allocations(|| {
        for _ in 0..50 {
            let r = p.put_batch(&bodies, opts, &mut out).unwrap();
            assert_eq!(r.inserted, 64);
        }
    });
    assert_eq!(n, 0, "allocations in 50 batches of 64");
    assert_eq!(
        p.io_counts().unwrap().writes - before.writes,
        50,
        "one write per batch"
    );

    let before = p.io_counts().unwrap();
    let n = allocations(|| {
        for _ in 0..100 {
            p.put_with_position(&small, opts).unwrap();
        }
    });
    assert_eq!(n, 0, "allocations in 100 puts with position");
    assert_eq!(p.io_counts().unwrap().writes - before.writes, 100);

    // The counter itself works: an allocation is seen.
    assert!(allocations(|| drop(std::hint::black_box(vec![1u8; 10]))) >= 1);
}

#[test]
fn jetstream_put_and_put_batch_allocate_nothing_and_write_once() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = taskq_testkit::NatsCluster::start(1).unwrap();
    let mut p = Producer::builder()
        .tube("counted")
        .connect(cluster.url())
        .unwrap();
    let small = [b'x'; 100];
    let bodies: Vec<&[u8]> = (0..64).map(|i| &small[..i]).collect();
    let mut out = [PutOutcome::NotSent; 64];
    let opts = PutOptions::default();
    let delayed = PutOptions { delay: 5, ..opts };
    // Warm up: buffers reach their steady-state sizes.
    p.put(&small, opts).unwrap();
    p.put(&small, delayed).unwrap();
    p.put_batch(&bodies, opts, &mut out).unwrap();

    let before = p.io_counts().unwrap();
    let n = allocations(|| {
        for _ in 0..1000 {
            p.put(&small, opts).unwrap();
        }
    });
    assert_eq!(n, 0, "allocations in 1000 JetStream puts");
    let after = p.io_counts().unwrap();
    // The server PINGs once a few seconds after connect: its PONG is a write
    // of its own, so allow one.
    let writes = after.writes - before.writes;
    assert!(
        (1000..=1001).contains(&writes),
        "{writes} writes for 1000 puts"
    );

    let n = allocations(|| {
        for _ in 0..100 {
            p.put(&small, delayed).unwrap();
        }
    });
    assert_eq!(
        n, 0,
        "allocations in 100 delayed puts (a ready time; on a current server a schedule on a subject of its own)"
    );

    let before = p.io_counts().unwrap();
    let n = allocations(|| {
        for _ in 0..50 {
            let r = p.put_batch(&bodies, opts, &mut out).unwrap();
            assert_eq!(r.inserted, 64);
        }
    });
    assert_eq!(n, 0, "allocations in 50 JetStream batches of 64");
    let writes = p.io_counts().unwrap().writes - before.writes;
    assert!(
        (50..=51).contains(&writes),
        "{writes} writes for 50 batches"
    );
}
