//! The server's side of the codec through its public API: a table of
//! commands, framing and partial input, replies encoded as the client parses
//! them, and property round trips.

use taskq_proto::server::{encode_reply, parse_command, skip_line, CommandError, Skip};
use taskq_proto::{parse_reply, Command, CommandKind, Limits, Reply, Status, MAX_LINE};

fn parse(s: &[u8]) -> Result<Status<Command<'_>>, CommandError> {
    parse_command(s, 100)
}

#[test]
fn table() {
    use Command as C;
    let ok: &[(&[u8], Command<'_>)] = &[
        (b"reserve\r\n", C::Reserve),
        (
            b"reserve-with-timeout 5\r\n",
            C::ReserveWithTimeout { timeout: 5 },
        ),
        (
            b"reserve-with-timeout   5\r\n",
            C::ReserveWithTimeout { timeout: 5 },
        ),
        (b"reserve-job 3\r\n", C::ReserveJob { id: 3 }),
        (
            b"delete 18446744073709551615\r\n",
            C::Delete { id: u64::MAX },
        ),
        (
            b"release 1 2 3\r\n",
            C::Release {
                id: 1,
                pri: 2,
                delay: 3,
            },
        ),
        (
            b"bury 1  4294967295\r\n",
            C::Bury {
                id: 1,
                pri: u32::MAX,
            },
        ),
        (b"touch 9\r\n", C::Touch { id: 9 }),
        (b"use a-b\r\n", C::Use { tube: "a-b" }),
        (b"watch x\r\n", C::Watch { tube: "x" }),
        (b"ignore x\r\n", C::Ignore { tube: "x" }),
        (b"peek 1\r\n", C::Peek { id: 1 }),
        (b"peek-ready\r\n", C::PeekReady),
        (b"peek-delayed\r\n", C::PeekDelayed),
        (b"peek-buried\r\n", C::PeekBuried),
        (b"kick 10\r\n", C::Kick { bound: 10 }),
        (b"kick 4294967297 x\r\n", C::Kick { bound: 1 }),
        (b"kick -1\r\n", C::Kick { bound: u32::MAX }),
        (b"kick  +2\r\n", C::Kick { bound: 2 }),
        (b"kick-job 10\r\n", C::KickJob { id: 10 }),
        (b"stats\r\n", C::Stats),
        (b"stats-job 2\r\n", C::StatsJob { id: 2 }),
        (b"stats-tube t\r\n", C::StatsTube { tube: "t" }),
        (b"list-tubes\r\n", C::ListTubes),
        (b"list-tube-used\r\n", C::ListTubeUsed),
        (b"list-tubes-watched\r\n", C::ListTubesWatched),
        (
            b"pause-tube t 5\r\n",
            C::PauseTube {
                tube: "t",
                delay: 5,
            },
        ),
        (b"quit\r\n", C::Quit),
        (b"quitx\r\n", C::Quit),
        (
            b"put 1 2 3 0\r\n\r\n",
            C::Put {
                pri: 1,
                delay: 2,
                ttr: 3,
                body: b"",
            },
        ),
        (
            b"put 1 2 3 4\r\na\r\nb\r\n",
            C::Put {
                pri: 1,
                delay: 2,
                ttr: 3,
                body: b"a\r\nb",
            },
        ),
    ];
    for (input, want) in ok {
        assert_eq!(
            parse(input),
            Ok(Status::Complete(*want, input.len())),
            "{input:?}"
        );
    }
    let bad: &[&[u8]] = &[
        b"reserve \r\n",
        b"reserve-with-timeout\r\n",
        b"reserve-with-timeout 99999999999999999999\r\n",
        b"delete 18446744073709551616\r\n",
        b"delete 1 \r\n",
        b"delete x\r\n",
        b"bury 1 4294967296\r\n",
        b"kick \r\n",
        b"kick x\r\n",
        b"kick 99999999999999999999\r\n",
        b"use \r\n",
        b"use  a\r\n",
        b"use -a\r\n",
        b"use a b\r\n",
        b"stats \r\n",
        b"put 1 2 3\r\n",
        b"delete 1\0\r\n",
    ];
    for input in bad {
        assert_eq!(
            parse(input),
            Err(CommandError::BadFormat {
                consumed: input.len()
            }),
            "{input:?}"
        );
    }
    for input in [&b"\r\n"[..], b"frob\r\n", b"put1 2 3 4\r\n", b"kick\r\n"] {
        assert_eq!(
            parse(input),
            Err(CommandError::UnknownCommand {
                consumed: input.len()
            }),
            "{input:?}"
        );
    }
}

#[test]
fn partial_and_framing() {
    assert_eq!(parse(b""), Ok(Status::Partial));
    assert_eq!(parse(b"reserve"), Ok(Status::Partial));
    assert_eq!(parse(b"reserve\r"), Ok(Status::Partial));
    assert_eq!(parse(b"put 1 2 3 4\r\nab"), Ok(Status::Partial));
    assert_eq!(parse(b"put 1 2 3 4\r\nabcd\r"), Ok(Status::Partial));
    assert_eq!(
        parse(b"put 1 2 3 4\r\nabcdXY"),
        Err(CommandError::ExpectedCrlf { consumed: 19 })
    );
    assert_eq!(
        parse(b"put 1 2 3 4 \r\n"),
        Err(CommandError::CountedBadFormat {
            consumed: 14,
            kind: CommandKind::Put
        })
    );
    assert_eq!(
        parse(b"put 1 2 3 101 junk\r\n"),
        Err(CommandError::JobTooBig {
            consumed: 20,
            discard: 103
        })
    );
    // A stray CR hides the line end until 224 bytes have come.
    assert_eq!(parse(b"use a\rb\r\n"), Ok(Status::Partial));
    let long = [b'x'; 300];
    assert_eq!(parse(&long), Err(CommandError::LineTooLong));
    let mut edge = [b'x'; 224];
    edge[222] = b'\r';
    edge[223] = b'\n';
    assert!(matches!(
        parse(&edge),
        Err(CommandError::UnknownCommand { consumed: 224 })
    ));
    edge[222] = b'x';
    edge[223] = b'\r';
    assert_eq!(parse(&edge), Err(CommandError::LineTooLong));
    assert_eq!(skip_line(b"xx"), Skip::More(0));
    assert_eq!(skip_line(b"xx\r\nquit\r\n"), Skip::Done(4));
    assert_eq!(skip_line(&long), Skip::More(224));
}

#[test]
fn replies_encode_as_the_client_parses() {
    let limits = Limits::default();
    let cases: &[(CommandKind, Reply<'_>)] = &[
        (CommandKind::Put, Reply::Inserted { id: 5 }),
        (CommandKind::Put, Reply::InsertedBuried { id: 5 }),
        (
            CommandKind::Reserve,
            Reply::Reserved {
                id: 1,
                body: b"a\r\nb",
            },
        ),
        (CommandKind::Use, Reply::Using { tube: "q" }),
        (CommandKind::Kick, Reply::Kicked { count: 3 }),
        (CommandKind::KickJob, Reply::KickedJob),
        (
            CommandKind::Stats,
            Reply::Ok {
                yaml: b"---\na: 1\n",
            },
        ),
        (CommandKind::Bury, Reply::Buried),
    ];
    let mut buf = [0u8; 256];
    for (kind, reply) in cases {
        let n = encode_reply(reply, &mut buf).unwrap();
        assert_eq!(
            parse_reply(*kind, &buf[..n], &limits).unwrap(),
            Status::Complete(*reply, n)
        );
    }
    assert!(encode_reply(
        &Reply::Reserved {
            id: 1,
            body: &[0; 300]
        },
        &mut buf
    )
    .is_err());
}

mod props {
    use super::*;
    use proptest::prelude::*;

    fn tube() -> impl Strategy<Value = String> {
        "[A-Za-z0-9+/;.$_()][A-Za-z0-9+/;.$_()-]{0,40}"
    }

    /// Owned parts of a command, built into a borrowed `Command` in the test.
    #[derive(Debug, Clone)]
    enum Owned {
        Put(u32, u32, u32, Vec<u8>),
        Tube(u8, String),
        Id(u8, u64),
        Release(u64, u32, u32),
        Bury(u64, u32),
        Timeout(u32),
        Kick(u32),
        Pause(String, u32),
        Bare(u8),
    }

    fn owned() -> impl Strategy<Value = Owned> {
        prop_oneof![
            (
                any::<u32>(),
                any::<u32>(),
                any::<u32>(),
                prop::collection::vec(any::<u8>(), 0..300)
            )
                .prop_map(|(p, d, t, b)| Owned::Put(p, d, t, b)),
            (0u8..4, tube()).prop_map(|(k, t)| Owned::Tube(k, t)),
            (0u8..7, any::<u64>()).prop_map(|(k, i)| Owned::Id(k, i)),
            (any::<u64>(), any::<u32>(), any::<u32>())
                .prop_map(|(i, p, d)| Owned::Release(i, p, d)),
            (any::<u64>(), any::<u32>()).prop_map(|(i, p)| Owned::Bury(i, p)),
            // beanstalkd reads the timeout as a signed int: above 2^31 - 1 it
            // means "forever" (see the module docs), so the round trip stops there.
            (0u32..=i32::MAX as u32).prop_map(Owned::Timeout),
            any::<u32>().prop_map(Owned::Kick),
            (tube(), any::<u32>()).prop_map(|(t, d)| Owned::Pause(t, d)),
            (0u8..10).prop_map(Owned::Bare),
        ]
    }

    fn command(o: &Owned) -> Command<'_> {
        match o {
            Owned::Put(pri, delay, ttr, body) => Command::Put {
                pri: *pri,
                delay: *delay,
                ttr: *ttr,
                body,
            },
            Owned::Tube(0, tube) => Command::Use { tube },
            Owned::Tube(1, tube) => Command::Watch { tube },
            Owned::Tube(2, tube) => Command::Ignore { tube },
            Owned::Tube(_, tube) => Command::StatsTube { tube },
            Owned::Id(0, id) => Command::ReserveJob { id: *id },
            Owned::Id(1, id) => Command::Delete { id: *id },
            Owned::Id(2, id) => Command::Touch { id: *id },
            Owned::Id(3, id) => Command::Peek { id: *id },
            Owned::Id(4, id) => Command::KickJob { id: *id },
            Owned::Id(5, id) => Command::StatsJob { id: *id },
            Owned::Id(_, id) => Command::Delete { id: *id },
            Owned::Release(id, pri, delay) => Command::Release {
                id: *id,
                pri: *pri,
                delay: *delay,
            },
            Owned::Bury(id, pri) => Command::Bury { id: *id, pri: *pri },
            Owned::Timeout(timeout) => Command::ReserveWithTimeout { timeout: *timeout },
            Owned::Kick(bound) => Command::Kick { bound: *bound },
            Owned::Pause(tube, delay) => Command::PauseTube {
                tube,
                delay: *delay,
            },
            Owned::Bare(k) => [
                Command::Reserve,
                Command::PeekReady,
                Command::PeekDelayed,
                Command::PeekBuried,
                Command::Stats,
                Command::ListTubes,
                Command::ListTubeUsed,
                Command::ListTubesWatched,
                Command::Quit,
                Command::Reserve,
            ][*k as usize],
        }
    }

    fn reply(k: u8, n: u64, body: &[u8], tube: &'static str) -> (CommandKind, Reply<'static>) {
        let body: &'static [u8] = Box::leak(body.to_vec().into_boxed_slice());
        let all = [
            (CommandKind::Put, Reply::Inserted { id: n }),
            (CommandKind::Put, Reply::InsertedBuried { id: n }),
            (CommandKind::Put, Reply::ExpectedCrlf),
            (CommandKind::Put, Reply::JobTooBig),
            (CommandKind::Put, Reply::Draining),
            (CommandKind::Use, Reply::Using { tube }),
            (CommandKind::Reserve, Reply::Reserved { id: n, body }),
            (CommandKind::Reserve, Reply::DeadlineSoon),
            (
                CommandKind::ReserveWithTimeout { timeout: 1 },
                Reply::TimedOut,
            ),
            (CommandKind::Delete, Reply::Deleted),
            (CommandKind::Delete, Reply::NotFound),
            (CommandKind::Release, Reply::Released),
            (CommandKind::Release, Reply::Buried),
            (CommandKind::Touch, Reply::Touched),
            (CommandKind::Watch, Reply::Watching { count: n }),
            (CommandKind::Ignore, Reply::NotIgnored),
            (CommandKind::Peek, Reply::Found { id: n, body }),
            (CommandKind::Kick, Reply::Kicked { count: n }),
            (CommandKind::KickJob, Reply::KickedJob),
            (CommandKind::Stats, Reply::Ok { yaml: body }),
            (CommandKind::PauseTube, Reply::Paused),
            (CommandKind::Stats, Reply::OutOfMemory),
            (CommandKind::Stats, Reply::InternalError),
            (CommandKind::Stats, Reply::BadFormat),
            (CommandKind::Stats, Reply::UnknownCommand),
        ];
        all[k as usize % all.len()]
    }

    proptest! {
        #[test]
        fn client_encoding_parses_to_the_same_command(o in owned()) {
            let cmd = command(&o);
            let mut buf = vec![0u8; 1024];
            let n = cmd.encode(&mut buf, 65535).unwrap();
            prop_assert_eq!(parse_command(&buf[..n], 65535), Ok(Status::Complete(cmd, n)));
            // Every strict prefix is a partial command, never an error.
            for cut in 0..n {
                prop_assert_eq!(parse_command(&buf[..cut], 65535), Ok(Status::Partial));
            }
        }

        #[test]
        fn server_encoding_parses_to_the_same_reply(
            k in any::<u8>(),
            n in any::<u64>(),
            body in prop::collection::vec(any::<u8>(), 0..300),
            tube in prop::sample::select(vec!["default", "a-b", "x(1)"]),
        ) {
            let (kind, r) = reply(k, n, &body, tube);
            let mut buf = vec![0u8; 1024];
            let len = encode_reply(&r, &mut buf).unwrap();
            prop_assert_eq!(parse_reply(kind, &buf[..len], &Limits::default()), Ok(Status::Complete(r, len)));
            // Too small a buffer is an error, never a panic or a short write.
            prop_assert!(encode_reply(&r, &mut buf[..len - 1]).is_err());
        }

        #[test]
        fn arbitrary_input_never_panics(input in prop::collection::vec(any::<u8>(), 0..400)) {
            match parse_command(&input, 100) {
                Ok(Status::Complete(_, n)) => prop_assert!(n <= input.len()),
                Ok(Status::Partial) => prop_assert!(input.len() < MAX_LINE + 100 + 2 + 32),
                Err(e) => prop_assert!(e.consumed() <= input.len().max(MAX_LINE)),
            }
            let _ = skip_line(&input);
        }
    }
}
