//! A server that accepts and then says nothing makes every subcommand fail
//! within a few seconds, with one line on stderr.

mod cli_common;

use std::io::Read;
use std::net::TcpListener;
use std::time::Duration;

use cli_common::taskq;

#[test]
fn every_subcommand_gives_up_on_a_silent_server() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    // Accept everything and read (so writes never block), never answer.
    std::thread::spawn(move || {
        for s in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut s = s;
                let mut buf = [0u8; 4096];
                while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
            });
        }
    });
    let cases: [&[&str]; 5] = [
        &["put", "--addr", &addr, "x"],
        &["put", "--addr", &addr, "--tube", "t", "x"],
        &["put", "--addr", &addr, "--position", "x"],
        &["stats", "--addr", &addr],
        &["bench", "--addr", &addr, "-n", "10"],
    ];
    for args in cases {
        let mut args = args.to_vec();
        args.extend(["--io-timeout", "500"]);
        if args[0] == "put" {
            args.extend(["--retry-for", "1"]);
        }
        let (out, took) = taskq(&args, b"", Duration::from_secs(10));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(took < Duration::from_secs(3), "{args:?} took {took:?}");
        assert!(err.contains("no complete reply"), "{args:?}: {err}");
        if args[0] == "put" {
            // A job sent and never answered has an unknown outcome (exit 3);
            // one behind a `use` that is never answered is not sent (exit 4,
            // after --retry-for). Either way the summary names it by position.
            let (code, summary) = if args.contains(&"--tube") {
                (4, "taskq put: acknowledged 0, rejected 0, unknown 0, not sent 1 (not sent: job 1)")
            } else {
                (
                    3,
                    "taskq put: acknowledged 0, rejected 0, unknown 1, not sent 0 (unknown: job 1)",
                )
            };
            assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
            assert_eq!(err.lines().last(), Some(summary), "{args:?}: {err}");
        } else {
            assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
            assert_eq!(err.lines().count(), 1, "{err}");
        }
    }
    // Stdin input too, with the default timeout: each line is sent (the second
    // on a new connection) and never answered.
    let (out, took) = taskq(
        &["put", "--addr", &addr],
        b"a\nb\n",
        Duration::from_secs(10),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert_eq!(
        err.lines().last(),
        Some("taskq put: acknowledged 0, rejected 0, unknown 2, not sent 0 (unknown: jobs 1-2)"),
        "{err}"
    );
    // Each line waits out the default I/O timeout once, with 2 s to spare.
    let bound = 2 * taskq_proto::defaults::IO_TIMEOUT + Duration::from_secs(2);
    assert!(took < bound, "took {took:?}");
}
