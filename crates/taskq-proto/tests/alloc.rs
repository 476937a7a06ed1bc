//! Zero allocation in steady state, proved by a counting global allocator:
//! 10,000 put / reserve-with-timeout / delete cycles against a real beanstalkd
//! (with 4 KiB bodies and pipelined batches mixed in) allocate nothing after warm-up.

use taskq_proto::{Command, Connection, ConnectionConfig, Reply};
use taskq_testkit::alloc::{self, CountingAllocator};
use taskq_testkit::Beanstalkd;

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// Allocations made by this thread while `f` runs.
fn allocations_in<T>(f: impl FnOnce() -> T) -> (T, u64) {
    alloc::in_this_thread(f)
}

const SMALL: &[u8; 64] = &[b'j'; 64];
const BIG: &[u8; 4096] = &[b'k'; 4096];
const BATCH: usize = 16;

/// One put / reserve-with-timeout / delete cycle; returns the job id.
fn cycle(c: &mut Connection, body: &[u8]) -> u64 {
    let put = Command::Put {
        pri: 1,
        delay: 0,
        ttr: 60,
        body,
    };
    let id = match c.request(&put).expect("put") {
        Reply::Inserted { id } => id,
        r => panic!("put: {r:?}"),
    };
    match c
        .request(&Command::ReserveWithTimeout { timeout: 1 })
        .expect("reserve")
    {
        Reply::Reserved { id: got, body: b } => {
            assert_eq!(got, id);
            assert_eq!(b, body);
        }
        r => panic!("reserve: {r:?}"),
    }
    assert_eq!(
        c.request(&Command::Delete { id }).expect("delete"),
        Reply::Deleted
    );
    id
}

/// Puts a batch with one write, reads the replies in order, then reserves and deletes them.
fn batch(c: &mut Connection) {
    let put = Command::Put {
        pri: 1,
        delay: 0,
        ttr: 60,
        body: SMALL,
    };
    for _ in 0..BATCH {
        c.queue(&put).unwrap();
    }
    c.flush().unwrap();
    for _ in 0..BATCH {
        assert!(matches!(c.recv().unwrap(), Reply::Inserted { .. }));
    }
    for _ in 0..BATCH {
        let id = match c
            .request(&Command::ReserveWithTimeout { timeout: 1 })
            .unwrap()
        {
            Reply::Reserved { id, .. } => id,
            r => panic!("{r:?}"),
        };
        c.queue(&Command::Delete { id }).unwrap();
    }
    c.flush().unwrap();
    for _ in 0..BATCH {
        assert_eq!(c.recv().unwrap(), Reply::Deleted);
    }
}

#[test]
fn steady_state_allocates_nothing() {
    let server = Beanstalkd::start().expect("start beanstalkd");
    let mut c = Connection::connect(server.addr(), ConnectionConfig::default()).unwrap();

    // Warm-up: the first of each kind of request may size the buffers.
    let (_, warm) = allocations_in(|| {
        cycle(&mut c, SMALL);
        cycle(&mut c, BIG);
        batch(&mut c);
    });

    let ((), steady) = allocations_in(|| {
        for i in 0..10_000 {
            cycle(&mut c, SMALL);
            if i % 100 == 0 {
                cycle(&mut c, BIG);
                batch(&mut c);
            }
        }
    });
    eprintln!("allocations: warm-up {warm}, 10,000 cycles after it {steady}");
    assert_eq!(steady, 0, "steady state must not allocate");
    // The counter works: the warm-up sized the receive and pipeline buffers.
    assert!(warm > 0, "the counting allocator saw nothing at all");
    let ((), probe) = allocations_in(|| drop(std::hint::black_box(vec![1u8; 10])));
    assert_eq!(probe, 1);
}
