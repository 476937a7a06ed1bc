//! The NATS connection options of the `taskq` and `taskq-worker` commands,
//! named as the `nats` CLI names them so that existing set-ups carry over:
//! `--creds` (`NATS_CREDS`), `--nkey` (`NATS_NKEY`), `--tls-ca` (`NATS_CA`),
//! `--tls-cert` (`NATS_CERT`), `--tls-key` (`NATS_KEY`), `--tls-first`,
//! `--context` (`NATS_CONTEXT`), and from the environment only (never on a
//! command line, where `ps` shows it) `NATS_USER` + `NATS_PASSWORD` or
//! `NATS_TOKEN`.
//!
//! Explicit flags win over the environment, which wins over the context; a
//! `nats://USER:PASS@HOST` address's own user info wins over all of them.
//! The libraries never read the environment: this is where the commands do.

use std::path::{Path, PathBuf};

use taskq_connect::nats::NatsAccess;
use taskq_proto::Secret;

/// The NATS options every connecting subcommand takes.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct NatsArgs {
    /// NATS: a JWT user credentials file (`.creds`).
    #[arg(long, value_name = "FILE", env = "NATS_CREDS", global = true)]
    pub creds: Option<PathBuf>,
    /// NATS: a file holding a user nkey seed (`SU...`).
    #[arg(long, value_name = "FILE", env = "NATS_NKEY", global = true)]
    pub nkey: Option<PathBuf>,
    /// NATS: a saved `nats` CLI context (`~/.config/nats/context/NAME.json`):
    /// its url, credentials and TLS files, where no flag or variable gives them.
    #[arg(long, value_name = "NAME", env = "NATS_CONTEXT", global = true)]
    pub context: Option<String>,
    /// NATS: PEM file of the CAs to trust (default: the system's).
    #[arg(long = "tls-ca", value_name = "FILE", env = "NATS_CA", global = true)]
    pub tls_ca: Option<PathBuf>,
    /// NATS: PEM client certificate, for mutual TLS.
    #[arg(
        long = "tls-cert",
        value_name = "FILE",
        env = "NATS_CERT",
        global = true
    )]
    pub tls_cert: Option<PathBuf>,
    /// NATS: PEM private key of the client certificate.
    #[arg(long = "tls-key", value_name = "FILE", env = "NATS_KEY", global = true)]
    pub tls_key: Option<PathBuf>,
    /// NATS: start with the TLS handshake (a server with `handshake_first`).
    #[arg(long = "tls-first", global = true)]
    pub tls_first: bool,
}

/// What a `nats` CLI context file holds that taskq uses.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Context {
    /// `url`: the servers.
    pub url: Option<String>,
    /// `user`.
    pub user: Option<String>,
    /// `password`.
    pub password: Option<Secret>,
    /// `token`.
    pub token: Option<Secret>,
    /// `creds`: a credentials file.
    pub creds: Option<PathBuf>,
    /// `nkey`: an nkey seed file.
    pub nkey: Option<PathBuf>,
    /// `cert`.
    pub cert: Option<PathBuf>,
    /// `key`.
    pub key: Option<PathBuf>,
    /// `ca`.
    pub ca: Option<PathBuf>,
    /// `tls_first`.
    pub tls_first: bool,
}

impl Context {
    /// Reads context `name` from the `nats` CLI's folder: under
    /// `$XDG_CONFIG_HOME/nats/context`, else `$HOME/.config/nats/context`.
    /// `env` is the environment (given, so that this is testable).
    pub fn load(name: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Context, String> {
        if name.is_empty() || name.contains(['/', '\\']) || name.starts_with('.') {
            return Err(format!("bad NATS context name {name:?}"));
        }
        let base = match env("XDG_CONFIG_HOME").filter(|s| !s.is_empty()) {
            Some(x) => PathBuf::from(x),
            None => PathBuf::from(env("HOME").ok_or("no $HOME to find NATS contexts in")?)
                .join(".config"),
        };
        let path = base
            .join("nats")
            .join("context")
            .join(format!("{name}.json"));
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("NATS context {name:?}: cannot read {}: {e}", path.display()))?;
        Context::parse(&text).map_err(|e| format!("NATS context {}: {e}", path.display()))
    }

    /// Reads a context file's JSON. Empty strings count as absent, as the
    /// `nats` CLI writes every key.
    pub fn parse(json: &str) -> Result<Context, String> {
        let v: serde_json::Value =
            serde_json::from_str(json).map_err(|e| format!("not JSON ({e})"))?;
        let text = |k: &str| {
            v.get(k)
                .and_then(|x| x.as_str())
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
        };
        let path = |k: &str| text(k).map(|p| expand_home(&p));
        Ok(Context {
            url: text("url"),
            user: text("user"),
            password: text("password").map(Secret::new),
            token: text("token").map(Secret::new),
            creds: path("creds"),
            nkey: path("nkey"),
            cert: path("cert"),
            key: path("key"),
            ca: path("ca"),
            tls_first: v
                .get("tls_first")
                .and_then(|b| b.as_bool())
                .unwrap_or(false),
        })
    }
}

/// A context's `url` as a taskq address: a NATS address whatever its form
/// (`nats://a:4222,nats://b:4222`, `tls://...`, or bare `HOST:PORT`s,
/// which the `nats` CLI takes for NATS).
pub fn context_address(url: &str) -> String {
    let url = url.trim();
    if url.contains("://") {
        url.to_owned()
    } else {
        format!("nats://{url}")
    }
}

/// What to warn of when `argv` itself carries a secret: an address with a
/// password or token in it (`--addr nats://USER:PASS@HOST`, `--addr=...`),
/// or a flag whose value is one (`--token`, `taskq web`'s). Every user of
/// the machine reads a running command's arguments (`ps`,
/// `/proc/PID/cmdline`), and a program cannot take them back. The secret is
/// never named, only where it was and where to put it instead.
pub fn secrets_on_argv<S: AsRef<std::ffi::OsStr>>(argv: &[S]) -> Option<&'static str> {
    let args: Vec<&str> = argv.iter().filter_map(|a| a.as_ref().to_str()).collect();
    let in_address = |v: &str| {
        taskq_connect::Address::parse(v).is_ok_and(|a| a.user_info().is_some())
            || (v.contains('@') && v.contains("://"))
    };
    let found = args.iter().enumerate().any(|(i, a)| {
        let next = || args.get(i + 1).copied().unwrap_or("");
        match *a {
            "--addr" => in_address(next()),
            "--token" => true,
            _ => a.strip_prefix("--addr=").is_some_and(in_address) || a.starts_with("--token="),
        }
    });
    found.then_some(
        "a password or token given on the command line can be read by every user of \
         this machine (ps, /proc/PID/cmdline) while the command runs: give it in the \
         environment instead ($TASKQ_ADDR, $NATS_USER and $NATS_PASSWORD, $NATS_TOKEN, \
         $TASKQ_WEB_TOKEN) or in a credentials file (--creds)",
    )
}

/// `~/x` as the `nats` CLI writes it, with the home folder put in.
fn expand_home(p: &str) -> PathBuf {
    match (p.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => Path::new(&home).join(rest),
        _ => PathBuf::from(p),
    }
}

impl NatsArgs {
    /// The settings these options, the environment (`env`) and the selected
    /// context give, and the context's url (used where no address is given).
    pub fn resolve(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(NatsAccess, Option<String>), String> {
        let ctx = match &self.context {
            Some(name) => Context::load(name, env)?,
            None => Context::default(),
        };
        let var = |k: &str| env(k).filter(|s| !s.is_empty());
        let user = match (var("NATS_USER"), var("NATS_PASSWORD")) {
            (Some(u), p) => Some((u, Secret::new(p.unwrap_or_default()))),
            (None, _) => ctx
                .user
                .clone()
                .map(|u| (u, ctx.password.clone().unwrap_or_default())),
        };
        let token = var("NATS_TOKEN").map(Secret::new).or(ctx.token.clone());
        let mut access = NatsAccess {
            user,
            token,
            nkey_file: self.nkey.clone().or(ctx.nkey.clone()),
            creds_file: self.creds.clone().or(ctx.creds.clone()),
            ..NatsAccess::default()
        };
        access.tls.ca_file = self.tls_ca.clone().or(ctx.ca.clone());
        access.tls.cert_file = self.tls_cert.clone().or(ctx.cert.clone());
        access.tls.key_file = self.tls_key.clone().or(ctx.key.clone());
        access.tls.first = self.tls_first || ctx.tls_first;
        Ok((access, ctx.url))
    }

    /// [`resolve`](Self::resolve) with the process's environment.
    pub fn from_env(&self) -> Result<(NatsAccess, Option<String>), String> {
        self.resolve(&|k| std::env::var(k).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn a_secret_on_the_command_line_is_warned_of_without_being_named() {
        let w = |argv: &[&str]| secrets_on_argv(argv);
        assert!(w(&[
            "taskq",
            "put",
            "--addr",
            "nats://alice:s3cret@127.0.0.1:4222"
        ])
        .is_some());
        assert!(w(&["taskq", "stats", "--addr=nats://tok3n@127.0.0.1:4222"]).is_some());
        assert!(w(&["taskq", "web", "--token", "s3cret"]).is_some());
        assert!(w(&["taskq", "web", "--token=s3cret"]).is_some());
        // An address that does not parse but carries user info still counts.
        assert!(w(&["taskq-worker", "--addr", "nats://a:b@[bad"]).is_some());
        let text = w(&["x", "--addr", "nats://alice:s3cret@h:1"]).unwrap();
        assert!(
            !text.contains("s3cret") && !text.contains("alice"),
            "{text}"
        );
        // Nothing secret: no warning.
        assert!(w(&[
            "taskq",
            "put",
            "--addr",
            "nats://127.0.0.1:4222",
            "--tube",
            "a"
        ])
        .is_none());
        assert!(w(&["taskq", "put", "--addr", "127.0.0.1:11300"]).is_none());
    }

    #[test]
    fn flags_win_over_the_environment_which_wins_over_the_context() {
        let dir = std::env::temp_dir().join(format!("taskq-ctx-{}", std::process::id()));
        let ctxdir = dir.join("nats").join("context");
        std::fs::create_dir_all(&ctxdir).unwrap();
        std::fs::write(
            ctxdir.join("prod.json"),
            r#"{"description":"","url":"nats://n1:4222","user":"ctxuser","password":"ctxpass","token":"",
               "creds":"/c/ctx.creds","nkey":"","cert":"/c/cert.pem","key":"/c/key.pem","ca":"/c/ca.pem","tls_first":true}"#,
        )
        .unwrap();
        let xdg = dir.to_str().unwrap();
        let args = NatsArgs {
            context: Some("prod".into()),
            tls_ca: Some("/flag/ca.pem".into()),
            ..NatsArgs::default()
        };
        // The context alone gives what no flag or variable gives.
        let (a, url) = args.resolve(&env_of(&[("XDG_CONFIG_HOME", xdg)])).unwrap();
        assert_eq!(url.as_deref(), Some("nats://n1:4222"));
        assert_eq!(a.user, Some(("ctxuser".into(), Secret::new("ctxpass"))));
        assert_eq!(a.creds_file, Some(PathBuf::from("/c/ctx.creds")));
        assert_eq!(
            a.tls.ca_file,
            Some(PathBuf::from("/flag/ca.pem")),
            "the flag wins"
        );
        assert_eq!(a.tls.cert_file, Some(PathBuf::from("/c/cert.pem")));
        assert!(a.tls.first);
        assert_eq!(a.nkey_file, None, "an empty string is absent");
        // The environment wins over the context.
        let (a, _) = args
            .resolve(&env_of(&[
                ("XDG_CONFIG_HOME", xdg),
                ("NATS_USER", "envuser"),
                ("NATS_PASSWORD", "envpass"),
                ("NATS_TOKEN", "envtok"),
            ]))
            .unwrap();
        assert_eq!(a.user, Some(("envuser".into(), Secret::new("envpass"))));
        assert_eq!(a.token, Some(Secret::new("envtok")));
        // Under $HOME when XDG_CONFIG_HOME is not set.
        let home = dir.join("home");
        std::fs::create_dir_all(home.join(".config/nats/context")).unwrap();
        std::fs::write(
            home.join(".config/nats/context/dev.json"),
            r#"{"url":"nats://dev:1","token":"t0k"}"#,
        )
        .unwrap();
        let dev = NatsArgs {
            context: Some("dev".into()),
            ..NatsArgs::default()
        };
        let (a, url) = dev
            .resolve(&env_of(&[("HOME", home.to_str().unwrap())]))
            .unwrap();
        assert_eq!(
            (url.as_deref(), a.token.clone()),
            (Some("nats://dev:1"), Some(Secret::new("t0k")))
        );
        // Missing or hostile names are errors naming the file, never its secrets.
        let e = NatsArgs {
            context: Some("nope".into()),
            ..NatsArgs::default()
        }
        .resolve(&env_of(&[("XDG_CONFIG_HOME", xdg)]))
        .unwrap_err();
        assert!(e.contains("nope.json"), "{e}");
        let e = NatsArgs {
            context: Some("../x".into()),
            ..NatsArgs::default()
        }
        .resolve(&env_of(&[("XDG_CONFIG_HOME", xdg)]))
        .unwrap_err();
        assert!(e.contains("bad NATS context name"), "{e}");
        assert!(!format!("{a:?}").contains("t0k"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
