//! Real `nats-server` processes with JetStream on free loopback ports, started
//! and stopped by a test: one node, or a cluster whose nodes route to each other.
//!
//! Each node gets its own client, route and monitoring port and its own store
//! directory under one temporary directory, removed on drop. The monitoring
//! port answers `/healthz`, `/varz` and `/jsz`, which is how the harness tells
//! that a node is up, that the cluster has a meta leader, and which node leads
//! a stream or a consumer.
//!
//! [`NatsCluster::start`] runs the `nats-server` found on `PATH` with nothing but
//! command-line options. [`NatsCluster::builder`] also takes configuration text
//! for every node (authorization, TLS, accounts, operator mode: anything a
//! `nats-server -c FILE` reads) and a particular binary, such as the pinned
//! current release from [`current_server_binary`].

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::beanstalkd::free_port;

mod binary;
mod monitor;
mod process;

pub use binary::{
    binary_version, current_node, current_server_binary, oldest_node, server_binary, ServerVersion,
    CURRENT_SERVER_ENV, DEBIAN_SERVER,
};
use monitor::http_json;
use process::{thread_states, SIGNAL_WAIT};

/// How long a node may take to answer its health check after a start.
const START_WAIT: Duration = Duration::from_secs(15);

/// One node's ports, directory and process.
#[derive(Debug)]
struct Node {
    name: String,
    port: u16,
    route_port: u16,
    monitor_port: u16,
    store: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl Node {
    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    fn monitor(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.monitor_port))
    }
}

/// A cluster of `nats-server` nodes with JetStream (or a single node), all on
/// 127.0.0.1. Every process is killed and every directory removed on drop.
#[derive(Debug)]
pub struct NatsCluster {
    dir: PathBuf,
    cluster: String,
    binary: PathBuf,
    /// The configuration file every node reads with `-c`, if one was given.
    config: Option<PathBuf>,
    nodes: Vec<Node>,
}

/// How to start a [`NatsCluster`]: see [`NatsCluster::builder`].
#[derive(Debug, Clone)]
pub struct NatsBuilder {
    nodes: usize,
    config: Option<String>,
    binary: Option<PathBuf>,
}

impl NatsBuilder {
    /// The number of nodes (1, the default, is a single server without clustering).
    pub fn nodes(mut self, n: usize) -> NatsBuilder {
        self.nodes = n;
        self
    }

    /// Configuration text every node reads from a file given with `-c`: an
    /// `authorization { ... }`, `tls { ... }`, `accounts { ... }` or operator
    /// block, for example. The harness's own options (ports, name, store
    /// directory, `-js`, the cluster's routes) are given on the command line,
    /// which wins over the file; the monitoring port stays plain HTTP, so the
    /// harness still sees the nodes whatever the clients must present.
    pub fn config(mut self, text: impl Into<String>) -> NatsBuilder {
        self.config = Some(text.into());
        self
    }

    /// The `nats-server` binary to run instead of the one on `PATH`.
    pub fn binary(mut self, path: impl Into<PathBuf>) -> NatsBuilder {
        self.binary = Some(path.into());
        self
    }

    /// Starts the nodes and waits until every node is healthy and, for a
    /// cluster, agrees on a meta leader.
    pub fn start(&self) -> io::Result<NatsCluster> {
        assert!(self.nodes >= 1, "a cluster has at least one node");
        let binary = self.binary.clone().unwrap_or_else(server_binary);
        let mut last = None;
        // A port found free can be taken before the server binds it: retry
        // the whole cluster with fresh ports.
        for _ in 0..3 {
            match NatsCluster::try_start(self.nodes, &binary, self.config.as_deref()) {
                Ok(c) => return Ok(c),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("nats-server did not start")))
    }
}

impl NatsCluster {
    /// Starts `n` nodes (1 for a single server without clustering) of the
    /// `nats-server` on `PATH` and waits until every node is healthy and, for a
    /// cluster, agrees on a meta leader.
    pub fn start(n: usize) -> io::Result<NatsCluster> {
        NatsCluster::builder().nodes(n).start()
    }

    /// A builder for a cluster with configuration text or another binary:
    /// `NatsCluster::builder().nodes(3).config(text).binary(path).start()`.
    pub fn builder() -> NatsBuilder {
        NatsBuilder {
            nodes: 1,
            config: None,
            binary: None,
        }
    }

    fn try_start(n: usize, binary: &Path, config: Option<&str>) -> io::Result<NatsCluster> {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let tag = format!(
            "{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let dir = std::env::temp_dir().join(format!("taskq-nats-{tag}"));
        std::fs::create_dir_all(&dir)?;
        let config = match config {
            Some(text) => {
                let path = dir.join("server.conf");
                std::fs::write(&path, text)?;
                Some(path)
            }
            None => None,
        };
        let mut c = NatsCluster {
            dir,
            cluster: format!("taskq-{tag}"),
            binary: binary.to_path_buf(),
            config,
            nodes: Vec::with_capacity(n),
        };
        for i in 0..n {
            let store = c.dir.join(format!("n{}", i + 1));
            std::fs::create_dir_all(&store)?;
            c.nodes.push(Node {
                name: format!("n{}", i + 1),
                port: free_port()?,
                route_port: free_port()?,
                monitor_port: free_port()?,
                log: c.dir.join(format!("n{}.log", i + 1)),
                store,
                child: None,
            });
        }
        for i in 0..n {
            c.spawn(i)?;
        }
        for i in 0..n {
            c.wait_healthy(i, START_WAIT)?;
        }
        if n > 1 {
            c.wait_meta_leader(START_WAIT)?;
            c.wait_connect_urls(START_WAIT)?;
        }
        Ok(c)
    }

    /// Waits until every node announces every node's client port in its
    /// `connect_urls` (what a client's `INFO` lists): a meta leader needs
    /// only a quorum of routes, and a client that connects before the last
    /// route would learn of two nodes of three (and make a stream of one
    /// replica, by the clients' rule).
    fn wait_connect_urls(&self, wait: Duration) -> io::Result<()> {
        let until = Instant::now() + wait;
        let ports: Vec<u16> = self.running().map(|i| self.addr(i).port()).collect();
        loop {
            let all = self.running().all(|i| {
                let Ok(v) = http_json(self.nodes[i].monitor(), "/varz") else {
                    return false;
                };
                let known: Vec<u16> = v["connect_urls"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|u| u.as_str()?.rsplit(':').next()?.parse().ok())
                    .collect();
                ports.iter().all(|p| known.contains(p))
            });
            if all {
                return Ok(());
            }
            if Instant::now() > until {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the nodes did not all announce each other within {wait:?}"),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn spawn(&mut self, i: usize) -> io::Result<()> {
        let routes = self
            .nodes
            .iter()
            .map(|n| format!("nats://127.0.0.1:{}", n.route_port))
            .collect::<Vec<_>>()
            .join(",");
        let clustered = self.nodes.len() > 1;
        let node = &self.nodes[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)?;
        let mut cmd = Command::new(&self.binary);
        if let Some(config) = &self.config {
            cmd.arg("-c").arg(config);
        }
        cmd.args(["-js", "-a", "127.0.0.1"])
            .args(["-p", &node.port.to_string()])
            .args(["-m", &node.monitor_port.to_string()])
            .args(["--name", &node.name])
            .arg("--store_dir")
            .arg(&node.store);
        if clustered {
            cmd.args([
                "--cluster",
                &format!("nats://127.0.0.1:{}", node.route_port),
                "--cluster_name",
                &self.cluster,
                "--routes",
                &routes,
            ]);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "cannot run {} ({e}); install it: apt-get install -y nats-server",
                        self.binary.display()
                    ),
                )
            })?;
        self.nodes[i].child = Some(child);
        Ok(())
    }

    /// Waits until node `i` answers its health check as itself.
    fn wait_healthy(&mut self, i: usize, wait: Duration) -> io::Result<()> {
        let until = Instant::now() + wait;
        loop {
            if let Some(child) = self.nodes[i].child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    self.nodes[i].child = None;
                    return Err(io::Error::other(format!(
                        "nats-server {} exited at start: {status}; log: {}",
                        self.nodes[i].name,
                        tail(&self.nodes[i].log)
                    )));
                }
            }
            // Ours: its name, and the client port it was given (every
            // cluster names its nodes n1, n2, ...: another test's node on
            // this monitor port would have the name, not the port).
            let node = &self.nodes[i];
            let ours = http_json(node.monitor(), "/varz").ok().and_then(|v| {
                let name = v["server_name"].as_str()?;
                let port = v["port"].as_u64()?;
                Some(name == node.name && port == u64::from(node.port))
            });
            match ours {
                Some(false) => {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        format!("port {} is another server's", self.nodes[i].monitor_port),
                    ))
                }
                Some(true) => {
                    if let Ok(h) = http_json(self.nodes[i].monitor(), "/healthz") {
                        if h["status"].as_str() == Some("ok") {
                            return Ok(());
                        }
                    }
                }
                None => {}
            }
            if Instant::now() > until {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "nats-server {} not healthy within {wait:?}; log: {}",
                        self.nodes[i].name,
                        tail(&self.nodes[i].log)
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// The server's version as a running node reports it in `/varz`.
    pub fn version(&self) -> io::Result<ServerVersion> {
        let i = self
            .running()
            .next()
            .ok_or_else(|| io::Error::other("no node is running"))?;
        let v = http_json(self.nodes[i].monitor(), "/varz")?;
        let text = v["version"]
            .as_str()
            .ok_or_else(|| io::Error::other("/varz has no version"))?;
        ServerVersion::parse(text)
            .ok_or_else(|| io::Error::other(format!("unreadable server version {text:?}")))
    }

    /// The `nats-server` binary the nodes run (a bare `nats-server` is the one on `PATH`).
    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Always false: a cluster has a node.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Node `i`'s client address.
    pub fn addr(&self, i: usize) -> SocketAddr {
        self.nodes[i].addr()
    }

    /// Node `i`'s server name (`n1`, `n2`, ...).
    pub fn name(&self, i: usize) -> &str {
        &self.nodes[i].name
    }

    /// Node `i`'s process id, while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.nodes[i].child.as_ref().map(Child::id)
    }

    /// Every node's client address as `HOST:PORT`, comma-separated.
    pub fn seeds(&self) -> String {
        self.nodes
            .iter()
            .map(|n| n.addr().to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The address taskq takes for this cluster: `nats://` and the seeds.
    pub fn url(&self) -> String {
        format!("nats://{}", self.seeds())
    }

    /// The address of node `i` alone, as `nats://HOST:PORT`.
    pub fn node_url(&self, i: usize) -> String {
        format!("nats://{}", self.nodes[i].addr())
    }

    /// Kills node `i` at once (SIGKILL) and reaps it. Its store stays for a restart.
    pub fn kill(&mut self, i: usize) -> io::Result<()> {
        if let Some(mut child) = self.nodes[i].child.take() {
            // A stopped process still dies of SIGKILL.
            let _ = child.kill();
            child.wait()?;
        }
        Ok(())
    }

    /// Freezes node `i` (SIGSTOP): its sockets stay open, it answers nothing.
    /// Returns once every thread of the node is stopped: kill(2) only queues
    /// the signal, and a node still running for a moment after it would answer
    /// what a test sends next.
    pub fn stop(&self, i: usize) -> io::Result<()> {
        self.signal(i, libc::SIGSTOP)?;
        self.wait_threads(i, true)
    }

    /// Thaws node `i` (SIGCONT), returning once no thread of it is stopped.
    pub fn cont(&self, i: usize) -> io::Result<()> {
        self.signal(i, libc::SIGCONT)?;
        self.wait_threads(i, false)
    }

    /// Waits (at most [`SIGNAL_WAIT`]) until every thread of node `i` is
    /// stopped (`stopped`) or none is, as `/proc/PID/task/*/stat` tells.
    fn wait_threads(&self, i: usize, stopped: bool) -> io::Result<()> {
        let pid = self
            .pid(i)
            .ok_or_else(|| io::Error::other("node not running"))?;
        let until = Instant::now() + SIGNAL_WAIT;
        loop {
            let states = thread_states(pid)?;
            if !states.is_empty() && states.iter().all(|&s| (s == b'T') == stopped) {
                return Ok(());
            }
            if Instant::now() >= until {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "node {i}'s threads are {:?} {SIGNAL_WAIT:?} after the signal",
                        String::from_utf8_lossy(&states)
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn signal(&self, i: usize, sig: libc::c_int) -> io::Result<()> {
        let pid = self
            .pid(i)
            .ok_or_else(|| io::Error::other("node not running"))?;
        process::kill(pid, sig)
    }

    /// Starts node `i` again on its ports with its store (after [`kill`](Self::kill)),
    /// and waits until it is healthy.
    pub fn restart(&mut self, i: usize) -> io::Result<()> {
        self.kill(i)?;
        self.spawn(i)?;
        self.wait_healthy(i, START_WAIT)
    }

    /// Node `i`'s `/jsz` with `query` (for example `streams=true&consumers=true`).
    pub fn jsz(&self, i: usize, query: &str) -> io::Result<Value> {
        http_json(self.nodes[i].monitor(), &format!("/jsz?{query}"))
    }

    /// The index of the meta leader as a running node sees it, if one is elected.
    pub fn meta_leader(&self) -> Option<usize> {
        if self.nodes.len() == 1 {
            return self.nodes[0].child.as_ref().map(|_| 0);
        }
        self.running().find_map(|i| {
            let v = self.jsz(i, "").ok()?;
            let l = self.index_of(v["meta_cluster"]["leader"].as_str()?)?;
            self.nodes[l].child.as_ref().map(|_| l)
        })
    }

    /// Waits until every running node names the same running node as meta
    /// leader; returns it. (Right after a kill the others still name the dead
    /// leader for a while: that is not an answer.)
    pub fn wait_meta_leader(&self, wait: Duration) -> io::Result<usize> {
        let until = Instant::now() + wait;
        loop {
            let seen: Vec<Option<usize>> = self
                .running()
                .map(|i| {
                    let v = self.jsz(i, "").ok()?;
                    self.index_of(v["meta_cluster"]["leader"].as_str()?)
                })
                .collect();
            if let Some(Some(first)) = seen.first() {
                if self.nodes[*first].child.is_some() && seen.iter().all(|s| *s == Some(*first)) {
                    return Ok(*first);
                }
            }
            if Instant::now() > until {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no agreed meta leader within {wait:?}: {seen:?}"),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The index of the node leading stream `stream`, if a running node knows one.
    pub fn stream_leader(&self, stream: &str) -> Option<usize> {
        self.asset_leader(stream, None)
    }

    /// The index of the node leading consumer `consumer` of `stream`.
    pub fn consumer_leader(&self, stream: &str, consumer: &str) -> Option<usize> {
        self.asset_leader(stream, Some(consumer))
    }

    fn asset_leader(&self, stream: &str, consumer: Option<&str>) -> Option<usize> {
        if self.nodes.len() == 1 {
            return self.nodes[0].child.as_ref().map(|_| 0);
        }
        self.running().find_map(|i| {
            let v = self
                .jsz(i, "accounts=true&streams=true&consumers=true")
                .ok()?;
            for acc in v["account_details"].as_array()? {
                for s in acc["stream_detail"].as_array().into_iter().flatten() {
                    if s["name"].as_str() != Some(stream) {
                        continue;
                    }
                    let leader = match consumer {
                        None => s["cluster"]["leader"].as_str(),
                        Some(c) => s["consumer_detail"]
                            .as_array()?
                            .iter()
                            .find(|d| d["name"].as_str() == Some(c))
                            .and_then(|d| d["cluster"]["leader"].as_str()),
                    };
                    if let Some(l) = leader.and_then(|l| self.index_of(l)) {
                        return Some(l);
                    }
                }
            }
            None
        })
    }

    fn index_of(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    fn running(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.nodes.len()).filter(|&i| self.nodes[i].child.is_some())
    }

    /// Node `i`'s whole log (its standard error), for tests that count what
    /// the server saw.
    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(&self.nodes[i].log).unwrap_or_default()
    }

    /// The last lines of node `i`'s log, for a failing test's message.
    pub fn log_tail(&self, i: usize) -> String {
        tail(&self.nodes[i].log)
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            // Thaw first so a frozen node does not linger as a stopped zombie.
            let _ = self.cont(i);
            let _ = self.kill(i);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::net::TcpStream;

    use super::*;

    #[test]
    fn a_single_node_is_healthy_and_leads() {
        let c = NatsCluster::start(1).unwrap();
        assert_eq!(c.meta_leader(), Some(0));
        assert!(TcpStream::connect(c.addr(0)).is_ok());
        assert_eq!(c.url(), format!("nats://{}", c.addr(0)));
    }

    /// A raw client: INFO, then CONNECT with `fields` and a PING; the first line after.
    fn connect_raw(addr: SocketAddr, fields: &str) -> (Value, String) {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut r = io::BufReader::new(s.try_clone().unwrap());
        let mut line = String::new();
        io::BufRead::read_line(&mut r, &mut line).unwrap();
        let info: Value = serde_json::from_str(line.strip_prefix("INFO ").unwrap()).unwrap();
        write!(s, "CONNECT {{\"verbose\":false{fields}}}\r\nPING\r\n").unwrap();
        line.clear();
        io::BufRead::read_line(&mut r, &mut line).unwrap();
        (info, line.trim_end().to_string())
    }

    #[test]
    fn the_version_is_the_running_binarys() {
        let c = NatsCluster::start(1).unwrap();
        assert_eq!(c.version().unwrap(), binary_version(c.binary()).unwrap());
    }

    #[test]
    fn nodes_read_the_configuration_text() {
        let c = NatsCluster::builder()
            .nodes(3)
            .config("authorization {\n  token: \"s3cret-token\"\n}\n")
            .start()
            .unwrap();
        assert_eq!(c.len(), 3);
        for i in 0..c.len() {
            let (info, reply) = connect_raw(c.addr(i), "");
            assert_eq!(info["auth_required"], Value::Bool(true), "node {i}: {info}");
            assert!(
                reply.contains("Authorization Violation"),
                "node {i} without the token: {reply}"
            );
            let (_, reply) = connect_raw(c.addr(i), ",\"auth_token\":\"s3cret-token\"");
            assert_eq!(reply, "PONG", "node {i} with the token");
        }
    }

    #[test]
    fn the_current_server_is_the_pinned_release() {
        let bin = current_server_binary().unwrap();
        let c = NatsCluster::builder().binary(&bin).start().unwrap();
        assert_eq!(c.binary(), bin.as_path());
        let v = c.version().unwrap();
        assert_eq!(v, binary_version(&bin).unwrap());
        // The pin is a release line with TLS handshake_first, consumer pause
        // and message schedules, which the tests that ask for it rely on.
        assert!(v >= ServerVersion::new(2, 12, 0), "{v}");
    }

    #[test]
    fn three_nodes_agree_on_a_meta_leader_and_survive_a_kill() {
        let mut c = NatsCluster::start(3).unwrap();
        let leader = c.wait_meta_leader(Duration::from_secs(10)).unwrap();
        let v = c.jsz(leader, "").unwrap();
        assert_eq!(v["meta_cluster"]["replicas"].as_array().unwrap().len(), 2);
        let dir = c.dir.clone();
        c.kill(leader).unwrap();
        assert!(c.pid(leader).is_none());
        // Two of three still elect a leader among themselves.
        let next = c.wait_meta_leader(Duration::from_secs(20)).unwrap();
        assert_ne!(next, leader);
        c.restart(leader).unwrap();
        c.wait_meta_leader(Duration::from_secs(20)).unwrap();
        c.stop(next).unwrap();
        c.cont(next).unwrap();
        drop(c);
        assert!(!dir.exists(), "the cluster's directory is removed on drop");
    }
}
