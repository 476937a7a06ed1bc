//! Helpers shared by the producer's integration tests.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use taskq_proto::{Command, Connection, ConnectionConfig, Reply};

#[cfg(feature = "tokio")]
pub mod shared;

/// Reserves every ready job of `tube` (polling) and returns (id, body) in order.
pub fn drain(addr: SocketAddr, tube: &str) -> Vec<(u64, Vec<u8>)> {
    let cfg = ConnectionConfig {
        limits: taskq_proto::Limits {
            max_job_size: 1 << 20,
            ..Default::default()
        },
        ..ConnectionConfig::default()
    };
    let mut c = Connection::connect(addr, cfg).unwrap();
    c.request(&Command::Watch { tube }).unwrap();
    let mut out = Vec::new();
    loop {
        let (id, body) = match c
            .request(&Command::ReserveWithTimeout { timeout: 0 })
            .unwrap()
        {
            Reply::Reserved { id, body } => (id, body.to_vec()),
            Reply::TimedOut => return out,
            r => panic!("unexpected {r:?}"),
        };
        assert_eq!(c.request(&Command::Delete { id }).unwrap(), Reply::Deleted);
        out.push((id, body));
    }
}

/// The pinned current nats-server's node ([`taskq_testkit::current_node`]):
/// `None`, and the test skips, where that binary is not available, unless
/// `TASKQ_NATS_CURRENT` is set (scripts/test sets it, and CI runs that):
/// then a missing server fails the test.
pub fn current_node() -> Option<taskq_testkit::NatsCluster> {
    let node = taskq_testkit::current_node();
    if node.is_none() {
        servers_required("the current nats-server");
    }
    node
}

/// Debian's nats-server's node ([`taskq_testkit::oldest_node`]), skipped or
/// failed as [`current_node`] is.
pub fn oldest_node() -> Option<taskq_testkit::NatsCluster> {
    let node = taskq_testkit::oldest_node();
    if node.is_none() {
        servers_required("Debian's nats-server");
    }
    node
}

/// Fails where `TASKQ_NATS_CURRENT` says this run has every server.
fn servers_required(what: &str) {
    let env = taskq_testkit::nats::CURRENT_SERVER_ENV;
    if let Some(v) = std::env::var_os(env).filter(|v| !v.is_empty()) {
        panic!("{what} is not available, yet {env}={v:?}: this run must not skip it");
    }
}

/// What one connection to the fake peer does after reading requests.
#[derive(Clone, Copy, Debug)]
pub enum Act {
    /// Answer `use` with USING and each put with INSERTED <n> (n counts from 1 per peer).
    Serve,
    /// Read the first put (line and body), then close without a reply.
    CloseAfterPut,
    /// Read `n` puts, answer the first `answered`, then close.
    AnswerThenClose { n: usize, answered: usize },
    /// Accept and never answer (read and discard everything).
    Silent,
}

/// A loopback peer speaking just enough of the protocol to fail on cue. It
/// records every command line it receives, per connection.
pub struct FakePeer {
    pub addr: SocketAddr,
    pub log: Arc<Mutex<Vec<Vec<String>>>>,
    _thread: JoinHandle<()>,
}

impl FakePeer {
    /// Connection i gets `plan[i]`; connections past the plan get `Serve`.
    pub fn start(plan: Vec<Act>) -> FakePeer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let log2 = log.clone();
        let thread = std::thread::spawn(move || {
            let mut next_id = 1u64;
            for (i, s) in listener.incoming().enumerate() {
                let Ok(s) = s else { return };
                let act = plan.get(i).copied().unwrap_or(Act::Serve);
                log2.lock().unwrap().push(Vec::new());
                // Serve connections one at a time: tests use one client at a time.
                serve(s, act, &log2, i, &mut next_id);
            }
        });
        FakePeer {
            addr,
            log,
            _thread: thread,
        }
    }

    pub fn commands(&self, conn: usize) -> Vec<String> {
        self.log
            .lock()
            .unwrap()
            .get(conn)
            .cloned()
            .unwrap_or_default()
    }

    pub fn connections(&self) -> usize {
        self.log.lock().unwrap().len()
    }
}

fn serve(s: TcpStream, act: Act, log: &Mutex<Vec<Vec<String>>>, i: usize, next_id: &mut u64) {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    let mut puts = 0usize;
    loop {
        let mut line = String::new();
        match r.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let line = line.trim_end().to_string();
        log.lock().unwrap()[i].push(line.clone());
        if matches!(act, Act::Silent) {
            continue;
        }
        let words: Vec<&str> = line.split(' ').collect();
        let reply = match words[0] {
            "use" => format!("USING {}\r\n", words[1]),
            "put" => {
                let n: usize = words[4].parse().unwrap();
                let mut body = vec![0u8; n + 2];
                if r.read_exact(&mut body).is_err() {
                    return;
                }
                puts += 1;
                let id = *next_id;
                *next_id += 1;
                format!("INSERTED {id}\r\n")
            }
            "stats-tube" => {
                let yaml = format!("---\nname: {}\ncurrent-jobs-ready: 1\n", words[1]);
                format!("OK {}\r\n{yaml}\r\n", yaml.len())
            }
            _ => "UNKNOWN_COMMAND\r\n".to_string(),
        };
        match act {
            Act::Serve => {}
            Act::CloseAfterPut if puts == 1 => return,
            Act::CloseAfterPut => {}
            Act::AnswerThenClose { n, answered } => {
                if puts > answered && puts <= n {
                    if puts == n {
                        return;
                    }
                    continue;
                }
            }
            Act::Silent => unreachable!(),
        }
        if w.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}
