//! Certificates for TLS tests, made with the `openssl` command in a
//! directory the test owns: a CA, a server certificate for 127.0.0.1 and
//! localhost, a client certificate, a second CA that signed none of them,
//! and a server certificate for another name only.
//!
//! Keys are P-256 (PKCS#8 PEM, `BEGIN PRIVATE KEY`), certificates are valid
//! for two days from now, and nothing depends on the system's OpenSSL
//! configuration: a minimal one is written beside them.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The PEM files [`TestCerts::generate`] wrote.
#[derive(Debug, Clone)]
pub struct TestCerts {
    /// The CA that signed every certificate below.
    pub ca: PathBuf,
    /// A second CA, unrelated to the others: trusting it alone trusts nothing here.
    pub other_ca: PathBuf,
    /// The server's certificate: subject alternative names IP:127.0.0.1 and DNS:localhost.
    pub server_cert: PathBuf,
    /// Its key.
    pub server_key: PathBuf,
    /// A client certificate (extended key usage clientAuth).
    pub client_cert: PathBuf,
    /// Its key.
    pub client_key: PathBuf,
    /// A server certificate signed by [`ca`](Self::ca) for `other.invalid` only.
    pub other_name_cert: PathBuf,
    /// Its key.
    pub other_name_key: PathBuf,
}

impl TestCerts {
    /// Writes the CAs, certificates and keys into `dir` (created if needed).
    pub fn generate(dir: &Path) -> io::Result<TestCerts> {
        std::fs::create_dir_all(dir)?;
        let conf = dir.join("openssl.cnf");
        std::fs::write(&conf, "[req]\ndistinguished_name = dn\n[dn]\n")?;
        let ca_ext = "basicConstraints=critical,CA:TRUE\n\
                      keyUsage=critical,keyCertSign,cRLSign\n\
                      subjectKeyIdentifier=hash\n";
        let leaf = |usage: &str, names: &str| {
            let mut ext = format!(
                "basicConstraints=critical,CA:FALSE\n\
                 keyUsage=critical,digitalSignature\n\
                 extendedKeyUsage={usage}\n"
            );
            if !names.is_empty() {
                ext.push_str(&format!("subjectAltName={names}\n"));
            }
            ext
        };
        let pki = Pki { dir, conf: &conf };
        let ca = pki.make("ca", "taskq test CA", None, ca_ext, 1)?;
        let other_ca = pki.make("other-ca", "taskq unrelated CA", None, ca_ext, 1)?;
        let server = pki.make(
            "server",
            "localhost",
            Some("ca"),
            &leaf("serverAuth", "IP:127.0.0.1,DNS:localhost"),
            2,
        )?;
        let client = pki.make(
            "client",
            "taskq test client",
            Some("ca"),
            &leaf("clientAuth", ""),
            3,
        )?;
        let other_name = pki.make(
            "other-name",
            "other.invalid",
            Some("ca"),
            &leaf("serverAuth", "DNS:other.invalid"),
            4,
        )?;
        Ok(TestCerts {
            ca: ca.0,
            other_ca: other_ca.0,
            server_cert: server.0,
            server_key: server.1,
            client_cert: client.0,
            client_key: client.1,
            other_name_cert: other_name.0,
            other_name_key: other_name.1,
        })
    }
}

struct Pki<'a> {
    dir: &'a Path,
    conf: &'a Path,
}

impl Pki<'_> {
    /// Makes `NAME.key` and `NAME.pem` with common name `cn`, signed by the
    /// key of `issuer` (its `.pem` and `.key`) or by itself.
    fn make(
        &self,
        name: &str,
        cn: &str,
        issuer: Option<&str>,
        ext: &str,
        serial: u32,
    ) -> io::Result<(PathBuf, PathBuf)> {
        let key = self.dir.join(format!("{name}.key"));
        let csr = self.dir.join(format!("{name}.csr"));
        let pem = self.dir.join(format!("{name}.pem"));
        let extfile = self.dir.join(format!("{name}.ext"));
        std::fs::write(&extfile, ext)?;
        openssl(
            Command::new("openssl")
                .args(["req", "-new", "-newkey", "ec"])
                .args(["-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"])
                .arg("-config")
                .arg(self.conf)
                .args(["-subj", &format!("/CN={cn}")])
                .arg("-keyout")
                .arg(&key)
                .arg("-out")
                .arg(&csr),
        )?;
        let mut sign = Command::new("openssl");
        sign.args(["x509", "-req", "-days", "2"])
            .args(["-set_serial", &serial.to_string()])
            .arg("-in")
            .arg(&csr)
            .arg("-extfile")
            .arg(&extfile)
            .arg("-out")
            .arg(&pem);
        match issuer {
            Some(i) => sign
                .arg("-CA")
                .arg(self.dir.join(format!("{i}.pem")))
                .arg("-CAkey")
                .arg(self.dir.join(format!("{i}.key"))),
            None => sign.arg("-signkey").arg(&key),
        };
        openssl(&mut sign)?;
        Ok((pem, key))
    }
}

/// Runs an `openssl` command; its error output becomes the error.
fn openssl(cmd: &mut Command) -> io::Result<()> {
    let out = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("cannot run openssl: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "openssl failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}
