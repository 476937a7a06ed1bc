//! `taskq serve`: the reference server as a process, with its address and `-z`.

mod cli_common;

use std::process::{Child, Command as Process, Stdio};
use std::time::{Duration, Instant};

use taskq_proto::{Command, Connection, ConnectionConfig, Limits, Reply};
use taskq_testkit::beanstalkd::free_port;

struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn serves_the_protocol_with_its_max_job_size() {
    let port = free_port().unwrap();
    let addr = format!("127.0.0.1:{port}");
    let mut served = Served(
        Process::new(env!("CARGO_BIN_EXE_taskq"))
            .args(["serve", "--addr", &addr, "-z", "10"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let cfg = ConnectionConfig {
        limits: Limits {
            max_job_size: 100,
            ..Limits::default()
        },
        ..ConnectionConfig::default()
    };
    let until = Instant::now() + Duration::from_secs(10);
    let mut c = loop {
        match Connection::connect(addr.as_str(), cfg) {
            Ok(c) => break c,
            Err(e) => {
                assert!(served.0.try_wait().unwrap().is_none(), "taskq serve exited");
                assert!(Instant::now() < until, "taskq serve did not listen: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    let put = |body: &'static [u8]| Command::Put {
        pri: 0,
        delay: 0,
        ttr: 10,
        body,
    };
    assert_eq!(
        c.request(&put(b"0123456789")).unwrap(),
        Reply::Inserted { id: 1 }
    );
    assert_eq!(c.request(&put(b"0123456789A")).unwrap(), Reply::JobTooBig);
    match c
        .request(&Command::ReserveWithTimeout { timeout: 0 })
        .unwrap()
    {
        Reply::Reserved { id: 1, body } => assert_eq!(body, b"0123456789"),
        r => panic!("{r:?}"),
    }
    match c.request(&Command::Stats).unwrap() {
        Reply::Ok { yaml } => {
            let stats = taskq_proto::ServerStats::parse(yaml).unwrap();
            assert_eq!((stats.max_job_size, stats.cmd_put), (10, 2));
        }
        r => panic!("{r:?}"),
    }
    // It runs until stopped.
    assert!(served.0.try_wait().unwrap().is_none());
}

#[test]
fn refuses_an_address_in_use() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (out, _) = cli_common::taskq(
        &["serve", "--addr", &taken.local_addr().unwrap().to_string()],
        b"",
        Duration::from_secs(30),
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot listen"), "{err}");
}

#[test]
fn sigterm_and_sigint_stop_it_with_exit_0() {
    for signal in ["-TERM", "-INT"] {
        let port = free_port().unwrap();
        let addr = format!("127.0.0.1:{port}");
        let mut served = Served(
            Process::new(env!("CARGO_BIN_EXE_taskq"))
                .args(["serve", "--addr", &addr])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let until = Instant::now() + Duration::from_secs(10);
        while Connection::connect(addr.as_str(), ConnectionConfig::default()).is_err() {
            assert!(served.0.try_wait().unwrap().is_none(), "taskq serve exited");
            assert!(Instant::now() < until, "taskq serve did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        let pid = served.0.id().to_string();
        assert!(Process::new("kill")
            .args([signal, &pid])
            .status()
            .unwrap()
            .success());
        let until = Instant::now() + Duration::from_secs(3);
        let status = loop {
            if let Some(status) = served.0.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < until, "taskq serve ignored {signal}");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "taskq serve after {signal}: {status}");
    }
}
