//! Server addresses as users write them, and the engine each one selects.
//!
//! `nats://HOST:PORT[,HOST:PORT...]` selects NATS JetStream, the listed nodes
//! being seeds (the client learns the rest of the cluster from the server).
//! `beanstalk://HOST:PORT` and a bare `HOST:PORT` select beanstalkd, as every
//! taskq address did before there was a second engine. `tls://` is a NATS
//! address that requires TLS.
//!
//! A NATS address may carry credentials as user info, as the official NATS
//! clients read it: `nats://USER:PASS@HOST` (user and password) or
//! `nats://TOKEN@HOST` (a token), percent-decoded. They are kept as
//! [`Secret`]s: an address is always shown as `nats://USER:***@HOST:PORT`.

use std::fmt;
use std::str::FromStr;

use taskq_proto::Secret;

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

/// Credentials given in a NATS address's user info.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum UserInfo {
    /// `USER:PASS@`: sent as `user` and `pass`.
    UserPass {
        /// The user name (shown in messages).
        user: String,
        /// The password (never shown).
        pass: Secret,
    },
    /// `TOKEN@`: sent as `auth_token` (never shown).
    Token(Secret),
}

/// A parsed address: an engine, one or more `HOST:PORT`s, and for NATS the
/// credentials of its user info and whether it requires TLS.
///
/// `Debug` and `Display` never show a password or token.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Address {
    engine: Engine,
    hosts: Vec<String>,
    user_info: Option<UserInfo>,
    tls: bool,
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
    /// User info on a beanstalkd address (beanstalkd has no authentication).
    CredentialsOnBeanstalkd,
    /// Entries of one NATS address with different credentials.
    MixedCredentials,
    /// A `%` not followed by two hex digits in the user info.
    BadEscape,
    /// A `,` that may lie inside the user info (`nats://alice:pa,ss@h`):
    /// an entry without a scheme of its own carries user info after an
    /// entry that carries none. Refused rather than guessed at, since the
    /// guess would dial half a password as a host.
    CommaInUserInfo,
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
            AddressError::CredentialsOnBeanstalkd => {
                f.write_str("beanstalkd takes no credentials (user info in a beanstalkd address)")
            }
            AddressError::MixedCredentials => {
                f.write_str("the entries of one nats:// address carry different credentials")
            }
            AddressError::BadEscape => {
                f.write_str("bad percent escape in the address's user info")
            }
            AddressError::CommaInUserInfo => f.write_str(
                "a ',' in the address's user info, or an entry with credentials after one without: write a ',' in a password as %2C, and give credentials on the first entry",
            ),
        }
    }
}

impl std::error::Error for AddressError {}

impl Address {
    /// Parses `nats://[CREDS@]H:P[,H:P...]`, `tls://...`, `beanstalk://H:P`
    /// or `H:P`. Each entry of a NATS list may repeat the scheme and the
    /// credentials (`nats://u:p@a:1,nats://u:p@b:2`); they must agree.
    ///
    /// A bare address is passed on as written (name resolution comes later);
    /// `nats://` entries are checked here, and one without a port gets 4222.
    pub fn parse(s: &str) -> Result<Address, AddressError> {
        let s = s.trim();
        if s.is_empty() {
            return Err(AddressError::Empty);
        }
        let (engine, tls, rest) = match scheme(s)? {
            None => (Engine::Beanstalkd, false, s),
            Some((e, tls, rest)) => (e, tls, rest),
        };
        let rest = rest.trim_end_matches('/');
        if engine == Engine::Nats && comma_in_user_info(rest) {
            return Err(AddressError::CommaInUserInfo);
        }
        let mut hosts = Vec::new();
        let mut user_info: Option<UserInfo> = None;
        let mut tls = tls;
        for entry in rest.split(',') {
            let mut entry = entry.trim().trim_end_matches('/');
            if engine == Engine::Nats {
                // A later entry may repeat a NATS scheme.
                if let Some((Engine::Nats, t, after)) = scheme(entry)? {
                    tls |= t;
                    entry = after;
                }
            }
            let (creds, host) = match entry.rfind('@') {
                Some(at) => (Some(&entry[..at]), &entry[at + 1..]),
                None => (None, entry),
            };
            if let Some(c) = creds {
                if engine == Engine::Beanstalkd {
                    return Err(AddressError::CredentialsOnBeanstalkd);
                }
                let info = parse_user_info(c)?;
                match &user_info {
                    Some(had) if *had != info => return Err(AddressError::MixedCredentials),
                    _ => user_info = Some(info),
                }
            }
            if host.is_empty() {
                return Err(AddressError::EmptyHost);
            }
            hosts.push(match engine {
                Engine::Nats => with_port(host)?,
                Engine::Beanstalkd => host.to_owned(),
            });
        }
        if engine == Engine::Beanstalkd && hosts.len() > 1 {
            return Err(AddressError::ManyBeanstalkd);
        }
        Ok(Address {
            engine,
            hosts,
            user_info,
            tls,
        })
    }

    /// The credentials of the address's user info, if any.
    pub fn user_info(&self) -> Option<&UserInfo> {
        self.user_info.as_ref()
    }

    /// The same address without its user info (what logs, metrics and a
    /// job's `TASKQ_ADDR` may show once the credentials were taken out).
    pub fn without_credentials(&self) -> Address {
        Address {
            user_info: None,
            ..self.clone()
        }
    }

    /// True for a `tls://` address: the connection must be encrypted.
    pub fn requires_tls(&self) -> bool {
        self.tls
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
    /// The address as given, with any password or token shown as `***`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.engine == Engine::Nats {
            f.write_str(if self.tls { "tls://" } else { "nats://" })?;
            match &self.user_info {
                Some(UserInfo::UserPass { user, .. }) => write!(f, "{user}:***@")?,
                Some(UserInfo::Token(_)) => f.write_str("***@")?,
                None => {}
            }
        }
        f.write_str(&self.hosts.join(","))
    }
}

/// `s` with the password or token of any user info shown as `***`, for
/// messages about an address that may not even parse.
pub fn redact_address(s: &str) -> String {
    if let Some(k) = s.find("://") {
        let rest = &s[k + 3..];
        if comma_in_user_info(rest) {
            // Which commas end entries cannot be told: all of it up to the
            // last `@` may be user info.
            let at = rest.rfind('@').expect("user info has an @");
            return format!("{}***{}", &s[..k + 3], &rest[at..]);
        }
    }
    let mut out = String::with_capacity(s.len());
    for (i, entry) in s.split(',').enumerate() {
        if i > 0 {
            out.push(',');
        }
        let (scheme, rest) = match entry.find("://") {
            Some(k) => entry.split_at(k + 3),
            None => ("", entry),
        };
        out.push_str(scheme);
        match rest.rfind('@') {
            Some(at) => {
                match rest[..at].split_once(':') {
                    Some((user, _)) => {
                        out.push_str(user);
                        out.push_str(":***");
                    }
                    None => out.push_str("***"),
                }
                out.push_str(&rest[at..]);
            }
            None => out.push_str(rest),
        }
    }
    out
}

/// True when a `,` in `rest` (what follows the scheme) may lie inside user
/// info: an entry after the first, without a scheme of its own, carries
/// user info (an `@`) while an entry before it carries none.
fn comma_in_user_info(rest: &str) -> bool {
    let mut bare_before = false;
    for entry in rest.split(',') {
        let info = entry.contains('@');
        if info && bare_before && !entry.contains("://") {
            return true;
        }
        bare_before |= !info;
    }
    false
}

/// The scheme of `s`, if it has one: the engine, whether it requires TLS,
/// and what follows `://`.
fn scheme(s: &str) -> Result<Option<(Engine, bool, &str)>, AddressError> {
    let Some((scheme, rest)) = s.split_once("://") else {
        return Ok(None);
    };
    // What comes before `://` is a scheme only when it is spelled as one (a
    // letter, then letters, digits, `+`, `-`, `.`): `alice:se://cret@h` is
    // user info with an unescaped password, not a scheme to name.
    let spelled = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !spelled {
        return Ok(None);
    }
    let (engine, tls) = match scheme.to_ascii_lowercase().as_str() {
        "nats" => (Engine::Nats, false),
        "tls" => (Engine::Nats, true),
        "beanstalk" | "beanstalkd" => (Engine::Beanstalkd, false),
        _ => {
            // With an `@` after it, the text may be a token or a user's
            // password (`nats://tok://x@h`): never shown in the error.
            let shown = if rest.contains('@') { "***" } else { scheme };
            return Err(AddressError::UnknownScheme {
                scheme: shown.to_owned(),
            });
        }
    };
    Ok(Some((engine, tls, rest)))
}

/// `USER:PASS` or `TOKEN`, percent-decoded.
fn parse_user_info(s: &str) -> Result<UserInfo, AddressError> {
    Ok(match s.split_once(':') {
        Some((user, pass)) => UserInfo::UserPass {
            user: percent_decode(user)?,
            pass: Secret::new(percent_decode(pass)?),
        },
        None => UserInfo::Token(Secret::new(percent_decode(s)?)),
    })
}

/// Decodes `%XX` escapes (user info may hold `@`, `:` or `/` that way).
fn percent_decode(s: &str) -> Result<String, AddressError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = |c: u8| (c as char).to_digit(16);
            match (
                b.get(i + 1).and_then(|&c| hex(c)),
                b.get(i + 2).and_then(|&c| hex(c)),
            ) {
                (Some(h), Some(l)) => out.push((h * 16 + l) as u8),
                _ => return Err(AddressError::BadEscape),
            }
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| AddressError::BadEscape)
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
    fn an_address_error_never_shows_a_part_of_its_user_info() {
        for (given, secret) in [
            ("nats://tok3n://x@127.0.0.1:4222", "tok3n"),
            ("nats://alice:s3://cret@127.0.0.1:4222,b:0", "s3"),
            ("xyzsecret://a@h:1", "xyzsecret"),
        ] {
            let e = Address::parse(given).unwrap_err();
            let shown = format!("{e} {e:?}");
            assert!(!shown.contains(secret), "{given}: {shown}");
        }
        // A password with an unescaped `://` is user info, not a scheme.
        let a = Address::parse("nats://alice:se://cret@127.0.0.1:4222").unwrap();
        match a.user_info() {
            Some(UserInfo::UserPass { user, pass }) => {
                assert_eq!((user.as_str(), pass.expose()), ("alice", "se://cret"));
            }
            other => panic!("{other:?}"),
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
    fn user_info_is_read_percent_decoded_and_never_shown() {
        let a = Address::parse("nats://alice:s3%40cret@h1:4222,nats://alice:s3%40cret@h2").unwrap();
        assert_eq!(a.hosts(), ["h1:4222", "h2:4222"]);
        assert_eq!(
            a.user_info(),
            Some(&UserInfo::UserPass {
                user: "alice".into(),
                pass: Secret::new("s3@cret")
            })
        );
        assert_eq!(a.to_string(), "nats://alice:***@h1:4222,h2:4222");
        assert!(!format!("{a:?}").contains("s3"), "{a:?}");
        let t = Address::parse("tls://T0k3n@h:5").unwrap();
        assert_eq!(t.user_info(), Some(&UserInfo::Token(Secret::new("T0k3n"))));
        assert!(t.requires_tls() && t.is_nats());
        assert_eq!(t.to_string(), "tls://***@h:5");
        assert!(!format!("{t:?}").contains("T0k3n"));
        // A password with a colon: only the first one splits.
        let c = Address::parse("nats://u:a:b@h").unwrap();
        assert_eq!(
            c.user_info(),
            Some(&UserInfo::UserPass {
                user: "u".into(),
                pass: Secret::new("a:b")
            })
        );
        let table: &[(&str, AddressError)] = &[
            ("u:p@h:1", AddressError::CredentialsOnBeanstalkd),
            ("nats://u:p@a,nats://u:q@b", AddressError::MixedCredentials),
            ("nats://u:p%4@a", AddressError::BadEscape),
            ("nats://u:p@", AddressError::EmptyHost),
        ];
        for (s, want) in table {
            let e = Address::parse(s).unwrap_err();
            assert_eq!(e, *want, "{s:?}");
            assert!(!e.to_string().contains("p%4"), "{e}");
        }
        assert_eq!(
            redact_address("nats://u:pw@a:1,nats://u:pw@b:x, tok@c"),
            "nats://u:***@a:1,nats://u:***@b:x,***@c"
        );
        assert_eq!(redact_address("127.0.0.1:11300"), "127.0.0.1:11300");
        // A comma in a password: refused, never split into a host and a
        // token, and redacted whole.
        for s in [
            "nats://alice:pa,ss@h",
            "nats://alice:12,34@h:1",
            "nats://a:1,u:pw@b",
        ] {
            assert_eq!(
                Address::parse(s).unwrap_err(),
                AddressError::CommaInUserInfo,
                "{s}"
            );
            let shown = redact_address(s);
            for secret in ["pa", "ss", "12", "34", "pw"] {
                assert!(!shown.contains(secret), "{s}: {shown}");
            }
        }
        assert_eq!(redact_address("nats://alice:12,34@h:1"), "nats://***@h:1");
        // A bad port names the entry without its credentials.
        let e = Address::parse("nats://u:secret@a:x").unwrap_err();
        assert!(!e.to_string().contains("secret"), "{e}");
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
