//! A producer over several servers, the way beanstalkd deployments scale past
//! one machine: each job goes to one server, chosen round-robin or by a key.

use std::net::ToSocketAddrs;

use taskq_proto::{validate_tube, EncodeError};

use crate::builder::Builder;
use crate::error::{Error, Invalid, Rejection};
use crate::producer::Producer;
use crate::{JobId, PutOptions};

/// Where a job went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    /// Index of the server (in the order the addresses were given).
    pub server: usize,
    /// The job's id on that server.
    pub id: JobId,
}

/// A producer over several servers.
///
/// A job goes to the next server in turn ([`put`](Self::put)) or to the one
/// its key hashes to ([`put_keyed`](Self::put_keyed)). A server that is down
/// (in its reconnect backoff) is skipped without waiting, and a job that was not
/// sent goes on to the next server. A job whose outcome is unknown is *not*
/// sent again elsewhere unless [`resend_unknown`](Self::resend_unknown) is set,
/// since it may already be queued.
#[derive(Debug)]
pub struct MultiProducer {
    servers: Vec<Producer>,
    next: usize,
    resend_unknown: bool,
}

impl MultiProducer {
    /// Connects to every server with the default settings. Each address is
    /// resolved once, here: one that does not resolve fails the whole call.
    /// Succeeds when at least one server is reachable; the others are
    /// retried as jobs come.
    pub fn connect<A: ToSocketAddrs>(addrs: &[A]) -> Result<MultiProducer, Error> {
        MultiProducer::with_builder(&Builder::default(), addrs)
    }

    /// Connects to every server with the builder's settings (its at-least-once
    /// setting is not used here: see [`resend_unknown`](Self::resend_unknown)).
    pub fn with_builder<A: ToSocketAddrs>(
        builder: &Builder,
        addrs: &[A],
    ) -> Result<MultiProducer, Error> {
        if addrs.is_empty() {
            return Err(Error::Invalid(Invalid::NoServers));
        }
        let mut servers = Vec::with_capacity(addrs.len());
        for a in addrs {
            // Each server is one beanstalkd, resolved as given.
            let resolved = a
                .to_socket_addrs()
                .map_err(|e| Error::NotSent(crate::NotSent::Io(e)))?
                .collect::<Vec<_>>();
            servers.push(builder.clone().build(resolved)?);
        }
        let mut last = None;
        let mut up = 0;
        for s in &mut servers {
            match s.connected(false) {
                Ok(_) => up += 1,
                Err(e) => last = Some(e),
            }
        }
        match (up, last) {
            (0, Some(e)) => Err(e),
            _ => Ok(MultiProducer {
                servers,
                next: 0,
                resend_unknown: false,
            }),
        }
    }

    /// Sends a job whose outcome is unknown on to the next server too
    /// (at-least-once across servers: it may then be queued twice).
    pub fn resend_unknown(mut self, yes: bool) -> Self {
        self.resend_unknown = yes;
        self
    }

    /// Puts later jobs into `tube` on every server. Servers that are down take
    /// the tube when they reconnect.
    pub fn use_tube(&mut self, tube: &str) -> Result<(), Error> {
        validate_tube(tube).map_err(|e| Error::from(EncodeError::BadTubeName(e)))?;
        for s in &mut self.servers {
            s.want_tube(tube);
        }
        Ok(())
    }

    /// Puts a job on the next server in turn, skipping servers that are down.
    pub fn put(&mut self, body: &[u8], opts: PutOptions) -> Result<Placed, Error> {
        let start = self.next;
        self.next = (self.next + 1) % self.servers.len();
        self.put_from(start, body, opts)
    }

    /// Puts a job on the server `key` hashes to (stable while the server list is),
    /// or on the next one up when that server is down.
    pub fn put_keyed(
        &mut self,
        key: &[u8],
        body: &[u8],
        opts: PutOptions,
    ) -> Result<Placed, Error> {
        let start = (fnv1a(key) % self.servers.len() as u64) as usize;
        self.put_from(start, body, opts)
    }

    /// The server a key hashes to.
    pub fn server_for(&self, key: &[u8]) -> usize {
        (fnv1a(key) % self.servers.len() as u64) as usize
    }

    /// The producers, one per server, in the order given.
    pub fn servers(&self) -> &[Producer] {
        &self.servers
    }

    fn put_from(&mut self, start: usize, body: &[u8], opts: PutOptions) -> Result<Placed, Error> {
        let max = self.servers[0].max_job_size();
        if body.len() > max {
            return Err(Error::from(EncodeError::JobTooBig {
                size: body.len(),
                max,
            }));
        }
        let n = self.servers.len();
        let mut last = None;
        // A server that may have stored the job: however the others fail,
        // the put is then unknown, never "not sent" (which promises a
        // re-send makes no second job) nor a later server's refusal.
        let mut unknown = None;
        for k in 0..n {
            let server = (start + k) % n;
            match self.servers[server].put_once(body, opts, false) {
                Ok(id) => return Ok(Placed { server, id }),
                Err(e @ Error::NotSent(_)) => last = Some(e),
                Err(e @ Error::Unknown(_)) if self.resend_unknown => unknown = Some(e),
                Err(e @ Error::Rejected(Rejection::InsertedBuried { .. })) => return Err(e),
                Err(e) => return Err(unknown.unwrap_or(e)),
            }
        }
        Err(unknown.or(last).expect("at least one server"))
    }
}

/// FNV-1a: small, stable across runs and platforms, and good enough to spread keys.
fn fnv1a(key: &[u8]) -> u64 {
    key.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
