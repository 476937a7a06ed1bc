//! Interoperation on JetStream with the Python client nats-py (PyPI): plain
//! messages it publishes to a tube's subject are done by `taskq-worker`, and
//! jobs `taskq put` puts are consumed by it through taskq's own consumer,
//! byte-exact both ways. The scripts are in tests/interop/.

mod common;

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::*;
use taskq_testkit::NatsCluster;

/// Fails, saying what to do, when nats-py cannot be imported.
fn need_nats_py() {
    let ok = Command::new("python3")
        .args(["-c", "import nats, nats.js"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "python3 cannot import nats (nats-py): run scripts/test, which installs it \
         (python3 -m pip install nats-py)"
    );
}

fn script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/interop")
        .join(name)
}

/// Bodies a protocol could trip on: CR LF, NUL, bytes of 0x80 and up, an
/// empty body, and 100 KiB.
fn bodies() -> Vec<Vec<u8>> {
    vec![
        b"plain".to_vec(),
        b"a\r\nb\r\nPUB x 1\r\n".to_vec(),
        vec![0, 1, 0, 0],
        vec![0x80, 0xff, 0xfe, 13, 10, 0xc3],
        Vec::new(),
        (0..100 * 1024u32).map(|i| (i * 7 % 256) as u8).collect(),
    ]
}

#[test]
fn nats_py_publishes_taskq_worker_does_byte_exact() {
    need_nats_py();
    let c = NatsCluster::start(1).unwrap();
    let tube = "pyput";
    js_setup(&c, tube, None);
    let dir = TempDir::new("nats-py-put");
    let bodies = bodies();
    for (i, b) in bodies.iter().enumerate() {
        std::fs::write(dir.0.join(format!("in{i}")), b).unwrap();
    }
    let n = bodies.len().to_string();
    let d = dir.0.display().to_string();
    python3(&[
        script("js_publish.py").as_os_str(),
        OsStr::new(&c.url()),
        OsStr::new(&format!("taskq.{tube}")),
        OsStr::new(&d),
        OsStr::new(&n),
    ]);
    let url = c.url();
    let mut w = WorkerProc::start(
        &["--addr", &url, "--tube", tube, "--max-jobs", &n],
        &format!("cat > {d}/out$TASKQ_JOB_ID"),
    );
    let st = w.wait(Duration::from_secs(30));
    assert!(st.success(), "{st}: {}", w.stderr());
    for (i, b) in bodies.iter().enumerate() {
        let id = std::fs::read_to_string(dir.0.join(format!("id{i}"))).unwrap();
        let got = std::fs::read(dir.0.join(format!("out{id}"))).unwrap();
        assert_eq!(&got, b, "job {i} (sequence {id})");
    }
    assert_eq!(get(&w.counters(), "deleted"), bodies.len() as u64);
    assert_eq!(js_admin(&c).stream_info("TASKQ").unwrap().messages, 0);
}

#[test]
fn taskq_puts_nats_py_takes_through_taskqs_consumer_byte_exact() {
    need_nats_py();
    let c = NatsCluster::start(1).unwrap();
    let tube = "pytake";
    // taskq's consumer, as a worker makes it, before nats-py binds to it.
    js_setup(&c, tube, Some(Duration::from_secs(30)));
    let before = js_consumer(&c, tube);
    let dir = TempDir::new("nats-py-take");
    let bodies = bodies();
    // Bodies without NUL go through the `taskq put` command (NUL-terminated
    // on stdin); a body holding NUL can only be sent through the library.
    let (cli, lib): (Vec<&Vec<u8>>, Vec<&Vec<u8>>) = bodies.iter().partition(|b| !b.contains(&0));
    let mut ids = taskq_put_null(&c.url(), tube, &cli);
    let mut p = taskq_producer::Producer::builder()
        .tube(tube)
        .connect(c.url())
        .unwrap();
    for b in &lib {
        ids.push(p.put(b, Default::default()).unwrap().get());
    }
    let bodies: Vec<&Vec<u8>> = cli.into_iter().chain(lib).collect();
    let d = dir.0.display().to_string();
    python3(&[
        script("js_pull.py").as_os_str(),
        OsStr::new(&c.url()),
        OsStr::new(tube),
        OsStr::new(&d),
        OsStr::new(&bodies.len().to_string()),
    ]);
    for (id, b) in ids.iter().zip(&bodies) {
        let got = std::fs::read(dir.0.join(format!("out{id}"))).unwrap();
        assert_eq!(&got, *b, "job {id}");
    }
    // nats-py bound to the consumer as it was and changed nothing.
    let seen = lines(&dir.0.join("config"));
    let ack_wait: f64 = seen[0].parse().unwrap();
    assert_eq!(Duration::from_secs_f64(ack_wait), before.ack_wait);
    assert_eq!(seen[1], before.max_ack_pending.to_string());
    assert_eq!(seen[2], format!("taskq.{tube}"));
    let after = js_consumer(&c, tube);
    assert_eq!(
        (
            after.ack_wait,
            after.max_ack_pending,
            after.max_deliver,
            after.filter_subject
        ),
        (
            before.ack_wait,
            before.max_ack_pending,
            before.max_deliver,
            before.filter_subject
        )
    );
    assert_eq!((after.num_pending, after.num_ack_pending), (0, 0));
    assert_eq!(
        js_admin(&c).stream_info("TASKQ").unwrap().messages,
        0,
        "all acked"
    );
}
