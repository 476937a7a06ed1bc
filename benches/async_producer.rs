//! The async producer against a local beanstalkd, beside a raw tokio loop in
//! the same group: pre-built put bytes, one `write_all`, read until the CRLF,
//! on a current-thread runtime, 64-byte bodies.
//!
//! `cargo bench --bench async_producer` (needs `beanstalkd` on PATH). Compare
//! `async_producer` with `raw_tokio`: the target is at least 0.95 of it.
#![allow(missing_docs)] // criterion_group! defines an undocumented public function.

use std::time::Instant;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use taskq_producer::{AsyncProducer, PutOptions};
use taskq_testkit::Beanstalkd;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SIZE: usize = 64;

fn bench_async_put(c: &mut Criterion) {
    let server = Beanstalkd::start().expect("beanstalkd must be installed");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut g = c.benchmark_group("async_put");
    g.throughput(Throughput::Elements(1));

    let mut req = format!("put 1024 0 60 {SIZE}\r\n").into_bytes();
    req.extend_from_slice(&[b'x'; SIZE]);
    req.extend_from_slice(b"\r\n");
    let mut s = rt.block_on(async {
        let s = TcpStream::connect(server.addr()).await.unwrap();
        s.set_nodelay(true).unwrap();
        s
    });
    let mut buf = [0u8; 64];
    g.bench_function("raw_tokio", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let t = Instant::now();
                for _ in 0..iters {
                    s.write_all(&req).await.unwrap();
                    let mut got = 0;
                    loop {
                        let n = s.read(&mut buf[got..]).await.unwrap();
                        assert!(n > 0, "server closed");
                        got += n;
                        if buf[..got].ends_with(b"\r\n") {
                            break;
                        }
                    }
                    assert_eq!(buf[0], b'I');
                }
                t.elapsed()
            })
        })
    });

    let addr = server.addr().to_string();
    let mut p = rt.block_on(AsyncProducer::connect(&addr)).unwrap();
    let body = [b'x'; SIZE];
    g.bench_function("async_producer", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let t = Instant::now();
                for _ in 0..iters {
                    p.put(&body, PutOptions::default()).await.unwrap();
                }
                t.elapsed()
            })
        })
    });
    g.finish();
    drop(s);
}

criterion_group!(benches, bench_async_put);
criterion_main!(benches);
