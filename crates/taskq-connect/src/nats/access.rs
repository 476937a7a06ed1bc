//! [`NatsAccess`]: how a client proves who it is to a NATS server and how it
//! encrypts the connection. One type for every taskq part that connects (the
//! producers, the worker, the `taskq` command), so that each reads the same
//! settings the same way. Libraries take it as given: only the commands read
//! flags, the environment and `nats` CLI contexts into it.

use std::path::PathBuf;

use taskq_proto::nats::session::{Credentials, Signed};
use taskq_proto::Secret;

use crate::address::{Address, UserInfo};

/// Credentials and TLS settings for a NATS connection.
///
/// At most one way of authenticating is used, in this order: a credentials
/// file (`jwt` and `sig`), an nkey seed file (`nkey` and `sig`), a user and
/// password, a token. `Debug` never shows a password or token; files are
/// read at each connect, so rotated credentials are picked up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NatsAccess {
    /// User and password (`user`, `pass` in `CONNECT`).
    pub user: Option<(String, Secret)>,
    /// A token (`auth_token`).
    pub token: Option<Secret>,
    /// A file holding an nkey seed (`SU...`): the server's nonce is signed with it.
    pub nkey_file: Option<PathBuf>,
    /// A JWT user credentials file (`.creds`: the user JWT and its nkey seed).
    pub creds_file: Option<PathBuf>,
    /// TLS.
    pub tls: TlsSettings,
}

/// How the connection is encrypted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// Refuse a server that does not offer TLS (a `tls://` address, or any
    /// TLS file given). A server whose `INFO` says `tls_required` gets TLS
    /// whatever this says.
    pub required: bool,
    /// Start with the TLS handshake, before the server's `INFO` (the server's
    /// `handshake_first`, nats-server 2.10.4 and later).
    pub first: bool,
    /// PEM file of the certificate authorities to trust; `None`: the system's.
    pub ca_file: Option<PathBuf>,
    /// PEM file of the client's certificate chain, for mutual TLS.
    pub cert_file: Option<PathBuf>,
    /// PEM file of the client certificate's private key.
    pub key_file: Option<PathBuf>,
    /// The nodes this client found speaking TLS, held to it from then on
    /// (a later `INFO` that asks for no TLS is refused, not believed): see
    /// [`TlsPins`](crate::nats::TlsPins). Shared by the settings' clones.
    pub seen: crate::nats::TlsPins,
}

impl TlsSettings {
    /// True when TLS must be used whatever the server offers.
    pub fn wanted(&self) -> bool {
        self.required
            || self.first
            || self.ca_file.is_some()
            || self.cert_file.is_some()
            || self.key_file.is_some()
    }
}

impl NatsAccess {
    /// These settings for `addr`: its user info takes the place of any user,
    /// password or token given here, and `tls://` requires TLS.
    pub fn for_address(&self, addr: &Address) -> NatsAccess {
        let mut a = self.clone();
        match addr.user_info() {
            Some(UserInfo::UserPass { user, pass }) => {
                a.user = Some((user.clone(), pass.clone()));
                a.token = None;
            }
            Some(UserInfo::Token(t)) => {
                a.token = Some(t.clone());
                a.user = None;
            }
            None => {}
        }
        a.tls.required |= addr.requires_tls();
        a
    }

    /// What `CONNECT` carries of these settings, with the nonce's signature
    /// where one was made, named in errors as `describe` says.
    pub fn credentials<'a>(
        &'a self,
        signed: Option<&'a Signed>,
        describe: &'a str,
    ) -> Credentials<'a> {
        Credentials {
            user: self.user.as_ref().map(|(u, p)| (u.as_str(), p)),
            token: self.token.as_ref(),
            signed,
            describe,
        }
    }

    /// What authenticates, for messages: `user alice`, `token`, `nkey file
    /// PATH`, `credentials file PATH`, or `none`. Never a secret.
    pub fn describe(&self) -> String {
        if let Some(p) = &self.creds_file {
            format!("credentials file {}", p.display())
        } else if let Some(p) = &self.nkey_file {
            format!("nkey file {}", p.display())
        } else if let Some((u, _)) = &self.user {
            format!("user {u}")
        } else if self.token.is_some() {
            "token".into()
        } else {
            "none".into()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_address_user_info_wins_and_tls_scheme_requires_tls() {
        let base = NatsAccess {
            token: Some(Secret::new("envtoken")),
            ..NatsAccess::default()
        };
        let a = base.for_address(&Address::parse("tls://bob:pw@h:1").unwrap());
        assert_eq!(a.user, Some(("bob".into(), Secret::new("pw"))));
        assert_eq!(a.token, None);
        assert!(a.tls.required && a.tls.wanted());
        let b = base.for_address(&Address::parse("nats://h:1").unwrap());
        assert_eq!(b, base);
        assert!(!b.tls.wanted());
        assert_eq!(b.describe(), "token");
        assert!(!format!("{b:?}").contains("envtoken"));
    }
}
