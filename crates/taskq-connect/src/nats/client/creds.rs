//! Nkey and JWT authentication: the server's `INFO` carries a `nonce`; the
//! client signs its bytes with the ed25519 key of an nkey seed and sends the
//! signature (base64url, no padding) in `CONNECT`, with the public nkey (an
//! nkey seed file) or the user JWT (a `.creds` file) beside it.
//!
//! Files are read at each connect, so rotated credentials are picked up;
//! their contents never reach an error message.

use std::path::Path;

use crate::nats::access::NatsAccess;
use taskq_proto::Secret;

use super::NatsError;
use taskq_proto::nats::session::Signed;

/// Signs `nonce` with the credentials file or nkey seed file of `access`;
/// `None` when neither is given.
pub(crate) fn sign(access: &NatsAccess, nonce: &[u8]) -> Result<Option<Signed>, NatsError> {
    let (jwt, seed, path) = if let Some(path) = &access.creds_file {
        let text = read(path)?;
        let (jwt, seed) = parse_creds(text.expose()).ok_or_else(|| {
            NatsError::Credentials(format!(
                "{}: not a NATS credentials file (want a NATS USER JWT block and a USER NKEY SEED block)",
                path.display()
            ))
        })?;
        (Some(Secret::new(jwt)), Secret::new(seed), path)
    } else if let Some(path) = &access.nkey_file {
        let text = read(path)?;
        let seed = seed_in(text.expose()).ok_or_else(|| {
            NatsError::Credentials(format!(
                "{}: no nkey seed (a line starting SU)",
                path.display()
            ))
        })?;
        (None, Secret::new(seed), path)
    } else {
        return Ok(None);
    };
    if nonce.is_empty() {
        return Err(NatsError::Credentials(
            "the server sent no nonce to sign (is nkey or JWT authentication on?)".into(),
        ));
    }
    let key = nkeys::KeyPair::from_seed(seed.expose()).map_err(|_| {
        NatsError::Credentials(format!("{}: the nkey seed is not valid", path.display()))
    })?;
    let sig = key
        .sign(nonce)
        .map_err(|_| NatsError::Credentials(format!("{}: the seed cannot sign", path.display())))?;
    Ok(Some(Signed {
        nkey: jwt.is_none().then(|| key.public_key()),
        jwt,
        sig: base64url(&sig),
    }))
}

fn read(path: &Path) -> Result<Secret, NatsError> {
    std::fs::read_to_string(path)
        .map(Secret::new)
        .map_err(|e| NatsError::Credentials(format!("cannot read {}: {e}", path.display())))
}

/// The first line of `text` that is a user seed (`SU...`), trimmed.
fn seed_in(text: &str) -> Option<&str> {
    text.lines().map(str::trim).find(|l| l.starts_with("SU"))
}

/// The JWT and the seed of a `.creds` file: the first two tokens framed by
/// lines of dashes (`-----BEGIN NATS USER JWT-----`, `------END ...------`).
pub(crate) fn parse_creds(text: &str) -> Option<(&str, &str)> {
    let mut tokens = Vec::with_capacity(2);
    let mut lines = text.lines().map(str::trim);
    while let Some(line) = lines.next() {
        if !is_frame(line) {
            continue;
        }
        let token = lines.by_ref().find(|l| !l.is_empty())?;
        if is_frame(token) {
            return None;
        }
        match lines.by_ref().find(|l| !l.is_empty()) {
            Some(close) if is_frame(close) => tokens.push(token),
            _ => return None,
        }
        if tokens.len() == 2 {
            break;
        }
    }
    match tokens[..] {
        [jwt, seed] if seed.starts_with("SU") => Some((jwt, seed)),
        _ => None,
    }
}

/// A line of three or more dashes, some text, and three or more dashes.
fn is_frame(line: &str) -> bool {
    line.len() > 6 && line.starts_with("---") && line.ends_with("---")
}

/// Base64url without padding (RFC 4648 section 5).
pub(crate) fn base64url(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(char::from(ABC[(n >> (18 - 6 * i) & 63) as usize]));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64url_matches_rfc_4648_vectors_without_padding() {
        let table: &[(&[u8], &str)] = &[
            (b"", ""),
            (b"f", "Zg"),
            (b"fo", "Zm8"),
            (b"foo", "Zm9v"),
            (b"foob", "Zm9vYg"),
            (b"fooba", "Zm9vYmE"),
            (b"foobar", "Zm9vYmFy"),
            (&[0xfb, 0xff], "-_8"),
        ];
        for (raw, want) in table {
            assert_eq!(base64url(raw), *want);
        }
    }

    #[test]
    fn a_creds_file_gives_its_jwt_and_seed() {
        let text = "-----BEGIN NATS USER JWT-----\neyJ0eXAi.eyJqdGki.c2ln\n------END NATS USER JWT------\n\n\
************************* IMPORTANT *************************\nNKEY Seed printed below can be used to sign and prove identity.\n\n\
-----BEGIN USER NKEY SEED-----\nSUAIBDPBAUTWCWBKIO6XHQNINK5FWJW4OHLXC3HQ2KFE4PEJUA44CNHTC4\n------END USER NKEY SEED------\n\n*************************************************************\n";
        assert_eq!(
            parse_creds(text),
            Some((
                "eyJ0eXAi.eyJqdGki.c2ln",
                "SUAIBDPBAUTWCWBKIO6XHQNINK5FWJW4OHLXC3HQ2KFE4PEJUA44CNHTC4"
            ))
        );
        assert_eq!(parse_creds("no frames at all"), None);
        assert_eq!(
            parse_creds("-----BEGIN NATS USER JWT-----\neyJ\n------END NATS USER JWT------\n"),
            None
        );
        // A block left open is not a token.
        assert_eq!(parse_creds("-----BEGIN X-----\neyJ\n"), None);
    }

    #[test]
    fn an_nkey_signature_verifies_with_the_public_key() {
        let user = nkeys::KeyPair::new_user();
        let dir = std::env::temp_dir().join(format!("taskq-nkey-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("user.nk");
        std::fs::write(&path, format!("{}\n", user.seed().unwrap())).unwrap();
        let access = NatsAccess {
            nkey_file: Some(path.clone()),
            ..NatsAccess::default()
        };
        let s = sign(&access, b"NONCE123").unwrap().unwrap();
        assert_eq!(s.nkey.as_deref(), Some(user.public_key().as_str()));
        assert!(s.jwt.is_none());
        assert_eq!(s.sig.len(), 86, "64 bytes, base64url without padding");
        let raw = decode64url(&s.sig);
        assert!(user.verify(b"NONCE123", &raw).is_ok());
        // A file that holds no seed: an error naming the file, not its contents.
        std::fs::write(&path, "not a seed\n").unwrap();
        let e = sign(&access, b"n").err().unwrap().to_string();
        assert!(e.contains("user.nk") && !e.contains("not a seed"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn decode64url(s: &str) -> Vec<u8> {
        let abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut bits = 0u32;
        let mut n = 0;
        let mut out = Vec::new();
        for c in s.chars() {
            bits = bits << 6 | abc.find(c).unwrap() as u32;
            n += 6;
            if n >= 8 {
                n -= 8;
                out.push((bits >> n) as u8);
            }
        }
        out
    }
}
