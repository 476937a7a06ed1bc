//! JetStream's PubAck read by hand: a small JSON scanner that borrows its
//! strings and allocates nothing, tolerant of blanks and key order, and
//! skipping fields it does not know.

use super::error::NatsProtoError;

/// A successful publish: where the stream stored the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PubAckRef<'a> {
    /// The stream's name.
    pub stream: &'a [u8],
    /// The message's sequence number in the stream.
    pub seq: u64,
    /// True when the server had the message's id already (it was not stored again).
    pub duplicate: bool,
}

/// A JetStream API error object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiErrorRef<'a> {
    /// The HTTP-like status (`503`, `404`, ...).
    pub code: u64,
    /// JetStream's own error number (`10077`, ...); 0 when absent.
    pub err_code: u64,
    /// The description as it is in the JSON (escapes left as sent).
    pub description: &'a [u8],
}

/// A JetStream reply to a publish: a PubAck or an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsReply<'a> {
    /// The message was stored (or was a duplicate).
    Ack(PubAckRef<'a>),
    /// The server refused it.
    Error(ApiErrorRef<'a>),
}

impl<'a> JsReply<'a> {
    /// The PubAck, if it is one.
    pub fn ok(self) -> Option<PubAckRef<'a>> {
        match self {
            JsReply::Ack(a) => Some(a),
            JsReply::Error(_) => None,
        }
    }
}

/// Deepest nesting skipped in a value we do not read.
const MAX_DEPTH: u32 = 32;

struct Scan<'a> {
    s: &'a [u8],
    i: usize,
}

impl<'a> Scan<'a> {
    fn bad(&self) -> NatsProtoError {
        NatsProtoError::BadJson { at: self.i }
    }

    fn ws(&mut self) {
        while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\t' | b'\r' | b'\n') {
            self.i += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.s.get(self.i).copied()
    }

    fn eat(&mut self, b: u8) -> Result<(), NatsProtoError> {
        if self.peek() != Some(b) {
            return Err(self.bad());
        }
        self.i += 1;
        Ok(())
    }

    /// A string's raw contents (between its quotes, escapes as they are).
    fn string(&mut self) -> Result<&'a [u8], NatsProtoError> {
        self.eat(b'"')?;
        let start = self.i;
        while self.i < self.s.len() {
            match self.s[self.i] {
                b'"' => {
                    self.i += 1;
                    return Ok(&self.s[start..self.i - 1]);
                }
                b'\\' => self.i += 2,
                _ => self.i += 1,
            }
        }
        self.i = self.s.len();
        Err(self.bad())
    }

    /// An unsigned integer.
    fn u64(&mut self) -> Result<u64, NatsProtoError> {
        self.ws();
        let start = self.i;
        while self.i < self.s.len() && self.s[self.i].is_ascii_digit() {
            self.i += 1;
        }
        if matches!(self.s.get(self.i), Some(b'.' | b'e' | b'E')) {
            return Err(self.bad());
        }
        crate::reply::parse_u64(&self.s[start..self.i])
            .map_err(|_| NatsProtoError::BadJson { at: start })
    }

    fn word(&mut self, w: &[u8]) -> bool {
        self.ws();
        if self.s[self.i..].starts_with(w) {
            self.i += w.len();
            return true;
        }
        false
    }

    fn bool(&mut self) -> Result<bool, NatsProtoError> {
        if self.word(b"true") {
            Ok(true)
        } else if self.word(b"false") {
            Ok(false)
        } else {
            Err(self.bad())
        }
    }

    /// Skips any value.
    fn skip(&mut self, depth: u32) -> Result<(), NatsProtoError> {
        if depth > MAX_DEPTH {
            return Err(self.bad());
        }
        match self.peek() {
            Some(b'"') => self.string().map(|_| ()),
            Some(b'{') => self.object(|s, _| s.skip(depth + 1)),
            Some(b'[') => {
                self.i += 1;
                if self.peek() == Some(b']') {
                    self.i += 1;
                    return Ok(());
                }
                loop {
                    self.skip(depth + 1)?;
                    match self.peek() {
                        Some(b',') => self.i += 1,
                        Some(b']') => {
                            self.i += 1;
                            return Ok(());
                        }
                        _ => return Err(self.bad()),
                    }
                }
            }
            Some(b't' | b'f' | b'n') => {
                if self.word(b"true") || self.word(b"false") || self.word(b"null") {
                    Ok(())
                } else {
                    Err(self.bad())
                }
            }
            Some(b'-' | b'0'..=b'9') => {
                let start = self.i;
                while self.i < self.s.len()
                    && matches!(
                        self.s[self.i],
                        b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9'
                    )
                {
                    self.i += 1;
                }
                if self.i == start {
                    return Err(self.bad());
                }
                Ok(())
            }
            _ => Err(self.bad()),
        }
    }

    /// Reads an object, handing each key to `field`, which must consume its value.
    fn object(
        &mut self,
        mut field: impl FnMut(&mut Self, &'a [u8]) -> Result<(), NatsProtoError>,
    ) -> Result<(), NatsProtoError> {
        self.eat(b'{')?;
        if self.peek() == Some(b'}') {
            self.i += 1;
            return Ok(());
        }
        loop {
            let key = self.string()?;
            self.eat(b':')?;
            field(self, key)?;
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    return Ok(());
                }
                _ => return Err(self.bad()),
            }
        }
    }
}

/// Reads a JetStream publish reply: `{"stream":"S","seq":N[,"duplicate":true]}`
/// or `{"error":{"code":C,"err_code":E,"description":"..."}}`, blanks and key
/// order as they come, unknown fields skipped.
///
/// ```
/// use taskq_proto::nats::{parse_js_reply, JsReply};
/// let a = parse_js_reply(br#"{"stream":"TASKQ", "seq":2,"duplicate": true}"#).unwrap();
/// assert!(matches!(a, JsReply::Ack(a) if a.seq == 2 && a.duplicate && a.stream == b"TASKQ"));
/// let e = parse_js_reply(br#"{"error":{"code":503,"err_code":10077,"description":"x"}}"#).unwrap();
/// assert!(matches!(e, JsReply::Error(e) if e.code == 503 && e.err_code == 10077));
/// ```
pub fn parse_js_reply(json: &[u8]) -> Result<JsReply<'_>, NatsProtoError> {
    let mut s = Scan { s: json, i: 0 };
    let (mut stream, mut seq, mut duplicate, mut error) = (None, None, false, None);
    s.object(|s, key| {
        match key {
            b"stream" => stream = Some(s.string()?),
            b"seq" => seq = Some(s.u64()?),
            b"duplicate" => duplicate = s.bool()?,
            b"error" => {
                let (mut code, mut err_code, mut description) = (None, 0, &b""[..]);
                s.object(|s, key| {
                    match key {
                        b"code" => code = Some(s.u64()?),
                        b"err_code" => err_code = s.u64()?,
                        b"description" => description = s.string()?,
                        _ => s.skip(1)?,
                    }
                    Ok(())
                })?;
                error = Some(ApiErrorRef {
                    code: code.ok_or(NatsProtoError::MissingField { field: "code" })?,
                    err_code,
                    description,
                });
            }
            _ => s.skip(1)?,
        }
        Ok(())
    })?;
    if s.peek().is_some() {
        return Err(s.bad());
    }
    if let Some(e) = error {
        return Ok(JsReply::Error(e));
    }
    Ok(JsReply::Ack(PubAckRef {
        stream: stream.ok_or(NatsProtoError::MissingField { field: "stream" })?,
        seq: seq.ok_or(NatsProtoError::MissingField { field: "seq" })?,
        duplicate,
    }))
}

/// What taskq reads from a server's `INFO`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InfoRef<'a> {
    /// `server_id`.
    pub server_id: &'a [u8],
    /// `server_name`.
    pub server_name: &'a [u8],
    /// `max_payload`; 0 when absent.
    pub max_payload: u64,
    /// `headers`: whether the server takes `HPUB`.
    pub headers: bool,
    /// `jetstream`: whether JetStream is on.
    pub jetstream: bool,
    /// `version`: the server's release (`2.9.10`).
    pub version: &'a [u8],
    /// `nonce`: what the client signs for nkey and JWT authentication.
    pub nonce: &'a [u8],
    /// `tls_required`: the server takes only encrypted connections.
    pub tls_required: bool,
    /// `tls_available`: the server takes encrypted connections too.
    pub tls_available: bool,
    /// `auth_required`: the server wants credentials.
    pub auth_required: bool,
}

/// Reads an `INFO` object, handing each of its `connect_urls` to `url`.
///
/// ```
/// let mut urls = Vec::new();
/// let i = taskq_proto::nats::parse_info(
///     br#"{"server_id":"N1","max_payload":1048576,"headers":true,"connect_urls":["127.0.0.1:4223"]}"#,
///     |u| urls.push(u.to_vec()),
/// ).unwrap();
/// assert_eq!((i.server_id, i.max_payload, i.headers), (&b"N1"[..], 1 << 20, true));
/// assert!(!i.tls_required && i.nonce.is_empty());
/// assert_eq!(urls, [b"127.0.0.1:4223".to_vec()]);
/// ```
pub fn parse_info<'a>(
    json: &'a [u8],
    mut url: impl FnMut(&'a [u8]),
) -> Result<InfoRef<'a>, NatsProtoError> {
    let mut s = Scan { s: json, i: 0 };
    let mut info = InfoRef::default();
    s.object(|s, key| {
        match key {
            b"server_id" => info.server_id = s.string()?,
            b"server_name" => info.server_name = s.string()?,
            b"max_payload" => info.max_payload = s.u64()?,
            b"headers" => info.headers = s.bool()?,
            b"jetstream" => info.jetstream = s.bool()?,
            b"version" => info.version = s.string()?,
            b"nonce" => info.nonce = s.string()?,
            b"tls_required" => info.tls_required = s.bool()?,
            b"tls_available" => info.tls_available = s.bool()?,
            b"auth_required" => info.auth_required = s.bool()?,
            b"connect_urls" => {
                s.eat(b'[')?;
                if s.peek() == Some(b']') {
                    s.i += 1;
                    return Ok(());
                }
                loop {
                    url(s.string()?);
                    match s.peek() {
                        Some(b',') => s.i += 1,
                        Some(b']') => {
                            s.i += 1;
                            return Ok(());
                        }
                        _ => return Err(s.bad()),
                    }
                }
            }
            _ => s.skip(1)?,
        }
        Ok(())
    })?;
    Ok(info)
}
