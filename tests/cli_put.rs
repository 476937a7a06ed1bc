//! `taskq put` against a real beanstalkd: arguments, lines, `--null`, batches, `--position`, ids read live from a pipe.

mod cli_common;

use std::time::Duration;

use cli_common::{drain, ids, ok, taskq};
use taskq_proto::{Command as Cmd, Connection, ConnectionConfig, Reply};
use taskq_testkit::Beanstalkd;

#[test]
fn bodies_from_arguments_print_one_id_each_in_order() {
    let server = Beanstalkd::start().unwrap();
    let addr = server.addr().to_string();
    let out = ok(
        &[
            "put",
            "--addr",
            &addr,
            "--tube",
            "args",
            "first",
            "",
            "third one",
        ],
        b"",
    );
    let printed = ids(&out);
    assert_eq!(printed.len(), 3);
    let jobs = drain(server.addr(), "args");
    let want: [&[u8]; 3] = [b"first", b"", b"third one"];
    assert_eq!(jobs.iter().map(|(id, _)| *id).collect::<Vec<_>>(), printed);
    assert_eq!(
        jobs.iter().map(|(_, b)| b.as_slice()).collect::<Vec<_>>(),
        want
    );
}

#[test]
fn stdin_lines_are_jobs_sent_in_batches_in_input_order() {
    let server = Beanstalkd::start().unwrap();
    let addr = server.addr().to_string();
    // 1000 lines: several pipelined batches; a CRLF line end loses its CR too; an empty line is an empty job.
    let mut input = Vec::new();
    for i in 0..1000 {
        input.extend_from_slice(format!("line {i}\n").as_bytes());
    }
    input.extend_from_slice(b"windows\r\n\nlast without newline");
    let out = ok(
        &[
            "put", "--addr", &addr, "--tube", "lines", "--pri", "5", "--ttr", "7",
        ],
        &input,
    );
    let printed = ids(&out);
    assert_eq!(printed.len(), 1003);
    assert!(printed.windows(2).all(|w| w[1] > w[0]));
    let jobs = drain(server.addr(), "lines");
    assert_eq!(jobs.iter().map(|(id, _)| *id).collect::<Vec<_>>(), printed);
    assert_eq!(jobs[0].1, b"line 0");
    assert_eq!(jobs[999].1, b"line 999");
    assert_eq!(jobs[1000].1, b"windows");
    assert_eq!(jobs[1001].1, b"");
    assert_eq!(jobs[1002].1, b"last without newline");
}

#[test]
fn null_separated_input_keeps_every_other_byte_and_trailing_nul_adds_no_job() {
    let server = Beanstalkd::start().unwrap();
    let addr = server.addr().to_string();
    let out = ok(
        &["put", "--addr", &addr, "--tube", "nul", "--null"],
        b"a\r\nb\n\0\0tail\r\n\0",
    );
    assert_eq!(ids(&out).len(), 3);
    let jobs = drain(server.addr(), "nul");
    let bodies: Vec<&[u8]> = jobs.iter().map(|(_, b)| b.as_slice()).collect();
    assert_eq!(bodies, [&b"a\r\nb\n"[..], b"", b"tail\r\n"]);

    // No trailing NUL: the last item is still a job. Empty input: no job at all.
    ok(&["put", "--addr", &addr, "--tube", "nul", "-0"], b"x\0y");
    assert_eq!(drain(server.addr(), "nul").len(), 2);
    assert_eq!(
        ok(&["put", "--addr", &addr, "--tube", "nul", "-0"], b""),
        ""
    );
    assert!(drain(server.addr(), "nul").is_empty());
}

#[test]
fn position_prints_the_id_and_the_ready_jobs_ahead() {
    let server = Beanstalkd::start().unwrap();
    let addr = server.addr().to_string();
    ok(&["put", "--addr", &addr, "--tube", "q", "a", "b", "c"], b"");
    let out = ok(
        &[
            "put",
            "--addr",
            &addr,
            "--tube",
            "q",
            "--position",
            "d",
            "e",
        ],
        b"",
    );
    let lines: Vec<Vec<u64>> = out
        .lines()
        .map(|l| l.split(' ').map(|w| w.parse().unwrap()).collect())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0][1], 3, "three ready jobs ahead of d");
    assert_eq!(lines[1][1], 4);
    assert_eq!(lines[1][0], lines[0][0] + 1);
}

#[test]
fn errors_are_one_line_and_a_non_zero_exit() {
    let server = Beanstalkd::start_with(&["-z", "10"]).unwrap();
    let addr = server.addr().to_string();
    let cases: Vec<Vec<String>> = vec![
        vec![
            "put".into(),
            "--addr".into(),
            addr.clone(),
            "--tube".into(),
            "bad name".into(),
            "x".into(),
        ],
        vec![
            "put".into(),
            "--addr".into(),
            "127.0.0.1:1".into(),
            "x".into(),
        ],
        // A name that does not resolve, and that no DNS query is sent for:
        // a 64-octet label cannot be put in one, so the lookup fails here.
        vec![
            "put".into(),
            "--addr".into(),
            format!("{}.invalid:11300", "a".repeat(64)),
            "x".into(),
        ],
        vec![
            "stats".into(),
            "--addr".into(),
            addr.clone(),
            "--tube".into(),
            "missing".into(),
        ],
    ];
    for args in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (out, _) = taskq(&args, b"", Duration::from_secs(20));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("taskq: "), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    assert!(drain(server.addr(), "default").is_empty());
}

#[test]
fn rejected_and_oversized_jobs_are_counted_the_rest_go_on_and_exit_4() {
    let server = Beanstalkd::start_with(&["-z", "10"]).unwrap();
    let addr = server.addr().to_string();
    let big = "x".repeat(11);
    // The server's limit (-z 10) rejects job 2 and the others go on; then the
    // client's own limit keeps a job from being sent and the others go on.
    let (out, _) = taskq(
        &[
            "put",
            "--addr",
            &addr,
            "--max-job-size",
            "11",
            "ok",
            &big,
            "three",
            "x",
            "five",
        ],
        b"",
        Duration::from_secs(20),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.contains("job 2: rejected by the server: JOB_TOO_BIG"),
        "{err}"
    );
    assert_eq!(
        err.lines().last().unwrap(),
        "taskq put: acknowledged 4, rejected 1, unknown 0, not sent 0 (rejected: job 2)"
    );
    let printed = ids(&String::from_utf8(out.stdout).unwrap());
    let jobs = drain(server.addr(), "default");
    assert_eq!(jobs.iter().map(|(id, _)| *id).collect::<Vec<_>>(), printed);
    let bodies: Vec<&[u8]> = jobs.iter().map(|(_, b)| b.as_slice()).collect();
    assert_eq!(bodies, [&b"ok"[..], b"three", b"x", b"five"]);

    let (out, _) = taskq(
        &[
            "put",
            "--addr",
            &addr,
            "--max-job-size",
            "3",
            "a",
            "long",
            "b",
        ],
        b"",
        Duration::from_secs(20),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.contains("job 2: 4 bytes is over --max-job-size 3; not sent"),
        "{err}"
    );
    assert_eq!(
        err.lines().last().unwrap(),
        "taskq put: acknowledged 2, rejected 0, unknown 0, not sent 1 (not sent: job 2)"
    );
    assert_eq!(ids(&String::from_utf8(out.stdout).unwrap()).len(), 2);
    let bodies: Vec<Vec<u8>> = drain(server.addr(), "default")
        .into_iter()
        .map(|(_, b)| b)
        .collect();
    assert_eq!(bodies, [b"a".to_vec(), b"b".to_vec()]);
}

#[test]
fn full_success_still_prints_the_summary_and_help_documents_the_exit_status() {
    let server = Beanstalkd::start().unwrap();
    let addr = server.addr().to_string();
    let (out, _) = taskq(
        &["put", "--addr", &addr],
        b"a\nb\nc\n",
        Duration::from_secs(20),
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "taskq put: acknowledged 3, rejected 0, unknown 0, not sent 0\n"
    );
    let help = ok(&["put", "--help"], b"");
    for want in [
        "--retry-for <SECS>",
        "--at-least-once",
        "0  every job was acknowledged",
        "3  some outcomes are unknown",
        "4  none is unknown, but some jobs were rejected or not sent",
        "2  usage error",
        "1  error before any job was sent",
    ] {
        assert!(help.contains(want), "--help lacks {want:?}:\n{help}");
    }
    let (out, _) = taskq(
        &["put", "--retry-for", "soon"],
        b"",
        Duration::from_secs(20),
    );
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn ids_reach_a_pipe_as_each_job_is_acknowledged_not_at_the_end() {
    use std::io::{BufRead, BufReader, Write};
    let server = Beanstalkd::start().unwrap();
    let addr = server.addr().to_string();
    let mut child = cli_common::Reaped(cli_common::spawn(&[
        "put", "--addr", &addr, "--tube", "live",
    ]));
    let mut input = child.0.stdin.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line.unwrap()).is_err() {
                return;
            }
        }
    });
    let mut c = Connection::connect(server.addr(), ConnectionConfig::default()).unwrap();
    // Each job's id is read from the pipe while standard input is still open,
    // and the server has that job.
    for body in ["first", "second", "third"] {
        writeln!(input, "{body}").unwrap();
        input.flush().unwrap();
        let line = rx
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("no id for {body:?} while input is open"));
        let id: u64 = line.trim().parse().unwrap();
        match c.request(&Cmd::Peek { id }).unwrap() {
            Reply::Found { body: b, .. } => assert_eq!(b, body.as_bytes()),
            r => panic!("job {id}: {r:?}"),
        }
    }
    drop(input);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "put still runs 10 s after its input ended"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
}

/// The reader of the ids goes away (`taskq put ... | head -1`) while jobs
/// are still put: the ids can no longer be written, but every job sent is
/// counted, and the exit status says jobs were sent (4: the rest of the
/// input was not), never 1 ("nothing sent", which invites sending it all
/// again).
#[test]
fn ids_that_cannot_be_written_end_the_put_without_claiming_nothing_was_sent() {
    use std::io::{BufRead, BufReader, Write};
    let server = Beanstalkd::start().unwrap();
    let addr = server.addr().to_string();
    let mut child = cli_common::Reaped(cli_common::spawn(&[
        "put", "--addr", &addr, "--tube", "gone",
    ]));
    let mut input = child.0.stdin.take().unwrap();
    let mut ids = BufReader::new(child.0.stdout.take().unwrap());
    writeln!(input, "first").unwrap();
    input.flush().unwrap();
    let mut line = String::new();
    ids.read_line(&mut line).unwrap();
    assert!(line.trim().parse::<u64>().is_ok(), "{line:?}");
    // The reader is gone: the next ids meet a closed pipe.
    drop(ids);
    writeln!(input, "second\nthird").unwrap();
    drop(input);
    let out = child.output_within(Duration::from_secs(20));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains("writing ids"), "{err}");
    // "second" at least was sent (its id met the closed pipe); "third" too
    // when it was read with it. The summary counts what the server has.
    let acked: u64 = err
        .split("taskq put: acknowledged ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no summary: {err}"));
    assert!(acked >= 2, "{err}");
    let mut c = Connection::connect(server.addr(), ConnectionConfig::default()).unwrap();
    match c.request(&Cmd::StatsTube { tube: "gone" }).unwrap() {
        Reply::Ok { yaml } => {
            let text = String::from_utf8_lossy(yaml);
            let ready = format!("current-jobs-ready: {acked}\n");
            assert!(text.contains(&ready), "{text}");
        }
        r => panic!("{r:?}"),
    }
}
