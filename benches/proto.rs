//! Benchmarks of the protocol core, each beside a naive `format!`/`String`
//! baseline, and a put round trip against a local beanstalkd beside a raw
//! `TcpStream` loop of pre-built bytes.
//!
//! Run: `cargo bench --bench proto` (briefly: `-- --warm-up-time 1 --measurement-time 2`).

use std::hint::black_box;
use std::io::{Read, Write};
use std::net::TcpStream;

use criterion::{Criterion, Throughput};
use taskq_proto::{
    parse_reply, Command, CommandKind, Connection, ConnectionConfig, Limits, Reply, Status,
};
use taskq_testkit::Beanstalkd;

/// The way a client without a codec might build a put.
fn naive_encode_put(pri: u32, delay: u32, ttr: u32, body: &[u8]) -> Vec<u8> {
    let mut out = format!("put {} {} {} {}\r\n", pri, delay, ttr, body.len()).into_bytes();
    out.extend_from_slice(body);
    out.extend_from_slice(b"\r\n");
    out
}

/// The way a client without a codec might read a reply line: a `String`, split on spaces.
fn naive_parse_inserted(input: &[u8]) -> Option<u64> {
    let text = String::from_utf8(input.to_vec()).ok()?;
    let line = text.split("\r\n").next()?;
    let words: Vec<String> = line.split(' ').map(String::from).collect();
    match words.as_slice() {
        [w, id] if w == "INSERTED" => id.parse().ok(),
        _ => None,
    }
}

/// The same for RESERVED, copying the body out.
fn naive_parse_reserved(input: &[u8]) -> Option<(u64, Vec<u8>)> {
    let eol = input.windows(2).position(|w| w == b"\r\n")?;
    let line = String::from_utf8(input[..eol].to_vec()).ok()?;
    let words: Vec<String> = line.split(' ').map(String::from).collect();
    if words.len() != 3 || words[0] != "RESERVED" {
        return None;
    }
    let id = words[1].parse().ok()?;
    let len: usize = words[2].parse().ok()?;
    let body = input.get(eol + 2..eol + 2 + len)?.to_vec();
    Some((id, body))
}

fn encode(c: &mut Criterion) {
    for (name, size) in [("encode_put_64B", 64usize), ("encode_put_4KiB", 4096)] {
        let body = vec![b'x'; size];
        let mut g = c.benchmark_group(name);
        g.throughput(Throughput::Elements(1));
        let mut buf = vec![0u8; size + 64];
        g.bench_function("taskq", |b| {
            b.iter(|| {
                let put = Command::Put {
                    pri: 1024,
                    delay: 0,
                    ttr: 60,
                    body: black_box(&body),
                };
                black_box(put.encode(&mut buf, 65535).unwrap())
            })
        });
        g.bench_function("naive_format", |b| {
            b.iter(|| black_box(naive_encode_put(1024, 0, 60, black_box(&body))))
        });
        g.finish();
    }
}

fn parse(c: &mut Criterion) {
    let limits = Limits::default();
    let inserted = b"INSERTED 1234567\r\n";
    let mut g = c.benchmark_group("parse_INSERTED");
    g.bench_function("taskq", |b| {
        b.iter(
            || match parse_reply(CommandKind::Put, black_box(inserted), &limits) {
                Ok(Status::Complete(Reply::Inserted { id }, _)) => black_box(id),
                r => panic!("{r:?}"),
            },
        )
    });
    g.bench_function("naive_string", |b| {
        b.iter(|| black_box(naive_parse_inserted(black_box(inserted)).unwrap()))
    });
    g.finish();

    let mut reserved = b"RESERVED 1234567 64\r\n".to_vec();
    reserved.extend_from_slice(&[b'r'; 64]);
    reserved.extend_from_slice(b"\r\n");
    let mut g = c.benchmark_group("parse_RESERVED_64B");
    g.bench_function("taskq", |b| {
        b.iter(
            || match parse_reply(CommandKind::Reserve, black_box(&reserved), &limits) {
                Ok(Status::Complete(Reply::Reserved { id, body }, _)) => {
                    black_box((id, body.len()))
                }
                r => panic!("{r:?}"),
            },
        )
    });
    g.bench_function("naive_string", |b| {
        b.iter(|| black_box(naive_parse_reserved(black_box(&reserved)).unwrap()))
    });
    g.finish();
}

fn round_trip(c: &mut Criterion) {
    let server = Beanstalkd::start().expect("beanstalkd must be installed for this bench");
    let body = [b'p'; 64];
    let mut g = c.benchmark_group("put_round_trip_64B");
    g.throughput(Throughput::Elements(1));

    let mut conn = Connection::connect(server.addr(), ConnectionConfig::default()).unwrap();
    g.bench_function("taskq_connection", |b| {
        b.iter(|| {
            let put = Command::Put {
                pri: 1024,
                delay: 0,
                ttr: 60,
                body: &body,
            };
            match conn.request(&put).unwrap() {
                Reply::Inserted { id } => black_box(id),
                r => panic!("{r:?}"),
            }
        })
    });

    // The floor: the same request as pre-built bytes, and a read until the line ends.
    let request = naive_encode_put(1024, 0, 60, &body);
    let mut raw = TcpStream::connect(server.addr()).unwrap();
    raw.set_nodelay(true).unwrap();
    let mut reply = [0u8; 64];
    g.bench_function("raw_tcpstream", |b| {
        b.iter(|| {
            raw.write_all(&request).unwrap();
            let mut n = 0;
            while !reply[..n].ends_with(b"\r\n") {
                let got = raw.read(&mut reply[n..]).unwrap();
                assert!(got > 0, "server closed");
                n += got;
            }
            black_box(n)
        })
    });
    g.finish();
    drop(server);
}

// What `criterion_main!` would expand to, written out so every item is documented.
fn main() {
    let mut c = Criterion::default().configure_from_args();
    encode(&mut c);
    parse(&mut c);
    round_trip(&mut c);
    c.final_summary();
}
