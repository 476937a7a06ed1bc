//! `taskq` and `taskq-worker` against real nats-server nodes that require
//! TLS or JWT user credentials (operator mode), with certificates made by
//! `openssl` and JWTs minted here with nkeys:
//!
//! - each way in puts jobs and works them off, counted on both sides;
//! - each wrong secret (an untrusted CA, a certificate for another name, no
//!   client certificate, no `--tls-first`, a user of an unknown account, a
//!   corrupted or a foreign seed) is refused at once: `taskq put` exits 1
//!   naming the failure, never 3 ("outcome unknown");
//! - the same settings come from the environment (`NATS_CA`, `NATS_CERT`,
//!   `NATS_KEY`, `NATS_CREDS`) and from a `nats` CLI context file;
//! - no seed, JWT or private key appears in anything printed.
//!
//! Every scenario runs on the oldest server supported (the one on `PATH`,
//! Debian's 2.9.10) and on the pinned current release; `handshake_first`
//! is asserted per version (2.10.4 and later have it).

mod cli_common;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use cli_common::{bin_dir, bounded, command};
use nkeys::KeyPair;
use serde_json::{json, Value};
use taskq_testkit::{
    binary_version, current_server_binary, server_binary, NatsCluster, ServerVersion, TempDir,
    TestCerts,
};

/// Limit on connecting and on each reply (`--io-timeout`), in milliseconds.
const IO_MS: &str = "3000";
/// A refusal comes at once, long before any deadline: this is generous.
const FAST: Duration = Duration::from_secs(5);
/// Bound on one command.
const LIMIT: Duration = Duration::from_secs(30);

/// Variables that would change what a command reads: unset in every child.
const CLEARED: &[&str] = &[
    "TASKQ_ADDR",
    "NATS_URL",
    "NATS_USER",
    "NATS_PASSWORD",
    "NATS_TOKEN",
    "NATS_CREDS",
    "NATS_NKEY",
    "NATS_CONTEXT",
    "NATS_CA",
    "NATS_CERT",
    "NATS_KEY",
    "XDG_CONFIG_HOME",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "RUST_LOG",
];

/// The servers each scenario runs on: the oldest supported and the pinned current.
fn servers() -> Vec<(&'static str, PathBuf)> {
    vec![
        ("oldest", server_binary()),
        (
            "current",
            current_server_binary().expect("the pinned current nats-server"),
        ),
    ]
}

fn start(binary: &Path, config: &str) -> NatsCluster {
    NatsCluster::builder()
        .binary(binary)
        .config(config)
        .start()
        .unwrap_or_else(|e| panic!("{} does not start: {e}", binary.display()))
}

/// How a command reaches the server: its flags and its environment.
#[derive(Debug, Clone, Default)]
struct Via {
    args: Vec<String>,
    env: Vec<(String, OsString)>,
}

impl Via {
    fn flags(args: &[&str]) -> Via {
        Via {
            args: args.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
        }
    }

    fn env(mut self, key: &str, value: impl Into<OsString>) -> Via {
        self.env.push((key.to_owned(), value.into()));
        self
    }
}

/// What one command did.
struct Ran {
    code: Option<i32>,
    out: String,
    err: String,
    took: Duration,
}

/// Runs the commands of one scenario and keeps everything they printed.
struct Session {
    dir: TempDir,
    worker_bin: PathBuf,
    /// (what ran, what it printed), for the search for secrets.
    printed: Vec<(String, String)>,
    runs: usize,
}

impl Session {
    fn new(tag: &str) -> Session {
        Session {
            dir: TempDir::new(tag),
            worker_bin: bin_dir().join("taskq-worker"),
            printed: Vec::new(),
            runs: 0,
        }
    }

    /// Runs `cmd` with `env` and nothing else of the test's NATS settings.
    fn run(&mut self, mut cmd: Command, env: &[(String, OsString)], stdin: &[u8]) -> Ran {
        for k in CLEARED {
            cmd.env_remove(k);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let what = format!("{cmd:?}");
        let (o, took) = bounded(cmd, stdin, LIMIT);
        let ran = Ran {
            code: o.status.code(),
            out: String::from_utf8_lossy(&o.stdout).into_owned(),
            err: String::from_utf8_lossy(&o.stderr).into_owned(),
            took,
        };
        self.printed
            .push((what, format!("{}\n{}", ran.out, ran.err)));
        ran
    }

    /// `taskq ARGS` through `via`.
    fn taskq(&mut self, via: &Via, args: &[&str], stdin: &[u8]) -> Ran {
        let mut cmd = command(args);
        cmd.args(&via.args).args(["--io-timeout", IO_MS]);
        self.run(cmd, &via.env, stdin)
    }

    /// `taskq-worker` on `tube` through `via` until idle for 1 s, logging
    /// at debug level; its counters.
    fn work(&mut self, via: &Via, tube: &str) -> Value {
        self.work_with(via, tube, "cat >/dev/null")
    }

    /// [`work`](Self::work) with `sh -c SCRIPT` for each job.
    fn work_with(&mut self, via: &Via, tube: &str, script: &str) -> Value {
        self.runs += 1;
        let stats = self.dir.path().join(format!("worker-{}.json", self.runs));
        let mut cmd = Command::new(&self.worker_bin);
        cmd.args(&via.args)
            .args([
                "--tube",
                tube,
                "--exit-when-idle",
                "1",
                "--io-timeout",
                IO_MS,
            ])
            .arg("--stats-json")
            .arg(&stats)
            .args(["--", "sh", "-c", script]);
        let mut env = via.env.clone();
        env.push(("RUST_LOG".into(), "debug".into()));
        let r = self.run(cmd, &env, b"");
        assert_eq!(r.code, Some(0), "taskq-worker {via:?}: {}", r.err);
        let text = std::fs::read_to_string(&stats).unwrap();
        self.printed.push(("worker stats".into(), text.clone()));
        serde_json::from_str(&text).unwrap()
    }

    /// Jobs ready on `tube`, as `taskq stats --tube TUBE --json` reports them.
    fn ready(&mut self, via: &Via, tube: &str) -> u64 {
        let r = self.taskq(via, &["stats", "--tube", tube, "--json"], b"");
        assert_eq!(r.code, Some(0), "stats {via:?}: {}", r.err);
        let v: Value = serde_json::from_str(&r.out).unwrap();
        v["current-jobs-ready"].as_u64().unwrap()
    }

    /// Puts `n` jobs on `tube` through `via`, sees them ready, works them
    /// off with `taskq-worker` through `via`, and sees none left.
    fn put_and_work(&mut self, via: &Via, tube: &str, n: u64) {
        let lines: String = (0..n).map(|i| format!("job {i}\n")).collect();
        let r = self.taskq(via, &["put", "--tube", tube], lines.as_bytes());
        assert_eq!(r.code, Some(0), "put {via:?}: {}", r.err);
        assert_eq!(r.out.lines().count() as u64, n, "ids printed");
        assert_eq!(self.ready(via, tube), n);
        let counts = self.work(via, tube);
        assert_eq!(counts["deleted"], n, "{counts}");
        assert_eq!(self.ready(via, tube), 0);
    }

    /// One job of `len` bytes put and worked through `via`: it arrives whole.
    fn large_job(&mut self, via: &Via, tube: &str, len: usize) {
        let mut line: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
        line.push(b'\n');
        let r = self.taskq(
            via,
            &["put", "--tube", tube, "--max-job-size", "1048576"],
            &line,
        );
        assert_eq!(r.code, Some(0), "put of {len} bytes {via:?}: {}", r.err);
        let check = format!("[ \"$(wc -c)\" -eq {len} ]");
        let counts = self.work_with(via, tube, &check);
        assert_eq!(
            (counts["deleted"].as_u64(), counts["buried"].as_u64()),
            (Some(1), Some(0)),
            "{counts}"
        );
    }

    /// `taskq put` through `via` fails at once: exit 1 before anything is
    /// sent, one message naming the failure (each of `want`), no id, no
    /// "outcome unknown". Returns the message.
    fn refused(&mut self, via: &Via, want: &[&str]) -> String {
        self.refused_within(via, want, FAST)
    }

    fn refused_within(&mut self, via: &Via, want: &[&str], within: Duration) -> String {
        let r = self.taskq(via, &["put", "--tube", "refused", "x"], b"");
        assert_eq!(r.code, Some(1), "{via:?}: {}", r.err);
        assert!(r.out.is_empty(), "{via:?}: {}", r.out);
        assert!(r.err.starts_with("taskq: "), "{via:?}: {}", r.err);
        assert_eq!(r.err.trim_end().lines().count(), 1, "{}", r.err);
        for w in want {
            assert!(r.err.contains(w), "{via:?}: want {w:?} in {}", r.err);
        }
        for never in ["outcome unknown", "may be queued"] {
            assert!(!r.err.contains(never), "{via:?}: {}", r.err);
        }
        assert!(r.took < within, "{via:?}: took {:?}", r.took);
        r.err
    }

    /// None of `secrets` (name, text) appears in anything printed so far.
    fn assert_nothing_shows(&self, secrets: &[(&str, String)]) {
        assert!(!self.printed.is_empty());
        for (what, text) in &self.printed {
            for (name, secret) in secrets {
                assert!(secret.len() >= 16, "{name} is too short to search for");
                assert!(
                    !text.contains(secret.as_str()),
                    "{name} shows in what {what} printed:\n{text}"
                );
            }
        }
    }
}

/// Each line of a PEM file's base64 body: what a leak of the file would show.
fn pem_body(path: &Path) -> Vec<(&'static str, String)> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("-----") && l.len() >= 16)
        .map(|l| ("the client key", l.to_owned()))
        .collect()
}

fn tls_block(cert: &Path, key: &Path, extra: &str) -> String {
    format!(
        "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n{extra}}}\n",
        cert.display(),
        key.display()
    )
}

fn port(c: &NatsCluster) -> u16 {
    c.addr(0).port()
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn server_tls_by_tls_scheme_and_by_the_nats_upgrade_and_each_failure_named() {
    let mut s = Session::new("tls");
    let certs = TestCerts::generate(&s.dir.path().join("pki")).unwrap();
    let ca = path_str(&certs.ca).to_owned();
    let other_ca = path_str(&certs.other_ca).to_owned();
    for (which, bin) in servers() {
        let srv = start(&bin, &tls_block(&certs.server_cert, &certs.server_key, ""));
        println!("{which}: nats-server {}", srv.version().unwrap());
        let p = port(&srv);
        let tls = format!("tls://127.0.0.1:{p}");
        let nats = format!("nats://127.0.0.1:{p}");

        s.put_and_work(&Via::flags(&["--addr", &tls, "--tls-ca", &ca]), "a", 20);
        // Larger than rustls's 64 KiB of buffered records, and many records.
        s.large_job(
            &Via::flags(&["--addr", &tls, "--tls-ca", &ca]),
            "big",
            300_000,
        );
        // A nats:// address with no TLS option: the server's INFO says
        // tls_required, so the client upgrades, trusting the system's roots
        // (here the test CA, through SSL_CERT_FILE).
        s.put_and_work(
            &Via::flags(&["--addr", &nats]).env("SSL_CERT_FILE", &certs.ca),
            "b",
            7,
        );
        s.put_and_work(&Via::flags(&["--addr", &nats, "--tls-ca", &ca]), "c", 3);

        // The upgrade happened: without the CA the system's roots refuse it.
        s.refused(
            &Via::flags(&["--addr", &nats]),
            &["TLS: the server's certificate is not signed by a trusted CA"],
        );
        // A CA that signed nothing of the server's.
        let e = s.refused(
            &Via::flags(&["--addr", &tls, "--tls-ca", &other_ca]),
            &[
                "TLS: the server's certificate is not signed by a trusted CA",
                "UnknownIssuer",
            ],
        );
        println!("{which}: wrong CA: {e}");
        // A CA file that holds no certificate: named, nothing sent.
        s.refused(
            &Via::flags(&["--addr", &tls, "--tls-ca", path_str(&certs.client_key)]),
            &["CA certificates file", "client.key", "no certificate in it"],
        );
        drop(srv);

        // A certificate from the trusted CA, for another name only.
        let other = start(
            &bin,
            &tls_block(&certs.other_name_cert, &certs.other_name_key, ""),
        );
        let e = s.refused(
            &Via::flags(&[
                "--addr",
                &format!("tls://127.0.0.1:{}", port(&other)),
                "--tls-ca",
                &ca,
            ]),
            &["TLS: the server's certificate does not name the host connected to"],
        );
        println!("{which}: name mismatch: {e}");
        drop(other);

        // tls:// to a server without TLS.
        let plain = NatsCluster::builder().binary(&bin).start().unwrap();
        s.refused(
            &Via::flags(&[
                "--addr",
                &format!("tls://127.0.0.1:{}", port(&plain)),
                "--tls-ca",
                &ca,
            ]),
            &["TLS was asked for, but the server does not offer it"],
        );
    }
    s.assert_nothing_shows(&pem_body(&certs.client_key));
}

#[test]
fn mutual_tls_works_with_the_client_certificate_and_is_refused_without() {
    let mut s = Session::new("mtls");
    let certs = TestCerts::generate(&s.dir.path().join("pki")).unwrap();
    let (ca, cert, key) = (
        path_str(&certs.ca).to_owned(),
        path_str(&certs.client_cert).to_owned(),
        path_str(&certs.client_key).to_owned(),
    );
    let verify = format!("  ca_file: \"{ca}\"\n  verify: true\n");
    for (which, bin) in servers() {
        let srv = start(
            &bin,
            &tls_block(&certs.server_cert, &certs.server_key, &verify),
        );
        println!("{which}: nats-server {}", srv.version().unwrap());
        let tls = format!("tls://127.0.0.1:{}", port(&srv));
        let nats = format!("nats://127.0.0.1:{}", port(&srv));
        let mutual = [
            "--tls-ca",
            ca.as_str(),
            "--tls-cert",
            cert.as_str(),
            "--tls-key",
            key.as_str(),
        ];
        s.put_and_work(
            &Via::flags(&[&["--addr", &tls][..], &mutual[..]].concat()),
            "m",
            16,
        );
        s.put_and_work(
            &Via::flags(&[&["--addr", &nats][..], &mutual[..]].concat()),
            "n",
            4,
        );

        let e = s.refused(
            &Via::flags(&["--addr", &tls, "--tls-ca", &ca]),
            &["TLS: the server wants a client certificate it accepts (give --tls-cert and --tls-key)"],
        );
        println!("{which}: no client certificate: {e}");
        s.refused(
            &Via::flags(&["--addr", &tls, "--tls-ca", &ca, "--tls-cert", &cert]),
            &["a client certificate needs both --tls-cert and --tls-key"],
        );
        // A key file that holds no key: the message names the file, never
        // what is in it.
        s.refused(
            &Via::flags(&[
                "--addr",
                &tls,
                "--tls-ca",
                &ca,
                "--tls-cert",
                &cert,
                "--tls-key",
                &cert,
            ]),
            &["client key file", "client.pem", "no PEM private key in it"],
        );
    }
    s.assert_nothing_shows(&pem_body(&certs.client_key));
}

#[test]
fn tls_first_on_servers_with_handshake_first() {
    let mut s = Session::new("tlsfirst");
    let certs = TestCerts::generate(&s.dir.path().join("pki")).unwrap();
    let (ca, cert, key) = (
        path_str(&certs.ca).to_owned(),
        path_str(&certs.client_cert).to_owned(),
        path_str(&certs.client_key).to_owned(),
    );
    let config = tls_block(
        &certs.server_cert,
        &certs.server_key,
        "  handshake_first: true\n",
    );
    for (which, bin) in servers() {
        let version = binary_version(&bin).unwrap();
        if version < ServerVersion::new(2, 10, 4) {
            // No handshake_first before 2.10.4: the server refuses the option.
            let e = NatsCluster::builder()
                .binary(&bin)
                .config(config.as_str())
                .start()
                .expect_err("a server without handshake_first refuses it");
            assert!(
                e.to_string()
                    .contains("unknown field [\"handshake_first\"]"),
                "{e}"
            );
            println!("{which}: nats-server {version} has no handshake_first, checked that it refuses it; --tls-first is for 2.10.4 and later");
            continue;
        }
        let srv = start(&bin, &config);
        println!("{which}: nats-server {}", srv.version().unwrap());
        let tls = format!("tls://127.0.0.1:{}", port(&srv));
        // With a client certificate and key (which this server does not ask
        // for): the key is read, and must show nowhere.
        s.put_and_work(
            &Via::flags(&[
                "--addr",
                &tls,
                "--tls-ca",
                &ca,
                "--tls-first",
                "--tls-cert",
                &cert,
                "--tls-key",
                &key,
            ]),
            "f",
            12,
        );
        // Without it the client waits for an INFO the server never sends,
        // until the server gives up on the handshake or the I/O timeout
        // passes: either way the message says to use --tls-first.
        let e = s.refused_within(
            &Via::flags(&["--addr", &tls, "--tls-ca", &ca]),
            &["waiting for INFO", "--tls-first"],
            Duration::from_secs(10),
        );
        println!("{which}: without --tls-first: {e}");
    }
    s.assert_nothing_shows(&pem_body(&certs.client_key));
}

/// base64url without padding, as JWTs are encoded.
fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// A JWT for `subject` signed by `signer` (its issuer).
fn jwt(signer: &KeyPair, subject: &str, name: &str, nats: Value) -> String {
    let iat = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = json!({
        "jti": format!("{name}-{subject}-{iat}"),
        "iat": iat,
        "iss": signer.public_key(),
        "sub": subject,
        "name": name,
        "nats": nats,
    });
    let signed = format!(
        "{}.{}",
        b64(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#),
        b64(claims.to_string().as_bytes())
    );
    let sig = signer.sign(signed.as_bytes()).unwrap();
    format!("{signed}.{}", b64(&sig))
}

/// An account's claims; with `jetstream`, unlimited JetStream.
fn account_claims(jetstream: bool) -> Value {
    let mut limits = json!({
        "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
        "wildcards": true, "conn": -1, "leaf": -1,
    });
    if jetstream {
        for k in ["mem_storage", "disk_storage", "streams", "consumer"] {
            limits[k] = json!(-1);
        }
    }
    json!({ "type": "account", "version": 2, "limits": limits })
}

fn user_claims() -> Value {
    json!({
        "type": "user", "version": 2, "pub": {}, "sub": {},
        "subs": -1, "data": -1, "payload": -1,
    })
}

/// A user credentials file as `nsc` writes it.
fn creds_text(jwt: &str, seed: &str) -> String {
    format!(
        "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
         ************************* IMPORTANT *************************\n\
         NKEY Seed printed below can be used to sign and prove identity.\n\
         NKEYs are sensitive and should be treated as secrets.\n\n\
         -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n\n\
         *************************************************************\n"
    )
}

/// An operator-mode set-up: the server's configuration (operator, system
/// account, one account with JetStream, a memory resolver), a user's
/// credentials file, wrong ones, and the secrets they hold.
struct Operator {
    config: String,
    /// The good user's `.creds`.
    creds: PathBuf,
    /// A user whose JWT an account unknown to the server signed.
    foreign_account: PathBuf,
    /// The good JWT with a seed that fails its checksum.
    corrupted_seed: PathBuf,
    /// The good JWT with another user's (valid) seed.
    wrong_seed: PathBuf,
    secrets: Vec<(&'static str, String)>,
}

impl Operator {
    fn new(dir: &Path) -> Operator {
        let op = KeyPair::new_operator();
        let sys = KeyPair::new_account();
        let acc = KeyPair::new_account();
        let stranger = KeyPair::new_account();
        let user = KeyPair::new_user();
        let other_user = KeyPair::new_user();
        let op_jwt = jwt(
            &op,
            &op.public_key(),
            "taskq-op",
            json!({"type": "operator", "version": 2, "system_account": sys.public_key()}),
        );
        let sys_jwt = jwt(&op, &sys.public_key(), "SYS", account_claims(false));
        let acc_jwt = jwt(&op, &acc.public_key(), "TASKQ", account_claims(true));
        let user_jwt = jwt(&acc, &user.public_key(), "worker", user_claims());
        let stranger_jwt = jwt(&stranger, &other_user.public_key(), "stray", user_claims());
        let seed = user.seed().unwrap();
        let other_seed = other_user.seed().unwrap();
        // One character changed: the seed's CRC no longer matches.
        let mut bad = seed.clone().into_bytes();
        bad[20] = if bad[20] == b'A' { b'B' } else { b'A' };
        let bad = String::from_utf8(bad).unwrap();
        let config = format!(
            "operator: \"{op_jwt}\"\nsystem_account: {sys}\nresolver: MEMORY\n\
             resolver_preload: {{\n  {sys}: \"{sys_jwt}\"\n  {acc}: \"{acc_jwt}\"\n}}\n",
            sys = sys.public_key(),
            acc = acc.public_key(),
        );
        let write = |name: &str, jwt: &str, seed: &str| {
            let p = dir.join(name);
            std::fs::write(&p, creds_text(jwt, seed)).unwrap();
            p
        };
        let jwt_parts = |name: &'static str, j: &str| {
            // The claims and the signature; the header is the same for every JWT.
            j.split('.')
                .skip(1)
                .map(|part| (name, part.to_owned()))
                .collect::<Vec<_>>()
        };
        let mut secrets = vec![
            ("the user's seed", seed.clone()),
            ("the other user's seed", other_seed.clone()),
            ("the corrupted seed", bad.clone()),
        ];
        secrets.extend(jwt_parts("the user's JWT", &user_jwt));
        secrets.extend(jwt_parts("the stranger's JWT", &stranger_jwt));
        // What the server's configuration holds (given as a --creds file
        // that is not one): the operator's and the accounts' JWTs.
        secrets.extend(jwt_parts("the operator's JWT", &op_jwt));
        secrets.extend(jwt_parts("the system account's JWT", &sys_jwt));
        secrets.extend(jwt_parts("the account's JWT", &acc_jwt));
        Operator {
            config,
            creds: write("user.creds", &user_jwt, &seed),
            foreign_account: write("stranger.creds", &stranger_jwt, &other_seed),
            corrupted_seed: write("corrupted.creds", &user_jwt, &bad),
            wrong_seed: write("wrong-seed.creds", &user_jwt, &other_seed),
            secrets,
        }
    }

    /// The server configuration written to a file (it holds JWTs but no
    /// `.creds` frames).
    fn config_path(&self, dir: &Path) -> String {
        let p = dir.join("server.conf");
        std::fs::write(&p, &self.config).unwrap();
        path_str(&p).to_owned()
    }
}

#[test]
fn creds_in_operator_mode_put_and_work_and_wrong_ones_are_refused() {
    let mut s = Session::new("creds");
    let o = Operator::new(s.dir.path());
    for (which, bin) in servers() {
        let srv = start(&bin, &o.config);
        println!("{which}: nats-server {}", srv.version().unwrap());
        let url = srv.url();
        s.put_and_work(
            &Via::flags(&["--addr", &url, "--creds", path_str(&o.creds)]),
            "jobs",
            25,
        );
        let e = s.refused(
            &Via::flags(&["--addr", &url, "--creds", path_str(&o.foreign_account)]),
            &[
                "the server refused the connection: Authorization Violation",
                "(authenticating with credentials file",
                "stranger.creds",
            ],
        );
        println!("{which}: user of an unknown account: {e}");
        let e = s.refused(
            &Via::flags(&["--addr", &url, "--creds", path_str(&o.corrupted_seed)]),
            &["corrupted.creds: the nkey seed is not valid"],
        );
        println!("{which}: corrupted seed: {e}");
        s.refused(
            &Via::flags(&["--addr", &url, "--creds", path_str(&o.wrong_seed)]),
            &["Authorization Violation", "wrong-seed.creds"],
        );
        s.refused(
            &Via::flags(&["--addr", &url]),
            &["Authorization Violation", "(authenticating with none)"],
        );
        // A file that is no credentials file: named, its contents not shown.
        s.refused(
            &Via::flags(&["--addr", &url, "--creds", &o.config_path(s.dir.path())]),
            &["not a NATS credentials file"],
        );
    }
    s.assert_nothing_shows(&o.secrets);
}

#[test]
fn tls_and_creds_from_the_environment_and_from_a_nats_context() {
    let mut s = Session::new("envctx");
    let certs = TestCerts::generate(&s.dir.path().join("pki")).unwrap();
    let o = Operator::new(s.dir.path());
    let verify = format!("  ca_file: \"{}\"\n  verify: true\n", certs.ca.display());
    let config = format!(
        "{}{}",
        o.config,
        tls_block(&certs.server_cert, &certs.server_key, &verify)
    );
    let xdg = s.dir.path().join("config");
    let contexts = xdg.join("nats").join("context");
    std::fs::create_dir_all(&contexts).unwrap();
    for (which, bin) in servers() {
        let srv = start(&bin, &config);
        println!("{which}: nats-server {}", srv.version().unwrap());
        let tls = format!("tls://127.0.0.1:{}", port(&srv));

        // The environment, as the nats CLI reads it.
        let env = Via::flags(&["--addr", &tls])
            .env("NATS_CA", &certs.ca)
            .env("NATS_CERT", &certs.client_cert)
            .env("NATS_KEY", &certs.client_key)
            .env("NATS_CREDS", &o.creds);
        s.put_and_work(&env, "env", 9);
        s.refused(
            &env.clone().env("NATS_CREDS", &o.foreign_account),
            &["Authorization Violation", "stranger.creds"],
        );
        // A flag wins over the environment.
        let mut flag = env.clone().env("NATS_CREDS", &o.foreign_account);
        flag.args
            .extend(["--creds".to_owned(), path_str(&o.creds).to_owned()]);
        s.put_and_work(&flag, "flag", 2);

        // A nats CLI context, its url used where no --addr is given.
        let context = |ca: &Path| {
            json!({
                "description": "taskq test", "url": tls, "token": "", "user": "", "password": "",
                "creds": o.creds, "nkey": "", "cert": certs.client_cert, "key": certs.client_key,
                "ca": ca, "nsc": "", "jetstream_domain": "", "tls_first": false,
            })
            .to_string()
        };
        std::fs::write(contexts.join("prod.json"), context(&certs.ca)).unwrap();
        std::fs::write(contexts.join("bad.json"), context(&certs.other_ca)).unwrap();
        let ctx = Via::flags(&["--context", "prod"]).env("XDG_CONFIG_HOME", &xdg);
        s.put_and_work(&ctx, "ctx", 11);
        // Selected by NATS_CONTEXT as well.
        let by_env = Via::default()
            .env("XDG_CONFIG_HOME", &xdg)
            .env("NATS_CONTEXT", "prod");
        s.put_and_work(&by_env, "ctxenv", 3);
        s.refused(
            &Via::flags(&["--context", "bad"]).env("XDG_CONFIG_HOME", &xdg),
            &["not signed by a trusted CA"],
        );
        s.refused(
            &Via::flags(&["--context", "missing"]).env("XDG_CONFIG_HOME", &xdg),
            &["missing.json"],
        );
    }
    let mut secrets = o.secrets.clone();
    secrets.extend(pem_body(&certs.client_key));
    s.assert_nothing_shows(&secrets);
}
