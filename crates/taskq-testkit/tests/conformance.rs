//! Differential conformance: the same command scripts, and generated command
//! sequences, against a real beanstalkd and the reference server give the same
//! replies (statistics compared wherever they are deterministic).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use taskq_proto::Command;
use taskq_testkit::{Beanstalkd, ServerConfig, TestServer};

/// A raw client that reads replies without knowing the command, so that
/// malformed input can be sent as is.
struct Raw {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Raw {
    fn connect(addr: SocketAddr) -> Raw {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        s.set_nodelay(true).unwrap();
        Raw { s, buf: Vec::new() }
    }

    /// One whole reply, or a note of what happened instead, within `limit`.
    fn reply(&mut self, limit: Duration) -> String {
        let until = Instant::now() + limit;
        loop {
            if let Some((reply, used)) = frame(&self.buf) {
                self.buf.drain(..used);
                return reply;
            }
            if Instant::now() > until {
                return format!(
                    "<no reply; buffered {:?}>",
                    String::from_utf8_lossy(&self.buf)
                );
            }
            let mut chunk = [0u8; 4096];
            match self.s.read(&mut chunk) {
                Ok(0) => return "<closed>".into(),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => return format!("<error {:?}>", e.kind()),
            }
        }
    }
}

/// Frames one reply: its line, and for RESERVED, FOUND and OK its body.
fn frame(buf: &[u8]) -> Option<(String, usize)> {
    let nl = buf.windows(2).position(|w| w == b"\r\n")?;
    let line = String::from_utf8_lossy(&buf[..nl]).into_owned();
    let words: Vec<&str> = line.split(' ').collect();
    let len = match words[0] {
        "RESERVED" | "FOUND" if words.len() == 3 => words[2].parse::<usize>().ok(),
        "OK" if words.len() == 2 => words[1].parse::<usize>().ok(),
        _ => None,
    };
    match len {
        None => Some((line, nl + 2)),
        Some(len) => {
            let end = nl + 2 + len + 2;
            if buf.len() < end {
                return None;
            }
            let body = String::from_utf8_lossy(&buf[nl + 2..nl + 2 + len]);
            if words[0] == "OK" {
                Some((format!("OK\n{}", normalize_yaml(&body)), end))
            } else {
                Some((format!("{line}\n{body}"), end))
            }
        }
    }
}

/// Drops the statistics that differ between servers or from run to run.
fn normalize_yaml(yaml: &str) -> String {
    const VARIABLE: &[&str] = &[
        "pid",
        "version",
        "rusage-utime",
        "rusage-stime",
        "uptime",
        "id",
        "hostname",
        "os",
        "platform",
        "age",
        // The beanstalkd harness opens connections to see that it listens.
        "total-connections",
    ];
    // `id` of stats-job is deterministic; `id` of the server's stats (the
    // document with a `pid`) is random hex, which can happen to be all digits.
    let server_stats = yaml.lines().any(|l| l.starts_with("pid:"));
    yaml.lines()
        .filter(|l| {
            let key = l.split(':').next().unwrap_or("");
            !(VARIABLE.contains(&key) && (key != "id" || server_stats))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// One step: on connection `conn`, send `bytes`, then read `replies` replies.
type Step<'a> = (usize, &'a [u8], usize);

/// Runs a script against a server; returns every reply, tagged with its step.
fn run(addr: SocketAddr, script: &[Step<'_>]) -> Vec<String> {
    let mut conns: Vec<Option<Raw>> = Vec::new();
    let mut out = Vec::new();
    for (i, &(c, bytes, n)) in script.iter().enumerate() {
        while conns.len() <= c {
            conns.push(None);
        }
        if bytes == b"<settle>" {
            // Requests that draw no reply yet (a blocking reserve) are carried
            // out by beanstalkd in arrival order, by the reference server on
            // another thread: give that thread a moment before going on.
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        if bytes == b"<close>" {
            conns[c] = None;
            // Give the server a moment to notice; both servers put jobs back at once.
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        let raw = conns[c].get_or_insert_with(|| Raw::connect(addr));
        if !bytes.is_empty() {
            raw.s.write_all(bytes).unwrap();
        }
        for _ in 0..n {
            let reply = raw.reply(Duration::from_secs(3));
            let stuck = reply.starts_with("<no reply");
            out.push(format!("{i}/{c}: {reply}"));
            if stuck {
                // Everything after a missing reply is out of step: stop here.
                return out;
            }
        }
    }
    out
}

/// Starts the reference server and does what the beanstalkd harness does at
/// start (one `stats` to check the pid), so that the counters start level.
fn reference(cfg: ServerConfig) -> TestServer {
    let server = TestServer::start_with(cfg).unwrap();
    let mut raw = Raw::connect(server.addr());
    raw.s.write_all(b"stats\r\n").unwrap();
    assert!(raw.reply(Duration::from_secs(2)).starts_with("OK"));
    // The probe leaves by `quit`, and is gone once the server closes it:
    // the server forgets a connection before it closes the socket, so the
    // script's first `stats-tube` cannot count the probe as still using
    // `default` (seen once as `current-using: 3` against beanstalkd's 2).
    raw.s.write_all(b"quit\r\n").unwrap();
    let until = std::time::Instant::now() + Duration::from_secs(2);
    let mut rest = [0u8; 64];
    loop {
        match raw.s.read(&mut rest) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => break,
        }
        assert!(
            std::time::Instant::now() < until,
            "the probe was not closed"
        );
    }
    server
}

/// Runs a script against beanstalkd (with `args`) and the reference server (with `cfg`).
fn both(args: &[&str], cfg: ServerConfig, script: &[Step<'_>]) {
    let real = Beanstalkd::start_with(args).unwrap();
    let reference = reference(cfg);
    let want = run(real.addr(), script);
    let got = run(reference.addr(), script);
    // A script must draw a reply from beanstalkd at every step it reads one.
    assert!(!want.iter().any(|w| w.contains("<no reply")), "{want:#?}");
    for (w, g) in want.iter().zip(&got) {
        if g != w {
            let diff: Vec<String> = w
                .lines()
                .zip(g.lines())
                .filter(|(a, b)| a != b)
                .map(|(a, b)| format!("beanstalkd {a:?} / reference {b:?}"))
                .collect();
            let heads = |v: &[String]| {
                v.iter()
                    .map(|r| r.lines().next().unwrap_or("").to_string())
                    .collect::<Vec<_>>()
            };
            panic!("reference server differs from beanstalkd at {w:?}:\n{diff:#?}\nreference: {g:?}\nbeanstalkd replies: {:?}\nreference replies: {:?}", heads(&want), heads(&got));
        }
    }
    assert_eq!(got.len(), want.len());
}

fn check(script: &[Step<'_>]) {
    both(&[], ServerConfig::default(), script);
}

#[test]
fn put_reserve_delete_peek_stats_job() {
    check(&[
        (0, b"put 5 0 10 5\r\nhello\r\n", 1),
        (0, b"put 1 0 10 3\r\na\nb\r\n", 1),
        (0, b"put 1 0 0 0\r\n\r\n", 1),
        (0, b"peek 1\r\npeek 2\r\npeek 99\r\n", 3),
        (0, b"stats-job 3\r\n", 1),
        (0, b"peek-ready\r\n", 1),
        (0, b"reserve-with-timeout 0\r\n", 1),
        (0, b"stats-job 2\r\n", 1),
        (0, b"reserve\r\n", 1),
        (0, b"reserve-with-timeout 0\r\n", 1),
        (0, b"reserve-with-timeout 0\r\n", 1),
        (0, b"delete 2\r\ndelete 2\r\ndelete 3\r\n", 3),
        (1, b"delete 1\r\n", 1),
        (0, b"stats-job 1\r\ndelete 1\r\nstats-job 1\r\n", 3),
        (0, b"stats-tube default\r\n", 1),
        (0, b"stats\r\n", 1),
    ]);
}

#[test]
fn tubes_use_watch_ignore_and_lists() {
    check(&[
        (
            0,
            b"list-tubes\r\nlist-tube-used\r\nlist-tubes-watched\r\n",
            3,
        ),
        (0, b"use alpha\r\nput 0 0 10 1\r\na\r\n", 2),
        (0, b"watch beta\r\nwatch beta\r\nwatch alpha\r\n", 3),
        (0, b"list-tubes\r\nlist-tubes-watched\r\n", 2),
        (
            0,
            b"ignore gamma\r\nignore default\r\nignore beta\r\nignore alpha\r\n",
            4,
        ),
        (0, b"list-tubes-watched\r\nlist-tubes\r\n", 2),
        (
            1,
            b"stats-tube beta\r\nstats-tube alpha\r\nstats-tube nope\r\n",
            3,
        ),
        (
            1,
            b"watch alpha\r\nignore default\r\nreserve-with-timeout 0\r\n",
            3,
        ),
        (0, b"<close>", 0),
        (1, b"list-tubes\r\n", 1),
        (1, b"delete 1\r\nlist-tubes\r\nstats\r\n", 3),
    ]);
}

#[test]
fn priority_then_id_across_watched_tubes() {
    check(&[
        (
            0,
            b"use a\r\nput 10 0 10 2\r\na1\r\nput 5 0 10 2\r\na2\r\n",
            3,
        ),
        (
            0,
            b"use b\r\nput 5 0 10 2\r\nb1\r\nput 0 0 10 2\r\nb2\r\n",
            3,
        ),
        (0, b"use default\r\nput 5 0 10 2\r\nd1\r\n", 2),
        (1, b"watch a\r\nwatch b\r\n", 2),
        (
            1,
            b"reserve-with-timeout 0\r\nreserve-with-timeout 0\r\n",
            2,
        ),
        (
            1,
            b"reserve-with-timeout 0\r\nreserve-with-timeout 0\r\n",
            2,
        ),
        (
            1,
            b"reserve-with-timeout 0\r\nreserve-with-timeout 0\r\n",
            2,
        ),
        (1, b"stats\r\n", 1),
    ]);
}

#[test]
fn release_bury_kick_touch_and_ownership() {
    check(&[
        (
            0,
            b"put 1 0 10 1\r\na\r\nput 2 0 10 1\r\nb\r\nput 3 5 10 1\r\nc\r\n",
            3,
        ),
        (0, b"peek-delayed\r\nstats-job 3\r\n", 2),
        (0, b"reserve\r\nreserve\r\n", 2),
        (
            1,
            b"release 1 0 0\r\nbury 1 0\r\ntouch 1\r\ndelete 1\r\n",
            4,
        ),
        (
            0,
            b"touch 1\r\nbury 1 7\r\nbury 1 7\r\nrelease 2 9 0\r\n",
            4,
        ),
        (
            0,
            b"peek-buried\r\nstats-job 1\r\nstats-tube default\r\n",
            3,
        ),
        (0, b"kick 10\r\nkick 10\r\nkick 10\r\n", 3),
        (0, b"stats-job 1\r\nstats-job 3\r\n", 2),
        (0, b"reserve\r\nbury 1 0\r\nreserve\r\nbury 2 1\r\n", 4),
        (0, b"put 0 100 10 1\r\nd\r\n", 1),
        (
            0,
            b"kick-job 4\r\nkick-job 2\r\nkick-job 2\r\nkick-job 99\r\n",
            4,
        ),
        (0, b"kick 1\r\nkick 0\r\npeek-buried\r\n", 3),
        (
            0,
            b"reserve-job 3\r\nreserve-job 3\r\nreserve-job 1\r\nreserve-job 50\r\n",
            4,
        ),
        (1, b"reserve-job 3\r\nrelease 3 0 0\r\n", 2),
        (
            0,
            b"release 3 0 100\r\npeek-delayed\r\nstats-tube default\r\n",
            3,
        ),
        (0, b"stats\r\n", 1),
    ]);
}

#[test]
fn reserved_jobs_go_back_when_their_connection_closes() {
    check(&[
        (0, b"put 0 0 100 1\r\nx\r\nput 0 0 100 1\r\ny\r\n", 2),
        (1, b"reserve\r\nreserve\r\n", 2),
        (0, b"reserve-with-timeout 0\r\nstats-tube default\r\n", 2),
        (1, b"<close>", 0),
        (
            0,
            b"stats-job 1\r\nreserve-with-timeout 0\r\nreserve-with-timeout 0\r\n",
            3,
        ),
        (0, b"stats\r\n", 1),
    ]);
}

#[test]
fn blocking_reserve_gets_a_later_put() {
    check(&[
        (1, b"watch w\r\n", 1),
        (1, b"reserve\r\n", 0),
        (1, b"<settle>", 0),
        (0, b"use w\r\nstats-tube w\r\n", 2),
        (0, b"put 0 0 10 1\r\nz\r\n", 1),
        (1, b"", 1),
        (1, b"reserve-with-timeout 1\r\n", 1),
    ]);
}

#[test]
fn malformed_commands_get_beanstalkd_answers() {
    let long_line = [b'x'; 300];
    let mut too_long_use = b"use ".to_vec();
    too_long_use.extend([b'a'; 210]);
    too_long_use.extend(b"\r\n");
    let mut max_tube = b"use ".to_vec();
    max_tube.extend([b'a'; 200]);
    max_tube.extend(b"\r\n");
    let mut long_then_cmd = long_line.to_vec();
    long_then_cmd.extend(b"\r\nlist-tube-used\r\n");
    #[rustfmt::skip]
    check(&[
        (0, b"\r\n", 1),
        (0, b"frob\r\nPUT 1 2 3 4\r\nput1 0 0 1\r\n", 3),
        (0, b"reserve \r\nreserve x\r\nreserve-with-timeout\r\n", 3),
        // strtol: trailing bytes ignored, no digits is 0, 2^32 wraps to 0.
        (0, b"reserve-with-timeout 0x\r\nreserve-with-timeout \r\n", 2),
        (0, b"reserve-with-timeout 4294967296\r\nreserve-with-timeout 99999999999999999999\r\n", 2),
        // A negative timeout waits forever, like reserve.
        (2, b"reserve-with-timeout -1\r\n", 0),
        (2, b"<settle>", 0),
        (0, b"delete\r\ndelete \r\ndelete x\r\ndelete 1 2\r\ndelete 18446744073709551616\r\n", 5),
        (0, b"delete 18446744073709551615\r\ndelete  7\r\ndelete 007\r\n", 3),
        (0, b"bury 1 4294967296\r\nrelease 1 2\r\nkick\r\nkick x\r\nkick 4294967296\r\n", 5),
        (0, b"kick -1\r\nkick 1x\r\nkick \r\nkick 99999999999999999999\r\nkick +1 2\r\n", 5),
        (0, b"release 1 0 -1\r\nrelease 1 0 1x\r\nbury 1 -1\r\nput 0 -1 10 1\r\n", 4),
        (0, b"use \r\nuse  a\r\nuse -a\r\nuse a b\r\nuse a*b\r\nwatch \r\nignore -\r\n", 7),
        (0, &too_long_use, 1),
        (0, &max_tube, 1),
        (0, b"stats-tube \r\nstats-tube -x\r\nstats \r\nlist-tubes \r\n", 4),
        (0, b"pause-tubedefault 0\r\nuse\r\nstats-job\r\nreserve-job\r\npeek\r\n", 5),
        (0, b"pause-tube\r\npause-tube default\r\npause-tube default x\r\npause-tube nope 1\r\n", 4),
        (0, b"put 1 2 3\r\nput 1 2 3 4 \r\nput -1 0 0 1\r\nput 1 0 0 4294967296\r\n", 4),
        (0, b"put 4294967295 4294967295 4294967295 1\r\nq\r\n", 1),
        (0, b"put  1  0  10  1\r\nz\r\n", 1),
        (0, b"delete 1\0\r\n", 1),
        // The rest of a long line is dropped through its end, then one BAD_FORMAT.
        (0, &long_then_cmd, 2),
        (0, &[b'x'; 224], 0),
        (0, b"list-tube-used\r\nlist-tube-used\r\n", 2),
        (0, b"put 0 0 10 2\r\nabXY", 1),
        (0, b"put 0 0 10 1\r\nq\r\n", 1),
        // A stray CR hides the line end until 224 bytes have come.
        (1, b"use a\rb\r\n", 0),
        (1, &long_line[..215], 0),
        (1, b"\r\nlist-tube-used\r\n", 2),
        (0, b"stats\r\n", 1),
        (3, b"put 0 0 10 1\r\nw\r\n", 1),
        (2, b"", 1),
        (3, b"quitx\r\n", 1),
    ]);
}

#[test]
fn job_too_big_discards_the_body() {
    let mut big = b"put 0 0 10 1025\r\n".to_vec();
    big.extend([b'b'; 1025]);
    big.extend(b"\r\nlist-tube-used\r\n");
    both(
        &["-z", "1024"],
        ServerConfig::default().max_job_size(1024),
        &[
            (0, &big, 2),
            (0, b"put 0 0 10 5000 trailing\r\n", 0),
            (0, &[b'y'; 5002], 1),
            (0, b"put 0 0 10 1024\r\n", 0),
            (0, &[b'k'; 1024], 0),
            (0, b"\r\nstats\r\n", 2),
        ],
    );
}

#[test]
fn pause_tube_holds_reserves_back() {
    check(&[
        (0, b"put 0 0 10 1\r\np\r\npause-tube default 100\r\n", 2),
        (0, b"reserve-with-timeout 0\r\nstats-tube default\r\n", 2),
        (0, b"pause-tube default 0\r\nreserve-with-timeout 0\r\n", 2),
        (0, b"stats-tube default\r\n", 1),
    ]);
}

#[test]
fn deadline_soon_and_ttr_expiry() {
    check(&[
        // A TTR of 3 s leaves room for a slow machine between the steps.
        (0, b"put 0 0 3 1\r\nt\r\nput 0 0 3 1\r\nu\r\n", 2),
        (0, b"reserve\r\n", 1),
        // Another job is ready: it is handed out even though the first is due.
        (0, b"reserve-with-timeout 5\r\n", 1),
        // Nothing ready and a held job within a second of its TTR.
        (0, b"reserve-with-timeout 5\r\n", 1),
        (0, b"stats-tube default\r\n", 1),
    ]);
}

/// TTR expiry. The reference server puts a job back at its deadline, as the
/// protocol says. beanstalkd 1.12 does so only when the holder's connection
/// timer fires, and that timer is sometimes missed while the holder is idle: in
/// about one run in five here the job stays reserved (the holder can still
/// touch it 3 s after a 1 s TTR), so this is not compared with beanstalkd.
#[test]
fn ttr_expiry_puts_the_job_back_at_its_deadline() {
    let server = reference(ServerConfig::default());
    let started = Instant::now();
    let got = run(
        server.addr(),
        &[
            (0, b"put 0 0 1 1\r\nt\r\n", 1),
            (1, b"reserve\r\n", 1),
            (0, b"reserve-with-timeout 3\r\n", 1),
            (0, b"stats-job 1\r\n", 1),
            (1, b"touch 1\r\ndelete 1\r\n", 2),
        ],
    );
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(950) && waited < Duration::from_millis(2500),
        "{waited:?}"
    );
    assert_eq!(got[2], "2/0: RESERVED 1 1\nt");
    assert!(
        got[3].contains("state: reserved") && got[3].contains("timeouts: 1"),
        "{}",
        got[3]
    );
    assert_eq!(&got[4..], ["4/1: NOT_FOUND", "4/1: NOT_FOUND"]);
}

#[test]
fn drain_mode_answers_draining_and_spends_ids() {
    let real = Beanstalkd::start().unwrap();
    let reference = reference(ServerConfig::default());
    let script: &[Step<'_>] = &[
        (0, b"put 0 0 10 1\r\na\r\n", 1),
        (0, b"put 0 0 10 1\r\nb\r\n", 1),
        (0, b"put 0 0 10 1\r\nc\r\n", 1),
        (0, b"stats\r\n", 1),
    ];
    let drained = |addr, drain: &dyn Fn()| {
        let first = run(addr, &script[..1]);
        drain();
        [first, run(addr, &script[1..])].concat()
    };
    // beanstalkd's open sockets before the script: the stats at its end must
    // not count the first part's connection, which beanstalkd closes when it
    // gets round to the end of stream (late on a loaded machine).
    let fds = || {
        std::fs::read_dir(format!("/proc/{}/fd", real.pid()))
            .unwrap()
            .count()
    };
    let idle = fds();
    let want = drained(real.addr(), &|| {
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while fds() > idle {
            assert!(
                std::time::Instant::now() < until,
                "beanstalkd kept a closed connection"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        real.drain().unwrap();
        std::thread::sleep(Duration::from_millis(100));
    });
    let got = drained(reference.addr(), &|| reference.set_draining(true));
    assert_eq!(got, want);
    assert!(got[1].ends_with("DRAINING"), "{got:?}");
}

/// Generated command sequences on two connections, kept small and non-blocking.
fn command() -> impl Strategy<Value = (usize, Vec<u8>)> {
    let tube = prop::sample::select(vec!["default", "t1", "t2"]);
    let id = 1u64..8;
    let cmd = prop_oneof![
        4 => (0u32..3000, prop::sample::select(vec![0u32, 0, 100]), 1u32..100,
              prop::collection::vec(any::<u8>(), 0..20))
            .prop_map(|(pri, delay, ttr, body)| {
                let mut buf = vec![0u8; 256];
                let n = Command::Put { pri, delay, ttr, body: &body }.encode(&mut buf, 65535).unwrap();
                buf.truncate(n);
                buf
            }),
        3 => Just(b"reserve-with-timeout 0\r\n".to_vec()),
        1 => tube.clone().prop_map(|t| format!("use {t}\r\n").into_bytes()),
        1 => tube.clone().prop_map(|t| format!("watch {t}\r\n").into_bytes()),
        1 => tube.clone().prop_map(|t| format!("ignore {t}\r\n").into_bytes()),
        2 => id.clone().prop_map(|i| format!("delete {i}\r\n").into_bytes()),
        1 => (id.clone(), 0u32..2000, prop::sample::select(vec![0u32, 100]))
            .prop_map(|(i, p, d)| format!("release {i} {p} {d}\r\n").into_bytes()),
        1 => (id.clone(), 0u32..2000).prop_map(|(i, p)| format!("bury {i} {p}\r\n").into_bytes()),
        1 => id.clone().prop_map(|i| format!("touch {i}\r\n").into_bytes()),
        1 => id.clone().prop_map(|i| format!("kick-job {i}\r\n").into_bytes()),
        1 => id.clone().prop_map(|i| format!("reserve-job {i}\r\n").into_bytes()),
        1 => id.clone().prop_map(|i| format!("peek {i}\r\n").into_bytes()),
        1 => id.clone().prop_map(|i| format!("stats-job {i}\r\n").into_bytes()),
        1 => (0u32..4).prop_map(|n| format!("kick {n}\r\n").into_bytes()),
        1 => prop::sample::select(vec!["peek-ready", "peek-delayed", "peek-buried",
              "list-tubes", "list-tubes-watched", "list-tube-used", "stats"])
            .prop_map(|c| format!("{c}\r\n").into_bytes()),
        1 => tube.clone().prop_map(|t| format!("stats-tube {t}\r\n").into_bytes()),
        1 => (tube, prop::sample::select(vec![0u32, 100]))
            .prop_map(|(t, d)| format!("pause-tube {t} {d}\r\n").into_bytes()),
    ];
    (0usize..2, cmd)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn generated_sequences_match_beanstalkd(cmds in prop::collection::vec(command(), 1..40)) {
        let script: Vec<Step<'_>> = cmds.iter().map(|(c, b)| (*c, b.as_slice(), 1)).collect();
        let real = Beanstalkd::start().unwrap();
        let reference = reference(ServerConfig::default());
        let want = run(real.addr(), &script);
        let got = run(reference.addr(), &script);
        prop_assert_eq!(got, want);
    }
}

/// The usual description of the protocol (see docs/protocol.md) says a delete
/// of a job taken on a closed connection answers
/// NOT_FOUND. beanstalkd answers DELETED when the job is back in ready and
/// nobody has taken it since (delete works on ready, delayed and buried jobs by
/// anyone); NOT_FOUND only while another connection holds it.
#[test]
fn delete_after_the_lease_ended_finds_a_ready_job() {
    let script: &[Step<'_>] = &[
        (0, b"put 0 0 60 1\r\na\r\nput 0 0 60 1\r\nb\r\n", 2),
        (1, b"reserve\r\nreserve\r\n", 2),
        (1, b"<close>", 0),
        // Both went back when connection 1 closed: anyone may delete them.
        (0, b"delete 2\r\n", 1),
        (2, b"reserve\r\n", 1),
        // Job 1 is held by connection 2 now.
        (0, b"delete 1\r\n", 1),
        (2, b"delete 1\r\n", 1),
    ];
    let real = Beanstalkd::start().unwrap();
    let reference = reference(ServerConfig::default());
    let want = run(real.addr(), script);
    let heads: Vec<&str> = want
        .iter()
        .map(|r| {
            r.split(": ")
                .nth(1)
                .unwrap_or("")
                .lines()
                .next()
                .unwrap_or("")
        })
        .collect();
    assert_eq!(
        heads,
        [
            "INSERTED 1",
            "INSERTED 2",
            "RESERVED 1 1",
            "RESERVED 2 1",
            "DELETED",
            "RESERVED 1 1",
            "NOT_FOUND",
            "DELETED"
        ]
    );
    assert_eq!(run(reference.addr(), script), want);
}
