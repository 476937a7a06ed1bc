//! `taskq` and `taskq-worker` against nats-servers that require credentials:
//! a user and password (in the address, and from `NATS_USER` +
//! `NATS_PASSWORD`), a token (in the address, and from `NATS_TOKEN`), and an
//! nkey seed file (`--nkey`, `NATS_NKEY`). For each: jobs put and worked
//! through, a wrong secret refused fast with `taskq put` exit 1 naming the
//! authorization failure, a publish the account may not make rejected (exit
//! 4, not 3), a worker with a wrong secret backing off instead of spinning,
//! and no secret in any output.

mod cli_common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use cli_common::{bin_dir, ids, Reaped};
use taskq_testkit::NatsCluster;

const PASSWORD: &str = "s3cret-pw%/@x";
const TOKEN: &str = "T0ken-5ecret-zz";

/// `bin ARGS` with only the given `NATS_*` variables, bounded by 30 s.
fn run(bin: &Path, args: &[&str], env: &[(&str, &str)], stdin: &[u8]) -> (Output, Duration) {
    use std::io::Write;
    let started = Instant::now();
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .env_remove("TASKQ_ADDR")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, _) in std::env::vars() {
        if k.starts_with("NATS_") {
            cmd.env_remove(k);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    let data = stdin.to_vec();
    let feeder = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let limit = Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            panic!("{} {args:?} ran past {limit:?}", bin.display());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    let _ = feeder.join();
    (out, started.elapsed())
}

fn taskq_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_taskq"))
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Asserts that no secret shows in `out` (a command's whole output).
fn no_secret(out: &str, secrets: &[&str]) {
    for s in secrets {
        assert!(
            !out.contains(s),
            "a secret ({} bytes) shows in: {out}",
            s.len()
        );
    }
}

/// A single node with JetStream and `auth` as its configuration.
fn server(auth: &str) -> NatsCluster {
    NatsCluster::builder()
        .config(auth)
        .start()
        .expect("nats-server with auth")
}

/// Puts 3 jobs on `tube` and works them off with `taskq-worker`; checks
/// both outputs and returns them for the secret check.
fn put_and_work(addr: &str, tube: &str, env: &[(&str, &str)], extra: &[&str]) -> String {
    let mut args = vec!["put", "--tube", tube, "--addr", addr];
    args.extend_from_slice(extra);
    let (put, _) = run(&taskq_bin(), &args, env, b"a\nb\nc\n");
    assert_eq!(put.status.code(), Some(0), "put: {}", text(&put));
    assert_eq!(ids(&String::from_utf8_lossy(&put.stdout)).len(), 3);
    let worker = bin_dir().join("taskq-worker");
    let mut wargs = vec![
        "--addr",
        addr,
        "--tube",
        tube,
        "--exit-when-idle",
        "1",
        "--json",
    ];
    wargs.extend_from_slice(extra);
    wargs.extend(["--", "sh", "-c", "cat >/dev/null"]);
    let (w, _) = run(&worker, &wargs, env, b"");
    assert_eq!(w.status.code(), Some(0), "worker: {}", text(&w));
    let stderr = String::from_utf8_lossy(&w.stderr);
    assert!(stderr.contains("\"deleted\":3"), "worker: {stderr}");
    // A secret in an address on the command line, where `ps` shows it, is
    // warned of by both commands (unnamed: see the callers' `no_secret`);
    // one from the environment is not.
    let on_argv = addr.contains('@');
    for (name, out) in [("taskq", &put), ("taskq-worker", &w)] {
        let warned = text(out).contains(&format!(
            "{name}: warning: a password or token given on the command line"
        ));
        assert_eq!(warned, on_argv, "{name} {addr}: {}", text(out));
    }
    text(&put) + &text(&w)
}

/// `taskq put` refused at connect: exit 1 ("nothing sent"), fast, naming
/// the authorization failure.
fn refused(addr: &str, env: &[(&str, &str)], extra: &[&str]) -> String {
    let mut args = vec!["put", "--tube", "t", "--addr", addr];
    args.extend_from_slice(extra);
    let (out, took) = run(&taskq_bin(), &args, env, b"x\n");
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {all}");
    assert!(all.contains("Authorization Violation"), "{all}");
    assert!(all.contains("refused the connection"), "{all}");
    assert!(!all.contains("outcome unknown"), "{all}");
    assert!(took < Duration::from_secs(5), "refused in {took:?}");
    all
}

#[test]
fn user_and_password_in_the_address_and_from_the_environment() {
    let c = server(&format!(
        "authorization {{ users = [ {{ user: alice, password: \"{PASSWORD}\" }} ] }}"
    ));
    let host = c.addr(0).to_string();
    // In the address, percent-encoded as a URL needs.
    let enc = PASSWORD
        .replace('%', "%25")
        .replace('/', "%2F")
        .replace('@', "%40");
    let addr = format!("nats://alice:{enc}@{host}");
    let mut seen = put_and_work(&addr, "emails", &[], &[]);
    // From the environment, with an address that carries none.
    let plain = format!("nats://{host}");
    let env = [("NATS_USER", "alice"), ("NATS_PASSWORD", PASSWORD)];
    seen += &put_and_work(&plain, "emails", &env, &[]);
    // The address's user info wins over the environment.
    let env_wrong = [("NATS_USER", "alice"), ("NATS_PASSWORD", "wrong")];
    seen += &put_and_work(&addr, "emails", &env_wrong, &[]);
    // Wrong password, no credentials, wrong user: refused, exit 1.
    let all = refused(&format!("nats://alice:nope@{host}"), &[], &[]);
    // The command takes the user info out of the address before anything
    // holds it: messages show the address without it, and name the user.
    assert!(all.contains(&format!(" nats://{host}: ")), "{all}");
    assert!(all.contains("authenticating with user alice"), "{all}");
    seen += &all;
    seen += &refused(&plain, &[], &[]);
    seen += &refused(
        &plain,
        &[("NATS_USER", "bob"), ("NATS_PASSWORD", PASSWORD)],
        &[],
    );
    no_secret(&seen, &[PASSWORD, &enc]);
}

#[test]
fn a_token_in_the_address_and_from_the_environment() {
    let c = server(&format!("authorization {{ token: \"{TOKEN}\" }}"));
    let host = c.addr(0).to_string();
    let mut seen = put_and_work(&format!("nats://{TOKEN}@{host}"), "jobs", &[], &[]);
    seen += &put_and_work(
        &format!("nats://{host}"),
        "jobs",
        &[("NATS_TOKEN", TOKEN)],
        &[],
    );
    let all = refused(&format!("nats://{TOKEN}x@{host}"), &[], &[]);
    assert!(all.contains(&format!(" nats://{host}: ")), "{all}");
    assert!(all.contains("authenticating with token"), "{all}");
    seen += &all;
    seen += &refused(
        &format!("nats://{host}"),
        &[("NATS_TOKEN", "T0ken-wrong")],
        &[],
    );
    no_secret(&seen, &[TOKEN, "T0ken-wrong"]);
}

#[test]
fn an_nkey_seed_file_signs_the_servers_nonce() {
    let user = nkeys::KeyPair::new_user();
    let seed = user.seed().unwrap();
    let dir = tempdir("nkey");
    let file = dir.join("user.nk");
    std::fs::write(&file, format!("{seed}\n")).unwrap();
    let c = server(&format!(
        "authorization {{ users = [ {{ nkey: {} }} ] }}",
        user.public_key()
    ));
    let addr = format!("nats://{}", c.addr(0));
    let path = file.to_str().unwrap();
    let mut seen = put_and_work(&addr, "signed", &[], &["--nkey", path]);
    seen += &put_and_work(&addr, "signed", &[("NATS_NKEY", path)], &[]);
    // Another user's seed: a valid signature of a key the server does not know.
    let other = dir.join("other.nk");
    let other_seed = nkeys::KeyPair::new_user().seed().unwrap();
    std::fs::write(&other, &other_seed).unwrap();
    seen += &refused(&addr, &[], &["--nkey", other.to_str().unwrap()]);
    // A file that is no seed: refused before connecting, naming the file.
    let junk = dir.join("junk.nk");
    std::fs::write(&junk, "SUnot-a-seed\n").unwrap();
    let (out, _) = run(
        &taskq_bin(),
        &[
            "put",
            "--addr",
            &addr,
            "--nkey",
            junk.to_str().unwrap(),
            "x",
        ],
        &[],
        b"",
    );
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(
        all.contains("junk.nk") && all.contains("not valid"),
        "{all}"
    );
    no_secret(&(seen + &all), &[&seed, &other_seed, "SUnot-a-seed"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_publish_the_account_may_not_make_is_rejected_not_unknown() {
    let c = server(&format!(
        "authorization {{ users = [ {{ user: alice, password: \"{PASSWORD}\",
           permissions: {{ publish: {{ deny: [\"taskq.secret\"] }} }} }} ] }}"
    ));
    let addr = format!("nats://{}", c.addr(0));
    let env = [("NATS_USER", "alice"), ("NATS_PASSWORD", PASSWORD)];
    let (out, _) = run(
        &taskq_bin(),
        &["put", "--addr", &addr, "--tube", "secret", "x"],
        &env,
        b"",
    );
    let all = text(&out);
    assert_eq!(out.status.code(), Some(4), "rejected, not unknown: {all}");
    assert!(all.contains("Permissions Violation"), "{all}");
    assert!(all.contains("rejected 1"), "{all}");
    // The same user may publish elsewhere.
    let seen = put_and_work(&addr, "open", &env, &[]);
    no_secret(&(all + &seen), &[PASSWORD]);
}

#[test]
fn a_worker_refused_logs_an_error_and_backs_off() {
    let c = server(&format!(
        "authorization {{ users = [ {{ user: alice, password: \"{PASSWORD}\" }} ] }}"
    ));
    let worker = bin_dir().join("taskq-worker");
    let addr = format!("nats://alice:wrong-pw@{}", c.addr(0));
    let mut child = Reaped(
        Command::new(&worker)
            .args(["--addr", &addr, "--tube", "t", "--", "true"])
            .env_remove("TASKQ_ADDR")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_secs(4));
    let _ = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status();
    // The worker stops on SIGTERM within 10 s.
    let out = child.output_within(Duration::from_secs(10));
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(all.contains("Authorization Violation"), "{all}");
    assert!(!all.contains("\u{1b}["), "no colour codes in a pipe: {all}");
    no_secret(&all, &[PASSWORD]);
    // The server's log counts the attempts: with backoff (50 ms doubling to
    // 2 s) 4 seconds hold about 7, never a tight loop.
    let log = c.log(0);
    let attempts = log.matches("authentication error").count();
    assert!(
        (1..=15).contains(&attempts),
        "{attempts} refused connects in 4 s"
    );
}

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("taskq-auth-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// What else a user or an operator sees: a library's refusal (its `Display`
/// and `Debug`), the producer and the worker's settings printed with `{:?}`,
/// and the worker's metrics scraped while it runs with the password in its
/// address.
#[test]
fn library_errors_settings_and_the_workers_metrics_show_no_secret() {
    use std::io::{Read, Write};

    let c = server(&format!(
        "authorization {{ users = [ {{ user: alice, password: \"{PASSWORD}\" }} ] }}"
    ));
    let host = c.addr(0).to_string();
    let enc = PASSWORD
        .replace('%', "%25")
        .replace('/', "%2F")
        .replace('@', "%40");
    let mut seen = String::new();

    // A refused connect, and a good one, through the library.
    let wrong = format!("nats://alice:{enc}x@{host}");
    let e = taskq_producer::Producer::builder()
        .resolve_for(Duration::from_millis(500))
        .connect(wrong.as_str())
        .unwrap_err();
    assert!(e.not_sent(), "{e}");
    seen += &format!("{e}\n{e:?}\n");
    let good = format!("nats://alice:{enc}@{host}");
    let p = taskq_producer::Producer::builder()
        .connect(good.as_str())
        .unwrap();
    seen += &format!("{p:?}\n{:?}\n", taskq_connect::Address::parse(&good));
    drop(p);
    let cfg = taskq_worker::Config {
        servers: vec![good.clone()],
        ..taskq_worker::Config::default()
    };
    seen += &format!("{cfg:?}\n");

    // The worker's metrics, scraped mid-run.
    let port = taskq_testkit::beanstalkd::free_port().unwrap();
    let maddr = format!("127.0.0.1:{port}");
    let mut w = Reaped(
        Command::new(bin_dir().join("taskq-worker"))
            .args(["--addr", &good, "--tube", "m", "--metrics-addr", &maddr])
            .args(["--", "sh", "-c", "cat >/dev/null"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let until = Instant::now() + Duration::from_secs(10);
    let metrics = loop {
        if let Ok(mut s) = std::net::TcpStream::connect(&maddr) {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            write!(
                s,
                "GET /metrics HTTP/1.1\r\nHost: {maddr}\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            if out.contains("taskq") {
                break out;
            }
        }
        assert!(Instant::now() < until, "no metrics at {maddr}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = w.0.kill();
    let out = w.output_within(Duration::from_secs(10));
    seen += &metrics;
    seen += &text(&out);
    assert!(seen.contains("Authorization Violation"), "{seen}");
    no_secret(&seen, &[PASSWORD, &enc]);
}

/// Addresses that do not parse, each carrying a password: a `%` that is no
/// escape, a bad port, and a `,` inside the password (which must not be
/// split into a host and a token). Every command refuses them, and none
/// shows the password, or half of it, in what it prints. No server: the
/// address is refused before anything connects.
#[test]
fn an_address_that_does_not_parse_never_shows_its_password() {
    let cases = [
        (
            "nats://alice:100%sure-pw@127.0.0.1:4222",
            vec!["100%sure-pw", "sure-pw"],
        ),
        (
            "nats://alice:9f8e7d-pw@127.0.0.1:notaport",
            vec!["9f8e7d-pw"],
        ),
        (
            "nats://alice:left-half,right-half@127.0.0.1:4222",
            vec!["left-half", "right-half"],
        ),
    ];
    let worker = bin_dir().join("taskq-worker");
    for (addr, secrets) in &cases {
        let runs: [(&Path, Vec<&str>); 5] = [
            (&taskq_bin(), vec!["stats", "--addr", addr]),
            (
                &taskq_bin(),
                vec!["put", "--tube", "t", "--addr", addr, "x"],
            ),
            (&taskq_bin(), vec!["tubes", "--addr", addr]),
            (
                &taskq_bin(),
                vec!["exporter", "--addr", addr, "--listen", "127.0.0.1:0"],
            ),
            (&worker, vec!["--addr", addr, "--tube", "t", "--", "true"]),
        ];
        for (bin, args) in &runs {
            let (out, _) = run(bin, args, &[], b"");
            let all = text(&out);
            assert_ne!(out.status.code(), Some(0), "{args:?} accepted it: {all}");
            no_secret(&all, secrets);
        }
    }
}
