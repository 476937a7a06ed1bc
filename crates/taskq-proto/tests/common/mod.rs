//! The scripted loopback peer shared by the connection tests.
#![allow(dead_code)]

use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// Runs `script` on the one connection a fresh 127.0.0.1 listener accepts.
pub fn peer<F>(script: F) -> (SocketAddr, JoinHandle<()>)
where
    F: FnOnce(TcpStream) + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let handle = thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        stream.set_nodelay(true).unwrap();
        // No peer may outlive its test by much, whatever the client does.
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream
            .set_write_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        script(stream);
    });
    (addr, handle)
}

/// Reads one request line from the client.
pub fn read_line(s: &mut TcpStream) -> Vec<u8> {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while !line.ends_with(b"\r\n") {
        match s.read(&mut b) {
            Ok(1) => line.push(b[0]),
            _ => break,
        }
    }
    line
}
