//! Interoperation with the Python client greenstalk (PyPI): jobs it puts are done
//! by `taskq-worker`, and jobs `taskq put` puts are reserved and deleted by it, byte-exact.

mod common;

use std::ffi::OsStr;
use std::process::Command;
use std::time::Duration;

use common::*;
use taskq_testkit::Beanstalkd;

/// Fails, saying what to do, when greenstalk cannot be imported.
fn python_with_greenstalk() {
    let ok = Command::new("python3")
        .args(["-c", "import greenstalk"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "python3 cannot import greenstalk: run scripts/test, which installs it \
         (python3 -m pip install greenstalk)"
    );
}

/// Runs a Python script with a time limit; panics with its output on failure.
fn python(script: &str, args: &[String]) {
    let mut argv = vec![OsStr::new("-c"), OsStr::new(script)];
    argv.extend(args.iter().map(OsStr::new));
    python3(&argv);
}

fn bodies() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = vec![
        b"plain".to_vec(),
        b"a\r\nb\r\n".to_vec(),
        vec![0, 255, 13, 10, 0],
        "h\u{e9}llo w\u{f6}rld".as_bytes().to_vec(),
    ];
    v.push((0..60_000u32).map(|i| (i * 7 % 256) as u8).collect());
    v
}

#[test]
fn greenstalk_puts_taskq_worker_does() {
    python_with_greenstalk();
    let server = Beanstalkd::start().unwrap();
    let dir = TempDir::new("gs-put");
    let bodies = bodies();
    for (i, b) in bodies.iter().enumerate() {
        std::fs::write(dir.0.join(format!("in{i}")), b).unwrap();
    }
    let script = r#"
import sys, greenstalk
port, d, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
with greenstalk.Client(('127.0.0.1', port), encoding=None, use='interop') as c:
    for i in range(n):
        body = open(f'{d}/in{i}', 'rb').read()
        jid = c.put(body, ttr=60)
        open(f'{d}/id{i}', 'w').write(str(jid))
"#;
    python(
        script,
        &[
            server.addr().port().to_string(),
            dir.0.display().to_string(),
            bodies.len().to_string(),
        ],
    );
    let addr = server.addr().to_string();
    let n = bodies.len().to_string();
    let cmd = format!("cat > {}/out$TASKQ_JOB_ID", dir.0.display());
    let mut w = WorkerProc::start(
        &["--addr", &addr, "--tube", "interop", "--max-jobs", &n],
        &cmd,
    );
    assert!(w.wait(Duration::from_secs(20)).success());
    for (i, b) in bodies.iter().enumerate() {
        let id = std::fs::read_to_string(dir.0.join(format!("id{i}"))).unwrap();
        let got = std::fs::read(dir.0.join(format!("out{id}"))).unwrap();
        assert_eq!(&got, b, "job {i} (id {id})");
    }
    assert_eq!(get(&w.counters(), "deleted"), bodies.len() as u64);
    assert_eq!(record(server.addr()).ready, 0);
}

#[test]
fn taskq_puts_greenstalk_does() {
    python_with_greenstalk();
    let server = Beanstalkd::start().unwrap();
    let dir = TempDir::new("gs-take");
    let bodies = bodies();
    // Bodies without NUL go through the `taskq put` command (NUL-terminated on
    // stdin, so CR, LF and any other byte pass); a body holding NUL can only be
    // sent through the library.
    let (cli, lib): (Vec<&Vec<u8>>, Vec<&Vec<u8>>) = bodies.iter().partition(|b| !b.contains(&0));
    assert!(!cli.is_empty() && !lib.is_empty());
    let mut ids = taskq_put_null(&server.addr().to_string(), "interop", &cli);
    let mut p = taskq_producer::Producer::connect(server.addr()).unwrap();
    p.use_tube("interop").unwrap();
    for b in &lib {
        ids.push(
            p.put(b, taskq_producer::PutOptions::default())
                .unwrap()
                .get(),
        );
    }
    let bodies: Vec<&Vec<u8>> = cli.into_iter().chain(lib).collect();
    let script = r#"
import sys, greenstalk
port, d, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
with greenstalk.Client(('127.0.0.1', port), encoding=None, watch='interop') as c:
    for _ in range(n):
        job = c.reserve(timeout=5)
        open(f'{d}/out{job.id}', 'wb').write(job.body)
        c.delete(job)
"#;
    python(
        script,
        &[
            server.addr().port().to_string(),
            dir.0.display().to_string(),
            bodies.len().to_string(),
        ],
    );
    for (id, b) in ids.iter().zip(&bodies) {
        let got = std::fs::read(dir.0.join(format!("out{id}"))).unwrap();
        assert_eq!(&got, *b, "job {id}");
        assert!(job_state(server.addr(), *id).is_none(), "deleted");
    }
}
