//! Shared by the targets: which command a reply answers, the limits, and
//! feeding a stream in fuzzer-chosen pieces. Not every target uses every item.
#![allow(dead_code)]

use taskq_proto::{CommandKind as K, Limits};

/// Every command kind; the first input byte picks one.
pub const KINDS: &[K] = &K::ALL;

/// Small limits, so that the fuzzer reaches the size checks with short inputs.
pub const LIMITS: Limits = Limits {
    max_job_size: 300,
    max_yaml_size: 500,
};

/// The command kind for a selector byte.
pub fn kind(b: u8) -> K {
    KINDS[usize::from(b) % KINDS.len()]
}

/// Splits a fuzz input into the stream and where its pieces end: the first
/// byte says how many cut bytes follow (at most 15), each cut byte places one
/// end proportionally in the stream; the last end is the stream's end.
pub fn pieces(ncuts: u8, rest: &[u8]) -> (&[u8], Vec<usize>) {
    let ncuts = usize::from(ncuts % 16).min(rest.len());
    let (cuts, input) = rest.split_at(ncuts);
    let mut ends: Vec<usize> = cuts
        .iter()
        .map(|&c| usize::from(c) * input.len() / 255)
        .collect();
    ends.push(input.len());
    ends.sort_unstable();
    (input, ends)
}

/// Feeds `input` to `parse` as a reader receiving it up to each of `ends` in
/// turn: every value parsed and its length, and the error that ends the
/// stream, if any.
pub fn read_pieces<'a, T, E>(
    input: &'a [u8],
    ends: &[usize],
    parse: impl Fn(&'a [u8]) -> Result<taskq_proto::Status<T>, E>,
) -> Vec<Result<(T, usize), E>> {
    let mut out = Vec::new();
    let mut start = 0;
    for &end in ends {
        loop {
            match parse(&input[start..end]) {
                Ok(taskq_proto::Status::Complete(v, n)) => {
                    assert!(n > 0 && start + n <= end);
                    out.push(Ok((v, n)));
                    start += n;
                }
                Ok(taskq_proto::Status::Partial) => break,
                Err(e) => {
                    out.push(Err(e));
                    return out;
                }
            }
        }
    }
    out
}

/// One read: copies what fits of `piece` into `room` and moves `piece` past
/// it; the bytes copied.
pub fn read_into(room: &mut [u8], piece: &mut &[u8]) -> usize {
    let n = room.len().min(piece.len());
    room[..n].copy_from_slice(&piece[..n]);
    *piece = &piece[n..];
    n
}

/// The pieces a reader receives `input` in: up to each of `ends` in turn,
/// each with the end it reaches.
pub fn each_piece<'a>(
    input: &'a [u8],
    ends: &'a [usize],
) -> impl Iterator<Item = (&'a [u8], usize)> {
    let mut start = 0;
    ends.iter().map(move |&end| {
        let piece = &input[start..end];
        start = end;
        (piece, end)
    })
}

/// A session a driver reads into: the room it gives, and what was put there.
pub trait Receiver {
    fn room(&mut self) -> Result<&mut [u8], String>;
    fn took(&mut self, n: usize);
}

impl Receiver for taskq_proto::Session {
    fn room(&mut self) -> Result<&mut [u8], String> {
        self.recv_room().map_err(|e| format!("{e:?}"))
    }

    fn took(&mut self, n: usize) {
        self.received(n);
    }
}

impl Receiver for taskq_proto::nats::NatsSession {
    fn room(&mut self) -> Result<&mut [u8], String> {
        self.recv_room().map_err(|e| format!("{e:?}"))
    }

    fn took(&mut self, n: usize) {
        self.received(n);
    }
}

/// One read as a driver makes it: what fits of `piece` into the session's
/// room (`piece` moves past it). `Err`: the session gave no room, its error
/// as shown.
pub fn receive(s: &mut impl Receiver, piece: &mut &[u8]) -> Result<(), String> {
    let room = s.room()?;
    let n = read_into(room, piece);
    s.took(n);
    Ok(())
}
