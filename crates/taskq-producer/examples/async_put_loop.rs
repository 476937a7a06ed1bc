//! N puts in a loop on a current-thread tokio runtime, for measuring the async
//! producer against a raw tokio loop (`scripts/put-ratio --async`):
//! `async_put_loop ADDR N raw|producer|shared|shared_task|shared_256 [SIZE]`.
//!
//! `raw` is what any async client has to pay: pre-built request bytes, one
//! `write_all` and reads until the reply's CRLF on a plain tokio `TcpStream`.
//! `producer` is `AsyncProducer::put` with the same body, `shared` is
//! `SharedProducer::put` from one caller (`shared_task`: from a spawned task;
//! `shared_256`: from 256 spawned tasks at once, N/256 puts each, as a
//! service's handlers put: for the client's CPU a put under load).

use std::process::ExitCode;

use taskq_producer::{AsyncProducer, PutOptions, SharedProducer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        eprintln!("usage: async_put_loop ADDR N raw|producer|shared|shared_task|shared_256 [SIZE]");
        return ExitCode::from(2);
    }
    let (addr, mode) = (args[1].clone(), args[3].clone());
    let n: u64 = args[2].parse().expect("N is a number");
    let size: usize = args
        .get(4)
        .map_or(64, |s| s.parse().expect("SIZE is a number"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async move {
        let body = vec![b'x'; size];
        match mode.as_str() {
            "raw" => {
                let mut req = format!("put 1024 0 60 {size}\r\n").into_bytes();
                req.extend_from_slice(&body);
                req.extend_from_slice(b"\r\n");
                let mut s = TcpStream::connect(&addr).await.expect("connect");
                s.set_nodelay(true).expect("nodelay");
                let mut buf = [0u8; 64];
                for _ in 0..n {
                    s.write_all(&req).await.expect("write");
                    let mut got = 0;
                    loop {
                        let k = s.read(&mut buf[got..]).await.expect("read");
                        assert!(k > 0, "server closed");
                        got += k;
                        if buf[..got].ends_with(b"\r\n") {
                            break;
                        }
                    }
                    assert_eq!(buf[0], b'I');
                }
            }
            "producer" => {
                let mut p = AsyncProducer::connect(&addr).await.expect("connect");
                for _ in 0..n {
                    p.put(&body, PutOptions::default()).await.expect("put");
                }
            }
            "shared" => {
                let p = SharedProducer::connect(&addr).await.expect("connect");
                for _ in 0..n {
                    p.put("default", &body, PutOptions::default())
                        .await
                        .expect("put");
                }
            }
            "shared_task" => {
                // The same from a spawned task, as a service's handlers are.
                let p = SharedProducer::connect(&addr).await.expect("connect");
                tokio::spawn(async move {
                    for _ in 0..n {
                        p.put("default", &body, PutOptions::default())
                            .await
                            .expect("put");
                    }
                })
                .await
                .expect("the task");
            }
            "shared_256" => {
                let p = SharedProducer::connect(&addr).await.expect("connect");
                let t = std::time::Instant::now();
                let tasks: Vec<_> = (0..256)
                    .map(|_| {
                        let (p, body) = (p.clone(), body.clone());
                        tokio::spawn(async move {
                            for _ in 0..n / 256 {
                                p.put("default", &body, PutOptions::default())
                                    .await
                                    .expect("put");
                            }
                        })
                    })
                    .collect();
                for t in tasks {
                    t.await.expect("a task");
                }
                let puts = n / 256 * 256;
                let secs = t.elapsed().as_secs_f64();
                println!("{puts} puts in {secs:.3} s: {:.0}/s", puts as f64 / secs);
            }
            other => {
                eprintln!("unknown mode {other}");
                return ExitCode::from(2);
            }
        }
        ExitCode::SUCCESS
    })
}
