//! Encoding: the exact bytes of every command, and every refusal.

use taskq_proto::{
    secs_ceil, validate_tube, Command as C, EncodeError, TubeNameError as T, DEFAULT_MAX_JOB_SIZE,
    MAX_LINE,
};

fn encode(cmd: &C<'_>, max: usize) -> Result<Vec<u8>, EncodeError> {
    let mut buf = vec![0u8; 70_000];
    let n = cmd.encode(&mut buf, max)?;
    buf.truncate(n);
    Ok(buf)
}

#[test]
fn every_command_exact_bytes() {
    let max = DEFAULT_MAX_JOB_SIZE;
    #[rustfmt::skip]
    let cases: &[(C<'_>, &[u8])] = &[
        (C::Put { pri: 0, delay: 0, ttr: 0, body: b"" }, b"put 0 0 0 0\r\n\r\n"),
        (C::Put { pri: 10, delay: 2, ttr: 60, body: b"hi\r\nthere\0" }, b"put 10 2 60 10\r\nhi\r\nthere\0\r\n"),
        (C::Put { pri: u32::MAX, delay: u32::MAX, ttr: u32::MAX, body: b"x" }, b"put 4294967295 4294967295 4294967295 1\r\nx\r\n"),
        (C::Use { tube: "default" }, b"use default\r\n"),
        (C::Reserve, b"reserve\r\n"),
        (C::ReserveWithTimeout { timeout: 0 }, b"reserve-with-timeout 0\r\n"),
        (C::ReserveWithTimeout { timeout: i32::MAX as u32 }, b"reserve-with-timeout 2147483647\r\n"),
        (C::ReserveJob { id: 7 }, b"reserve-job 7\r\n"),
        (C::Delete { id: u64::MAX }, b"delete 18446744073709551615\r\n"),
        (C::Release { id: 1, pri: 2, delay: 3 }, b"release 1 2 3\r\n"),
        (C::Bury { id: 4, pri: 5 }, b"bury 4 5\r\n"),
        (C::Touch { id: 6 }, b"touch 6\r\n"),
        (C::Watch { tube: "a-b+c/d;e.f$g_h(i)" }, b"watch a-b+c/d;e.f$g_h(i)\r\n"),
        (C::Ignore { tube: "default" }, b"ignore default\r\n"),
        (C::Peek { id: 8 }, b"peek 8\r\n"),
        (C::PeekReady, b"peek-ready\r\n"),
        (C::PeekDelayed, b"peek-delayed\r\n"),
        (C::PeekBuried, b"peek-buried\r\n"),
        (C::Kick { bound: 100 }, b"kick 100\r\n"),
        (C::KickJob { id: 9 }, b"kick-job 9\r\n"),
        (C::Stats, b"stats\r\n"),
        (C::StatsJob { id: 10 }, b"stats-job 10\r\n"),
        (C::StatsTube { tube: "t" }, b"stats-tube t\r\n"),
        (C::ListTubes, b"list-tubes\r\n"),
        (C::ListTubeUsed, b"list-tube-used\r\n"),
        (C::ListTubesWatched, b"list-tubes-watched\r\n"),
        (C::PauseTube { tube: "t", delay: 30 }, b"pause-tube t 30\r\n"),
        (C::Quit, b"quit\r\n"),
    ];
    for (cmd, want) in cases {
        let got = encode(cmd, max).unwrap();
        assert_eq!(got, *want, "{cmd:?}: {:?}", String::from_utf8_lossy(&got));
        assert_eq!(cmd.encoded_len(), want.len(), "{cmd:?}");
        assert_eq!(
            cmd.kind().name(),
            std::str::from_utf8(want)
                .unwrap()
                .split([' ', '\r'])
                .next()
                .unwrap()
        );
        // The line alone is everything up to the first CRLF.
        let mut line = [0u8; MAX_LINE];
        let n = cmd.encode_line(&mut line, max).unwrap();
        let first_crlf = want.windows(2).position(|w| w == b"\r\n").unwrap() + 2;
        assert_eq!(&line[..n], &want[..first_crlf], "{cmd:?}");
    }
}

#[test]
fn bad_tube_names_are_refused_for_every_tube_command() {
    let long = "a".repeat(201);
    let longest = "a".repeat(200);
    #[rustfmt::skip]
    let names: &[(&str, Result<(), T>)] = &[
        ("", Err(T::Empty)),
        (&long, Err(T::TooLong { len: 201 })),
        ("-lead", Err(T::LeadingDash)),
        ("-", Err(T::LeadingDash)),
        ("a b", Err(T::BadByte { byte: b' ', at: 1 })),
        ("tab\t", Err(T::BadByte { byte: b'\t', at: 3 })),
        ("crlf\r\n", Err(T::BadByte { byte: b'\r', at: 4 })),
        ("caf\u{e9}", Err(T::BadByte { byte: 0xc3, at: 3 })),
        ("a*b", Err(T::BadByte { byte: b'*', at: 1 })),
        ("a:b", Err(T::BadByte { byte: b':', at: 1 })),
        (&longest, Ok(())),
        ("a-", Ok(())),
        ("AZaz09-+/;.$_()", Ok(())),
    ];
    for (name, want) in names {
        assert_eq!(validate_tube(name), *want, "{name:?}");
        let cmds = [
            C::Use { tube: name },
            C::Watch { tube: name },
            C::Ignore { tube: name },
            C::StatsTube { tube: name },
            C::PauseTube {
                tube: name,
                delay: u32::MAX,
            },
        ];
        for cmd in cmds {
            let got = encode(&cmd, DEFAULT_MAX_JOB_SIZE);
            match want {
                Err(e) => assert_eq!(got, Err(EncodeError::BadTubeName(*e)), "{cmd:?}"),
                Ok(()) => {
                    let bytes = got.unwrap();
                    assert!(bytes.len() <= MAX_LINE, "{cmd:?}");
                }
            }
        }
    }
}

#[test]
fn longest_possible_line_fits_exactly() {
    // pause-tube with a 200-byte name and the largest delay is 224 bytes: the
    // limit is reachable, never exceeded by a valid command.
    let tube = "z".repeat(200);
    let got = encode(
        &C::PauseTube {
            tube: &tube,
            delay: u32::MAX,
        },
        10,
    )
    .unwrap();
    assert_eq!(got.len(), MAX_LINE);
}

#[test]
fn body_over_the_maximum_is_refused() {
    let body = [7u8; 11];
    #[rustfmt::skip]
    let cases: &[(usize, usize, Option<EncodeError>)] = &[
        (10, 11, Some(EncodeError::JobTooBig { size: 11, max: 10 })),
        (10, 10, None),
        (0, 1, Some(EncodeError::JobTooBig { size: 1, max: 0 })),
        (0, 0, None),
    ];
    for (max, len, want) in cases {
        let cmd = C::Put {
            pri: 1,
            delay: 0,
            ttr: 1,
            body: &body[..*len],
        };
        let got = encode(&cmd, *max);
        match want {
            Some(e) => {
                assert_eq!(got, Err(*e));
                assert_eq!(cmd.validate(*max), Err(*e));
            }
            None => assert_eq!(got.unwrap().len(), cmd.encoded_len()),
        }
    }
}

#[test]
fn buffer_too_small_reports_the_whole_need_at_every_size() {
    let cmds = [
        C::Put {
            pri: 1,
            delay: 2,
            ttr: 3,
            body: b"hello\r\nworld",
        },
        C::Release {
            id: 123,
            pri: 4,
            delay: 5,
        },
        C::Use { tube: "some-tube" },
        C::Quit,
    ];
    for cmd in cmds {
        let need = cmd.encoded_len();
        let mut buf = vec![0u8; need];
        for size in 0..need {
            assert_eq!(
                cmd.encode(&mut buf[..size], 100),
                Err(EncodeError::BufferTooSmall { needed: need }),
                "{cmd:?} into {size}"
            );
        }
        assert_eq!(cmd.encode(&mut buf, 100), Ok(need));
        let line = match cmd {
            C::Put { body, .. } => need - body.len() - 2,
            _ => need,
        };
        for size in 0..line {
            assert_eq!(
                cmd.encode_line(&mut buf[..size], 100),
                Err(EncodeError::BufferTooSmall { needed: line }),
                "{cmd:?} line into {size}"
            );
        }
    }
}

#[test]
fn whole_seconds_round_up() {
    use std::time::Duration as D;
    #[rustfmt::skip]
    let cases: &[(D, u32)] = &[
        (D::ZERO, 0),
        (D::from_nanos(1), 1),
        (D::from_millis(500), 1),
        (D::from_millis(1000), 1),
        (D::from_millis(1001), 2),
        (D::from_secs(u64::from(u32::MAX)), u32::MAX),
        (D::from_secs(u64::MAX), u32::MAX),
    ];
    for (d, want) in cases {
        assert_eq!(secs_ceil(*d), *want, "{d:?}");
    }
}

#[test]
fn reserve_timeouts_the_server_would_misread_are_refused() {
    // beanstalkd parses the seconds as a signed 32-bit integer.
    for timeout in [i32::MAX as u32 + 1, u32::MAX] {
        let cmd = C::ReserveWithTimeout { timeout };
        assert_eq!(
            encode(&cmd, 10),
            Err(EncodeError::OutOfRange {
                what: "reserve-with-timeout seconds",
                value: u64::from(timeout),
                max: i32::MAX as u64,
            })
        );
    }
    assert!(encode(
        &C::ReserveWithTimeout {
            timeout: taskq_proto::MAX_RESERVE_TIMEOUT
        },
        10
    )
    .is_ok());
}
