//! `taskq web` in a real headless Chromium (Debian's chromium and
//! chromedriver, driven by tests/web/driver.py), on a beanstalkd and a
//! JetStream cluster at once: the overview shows each tube's counts and
//! follows new puts without a reload; Kick on a tube page moves a buried job
//! back to ready (checked in the server's own record); a body of HTML and
//! script shows as text and runs nothing; without the token, cross-site,
//! under a foreign Host and read-only, every change is refused and nothing
//! moves; the token's cookie reaches no other server on 127.0.0.1; 20 open
//! windows cost the server no more than 1.2 times one. The
//! screenshot in docs/dashboard.png is taken here.

mod cli_common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use cli_common::{count_on, ok, Reaped, ReapedGroup};
use serde_json::{json, Value};
use taskq_connect::nats::{NatsConfig, NatsConnection};
use taskq_proto::{Command as Cmd, Connection, ConnectionConfig, Reply};
use taskq_testkit::{beanstalkd::free_port, Beanstalkd, NatsCluster};
use taskq_worker::{Config, Job, Outcome, Worker};

/// A job body that would run script if it were ever taken for markup.
const SCRIPT_BODY: &str = "<script>window.__pwned=1;document.title='pwned'</script><img src=x onerror=\"window.__pwned=2\"><b>bold?</b>";

/// Bound on the browser's answer to one command, and on a startup line.
const ANSWER_LIMIT: Duration = Duration::from_secs(60);

/// The lines `r` gives, read on a thread of their own, so that each wait
/// for one can be bounded.
fn lines_of(r: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// `taskq web` on a free port; its address and token.
struct Web {
    _child: Reaped,
    base: String,
    port: u16,
    token: String,
}

impl Web {
    /// On 127.0.0.1, at a free port.
    fn start(args: &[&str]) -> Web {
        let listen = format!("127.0.0.1:{}", free_port().unwrap());
        Web::launch(Some(&listen), args)
    }

    /// At the address it picks itself when given none.
    fn launch(listen: Option<&str>, args: &[&str]) -> Web {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_taskq"));
        cmd.args(["web", "--io-timeout", "5000"]);
        if let Some(listen) = listen {
            cmd.args(["--listen", listen]);
        }
        let mut child = Reaped(
            cmd.args(args)
                .env_remove("TASKQ_ADDR")
                .env_remove("TASKQ_WEB_TOKEN")
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let line = lines_of(child.0.stdout.take().unwrap())
            .recv_timeout(ANSWER_LIMIT)
            .expect("taskq web prints its startup line in time");
        let at = line
            .strip_prefix("taskq web: http://")
            .and_then(|rest| rest.split_once('/'))
            .map(|(at, _)| at.to_owned())
            .unwrap_or_else(|| panic!("startup line {line:?}"));
        if let Some(listen) = listen {
            assert_eq!(at, listen, "startup line {line:?}");
        }
        let port = at.rsplit_once(':').unwrap().1.parse().unwrap();
        let token = match line.split_once("?token=") {
            Some((_, t)) => t.split_whitespace().next().unwrap().to_owned(),
            None => args
                .windows(2)
                .find(|w| w[0] == "--token")
                .map(|w| w[1].to_owned())
                .unwrap_or_else(|| panic!("no token in {line:?}")),
        };
        Web {
            _child: child,
            base: format!("http://{at}"),
            port,
            token,
        }
    }
}

/// A headless Chromium with a fresh profile, one command at a time. The
/// driver runs in a process group of its own, with chromedriver and
/// Chromium: however the test ends, the whole group is killed.
struct Browser {
    child: ReapedGroup,
    input: ChildStdin,
    output: Receiver<String>,
}

impl Browser {
    fn start() -> Browser {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/web/driver.py");
        let mut child = ReapedGroup(
            Command::new("python3")
                .process_group(0)
                .arg(script)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let input = child.0.stdin.take().unwrap();
        let output = lines_of(child.0.stdout.take().unwrap());
        let mut b = Browser {
            child,
            input,
            output,
        };
        assert_eq!(b.read(), Ok(json!("ready")), "chromium did not start");
        b
    }

    fn read(&mut self) -> Result<Value, String> {
        let line = self
            .output
            .recv_timeout(ANSWER_LIMIT)
            .unwrap_or_else(|e| panic!("no answer from the browser within {ANSWER_LIMIT:?}: {e}"));
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
        match v.get("ok") {
            Some(ok) => Ok(ok.clone()),
            None => Err(v["error"].to_string()),
        }
    }

    fn try_do(&mut self, c: Value) -> Result<Value, String> {
        writeln!(self.input, "{c}").unwrap();
        self.input.flush().unwrap();
        self.read()
    }

    fn go(&mut self, c: Value) -> Value {
        let what = c.to_string();
        self.try_do(c).unwrap_or_else(|e| panic!("{what}: {e}"))
    }

    fn get(&mut self, url: &str) -> String {
        self.go(json!({"op": "get", "url": url}))
            .as_str()
            .unwrap()
            .to_owned()
    }

    fn text(&mut self, css: &str) -> Option<String> {
        self.go(json!({"op": "text", "css": css}))
            .as_str()
            .map(str::to_owned)
    }

    fn exec(&mut self, js: &str) -> Value {
        self.go(json!({"op": "exec", "js": js}))
    }

    /// A POST from the page in the browser: the answer's status and text.
    fn post(&mut self, path: &str, form: &str) -> (u64, String) {
        let v = self.go(json!({"op": "exec_async", "js": format!(
            "const done = arguments[arguments.length - 1];
             fetch({path:?}, {{method: 'POST', credentials: 'same-origin',
               headers: {{'Content-Type': 'application/x-www-form-urlencoded'}}, body: {form:?}}})
               .then(r => r.text().then(t => done([r.status, t])))
               .catch(e => done([0, String(e)]));"
        )}));
        (v[0].as_u64().unwrap(), v[1].as_str().unwrap().to_owned())
    }

    /// Waits up to `limit` for `f` to hold.
    fn wait(&mut self, limit: Duration, what: &str, mut f: impl FnMut(&mut Browser) -> bool) {
        let until = Instant::now() + limit;
        while !f(self) {
            if Instant::now() > until {
                let page = self.go(json!({"op": "source"}));
                panic!(
                    "waited {limit:?} for {what}; page:\n{}",
                    page.as_str().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = writeln!(self.input, "{}", json!({"op": "quit"}));
        let _ = self.input.flush();
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if let Ok(Some(_)) = self.child.0.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // Then `child`'s drop kills what is left of its group (chromedriver
        // and Chromium too, should the driver have gone without them).
    }
}

/// The two servers the dashboard shows: a beanstalkd (server 0) and a
/// one-node JetStream cluster (server 1).
struct Servers {
    bs: Beanstalkd,
    nats: NatsCluster,
}

impl Servers {
    fn start() -> Servers {
        Servers {
            bs: Beanstalkd::start().unwrap(),
            nats: NatsCluster::start(1).unwrap(),
        }
    }

    fn addr(&self, i: usize) -> String {
        match i {
            0 => self.bs.addr().to_string(),
            _ => self.nats.url(),
        }
    }

    /// `taskq put`: the ids.
    fn put(&self, i: usize, tube: &str, bodies: &[&str]) -> Vec<u64> {
        let addr = self.addr(i);
        let mut args = vec!["put", "--addr", &addr, "--tube", tube];
        args.extend(bodies);
        cli_common::ids(&ok(&args, b""))
    }

    /// Puts one job into `tube` and buries it, as a worker would.
    fn bury_one(&self, i: usize, tube: &str) {
        self.put(i, tube, &["to bury"]);
        let counts = Worker::new(
            Config {
                servers: vec![self.addr(i)],
                tubes: vec![tube.into()],
                io_timeout: Duration::from_secs(5),
                exit_when_idle: Some(Duration::from_millis(500)),
                max_attempts: 1,
                ..Config::default()
            },
            |_: &mut Job<'_>| Outcome::Bury,
        )
        .unwrap()
        .run();
        assert_eq!(counts.buried, 1);
    }

    /// The server's own record of `tube`: (ready, buried).
    fn record(&self, i: usize, tube: &str) -> (u64, u64) {
        if i == 0 {
            return cli_common::with_tube_stats(self.bs.addr(), tube, |s| {
                (s.current_jobs_ready, s.current_jobs_buried)
            });
        }
        let mut a = NatsConnection::connect(
            &[self.nats.addr(0).to_string()],
            NatsConfig {
                io_timeout: Duration::from_secs(5),
                ..NatsConfig::default()
            },
        )
        .unwrap();
        let buried = count_on(&mut a, &format!("taskq.{tube}.buried"));
        let ready = match a.consumer_info("TASKQ", &format!("taskq-{tube}")) {
            Ok(c) => c.num_pending,
            Err(_) => count_on(&mut a, &format!("taskq.{tube}")),
        };
        (ready, buried)
    }
}

/// The CSS of a cell of tube `tube`'s row in server `i`'s table.
fn cell(i: usize, tube: &str, class: &str) -> String {
    format!(
        "section.server:nth-of-type({}) tr[data-tube=\"{tube}\"] td.{class}",
        i + 1
    )
}

#[test]
fn the_dashboard_in_a_real_browser_on_both_engines() {
    let s = Servers::start();
    let mut script_ids = Vec::new();
    for i in [0, 1] {
        s.bury_one(i, "mail");
        s.put(i, "mail", &["hello"]);
        script_ids.push(s.put(i, "mail", &[SCRIPT_BODY])[0]);
        assert_eq!(s.record(i, "mail"), (2, 1));
    }
    let (a0, a1) = (s.addr(0), s.addr(1));
    let web = Web::start(&["--addr", &a0, "--addr", &a1]);
    let mut b = Browser::start();

    // The token in the address is traded for a cookie and dropped from it.
    let at = b.get(&format!("{}/?token={}", web.base, web.token));
    assert_eq!(at, format!("{}/", web.base));
    for i in [0, 1] {
        b.wait(Duration::from_secs(10), "the counts", |b| {
            b.text(&cell(i, "mail", "ready")).as_deref() == Some("2")
                && b.text(&cell(i, "mail", "buried")).as_deref() == Some("1")
        });
        let first = b.text(&format!(
            "section.server:nth-of-type({}) tr[data-tube=\"mail\"] td",
            i + 1
        ));
        assert_eq!(
            first.as_deref(),
            Some("mail"),
            "the first cell is the tube's name"
        );
    }
    // New puts show up without a reload.
    b.exec("window.__kept = 1;");
    for i in [0, 1] {
        s.put(i, "mail", &["more 1", "more 2", "more 3"]);
    }
    for i in [0, 1] {
        b.wait(Duration::from_secs(5), "the new ready count", |b| {
            b.text(&cell(i, "mail", "ready")).as_deref() == Some("5")
        });
        assert_eq!(s.record(i, "mail").0, 5);
    }
    assert_eq!(
        b.exec("return window.__kept;"),
        json!(1),
        "the page was not reloaded"
    );
    // A few seconds of work on another tube, for the charts in the screenshot.
    for round in 1..=5 {
        for i in [0, 1] {
            let bodies: Vec<String> = (0..round * 3).map(|n| format!("report {n}")).collect();
            let bodies: Vec<&str> = bodies.iter().map(String::as_str).collect();
            s.put(i, "reports", &bodies);
        }
        std::thread::sleep(Duration::from_millis(800));
    }
    b.wait(Duration::from_secs(5), "the reports tube", |b| {
        b.text(&cell(1, "reports", "ready")).as_deref() == Some("45")
    });
    let shot = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/dashboard.png");
    assert_eq!(b.go(json!({"op": "screenshot", "path": shot})), json!(true));

    for i in [0, 1] {
        // A body of HTML and script is shown as text and runs nothing.
        let id = script_ids[i];
        b.get(&format!("{}/tubes/mail?server={i}&job={id}", web.base));
        let shown = b.text("section.lookup pre.body");
        assert_eq!(shown.as_deref(), Some(SCRIPT_BODY));
        assert_eq!(b.exec("return window.__pwned === undefined;"), json!(true));
        assert_eq!(b.go(json!({"op": "title"})), json!("tube mail · taskq"));
        assert_eq!(
            b.exec("return document.querySelectorAll('main b, main img').length;"),
            json!(0)
        );

        // Kick moves the buried job back to ready, and says so.
        b.get(&format!("{}/tubes/mail?server={i}", web.base));
        b.go(json!({"op": "click_button", "text": "Kick"}));
        b.wait(Duration::from_secs(10), "the answer", |b| {
            b.text("p.notice").is_some()
        });
        assert_eq!(
            b.text("p.notice").as_deref(),
            Some("Kicked 1 job of tube mail back to ready")
        );
        assert_eq!(s.record(i, "mail"), (6, 0), "server {i}'s own record");
    }
}

/// The server-wide command count of beanstalkd: every `cmd-*` counter.
fn commands(addr: std::net::SocketAddr) -> u64 {
    let mut c = Connection::connect(addr, ConnectionConfig::default()).unwrap();
    match c.request(&Cmd::Stats).unwrap() {
        Reply::Ok { yaml } => taskq_proto::yaml::pairs(yaml)
            .unwrap()
            .map(|p| p.unwrap())
            .filter(|(k, _)| k.starts_with("cmd-"))
            .map(|(_, v)| v.parse::<u64>().unwrap())
            .sum(),
        r => panic!("stats: {r:?}"),
    }
}

#[test]
fn every_change_is_refused_without_the_token_cross_site_under_a_foreign_host_and_read_only() {
    let s = Servers::start();
    for i in [0, 1] {
        s.bury_one(i, "mail");
        s.put(i, "mail", &["hello"]);
    }
    let before = [s.record(0, "mail"), s.record(1, "mail")];
    let (a0, a1) = (s.addr(0), s.addr(1));
    let web = Web::start(&["--addr", &a0, "--addr", &a1]);
    let kick = |i: usize| format!("server={i}&count=5");

    // Without the token: 401 and no queue data, for pages and changes alike.
    let mut stranger = Browser::start();
    stranger.get(&format!("{}/", web.base));
    let body = stranger.text("body").unwrap();
    assert!(body.starts_with("401"), "{body}");
    let source = stranger.go(json!({"op": "source"})).to_string();
    assert!(
        !source.contains("mail") && !source.contains("ready"),
        "{source}"
    );
    for i in [0, 1] {
        let (status, _) = stranger.post("/tubes/mail/kick", &kick(i));
        assert_eq!(status, 401);
    }
    drop(stranger);

    // Cross-site: a page on another origin posts a form to the dashboard,
    // once as a stranger would (its cookie is SameSite=Strict: 401) and once
    // even knowing the token (Sec-Fetch-Site: cross-site: 403).
    let mut b = Browser::start();
    b.get(&format!("{}/?token={}", web.base, web.token));
    // Even with the token: a wildcard for a tube on JetStream (which would
    // read or move every tube's buried jobs) is refused, nothing moved.
    for name in ["%2A", "%3E", "a.b"] {
        let (status, text) = b.post(&format!("/tubes/{name}/kick"), &kick(1));
        assert_eq!(status, 400, "{name}: {text}");
        let (status, text) = b.post(&format!("/tubes/{name}/pause"), "server=1&secs=60");
        assert_eq!(status, 400, "{name}: {text}");
    }
    let dir = std::env::temp_dir().join(format!("taskq-web-site-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("empty.html"), "<p>another site</p>").unwrap();
    for (name, token) in [
        ("plain", String::new()),
        ("knowing", format!("?token={}", web.token)),
    ] {
        for i in [0, 1] {
            std::fs::write(
                dir.join(format!("{name}-{i}.html")),
                format!(
                    "<form id=f method=post action=\"{}/tubes/mail/kick{token}\">\
                     <input name=server value={i}><input name=count value=5></form>\
                     <script>document.getElementById('f').submit()</script>",
                    web.base
                ),
            )
            .unwrap();
        }
    }
    let site_port = free_port().unwrap();
    let _site = Reaped(
        Command::new("python3")
            .args([
                "-m",
                "http.server",
                "--bind",
                "127.0.0.1",
                &site_port.to_string(),
            ])
            .current_dir(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(500));
    for (name, want) in [("plain", "401"), ("knowing", "403")] {
        for i in [0, 1] {
            // Another site: a name of its own (Chromium takes *.localhost to this machine).
            let page = format!("http://attacker.localhost:{site_port}/{name}-{i}.html");
            b.wait(Duration::from_secs(10), "the other site", |b| {
                b.try_do(json!({"op": "get", "url": page})).is_ok()
            });
            b.wait(Duration::from_secs(10), "the dashboard's answer", |b| {
                b.text("body").is_some_and(|t| t.starts_with(want))
            });
        }
    }

    // Another site's page sending the browser to the dashboard with a token
    // in the address, a guess or the right one: refused before the token is
    // looked at, so no answer (nor the time it takes) tells a right guess.
    for token in [web.token.as_str(), "0123456789abcdef0123456789abcdef"] {
        b.get(&format!("http://attacker.localhost:{site_port}/empty.html"));
        b.exec(&format!(
            "location.href = {:?};",
            format!("{}/?token={token}", web.base)
        ));
        b.wait(Duration::from_secs(10), "the dashboard's answer", |b| {
            b.text("body")
                .is_some_and(|t| t.starts_with("403: a token in the address"))
        });
    }

    // A foreign Host (another name for this machine, as a rebound DNS name is).
    let foreign = format!("http://rebound.localhost:{}", web.port);
    b.get(&format!("{foreign}/?token={}", web.token));
    let body = b.text("body").unwrap();
    assert!(
        body.starts_with("403: this dashboard answers only"),
        "{body}"
    );
    for i in [0, 1] {
        let (status, _) = b.post("/tubes/mail/kick", &kick(i));
        assert_eq!(status, 403);
    }

    // Read-only: no action shown, and every change refused by the server.
    let ro = Web::start(&[
        "--addr",
        &a0,
        "--addr",
        &a1,
        "--read-only",
        "--token",
        "ro-secret",
    ]);
    b.get(&format!("{}/?token=ro-secret", ro.base));
    for i in [0, 1] {
        b.get(&format!("{}/tubes/mail?server={i}", ro.base));
        let buttons = b.go(json!({"op": "texts", "css": "button"}));
        assert_eq!(buttons, json!(["Look up"]), "no action on a read-only page");
        assert!(b.text("pre.body").is_some(), "the jobs are shown");
        for (path, form) in [
            ("/tubes/mail/kick", kick(i)),
            ("/tubes/mail/kick-job", format!("server={i}&id=1")),
            ("/tubes/mail/delete", format!("server={i}&id=1")),
            ("/tubes/mail/pause", format!("server={i}&secs=60")),
            ("/tubes/mail/resume", format!("server={i}")),
        ] {
            let (status, text) = b.post(path, &form);
            assert_eq!(status, 403, "{path}: {text}");
            assert!(text.contains("read-only"), "{text}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        [s.record(0, "mail"), s.record(1, "mail")],
        before,
        "nothing moved"
    );
    let paused = cli_common::with_tube_stats(s.bs.addr(), "mail", |t| t.pause_time_left);
    assert_eq!(paused, 0);
}

/// Another server on 127.0.0.1, as the operator's other tools run there:
/// its port, and the head of every request it gets.
fn another_local_server() -> (u16, Receiver<String>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let _ = conn.set_read_timeout(Some(ANSWER_LIMIT));
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match conn.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let _ = conn.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\
                  Connection: close\r\n\r\nother",
            );
            if tx
                .send(String::from_utf8_lossy(&head).into_owned())
                .is_err()
            {
                return;
            }
        }
    });
    (port, rx)
}

#[test]
fn the_token_cookie_reaches_no_other_local_server() {
    let bs = Beanstalkd::start().unwrap();
    let addr = bs.addr().to_string();
    let (other, heads) = another_local_server();
    let mut b = Browser::start();
    // What the browser sends the other server once `web` has let it in.
    let mut sent_to_the_other = |web: &Web| -> Vec<String> {
        b.get(&format!("{}/?token={}", web.base, web.token));
        let body = b.text("body").unwrap();
        assert!(!body.starts_with("40"), "the cookie lets it in: {body}");
        b.get(&format!("http://127.0.0.1:{other}/"));
        assert_eq!(b.text("body").as_deref(), Some("other"));
        let mut got = vec![heads
            .recv_timeout(ANSWER_LIMIT)
            .expect("the other server was asked")];
        got.extend(heads.try_iter());
        got
    };

    // Unless told otherwise, the dashboard listens on a loopback address of
    // its own, and its cookie goes there only. (The one test that talks to
    // a loopback address other than 127.0.0.1: that address is the point.)
    let own = Web::launch(None, &["--addr", &addr]);
    let host = own
        .base
        .strip_prefix("http://")
        .unwrap()
        .rsplit_once(':')
        .unwrap()
        .0;
    let ip: std::net::Ipv4Addr = host.parse().unwrap();
    assert!(
        ip.is_loopback() && ip != std::net::Ipv4Addr::LOCALHOST,
        "{host}"
    );
    for head in sent_to_the_other(&own) {
        assert!(
            !head.contains("taskq_web_token") && !head.contains(&own.token),
            "the token went to another server: {head}"
        );
    }

    // On 127.0.0.1, as `--listen 127.0.0.1:PORT` asks, the browser sends the
    // other server the token: the leak the default address keeps out.
    let shared = Web::start(&["--addr", &addr]);
    let heads = sent_to_the_other(&shared);
    assert!(
        heads
            .iter()
            .any(|h| h.contains(&format!("taskq_web_token={}", shared.token))),
        "{heads:?}"
    );
}

#[test]
fn twenty_open_windows_cost_the_server_what_one_does() {
    let bs = Beanstalkd::start().unwrap();
    let addr = bs.addr().to_string();
    for t in ["a", "b", "c"] {
        ok(&["put", "--addr", &addr, "--tube", t, "job"], b"");
    }
    let web = Web::start(&["--addr", &addr]);
    let mut b = Browser::start();
    b.get(&format!("{}/?token={}", web.base, web.token));
    let rate = |b: &mut Browser, windows: usize| -> f64 {
        // Every window visible and refreshing before counting.
        let handles = b.go(json!({"op": "windows"}));
        let handles: Vec<String> = serde_json::from_value(handles).unwrap();
        assert_eq!(handles.len(), windows);
        for h in &handles {
            b.go(json!({"op": "switch", "handle": h}));
            assert_eq!(b.exec("return document.visibilityState;"), json!("visible"));
            let since =
                b.exec("return Number(document.getElementById('live').dataset.updated || 0);");
            b.wait(Duration::from_secs(5), "a refresh", |b| {
                b.exec("return Number(document.getElementById('live').dataset.updated || 0);")
                    != since
            });
        }
        let (c0, t0) = (commands(bs.addr()), Instant::now());
        std::thread::sleep(Duration::from_secs(8));
        let (c1, t1) = (commands(bs.addr()), Instant::now());
        // Less the one `stats` of this count.
        (c1 - c0 - 1) as f64 / (t1 - t0).as_secs_f64()
    };
    let one = rate(&mut b, 1);
    for _ in 1..20 {
        b.go(json!({"op": "new_window"}));
        b.get(&format!("{}/", web.base));
    }
    let twenty = rate(&mut b, 20);
    eprintln!("server commands per second: one window {one:.1}, twenty {twenty:.1}");
    assert!(one > 0.0, "one window reads the server");
    assert!(
        twenty <= one * 1.2,
        "twenty windows: {twenty:.1} commands/s against one's {one:.1}"
    );
}

#[test]
fn a_hidden_tab_stops_polling_and_then_costs_the_server_nothing() {
    let bs = Beanstalkd::start().unwrap();
    let addr = bs.addr().to_string();
    ok(&["put", "--addr", &addr, "--tube", "a", "job"], b"");
    let web = Web::start(&["--addr", &addr]);
    let mut b = Browser::start();
    b.get(&format!("{}/?token={}", web.base, web.token));
    // Visibility changes as the page sees them, on its own clock, recorded
    // ahead of the page's own listener (capture on window).
    b.exec(
        "window.seen = []; window.addEventListener('visibilitychange', \
         () => window.seen.push([document.visibilityState, performance.now()]), true);",
    );
    let page = b.go(json!({"op": "windows"}))[0]
        .as_str()
        .unwrap()
        .to_owned();
    std::thread::sleep(Duration::from_secs(3));
    b.go(json!({"op": "new_tab"}));
    // The hub samples for a while after the last request, then stops: the
    // last seconds of the hidden spell must cost the server nothing.
    std::thread::sleep(Duration::from_secs(7));
    let c0 = commands(bs.addr());
    std::thread::sleep(Duration::from_secs(3));
    let c1 = commands(bs.addr());
    b.go(json!({"op": "switch", "handle": page}));
    std::thread::sleep(Duration::from_millis(1500));
    let seen: Vec<(String, f64)> = serde_json::from_value(b.exec("return window.seen;")).unwrap();
    let states: Vec<&str> = seen.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(states, ["hidden", "visible"], "{seen:?}");
    let (hidden, shown) = (seen[0].1, seen[1].1);
    let fetches: Vec<f64> = serde_json::from_value(b.exec(
        "return performance.getEntriesByType('resource') \
         .filter(e => e.name.endsWith('/overview')).map(e => e.startTime);",
    ))
    .unwrap();
    let before = fetches.iter().filter(|&&t| t < hidden).count();
    let during: Vec<&f64> = fetches
        .iter()
        .filter(|&&t| t > hidden && t < shown)
        .collect();
    let after = fetches.iter().filter(|&&t| t >= shown).count();
    eprintln!("overview fetches: {before} visible, {during:?} hidden, {after} shown again");
    assert!(before >= 2, "polled while visible: {fetches:?}");
    assert!(
        during.is_empty(),
        "polled while hidden: {during:?} in {hidden}..{shown}"
    );
    assert!(after >= 1, "polling came back with the tab: {fetches:?}");
    // Less the one `stats` of the first count.
    assert_eq!(
        c1 - c0 - 1,
        0,
        "server commands in the hidden tab's last 3 s"
    );
}
