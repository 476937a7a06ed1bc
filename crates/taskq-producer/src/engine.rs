//! The engine seam on the producer side: what [`Producer`](crate::Producer)
//! needs of a connection (open and restore the tube, put, a batch in one
//! write, a put with its tube's statistics), in the producer's words. The
//! producer keeps the reconnect rule, at-least-once re-sends and the batch's
//! chunking; an engine owns the wire protocol and says what each reply means.
//!
//! One variant per engine, so each put costs one match (which the compiler
//! drops while there is one engine): no boxing, no allocation, no extra write.

use std::net::SocketAddr;

use taskq_proto::{Command, Connection, ConnectionConfig, IoCounts, Reply, TubeStats};

use crate::classify::Chunk;
use crate::classify::{
    chunk_write_failed, not_inserted, read_chunk, use_failed_on_reconnect, using,
};
use crate::error::Error;
use crate::nats::{NatsLink, NatsSetup};
use crate::outcome::{BatchError, BatchReport, PutOutcome};
use crate::{JobId, PutOptions};

/// A producer's connection to one server, by engine.
#[derive(Debug)]
// One link per producer: its size does not matter, and boxing the
// beanstalkd connection (its inline send buffer) would put a pointer chase
// on every put.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Link {
    /// beanstalkd: each put is `put` answered `INSERTED <id>`.
    Beanstalkd(Connection),
    /// JetStream: each put is a publish answered by the stream's PubAck.
    Nats(NatsLink),
}

impl Link {
    /// Connects to the first address that accepts and restores the tube in use
    /// (`None`: the engine's default). A failed restore is not sent: nothing of
    /// the caller's request left yet.
    pub(crate) fn open(
        addrs: &[SocketAddr],
        cfg: ConnectionConfig,
        tube: Option<&str>,
        nats: Option<&mut NatsSetup>,
    ) -> Result<Link, Error> {
        if let Some(setup) = nats {
            let ncfg = crate::nats::nats_config(&cfg);
            return NatsLink::open(addrs, ncfg, setup, tube.unwrap_or("default")).map(Link::Nats);
        }
        let mut link = Connection::connect(addrs, cfg)
            .map(Link::Beanstalkd)
            .map_err(Error::from_conn)?;
        if let Some(t) = tube {
            link.use_tube(t)
                .map_err(|e| use_failed_on_reconnect(t, e))?;
        }
        Ok(link)
    }

    /// True once the connection must be replaced.
    #[inline]
    pub(crate) fn is_broken(&self) -> bool {
        match self {
            Link::Beanstalkd(c) => c.is_broken(),
            Link::Nats(n) => n.is_broken(),
        }
    }

    /// System calls made so far.
    pub(crate) fn io_counts(&self) -> IoCounts {
        match self {
            Link::Beanstalkd(c) => c.io_counts(),
            Link::Nats(n) => n.io_counts(),
        }
    }

    /// Closes the connection politely.
    pub(crate) fn quit(self) {
        match self {
            Link::Beanstalkd(c) => c.quit(),
            Link::Nats(n) => n.quit(),
        }
    }

    /// Puts later jobs into `tube`. A reply out of step breaks the link.
    pub(crate) fn use_tube(&mut self, tube: &str) -> Result<(), Error> {
        match self {
            Link::Beanstalkd(c) => {
                let r = using(c.request(&Command::Use { tube }), tube);
                mark_if_out_of_step(c, &r);
                r
            }
            Link::Nats(n) => {
                n.use_tube(tube);
                Ok(())
            }
        }
    }

    /// One put: one write, one read. An unknown outcome breaks the link.
    #[inline(always)]
    pub(crate) fn put(&mut self, body: &[u8], opts: PutOptions) -> Result<JobId, Error> {
        match self {
            Link::Beanstalkd(c) => {
                if let Err(e) = c.send(&opts.command(body)) {
                    return Err(send_failed(e));
                }
                // `INSERTED` returns straight away; anything else is sorted on a
                // cold path, so the hot path carries no error handling.
                match c.recv() {
                    Ok(Reply::Inserted { id }) => Ok(JobId::new(id)),
                    other => {
                        let e = not_inserted(other);
                        Err(out_of_step(c, e))
                    }
                }
            }
            Link::Nats(n) => n.put(body, opts),
        }
    }

    /// Sends `chunk` in one write and reads its replies in order into
    /// `out[from..end]`. On a break, every job from the break on is
    /// `Unknown` (or `NotSent` when the write sent nothing) in `out`.
    pub(crate) fn put_chunk<B: AsRef<[u8]>>(
        &mut self,
        chunk: Chunk<'_, B>,
        out: &mut [PutOutcome],
        report: &mut BatchReport,
    ) -> Result<(), BatchError> {
        match self {
            Link::Beanstalkd(c) => {
                if let Err(e) = chunk.queue_puts(|cmd| c.queue(cmd)) {
                    c.clear_queue();
                    return Err(e);
                }
                if let Err(e) = c.flush() {
                    return Err(chunk_write_failed(Error::from_conn(e), out, chunk.span()));
                }
                read_chunk(out, report, chunk.span(), || put_reply(c))
            }
            Link::Nats(n) => n.put_chunk(chunk, out, report),
        }
    }

    /// A put and its tube's ready count right after it, in one write: the
    /// put's result, and the count when its reply came.
    pub(crate) fn put_with_ready(
        &mut self,
        body: &[u8],
        opts: PutOptions,
        tube: &str,
    ) -> (Result<JobId, Error>, Option<u64>) {
        match self {
            Link::Beanstalkd(c) => {
                let sent = c
                    .queue(&opts.command(body))
                    .and_then(|()| c.queue(&Command::StatsTube { tube }))
                    .and_then(|()| c.flush());
                let id = match sent {
                    Ok(()) => put_reply(c),
                    Err(e) => {
                        c.clear_queue();
                        Err(Error::from_conn(e))
                    }
                };
                // The statistics reply follows whatever the put got, unless the stream broke.
                let ready = if c.is_broken() {
                    None
                } else {
                    match c.recv() {
                        Ok(Reply::Ok { yaml }) => {
                            TubeStats::parse(yaml).ok().map(|s| s.current_jobs_ready)
                        }
                        _ => None,
                    }
                };
                (id, ready)
            }
            // A stream keeps no per-tube ready count a put could ask for in
            // the same write: the id alone.
            Link::Nats(n) => (n.put(body, opts), None),
        }
    }
}

/// Reads a put's reply: the id, or the rejection; out of step breaks the connection.
#[inline]
fn put_reply(conn: &mut Connection) -> Result<JobId, Error> {
    let r = match conn.recv() {
        Ok(Reply::Inserted { id }) => return Ok(JobId::new(id)),
        other => Err(not_inserted(other)),
    };
    mark_if_out_of_step(conn, &r);
    r
}

/// A put whose write failed (the connection marked itself broken).
#[cold]
fn send_failed(e: taskq_proto::ConnectionError) -> Error {
    Error::from_conn(e)
}

/// A put answered with anything but `INSERTED`: an unknown outcome puts the
/// stream out of step, so the connection is given up.
#[cold]
fn out_of_step(conn: &mut Connection, e: Error) -> Error {
    if matches!(e, Error::Unknown(_)) {
        conn.mark_broken();
    }
    e
}

fn mark_if_out_of_step<T>(conn: &mut Connection, r: &Result<T, Error>) {
    if matches!(r, Err(Error::Unknown(_))) {
        conn.mark_broken();
    }
}
