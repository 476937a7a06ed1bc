//! The enqueue path against a local beanstalkd, each case beside its raw
//! baseline in the same group: pre-built request bytes on a plain `TcpStream`,
//! one write and one read per put (or per pipelined batch).
//!
//! `cargo bench --bench producer` (needs `beanstalkd` on PATH). Throughput is
//! reported in jobs per second; compare `producer` with `raw` in each group,
//! and in the `put` group with `peer_beanstalkc`, the `beanstalkc` crate.
#![allow(missing_docs)] // criterion_group! defines an undocumented public function.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use taskq_producer::{Producer, PutOptions, PutOutcome};
use taskq_testkit::Beanstalkd;

const SIZE: usize = 64;

fn request() -> Vec<u8> {
    let mut req = format!("put 1024 0 60 {SIZE}\r\n").into_bytes();
    req.extend_from_slice(&[b'x'; SIZE]);
    req.extend_from_slice(b"\r\n");
    req
}

fn raw_stream(server: &Beanstalkd) -> TcpStream {
    let s = TcpStream::connect(server.addr()).unwrap();
    s.set_nodelay(true).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

/// Reads until `replies` reply lines (CRLF-terminated) have arrived.
fn read_replies(s: &mut TcpStream, buf: &mut [u8], replies: usize) {
    let mut seen = 0;
    while seen < replies {
        let n = s.read(buf).unwrap();
        assert!(n > 0, "server closed");
        seen += buf[..n].iter().filter(|&&b| b == b'\n').count();
    }
}

fn bench_put(c: &mut Criterion) {
    let server = Beanstalkd::start().expect("beanstalkd must be installed");
    let mut g = c.benchmark_group("put");
    g.throughput(Throughput::Elements(1));
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(2));

    let req = request();
    let mut s = raw_stream(&server);
    let mut buf = [0u8; 64];
    g.bench_function("raw", |b| {
        b.iter(|| {
            s.write_all(&req).unwrap();
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0 && buf[0] == b'I');
        })
    });

    let mut p = Producer::connect(server.addr()).unwrap();
    let body = [b'x'; SIZE];
    g.bench_function("producer", |b| {
        b.iter(|| p.put(&body, PutOptions::default()).unwrap())
    });

    // A peer from crates.io, the same put through its API, for the README's
    // "against other clients" ratio.
    let mut peer = beanstalkc::Beanstalkc::new()
        .host("127.0.0.1")
        .port(server.addr().port())
        .connect()
        .unwrap();
    g.bench_function("peer_beanstalkc", |b| {
        b.iter(|| {
            peer.put(&body, 1024, Duration::ZERO, Duration::from_secs(60))
                .unwrap()
        })
    });
    g.finish();
}

fn bench_batch(c: &mut Criterion) {
    let server = Beanstalkd::start().expect("beanstalkd must be installed");
    let mut g = c.benchmark_group("put_batch");
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(2));
    let body = [b'x'; SIZE];
    let mut p = Producer::connect(server.addr()).unwrap();
    let mut s = raw_stream(&server);
    let mut buf = vec![0u8; 64 * 1024];
    for k in [16usize, 64, 256] {
        g.throughput(Throughput::Elements(k as u64));
        let reqs = request().repeat(k);
        g.bench_with_input(BenchmarkId::new("raw", k), &k, |b, &k| {
            b.iter(|| {
                s.write_all(&reqs).unwrap();
                read_replies(&mut s, &mut buf, k);
            })
        });
        let bodies: Vec<&[u8]> = vec![&body[..]; k];
        let mut out = vec![PutOutcome::NotSent; k];
        g.bench_with_input(BenchmarkId::new("producer", k), &k, |b, _| {
            b.iter(|| {
                p.put_batch(&bodies, PutOptions::default(), &mut out)
                    .unwrap()
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench_put, bench_batch);
criterion_main!(benches);
