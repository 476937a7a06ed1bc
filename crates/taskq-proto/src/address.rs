//! Server addresses as users write them, and the engine each one selects.
//!
//! `nats://HOST:PORT[,HOST:PORT...]` selects NATS JetStream, the listed nodes
//! being seeds (the client learns the rest of the cluster from the server).
//! `beanstalk://HOST:PORT` and a bare `HOST:PORT` select beanstalkd, as every
//! taskq address did before there was a second engine.

use std::fmt;
use std::str::FromStr;

/// The queue server an address selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Engine {
    /// beanstalkd (a bare `HOST:PORT`, or `beanstalk://`).
    Beanstalkd,
    /// NATS JetStream (`nats://`).
    Nats,
}

impl Engine {
    /// The engine's name for messages and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Beanstalkd => "beanstalkd",
            Engine::Nats => "nats",
        }
    }
}

/// NATS's own default client port, taken when a `nats://` host has none.
pub const NATS_DEFAULT_PORT: u16 = 4222;

/// A parsed address: an engine and one or more `HOST:PORT`s.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Address {
    engine: Engine,
    hosts: Vec<String>,
}

/// Why an address was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AddressError {
    /// Nothing given.
    Empty,
    /// A `scheme://` other than `nats` or `beanstalk`.
    UnknownScheme {
        /// The scheme given.
        scheme: String,
    },
    /// An empty entry in a comma-separated list, or a port with no host.
    EmptyHost,
    /// A port that is not a number from 1 to 65535.
    BadPort {
        /// The entry holding it.
        host: String,
    },
    /// beanstalkd takes one server per address; repeat the option for more.
    ManyBeanstalkd,
}

impl fmt::Display for AddressError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AddressError::Empty => f.write_str("empty server address"),
            AddressError::UnknownScheme { scheme } => write!(
                f,
                "unknown address scheme {scheme:?}:// (use nats:// for JetStream, beanstalk:// or a bare HOST:PORT for beanstalkd)"
            ),
            AddressError::EmptyHost => f.write_str("an address entry without a host"),
            AddressError::BadPort { host } => {
                write!(f, "bad port in {host:?} (want a number from 1 to 65535)")
            }
            AddressError::ManyBeanstalkd => f.write_str(
                "a beanstalkd address names one server (give the option once per server)",
            ),
        }
    }
}

impl std::error::Error for AddressError {}

impl Address {
    /// Parses `nats://H:P[,H:P...]`, `beanstalk://H:P` or `H:P`.
    ///
    /// A bare address is passed on as written (name resolution comes later);
    /// `nats://` entries are checked here, and one without a port gets 4222.
    pub fn parse(s: &str) -> Result<Address, AddressError> {
        let s = s.trim();
        if s.is_empty() {
            return Err(AddressError::Empty);
        }
        let (engine, rest) = match s.split_once("://") {
            None => (Engine::Beanstalkd, s),
            Some((scheme, rest)) => match scheme.to_ascii_lowercase().as_str() {
                "nats" => (Engine::Nats, rest),
                "beanstalk" | "beanstalkd" => (Engine::Beanstalkd, rest),
                _ => {
                    return Err(AddressError::UnknownScheme {
                        scheme: scheme.to_owned(),
                    })
                }
            },
        };
        let rest = rest.trim_end_matches('/');
        let mut hosts = Vec::new();
        for entry in rest.split(',') {
            let entry = entry.trim();
            if entry.is_empty() {
                return Err(AddressError::EmptyHost);
            }
            hosts.push(match engine {
                Engine::Nats => with_port(entry)?,
                Engine::Beanstalkd => entry.to_owned(),
            });
        }
        if engine == Engine::Beanstalkd && hosts.len() > 1 {
            return Err(AddressError::ManyBeanstalkd);
        }
        Ok(Address { engine, hosts })
    }

    /// The engine selected.
    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// The servers as `HOST:PORT` (for NATS: the seeds).
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// True when the address selects NATS JetStream.
    pub fn is_nats(&self) -> bool {
        self.engine == Engine::Nats
    }
}

impl FromStr for Address {
    type Err = AddressError;
    fn from_str(s: &str) -> Result<Address, AddressError> {
        Address::parse(s)
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.engine == Engine::Nats {
            f.write_str("nats://")?;
        }
        f.write_str(&self.hosts.join(","))
    }
}

/// `HOST:PORT` with the port checked, or `HOST` given NATS's default port.
fn with_port(entry: &str) -> Result<String, AddressError> {
    // The last colon outside an IPv6 literal's brackets.
    let colon = match entry.rfind(']') {
        Some(close) => entry[close..].rfind(':').map(|i| close + i),
        None => entry.rfind(':'),
    };
    match colon {
        None => Ok(format!("{entry}:{NATS_DEFAULT_PORT}")),
        Some(0) => Err(AddressError::EmptyHost),
        Some(i) => match entry[i + 1..].parse::<u16>() {
            Ok(p) if p > 0 => Ok(entry.to_owned()),
            _ => Err(AddressError::BadPort {
                host: entry.to_owned(),
            }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> (Engine, Vec<&str>) {
        let a = Address::parse(s).unwrap();
        let hosts = a.hosts().iter().map(|h| leak(h)).collect();
        (a.engine(), hosts)
    }

    fn leak(s: &str) -> &'static str {
        Box::leak(s.to_owned().into_boxed_str())
    }

    #[test]
    fn addresses_select_their_engine() {
        use Engine::*;
        let table: &[(&str, Engine, &[&str])] = &[
            ("127.0.0.1:11300", Beanstalkd, &["127.0.0.1:11300"]),
            ("localhost:11300", Beanstalkd, &["localhost:11300"]),
            (
                "beanstalk://10.0.0.1:11300",
                Beanstalkd,
                &["10.0.0.1:11300"],
            ),
            ("BEANSTALK://h:1/", Beanstalkd, &["h:1"]),
            ("nats://127.0.0.1:4222", Nats, &["127.0.0.1:4222"]),
            ("nats://a:1,b:2, c:3", Nats, &["a:1", "b:2", "c:3"]),
            ("nats://node1", Nats, &["node1:4222"]),
            ("nats://[::1]:4223", Nats, &["[::1]:4223"]),
            ("nats://[::1]", Nats, &["[::1]:4222"]),
            (" NATS://h:5 ", Nats, &["h:5"]),
        ];
        for (s, engine, hosts) in table {
            assert_eq!(ok(s), (*engine, hosts.to_vec()), "{s}");
        }
    }

    #[test]
    fn bad_addresses_are_typed_errors() {
        let table: &[(&str, AddressError)] = &[
            ("", AddressError::Empty),
            ("   ", AddressError::Empty),
            (
                "redis://h:1",
                AddressError::UnknownScheme {
                    scheme: "redis".into(),
                },
            ),
            ("nats://", AddressError::EmptyHost),
            ("nats://a:1,,b:2", AddressError::EmptyHost),
            ("nats://:4222", AddressError::EmptyHost),
            ("nats://a:0", AddressError::BadPort { host: "a:0".into() }),
            (
                "nats://a:70000",
                AddressError::BadPort {
                    host: "a:70000".into(),
                },
            ),
            ("nats://a:x", AddressError::BadPort { host: "a:x".into() }),
            ("beanstalk://a:1,b:2", AddressError::ManyBeanstalkd),
        ];
        for (s, want) in table {
            assert_eq!(Address::parse(s).unwrap_err(), *want, "{s:?}");
        }
    }

    #[test]
    fn display_round_trips() {
        for s in ["nats://a:1,b:2", "127.0.0.1:11300"] {
            let a = Address::parse(s).unwrap();
            assert_eq!(a.to_string(), s);
            assert_eq!(Address::parse(&a.to_string()).unwrap(), a);
        }
        assert_eq!(
            Address::parse("beanstalk://h:1").unwrap().to_string(),
            "h:1"
        );
    }
}
