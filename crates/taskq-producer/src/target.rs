//! What a producer connects to: the engine and the servers' socket addresses,
//! from an address string (`nats://` selects JetStream) or from socket
//! addresses (beanstalkd, as before there was a second engine).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, ToSocketAddrs};

use taskq_connect::{Address, Engine};

/// An engine and the resolved addresses of its servers (for JetStream, the
/// seeds of one cluster).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    engine: Engine,
    addrs: Vec<SocketAddr>,
    /// The address string as parsed, when one was given: its host names
    /// (which TLS verifies), its user info and its scheme.
    address: Option<Address>,
}

impl Target {
    /// The engine selected.
    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// The resolved addresses, in the order given.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// The address string as parsed, when the target came from one.
    pub fn address(&self) -> Option<&Address> {
        self.address.as_ref()
    }

    fn beanstalkd(addr: impl ToSocketAddrs) -> io::Result<Target> {
        Ok(Target {
            engine: Engine::Beanstalkd,
            addrs: addr.to_socket_addrs()?.collect(),
            address: None,
        })
    }
}

/// Anything a producer can be pointed at: an address string
/// (`nats://HOST:PORT[,HOST:PORT...]`, `beanstalk://HOST:PORT` or a bare
/// `HOST:PORT`), or socket addresses in any form [`ToSocketAddrs`] takes, which
/// select beanstalkd.
pub trait IntoTarget {
    /// Parses and resolves the address.
    fn into_target(self) -> io::Result<Target>;
}

impl IntoTarget for &str {
    fn into_target(self) -> io::Result<Target> {
        let a = Address::parse(self).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let mut addrs = Vec::new();
        for h in a.hosts() {
            addrs.extend(h.as_str().to_socket_addrs()?);
        }
        Ok(Target {
            engine: a.engine(),
            addrs,
            address: Some(a),
        })
    }
}

impl IntoTarget for String {
    fn into_target(self) -> io::Result<Target> {
        self.as_str().into_target()
    }
}

impl IntoTarget for &String {
    fn into_target(self) -> io::Result<Target> {
        self.as_str().into_target()
    }
}

impl IntoTarget for Target {
    fn into_target(self) -> io::Result<Target> {
        Ok(self)
    }
}

macro_rules! beanstalkd_addrs {
    ($($t:ty),* $(,)?) => {$(
        impl IntoTarget for $t {
            fn into_target(self) -> io::Result<Target> {
                Target::beanstalkd(self)
            }
        }
    )*};
}

beanstalkd_addrs!(
    SocketAddr,
    &SocketAddr,
    SocketAddrV4,
    SocketAddrV6,
    (IpAddr, u16),
    (Ipv4Addr, u16),
    (Ipv6Addr, u16),
    (&str, u16),
    (String, u16),
    &[SocketAddr],
);

impl IntoTarget for Vec<SocketAddr> {
    fn into_target(self) -> io::Result<Target> {
        Target::beanstalkd(&self[..])
    }
}

impl IntoTarget for &Vec<SocketAddr> {
    fn into_target(self) -> io::Result<Target> {
        Target::beanstalkd(&self[..])
    }
}

impl<const N: usize> IntoTarget for [SocketAddr; N] {
    fn into_target(self) -> io::Result<Target> {
        Target::beanstalkd(&self[..])
    }
}

impl<const N: usize> IntoTarget for &[SocketAddr; N] {
    fn into_target(self) -> io::Result<Target> {
        Target::beanstalkd(&self[..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_select_the_engine_and_resolve() {
        let t = "nats://127.0.0.1:4222,127.0.0.1:4223"
            .into_target()
            .unwrap();
        assert_eq!(t.engine(), Engine::Nats);
        assert_eq!(
            t.addrs(),
            &[
                "127.0.0.1:4222".parse().unwrap(),
                "127.0.0.1:4223".parse().unwrap()
            ][..]
        );
        let t = "127.0.0.1:11300".into_target().unwrap();
        assert_eq!(t.engine(), Engine::Beanstalkd);
        let t = "beanstalk://127.0.0.1:11300"
            .to_owned()
            .into_target()
            .unwrap();
        assert_eq!(t.addrs(), &["127.0.0.1:11300".parse().unwrap()][..]);
        let e = "redis://127.0.0.1:1".into_target().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("redis"), "{e}");
    }

    #[test]
    fn socket_addresses_are_beanstalkd() {
        let a: SocketAddr = "127.0.0.1:11300".parse().unwrap();
        for t in [
            a.into_target().unwrap(),
            (&a).into_target().unwrap(),
            ("127.0.0.1", 11300).into_target().unwrap(),
            vec![a].into_target().unwrap(),
            [a].into_target().unwrap(),
        ] {
            assert_eq!(
                t,
                Target {
                    engine: Engine::Beanstalkd,
                    addrs: vec![a],
                    address: None,
                }
            );
        }
    }
}
