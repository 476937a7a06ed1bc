//! Puts over TLS, counted: the producer writes each put and
//! each batch of 64 with one send call (one TLS record), and the TLS
//! library allocates per record, not per job, so a batch of 64 costs about
//! what one put costs; a body larger than the TLS library's buffers goes
//! out whole. Plain TCP stays at zero allocations per put
//! (alloc_and_writes.rs).

use taskq_connect::nats::{NatsAccess, TlsSettings};
use taskq_producer::{Producer, PutOptions, PutOutcome};
use taskq_testkit::alloc::{self, CountingAllocator};
use taskq_testkit::{NatsCluster, TempDir, TestCerts};

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// Allocations made by `f` on this thread (the producer does all its work on
/// the caller's thread).
fn allocations(f: impl FnOnce()) -> u64 {
    alloc::in_this_thread(f).1
}

const PUTS: u64 = 1000;
const BATCHES: u64 = 50;

/// A single TLS server (its certificates in `dir`) and a producer on `tube` connected to it.
fn tls_producer(dir: &TempDir, tube: &str) -> (NatsCluster, Producer) {
    let certs = TestCerts::generate(dir.path()).unwrap();
    let server = NatsCluster::builder()
        .config(format!(
            "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n}}\n",
            certs.server_cert.display(),
            certs.server_key.display()
        ))
        .start()
        .unwrap();
    let p = Producer::builder()
        .tube(tube)
        .max_job_size(2 << 20)
        .nats_access(NatsAccess {
            tls: TlsSettings {
                ca_file: Some(certs.ca.clone()),
                ..TlsSettings::default()
            },
            ..NatsAccess::default()
        })
        .connect(format!("tls://{}", server.addr(0)))
        .unwrap();
    (server, p)
}

#[test]
fn a_tls_put_and_a_tls_batch_of_64_each_write_once_and_allocate_per_record() {
    let dir = TempDir::new("tls-alloc");
    let (_server, mut p) = tls_producer(&dir, "counted");
    let small = [b'x'; 100];
    let bodies: Vec<&[u8]> = (0..64).map(|i| &small[..i]).collect();
    let mut out = [PutOutcome::NotSent; 64];
    let opts = PutOptions::default();
    // Warm up: buffers reach their steady-state sizes.
    for _ in 0..10 {
        p.put(&small, opts).unwrap();
        p.put_batch(&bodies, opts, &mut out).unwrap();
    }

    let before = p.io_counts().unwrap();
    let per_put = allocations(|| {
        for _ in 0..PUTS {
            p.put(&small, opts).unwrap();
        }
    }) as f64
        / PUTS as f64;
    let after = p.io_counts().unwrap();
    let put_writes = after.writes - before.writes;
    let put_reads = after.reads - before.reads;
    // The server PINGs a few seconds after connect: its PONG is a write of its own.
    assert!(
        (PUTS..=PUTS + 1).contains(&put_writes),
        "{put_writes} writes for {PUTS} TLS puts"
    );

    let before = p.io_counts().unwrap();
    let per_batch = allocations(|| {
        for _ in 0..BATCHES {
            let r = p.put_batch(&bodies, opts, &mut out).unwrap();
            assert_eq!(r.inserted, 64);
        }
    }) as f64
        / BATCHES as f64;
    let after = p.io_counts().unwrap();
    let batch_writes = after.writes - before.writes;
    let batch_reads = after.reads - before.reads;
    assert!(
        (BATCHES..=BATCHES + 1).contains(&batch_writes),
        "{batch_writes} writes for {BATCHES} TLS batches of 64"
    );

    println!(
        "TLS: {per_put:.2} allocations and {:.2} reads per put; \
         {per_batch:.2} allocations and {:.2} reads per batch of 64 ({:.3} allocations per job)",
        put_reads as f64 / PUTS as f64,
        batch_reads as f64 / BATCHES as f64,
        per_batch / 64.0
    );
    // Records, not jobs: a put is one record out (its head, body and end
    // gathered) and its PubAck one record in, one allocation each (a server
    // PING in the window adds a pair); a batch is one record out and its 64
    // PubAcks in a few records (as the server flushes them: about 5 here,
    // more on a loaded machine). Per job it would be 64 times a put.
    assert!(
        (2.0..=2.01).contains(&per_put),
        "{per_put} allocations per TLS put"
    );
    assert!(
        per_batch <= 8.0 * per_put,
        "a batch of 64 costs {per_batch} allocations, a put {per_put}: per job, not per record"
    );
}

#[test]
fn tls_puts_larger_than_the_tls_library_buffers_go_out_whole_in_one_send() {
    let dir = TempDir::new("tls-large");
    let (_server, mut p) = tls_producer(&dir, "large");
    let opts = PutOptions::default();
    // rustls buffers 64 KiB of records by default; a body past that, and one
    // near the server's 1 MiB payload limit.
    for len in [70_000, 1_000_000] {
        let body: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let before = p.io_counts().unwrap();
        p.put(&body, opts)
            .unwrap_or_else(|e| panic!("a TLS put of {len} bytes: {e}"));
        let writes = p.io_counts().unwrap().writes - before.writes;
        assert_eq!(writes, 1, "send calls for a TLS put of {len} bytes");
    }
}
