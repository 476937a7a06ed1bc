//! Typed jobs (feature `serde`): `put_json` on every producer puts the
//! value's JSON, byte for byte, into a buffer it keeps (no allocation for a
//! value whose serialization makes none, counted), and a value that does not
//! serialize is refused with nothing sent. Against a real beanstalkd.
#![cfg(all(feature = "tokio", feature = "serde"))]

mod common;

use std::collections::HashMap;

use serde::Serialize;
use taskq_producer::{AsyncProducer, Error, Invalid, Producer, PutOptions, SharedProducer};
use taskq_testkit::alloc::{self, CountingAllocator};
use taskq_testkit::Beanstalkd;

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

#[derive(Serialize)]
struct Welcome<'a> {
    user: u64,
    name: &'a str,
    tags: [&'a str; 2],
}

const WANT: &[u8] = br#"{"user":42,"name":"Ada","tags":["new","eu"]}"#;

fn welcome() -> Welcome<'static> {
    Welcome {
        user: 42,
        name: "Ada",
        tags: ["new", "eu"],
    }
}

fn bad() -> HashMap<(u8, u8), u8> {
    [((1, 2), 3)].into()
}

#[test]
fn every_producer_puts_the_values_json_without_allocating() {
    let server = Beanstalkd::start().unwrap();
    let addr = server.addr().to_string();
    let opts = PutOptions::default();

    let mut p = Producer::builder()
        .tube("typed")
        .connect(addr.as_str())
        .unwrap();
    // Warm up: the connection's buffers and the JSON buffer reach their sizes.
    p.put_json(&welcome(), opts).unwrap();
    let ((), n) = alloc::in_this_thread(|| {
        for _ in 0..100 {
            p.put_json(&welcome(), opts).unwrap();
        }
    });
    assert_eq!(n, 0, "allocations in 100 blocking put_json");
    let r = p.put_json(&bad(), opts);
    assert!(
        matches!(r, Err(Error::Invalid(Invalid::Unserializable))),
        "{r:?}"
    );

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (mut a, s) = rt.block_on(async {
        let mut a = Producer::builder()
            .tube("typed")
            .connect_async(&addr)
            .await
            .unwrap();
        a.put_json(&welcome(), opts).await.unwrap();
        let s = SharedProducer::connect(&addr).await.unwrap();
        for _ in 0..10 {
            s.put_json("typed", &welcome(), opts).await.unwrap();
        }
        (a, s)
    });
    let ((), n) = alloc::in_this_thread(|| {
        rt.block_on(async {
            for _ in 0..100 {
                a.put_json(&welcome(), opts).await.unwrap();
                s.put_json("typed", &welcome(), opts).await.unwrap();
            }
        })
    });
    assert_eq!(n, 0, "allocations in 100 async and 100 shared put_json");
    rt.block_on(async {
        let r = a.put_json(&bad(), opts).await;
        assert!(
            matches!(r, Err(Error::Invalid(Invalid::Unserializable))),
            "{r:?}"
        );
        let r = s.put_json("typed", &bad(), opts).await;
        assert!(
            matches!(r, Err(Error::Invalid(Invalid::Unserializable))),
            "{r:?}"
        );
        assert_eq!(s.waiting(), 0, "a refused value holds no slot");
    });
    drop((a, s));
    let _: &AsyncProducer;
    let jobs = common::drain(server.addr(), "typed");
    assert_eq!(
        jobs.len(),
        1 + 100 + 1 + 10 + 200,
        "every put stored, none of the refused"
    );
    assert!(
        jobs.iter().all(|(_, body)| body == WANT),
        "each body is the value's JSON"
    );
}
