//! JetStream acknowledgements: what a delivery's ack subject says about it,
//! and the bodies that settle it.

use std::time::Duration;

use super::error::NatsProtoError;

/// What a delivered message's ack subject tells: where it is in the stream,
/// and how often it was delivered. Borrows the subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckInfo<'a> {
    /// The JetStream domain of the 12-token form; `None` in the 9-token form
    /// or when it is `_` (no domain).
    pub domain: Option<&'a [u8]>,
    /// The stream.
    pub stream: &'a [u8],
    /// The consumer.
    pub consumer: &'a [u8],
    /// Delivery count: 1 on the first delivery.
    pub delivered: u64,
    /// The message's sequence number in the stream.
    pub stream_seq: u64,
    /// The delivery's sequence number in the consumer.
    pub consumer_seq: u64,
    /// When the message was stored, in nanoseconds since the Unix epoch.
    pub timestamp: u64,
    /// Messages still pending for the consumer after this one.
    pub pending: u64,
}

impl<'a> AckInfo<'a> {
    /// Parses `$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>`
    /// or the newer `$JS.ACK.<domain>.<account>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>[.<token>]`.
    ///
    /// ```
    /// use taskq_proto::nats::AckInfo;
    /// let a = AckInfo::parse(b"$JS.ACK.TASKQ.w.2.17.5.1700000000000000000.3").unwrap();
    /// assert_eq!((a.stream, a.delivered, a.stream_seq, a.pending), (&b"TASKQ"[..], 2, 17, 3));
    /// ```
    pub fn parse(subject: &'a [u8]) -> Result<AckInfo<'a>, NatsProtoError> {
        let bad = NatsProtoError::BadAckSubject;
        let rest = subject.strip_prefix(b"$JS.ACK.").ok_or(bad)?;
        let mut t: [&[u8]; 10] = [&[]; 10];
        let mut n = 0;
        // The tokens between dots (found vectorized: every delivery's ack
        // subject is read here).
        let mut start = 0;
        loop {
            let end = memchr::memchr(b'.', &rest[start..]).map_or(rest.len(), |k| start + k);
            let tok = &rest[start..end];
            if n == t.len() || tok.is_empty() {
                return Err(bad);
            }
            t[n] = tok;
            n += 1;
            if end == rest.len() {
                break;
            }
            start = end + 1;
        }
        let (domain, at) = match n {
            7 => (None, 0),
            9 | 10 => ((t[0] != b"_").then_some(t[0]), 2),
            _ => return Err(bad),
        };
        let num = |s: &[u8]| crate::reply::parse_u64(s).map_err(|_| bad);
        Ok(AckInfo {
            domain,
            stream: t[at],
            consumer: t[at + 1],
            delivered: num(t[at + 2])?,
            stream_seq: num(t[at + 3])?,
            consumer_seq: num(t[at + 4])?,
            timestamp: num(t[at + 5])?,
            pending: num(t[at + 6])?,
        })
    }
}

/// How to settle a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckKind {
    /// `+ACK`: done; the work queue drops the message.
    Ack,
    /// `-NAK`: deliver again, after `delay` when given.
    Nak {
        /// How long the server waits before redelivering.
        delay: Option<Duration>,
    },
    /// `+WPI`: still working; restarts the ack wait.
    InProgress,
    /// `+TERM`: never deliver again.
    Term,
}

impl AckKind {
    /// Appends this ack's body (`+ACK`, `-NAK {"delay":N}`, ...) to `out`.
    pub fn encode_body(&self, out: &mut Vec<u8>) {
        match self {
            AckKind::Ack => out.extend_from_slice(b"+ACK"),
            AckKind::Nak { delay: None } => out.extend_from_slice(b"-NAK"),
            AckKind::Nak { delay: Some(d) } => {
                out.extend_from_slice(b"-NAK {\"delay\":");
                let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
                out.extend_from_slice(itoa::Buffer::new().format(nanos).as_bytes());
                out.push(b'}');
            }
            AckKind::InProgress => out.extend_from_slice(b"+WPI"),
            AckKind::Term => out.extend_from_slice(b"+TERM"),
        }
    }
}
