//! A real `beanstalkd` process on a free loopback port, started and stopped by a test.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `beanstalkd` child process listening on 127.0.0.1. Killed and reaped on drop.
#[derive(Debug)]
pub struct Beanstalkd {
    child: Child,
    addr: SocketAddr,
}

impl Beanstalkd {
    /// Starts `beanstalkd` with its defaults on a free loopback port.
    pub fn start() -> io::Result<Beanstalkd> {
        Beanstalkd::start_with(&[])
    }

    /// Starts `beanstalkd` with extra arguments (for example `["-z", "1024"]`).
    pub fn start_with(args: &[&str]) -> io::Result<Beanstalkd> {
        let mut last = None;
        // A port found free can be taken by someone else before the server binds it: retry.
        for _ in 0..5 {
            let port = free_port()?;
            let mut child = Command::new("beanstalkd")
                .args(["-l", "127.0.0.1", "-p", &port.to_string()])
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("cannot run beanstalkd ({e}); install it: apt-get install -y beanstalkd"),
                    )
                })?;
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let until = Instant::now() + Duration::from_secs(5);
            loop {
                if let Some(status) = child.try_wait()? {
                    last = Some(io::Error::other(format!(
                        "beanstalkd exited at start: {status}"
                    )));
                    break;
                }
                if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                    // Something listens; make sure it is our child and not another
                    // process's server that took the port first.
                    match served_pid(addr) {
                        Some(pid) if pid == u64::from(child.id()) => {
                            return Ok(Beanstalkd { child, addr })
                        }
                        Some(pid) => {
                            let _ = child.kill();
                            let _ = child.wait();
                            last = Some(io::Error::new(
                                io::ErrorKind::AddrInUse,
                                format!("port {port} is served by pid {pid}, not ours"),
                            ));
                            break;
                        }
                        // Not answering stats yet (or not beanstalkd): keep waiting.
                        None => {}
                    }
                }
                if Instant::now() > until {
                    let _ = child.kill();
                    let _ = child.wait();
                    last = Some(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "beanstalkd did not listen within 5 s",
                    ));
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("beanstalkd did not start")))
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Puts the server into drain mode (SIGUSR1): it answers `put` with `DRAINING`.
    pub fn drain(&self) -> io::Result<()> {
        self.signal("USR1")
    }

    /// Stops the process at once (SIGKILL) and reaps it.
    pub fn kill(&mut self) -> io::Result<()> {
        let _ = self.child.kill();
        self.child.wait().map(|_| ())
    }

    /// Sends a signal by name, through `kill(1)`.
    pub fn signal(&self, name: &str) -> io::Result<()> {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()?;
        if status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!("kill -{name} failed: {status}")))
        }
    }
}

impl Drop for Beanstalkd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The pid that the server at `addr` reports in `stats`.
fn served_pid(addr: SocketAddr) -> Option<u64> {
    let cfg = taskq_proto::ConnectionConfig {
        io_timeout: Duration::from_secs(1),
        ..taskq_proto::ConnectionConfig::default()
    };
    let mut conn = taskq_proto::Connection::connect_addr(addr, cfg).ok()?;
    match conn.request(&taskq_proto::Command::Stats).ok()? {
        taskq_proto::Reply::Ok { yaml } => {
            taskq_proto::ServerStats::parse(yaml).ok().map(|s| s.pid)
        }
        _ => None,
    }
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
