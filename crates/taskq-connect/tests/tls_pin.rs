//! A node that spoke TLS to a client is held to it by that client's
//! settings (and their clones): whoever answers at its address later with
//! an `INFO` that leaves `tls_required` out (anyone on the way can rewrite
//! that line, which comes in the clear) is refused before any credential
//! is written.
//!
//! One test in its own binary: it trusts the test CA through
//! `SSL_CERT_FILE`, for the whole process, so that a `nats://` address
//! with no TLS option upgrades because the server asks.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use taskq_connect::nats::{NatsAccess, NatsConfig, NatsConnection};
use taskq_proto::Secret;
use taskq_testkit::{NatsCluster, TempDir, TestCerts};

const PASSWORD: &str = "pin-s3cret-PW";

#[test]
fn a_node_that_spoke_tls_is_never_sent_credentials_in_the_clear_after() {
    let dir = TempDir::new("tls-pin");
    let certs = TestCerts::generate(&dir.path().join("pki")).unwrap();
    std::env::set_var("SSL_CERT_FILE", &certs.ca);
    let server = NatsCluster::builder()
        .config(format!(
            "authorization {{ user: alice, password: \"{PASSWORD}\" }}\n\
             tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n}}\n",
            certs.server_cert.display(),
            certs.server_key.display()
        ))
        .start()
        .unwrap();
    // The node's address as the client knows it: a relay the test owns, so
    // that the same address can later be answered by someone else.
    let front = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = front.local_addr().unwrap();
    let cfg = NatsConfig {
        io_timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(2),
        access: NatsAccess {
            user: Some(("alice".to_owned(), Secret::new(PASSWORD))),
            ..NatsAccess::default()
        },
        ..NatsConfig::default()
    };
    let relay = std::thread::spawn({
        let upstream = server.addr(0);
        let front = front.try_clone().unwrap();
        move || {
            let (client, _) = front.accept().unwrap();
            let server = TcpStream::connect(upstream).unwrap();
            let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            // The client's close reaches the server, which then closes too.
            let up = std::thread::spawn(move || {
                let _ = std::io::copy(&mut c2, &mut s2);
                let _ = s2.shutdown(std::net::Shutdown::Both);
            });
            let (mut c, mut s) = (client, server);
            let _ = std::io::copy(&mut s, &mut c);
            let _ = c.shutdown(std::net::Shutdown::Both);
            let _ = up.join();
        }
    });
    // First: the server asks for TLS, so the nats:// connection upgrades.
    let seeds = [addr.to_string()];
    let c = NatsConnection::connect(&seeds, cfg.clone()).unwrap();
    assert!(c.is_tls(), "the server required TLS");
    drop(c);
    relay.join().unwrap();

    // Then someone else answers at the same address, with an INFO that
    // asks for no TLS, and records what the client writes.
    let attacker = std::thread::spawn(move || {
        let (mut s, _) = front.accept().unwrap();
        let info = format!(
            "INFO {{\"server_id\":\"NFAKE\",\"server_name\":\"fake\",\"version\":\"2.9.10\",\
             \"proto\":1,\"host\":\"127.0.0.1\",\"port\":{},\"headers\":true,\
             \"max_payload\":1048576,\"auth_required\":true}}\r\n",
            addr.port()
        );
        s.write_all(info.as_bytes()).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let until = Instant::now() + Duration::from_secs(3);
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while Instant::now() < until {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => break,
            }
        }
        got
    });
    let e = NatsConnection::connect(&seeds, cfg).unwrap_err();
    let got = attacker.join().unwrap();
    let heard = String::from_utf8_lossy(&got);
    assert!(!heard.contains(PASSWORD), "sent in the clear: {heard}");
    assert!(!heard.contains("CONNECT"), "sent in the clear: {heard}");
    assert!(e.to_string().contains("offers no TLS"), "{e}");
}
