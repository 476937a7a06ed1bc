//! The reference server beside beanstalkd in the same run, so that readers know
//! how far numbers measured against `taskq serve` (and `taskq demo`) are from
//! the real server's: put round trips one at a time and pipelined by 16, and a
//! reserve+delete round trip, through the same client (`taskq_proto::Connection`).
//!
//! `cargo bench --bench server` (needs `beanstalkd` on PATH). Compare
//! `beanstalkd` with `reference` in each group.
#![allow(missing_docs)] // criterion_group! defines an undocumented public function.

use std::net::SocketAddr;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use taskq_proto::{Command, Connection, ConnectionConfig, Reply};
use taskq_testkit::{Beanstalkd, TestServer};

const BODY: &[u8] = &[b'x'; 64];
const PUT: Command<'static> = Command::Put {
    pri: 1024,
    delay: 0,
    ttr: 60,
    body: BODY,
};

fn connect(addr: SocketAddr) -> Connection {
    Connection::connect(addr, ConnectionConfig::default()).unwrap()
}

fn put_one(c: &mut Connection) {
    match c.request(&PUT).unwrap() {
        Reply::Inserted { .. } => {}
        r => panic!("{r:?}"),
    }
}

fn bench_servers(c: &mut Criterion) {
    let real = Beanstalkd::start().expect("beanstalkd must be installed");
    let reference = TestServer::start().unwrap();
    let servers = [("beanstalkd", real.addr()), ("reference", reference.addr())];

    let mut g = c.benchmark_group("server_put");
    g.throughput(Throughput::Elements(1));
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(2));
    for (name, addr) in servers {
        let mut conn = connect(addr);
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| put_one(&mut conn))
        });
    }
    g.finish();

    let mut g = c.benchmark_group("server_put_pipelined_16");
    g.throughput(Throughput::Elements(16));
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(2));
    for (name, addr) in servers {
        let mut conn = connect(addr);
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| {
                for _ in 0..16 {
                    conn.queue(&PUT).unwrap();
                }
                conn.flush().unwrap();
                for _ in 0..16 {
                    match conn.recv().unwrap() {
                        Reply::Inserted { .. } => {}
                        r => panic!("{r:?}"),
                    }
                }
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group("server_reserve_delete");
    g.throughput(Throughput::Elements(1));
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(2));
    for (name, addr) in servers {
        let mut conn = connect(addr);
        g.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| {
                put_one(&mut conn);
                let id = match conn
                    .request(&Command::ReserveWithTimeout { timeout: 0 })
                    .unwrap()
                {
                    Reply::Reserved { id, .. } => id,
                    r => panic!("{r:?}"),
                };
                assert_eq!(
                    conn.request(&Command::Delete { id }).unwrap(),
                    Reply::Deleted
                );
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench_servers);
criterion_main!(benches);
