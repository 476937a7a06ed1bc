//! Writing to a reset socket must give an error, not kill a host that left
//! SIGPIPE at its default action (Rust programs ignore it; C hosts often do not).
// Restoring SIGPIPE's default action needs `libc::signal`, which is `unsafe`.
#![allow(unsafe_code)]

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::process::Command as Process;
use std::thread;
use std::time::Duration;

use taskq_proto::{CommandKind, Connection, ConnectionConfig, ConnectionError};

fn default_sigpipe() {
    // SAFETY: `signal` with SIG_DFL installs no handler code; it only resets the
    // disposition, and nothing in this binary relies on SIGPIPE being ignored.
    let prev = unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    assert_ne!(prev, libc::SIG_ERR);
}

/// A peer that accepts one connection and closes it at once.
fn closing_peer() -> (SocketAddr, thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let h = thread::spawn(move || drop(listener.accept().unwrap()));
    (addr, h)
}

#[test]
fn writing_to_a_reset_socket_is_an_error_not_a_signal() {
    default_sigpipe();
    let (addr, peer) = closing_peer();
    let mut c = Connection::connect(addr, ConnectionConfig::default()).unwrap();
    peer.join().unwrap();
    thread::sleep(Duration::from_millis(50));
    // The first send lands in a half-closed socket and draws a reset; the
    // second then fails with EPIPE, which raises SIGPIPE unless suppressed.
    let first = c.send_raw(b"stats\r\n", CommandKind::Stats);
    thread::sleep(Duration::from_millis(50));
    let second = c.send_raw(b"stats\r\n", CommandKind::Stats);
    let e = first
        .err()
        .or(second.err())
        .expect("a write to a reset socket must fail");
    assert!(
        matches!(e, ConnectionError::NotSent(_) | ConnectionError::Io(_)),
        "{e:?}"
    );
    assert!(c.is_broken());
}

/// Run alone by the control test below: the same writes with plain `write(2)`.
#[test]
fn control_child() {
    if std::env::var_os("TASKQ_SIGPIPE_CONTROL").is_none() {
        return;
    }
    default_sigpipe();
    let (addr, peer) = closing_peer();
    let mut s = TcpStream::connect(addr).unwrap();
    peer.join().unwrap();
    thread::sleep(Duration::from_millis(50));
    let _ = s.write(b"stats\r\n");
    thread::sleep(Duration::from_millis(50));
    // SAFETY: writes 7 bytes from a live buffer to a descriptor this test owns.
    let _ = unsafe { libc::write(s.as_raw_fd(), b"stats\r\n".as_ptr().cast(), 7) };
    println!("survived");
}

#[test]
fn control_plain_write_is_killed_by_sigpipe() {
    // Shows the test above can fail: without MSG_NOSIGNAL the process dies.
    let out = Process::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "control_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("TASKQ_SIGPIPE_CONTROL", "1")
        .output()
        .unwrap();
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{out:?}");
}
