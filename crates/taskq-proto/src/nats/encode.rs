//! Client operations encoded into caller-owned buffers, and [`PutEncoder`],
//! the put hot path that keeps what repeats from one publish to the next.

use super::error::NatsEncodeError;

/// Headers a publish carries: the JetStream dedup id and any extra pairs
/// (taskq's own `Taskq-*` headers).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Headers<'a> {
    /// `Nats-Msg-Id`: the server drops a second publish with the same id
    /// within the stream's duplicate window.
    pub msg_id: Option<&'a [u8]>,
    /// Further `(name, value)` headers, in order.
    pub extra: &'a [(&'a [u8], &'a [u8])],
}

/// What the client says about itself in `CONNECT`. Its `Debug` shows
/// which credentials it carries, never the password, token or JWT.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ConnectOptions<'a> {
    /// The connection's name, shown by the server's monitoring.
    pub name: &'a str,
    /// The client's version.
    pub version: &'a str,
    /// User and password, when the server requires them.
    pub user_pass: Option<(&'a str, &'a str)>,
    /// An authentication token, when the server requires one.
    pub token: Option<&'a str>,
    /// A user JWT (from a credentials file).
    pub jwt: Option<&'a str>,
    /// The public nkey (`U...`) whose seed signed the nonce (nkey authentication).
    pub nkey: Option<&'a str>,
    /// The server's nonce signed with the seed, base64url without padding.
    pub sig: Option<&'a str>,
    /// True when the connection is encrypted.
    pub tls_required: bool,
}

impl std::fmt::Debug for ConnectOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hidden = |v: Option<&str>| v.map(|_| "***");
        f.debug_struct("ConnectOptions")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("user", &self.user_pass.map(|(u, _)| u))
            .field("pass", &hidden(self.user_pass.map(|(_, p)| p)))
            .field("token", &hidden(self.token))
            .field("jwt", &hidden(self.jwt))
            .field("nkey", &self.nkey)
            .field("tls_required", &self.tls_required)
            .finish_non_exhaustive()
    }
}

impl Default for ConnectOptions<'_> {
    fn default() -> Self {
        ConnectOptions {
            name: "taskq",
            version: env!("CARGO_PKG_VERSION"),
            user_pass: None,
            token: None,
            jwt: None,
            nkey: None,
            sig: None,
            tls_required: false,
        }
    }
}

/// Checks that `s` can stand as a subject (or reply subject) on a protocol
/// line: not empty, no blank, control byte or DEL.
pub fn validate_subject(s: &[u8]) -> Result<(), NatsEncodeError> {
    // Folded without an early exit, so that the loop is vectorized: every
    // ack's subject and reply go through here.
    let bad = s
        .iter()
        .fold(false, |bad, &b| bad | (b <= b' ') | (b == 0x7f));
    if s.is_empty() || bad {
        return Err(NatsEncodeError::BadSubject);
    }
    Ok(())
}

fn validate_header(name: &[u8], value: &[u8]) -> Result<(), NatsEncodeError> {
    let bad_name = name.is_empty() || name.iter().any(|&b| b <= b' ' || b == b':' || b == 0x7f);
    if bad_name || value.iter().any(|&b| b == b'\r' || b == b'\n') {
        return Err(NatsEncodeError::BadHeader);
    }
    Ok(())
}

/// Appends a JSON string literal of `s`.
pub(crate) fn json_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    for &b in s.as_bytes() {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0..=0x1f => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 15)]);
            }
            _ => out.push(b),
        }
    }
    out.push(b'"');
}

/// Appends `CONNECT {json}`: not verbose, not pedantic, headers and no-responders on.
pub fn encode_connect(out: &mut Vec<u8>, opts: &ConnectOptions<'_>) {
    out.extend_from_slice(b"CONNECT {\"verbose\":false,\"pedantic\":false,\"tls_required\":");
    out.extend_from_slice(if opts.tls_required { b"true" } else { b"false" });
    out.extend_from_slice(
        b",\"headers\":true,\"no_responders\":true,\"protocol\":1,\"lang\":\"rust\",\"version\":",
    );
    json_str(out, opts.version);
    out.extend_from_slice(b",\"name\":");
    json_str(out, opts.name);
    if let Some((user, pass)) = opts.user_pass {
        out.extend_from_slice(b",\"user\":");
        json_str(out, user);
        out.extend_from_slice(b",\"pass\":");
        json_str(out, pass);
    }
    if let Some(token) = opts.token {
        out.extend_from_slice(b",\"auth_token\":");
        json_str(out, token);
    }
    for (key, value) in [
        (&b",\"jwt\":"[..], opts.jwt),
        (b",\"nkey\":", opts.nkey),
        (b",\"sig\":", opts.sig),
    ] {
        if let Some(v) = value {
            out.extend_from_slice(key);
            json_str(out, v);
        }
    }
    out.extend_from_slice(b"}\r\n");
}

fn num(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

fn subject_and_reply(
    out: &mut Vec<u8>,
    op: &[u8],
    subject: &[u8],
    reply: Option<&[u8]>,
) -> Result<(), NatsEncodeError> {
    validate_subject(subject)?;
    if let Some(r) = reply {
        validate_subject(r)?;
    }
    out.extend_from_slice(op);
    out.extend_from_slice(subject);
    out.push(b' ');
    if let Some(r) = reply {
        out.extend_from_slice(r);
        out.push(b' ');
    }
    Ok(())
}

fn check_size(size: usize, max: usize) -> Result<(), NatsEncodeError> {
    if size > max {
        return Err(NatsEncodeError::PayloadTooLarge { size, max });
    }
    Ok(())
}

/// Appends `PUB <subject> [reply] <n>\r\n<payload>\r\n`.
pub fn encode_pub(
    out: &mut Vec<u8>,
    subject: &[u8],
    reply: Option<&[u8]>,
    payload: &[u8],
    max_payload: usize,
) -> Result<(), NatsEncodeError> {
    check_size(payload.len(), max_payload)?;
    subject_and_reply(out, b"PUB ", subject, reply)?;
    num(out, payload.len() as u64);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\r\n");
    Ok(())
}

/// The length of the header block `headers` encodes to.
fn header_len(headers: &Headers<'_>) -> Result<usize, NatsEncodeError> {
    let mut n = b"NATS/1.0\r\n".len() + 2;
    if let Some(id) = headers.msg_id {
        validate_header(b"Nats-Msg-Id", id)?;
        n += b"Nats-Msg-Id: \r\n".len() + id.len();
    }
    for (k, v) in headers.extra {
        validate_header(k, v)?;
        n += k.len() + v.len() + 4;
    }
    Ok(n)
}

fn header_block(out: &mut Vec<u8>, headers: &Headers<'_>) {
    out.extend_from_slice(b"NATS/1.0\r\n");
    if let Some(id) = headers.msg_id {
        out.extend_from_slice(b"Nats-Msg-Id: ");
        out.extend_from_slice(id);
        out.extend_from_slice(b"\r\n");
    }
    for (k, v) in headers.extra {
        out.extend_from_slice(k);
        out.extend_from_slice(b": ");
        out.extend_from_slice(v);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Appends `HPUB <subject> [reply] <hdr n> <total n>\r\n<headers><payload>\r\n`.
pub fn encode_hpub(
    out: &mut Vec<u8>,
    subject: &[u8],
    reply: Option<&[u8]>,
    headers: &Headers<'_>,
    payload: &[u8],
    max_payload: usize,
) -> Result<(), NatsEncodeError> {
    let hn = header_len(headers)?;
    check_size(hn.saturating_add(payload.len()), max_payload)?;
    subject_and_reply(out, b"HPUB ", subject, reply)?;
    num(out, hn as u64);
    out.push(b' ');
    num(out, (hn + payload.len()) as u64);
    out.extend_from_slice(b"\r\n");
    header_block(out, headers);
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\r\n");
    Ok(())
}

/// Appends `SUB <subject> <sid>`.
pub fn encode_sub(out: &mut Vec<u8>, subject: &[u8], sid: u64) -> Result<(), NatsEncodeError> {
    subject_and_reply(out, b"SUB ", subject, None)?;
    num(out, sid);
    out.extend_from_slice(b"\r\n");
    Ok(())
}

/// Appends `UNSUB <sid> [max]`.
pub fn encode_unsub(out: &mut Vec<u8>, sid: u64, max: Option<u64>) {
    out.extend_from_slice(b"UNSUB ");
    num(out, sid);
    if let Some(m) = max {
        out.push(b' ');
        num(out, m);
    }
    out.extend_from_slice(b"\r\n");
}

/// Appends `PING`.
pub fn encode_ping(out: &mut Vec<u8>) {
    out.extend_from_slice(b"PING\r\n");
}

/// Appends `PONG`.
pub fn encode_pong(out: &mut Vec<u8>) {
    out.extend_from_slice(b"PONG\r\n");
}

/// The put hot path: `HPUB <subject> <reply prefix><token> ...` where the
/// operation and subject part is kept from the last put and only the token,
/// lengths, message id and body are written anew. Its buffer keeps its
/// capacity, so a steady stream of puts allocates nothing.
///
/// ```
/// use taskq_proto::nats::{PutEncoder, Headers, encode_hpub};
/// let mut e = PutEncoder::new(b"_INBOX.abc.");
/// let put = e.encode(b"taskq.T", 7, b"id-1", &[], b"hello", 1 << 20).unwrap().to_vec();
/// let mut reference = Vec::new();
/// let h = Headers { msg_id: Some(b"id-1"), extra: &[] };
/// encode_hpub(&mut reference, b"taskq.T", Some(b"_INBOX.abc.7"), &h, b"hello", 1 << 20).unwrap();
/// assert_eq!(put, reference);
/// ```
#[derive(Debug, Clone)]
pub struct PutEncoder {
    buf: Vec<u8>,
    /// Bytes of `HPUB <subject> <reply prefix>` at the start of `buf`.
    prefix: usize,
    /// Where the subject sits in `buf` (it starts after `HPUB `).
    subject_end: usize,
    reply_prefix: Vec<u8>,
}

impl PutEncoder {
    /// An encoder whose reply subjects are `reply_prefix` followed by a token.
    pub fn new(reply_prefix: &[u8]) -> PutEncoder {
        PutEncoder {
            // Room for the line and headers of a put whose delay the server
            // holds (a subject of its own, its message id twice, three more
            // headers: about 260 bytes for a short tube), so that such puts
            // do not grow it either.
            buf: Vec::with_capacity(512),
            prefix: 0,
            subject_end: 0,
            reply_prefix: reply_prefix.to_vec(),
        }
    }

    /// Encodes the line and header block of a put (everything before the
    /// body); the body and `\r\n` follow it on the wire.
    pub fn head(
        &mut self,
        subject: &[u8],
        token: u64,
        msg_id: &[u8],
        extra: &[(&[u8], &[u8])],
        body_len: usize,
        max_payload: usize,
    ) -> Result<&[u8], NatsEncodeError> {
        let headers = Headers {
            msg_id: Some(msg_id),
            extra,
        };
        let hn = header_len(&headers)?;
        check_size(hn.saturating_add(body_len), max_payload)?;
        if self.prefix == 0 || &self.buf[5..self.subject_end] != subject {
            validate_subject(subject)?;
            validate_subject(&self.reply_prefix)?;
            self.buf.clear();
            self.buf.extend_from_slice(b"HPUB ");
            self.buf.extend_from_slice(subject);
            self.subject_end = self.buf.len();
            self.buf.push(b' ');
            self.buf.extend_from_slice(&self.reply_prefix);
            self.prefix = self.buf.len();
        }
        self.buf.truncate(self.prefix);
        num(&mut self.buf, token);
        self.buf.push(b' ');
        num(&mut self.buf, hn as u64);
        self.buf.push(b' ');
        num(&mut self.buf, (hn + body_len) as u64);
        self.buf.extend_from_slice(b"\r\n");
        header_block(&mut self.buf, &headers);
        Ok(&self.buf)
    }

    /// Encodes a whole put, body and final `\r\n` included.
    pub fn encode(
        &mut self,
        subject: &[u8],
        token: u64,
        msg_id: &[u8],
        extra: &[(&[u8], &[u8])],
        body: &[u8],
        max_payload: usize,
    ) -> Result<&[u8], NatsEncodeError> {
        self.head(subject, token, msg_id, extra, body.len(), max_payload)?;
        self.buf.extend_from_slice(body);
        self.buf.extend_from_slice(b"\r\n");
        Ok(&self.buf)
    }
}
