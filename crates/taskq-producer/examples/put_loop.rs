//! N puts in a loop, for counting instructions per put with callgrind
//! (scripts/callgrind-put): `put_loop ADDR N raw|producer|beanstalkc [SIZE]`.
//!
//! `raw` is the floor any client has to pay: pre-built request bytes, one write
//! and one read per put on a plain `TcpStream`, the reply only checked for its
//! first byte. `producer` is `Producer::put` with the same body; `beanstalkc`
//! is the `beanstalkc` crate's put, a peer measured the same way.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::ExitCode;
use std::time::Duration;

use taskq_producer::{Producer, PutOptions};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        eprintln!("usage: put_loop ADDR N raw|producer|beanstalkc [SIZE]");
        return ExitCode::from(2);
    }
    let addr = &args[1];
    let n: u64 = args[2].parse().expect("N is a number");
    let size: usize = args
        .get(4)
        .map_or(64, |s| s.parse().expect("SIZE is a number"));
    let body = vec![b'x'; size];
    match args[3].as_str() {
        "raw" => {
            let mut s = TcpStream::connect(addr).expect("connect");
            s.set_nodelay(true).unwrap();
            let mut req = format!("put 1024 0 60 {size}\r\n").into_bytes();
            req.extend_from_slice(&body);
            req.extend_from_slice(b"\r\n");
            let mut buf = [0u8; 64];
            for _ in 0..n {
                s.write_all(&req).unwrap();
                let got = s.read(&mut buf).unwrap();
                assert!(got > 0 && buf[0] == b'I', "not INSERTED");
            }
        }
        "producer" => {
            let mut p = Producer::connect(addr.as_str()).expect("connect");
            for _ in 0..n {
                std::hint::black_box(p.put(&body, PutOptions::default()).unwrap());
            }
        }
        "beanstalkc" => {
            // A peer client from crates.io, for comparison only.
            let port = addr
                .rsplit(':')
                .next()
                .and_then(|p| p.parse().ok())
                .expect("ADDR ends in :PORT");
            let mut c = beanstalkc::Beanstalkc::new()
                .host("127.0.0.1")
                .port(port)
                .connect()
                .expect("connect");
            for _ in 0..n {
                std::hint::black_box(
                    c.put(&body, 1024, Duration::ZERO, Duration::from_secs(60))
                        .unwrap(),
                );
            }
        }
        other => {
            eprintln!("unknown mode {other}");
            return ExitCode::from(2);
        }
    }
    ExitCode::SUCCESS
}
