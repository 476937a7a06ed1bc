//! The tokio driver of one JetStream server's machine ([`JsMachine`]). It
//! owns two connections, both taskq-connect's `AsyncNatsConn` (the same
//! handshake, TLS and credentials as every taskq client):
//! - the jobs' connection, on which the machine's pulls and acks are queued
//!   and written in one write a turn, and whose deliveries and
//!   confirmations are read as they come, the driver waking at the
//!   session's deadlines (a pull's probe, a reply overdue) as at the
//!   machine's;
//! - a second one for the management API: setting the stream and the
//!   consumers up, the copy a bury stores before its ack, and whether the
//!   consumers still have jobs out when an empty wait asks. A pull holds
//!   the jobs' connection's replies, so these requests cannot share it.
//!
//! Each turn of its loop, as the beanstalkd driver's: the slots' messages
//! and the stops to the machine; a connect when the machine wants one; the
//! management requests it asks for; what it queues written; then a wait for
//! bytes, a slot's message, a stop, or the machine's next deadline.

use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use taskq_connect::nats::MsgSelect;
use taskq_connect::tokio::AsyncNatsConn;
use taskq_connect::Address;
use taskq_proto::nats::{Delivery, NatsError};
use taskq_proto::{earliest, ConnectionError, IoCounts};
use tokio::time::Sleep;

use super::slot::{Inbox, SlotCell};
use super::Woke;
use crate::config::Config;
use crate::engine::nats::parts::{
    bury_copy_id, conn_error, connect_error, jobs_out, kept_headers, Tube,
};
use crate::engine::nats::{nats_config, seeds, set_up};
use crate::machine::js::{JsMachine, JsStep};
use crate::shared::Shared;

/// The two connections to one cluster.
struct Conns {
    jobs: AsyncNatsConn,
    api: Option<AsyncNatsConn>,
}

/// Runs server `server`'s JetStream machine until the worker stops and the
/// machine is done.
pub(super) async fn drive(
    sh: Arc<Shared>,
    server: usize,
    cells: Vec<Arc<SlotCell>>,
    inbox: Arc<Inbox>,
    idle: Arc<[AtomicBool]>,
) {
    let name = sh.cfg.servers[server].clone();
    let mut m = JsMachine::new(&sh, server, Instant::now());
    let mut conns: Option<Conns> = None;
    let mut learned: Vec<String> = Vec::new();
    let mut nth = server;
    let mut aborted = false;
    let mut seen = IoCounts::default();
    let mut sleep: std::pin::Pin<&mut Sleep> =
        pin!(tokio::time::sleep_until(tokio::time::Instant::now()));
    loop {
        let mut stopped = pin!(sh.stop_wake.notified());
        stopped.as_mut().enable();
        super::hand_over(&sh, &mut m, &cells, &inbox, &mut aborted);
        if m.is_done(&sh) {
            break;
        }
        if conns.is_none() && m.wants_connect(&sh, Instant::now()) {
            match open(&sh.cfg, &name, nth, &learned).await {
                Ok((c, stream, tubes)) => {
                    seen = c.jobs.io_counts();
                    learned = c.jobs.servers().to_vec();
                    inbox.connected_to(c.jobs.peer_addr());
                    m.connected(&sh, Instant::now(), &stream, tubes);
                    conns = Some(c);
                }
                Err(e) => {
                    // The next attempt starts on the next seed.
                    nth += 1;
                    m.connect_failed(&sh, Instant::now(), &e, fastrand::u64(..));
                }
            }
            continue;
        }
        let Some(c) = conns.as_mut() else {
            // No connection: a slot's message, a stop, or the machine's
            // next deadline (the next connect).
            let due = m.poll_timeout(&sh, Instant::now());
            super::wait(&inbox, stopped, sleep.as_mut(), due, |_| {
                Poll::<()>::Pending
            })
            .await;
            continue;
        };
        // The management requests the machine asks for.
        while let Some((seq, tube)) = m.next_copy() {
            let (stream, tubes) = m.layout();
            let ok = match copy(c, &sh.cfg, &name, &learned, stream, &tubes[tube], seq).await {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(job = seq, server = name, error = %e, "cannot copy a buried job");
                    c.api = None;
                    false
                }
            };
            m.copied(&sh, ok);
        }
        if m.wants_idle_check() {
            let (stream, tubes) = m.layout();
            let out = match api(c, &sh.cfg, &name, &learned).await {
                Ok(a) => match jobs_out(a, stream, tubes).await {
                    Ok(out) => Some(out),
                    Err(e) => {
                        tracing::debug!(server = name, error = %e, "cannot read the consumers' info");
                        if a.is_broken() {
                            c.api = None;
                        }
                        None
                    }
                },
                Err(_) => None,
            };
            m.idle_checked(Instant::now(), out);
        }
        let r = match m.transmit(&sh, Instant::now(), c.jobs.session_mut()) {
            Ok(()) => c.jobs.flush().await,
            Err(e) => Err(e),
        };
        if let Err(e) = r {
            m.failed(&sh, Instant::now(), &conn_error(e), fastrand::u64(..));
            conns = None;
            continue;
        }
        // What was written is waited for from now (what was waited for
        // already keeps its start); the earlier of the session's deadlines
        // and the machine's wakes the driver.
        let now = Instant::now();
        c.jobs.session_mut().start_wait(now);
        let due = earliest(
            m.poll_timeout(&sh, now),
            c.jobs.session_mut().poll_timeout(),
        );
        let woke = super::wait(&inbox, stopped, sleep.as_mut(), due, |cx| {
            c.jobs.poll_fill(cx)
        })
        .await;
        match woke {
            Woke::Read(Ok(_)) => {
                let r = match take_deliveries(&sh, &mut m, &mut c.jobs, &cells) {
                    Ok(()) => c.jobs.answer_pings().await.map_err(Some),
                    Err(e) => Err(e),
                };
                match r {
                    Ok(()) => {}
                    // The machine gave the connection up itself.
                    Err(None) => conns = None,
                    Err(Some(e)) => {
                        m.failed(&sh, Instant::now(), &conn_error(e), fastrand::u64(..));
                        conns = None;
                    }
                }
            }
            Woke::Read(Err(e)) => {
                m.failed(&sh, Instant::now(), &conn_error(e), fastrand::u64(..));
                conns = None;
            }
            Woke::Told | Woke::Due => {}
        }
        if let Some(c) = conns.as_ref() {
            account_io(&sh, &c.jobs, &mut seen);
            // The nodes the cluster announced since the connect (an INFO
            // read with the deliveries), for the next connect: a worker
            // given one node goes on through those it was told of later.
            if c.jobs.servers() != &learned[..] {
                learned = c.jobs.servers().to_vec();
            }
        }
        let now = Instant::now();
        // A reply overdue breaks the connection; a pull past its expiry is
        // probed, the probe written in the next turn.
        if let Some(Err(e)) = conns
            .as_mut()
            .map(|c| c.jobs.session_mut().handle_timeout(now))
        {
            m.reply_overdue(&sh, now, e, fastrand::u64(..));
            conns = None;
        }
        super::idle_exit(&sh, &idle, server, m.is_idle(&sh, now));
    }
    m.close(&sh);
    drop(conns);
}

/// Adds the system calls the jobs' connection made since the last call to
/// the counters.
fn account_io(sh: &Shared, c: &AsyncNatsConn, seen: &mut IoCounts) {
    let now = c.io_counts();
    let c = &sh.counters;
    c.writes
        .fetch_add(now.writes - seen.writes, Ordering::Relaxed);
    c.reads.fetch_add(now.reads - seen.reads, Ordering::Relaxed);
    *seen = now;
}

/// Gives everything whole the jobs' connection read to the machine,
/// starting the jobs it takes. `Err(Some(e))`: the connection failed (the
/// machine is to be told); `Err(None)`: the machine gave it up.
fn take_deliveries(
    sh: &Shared,
    m: &mut JsMachine,
    c: &mut AsyncNatsConn,
    cells: &[Arc<SlotCell>],
) -> Result<(), Option<NatsError>> {
    let session = c.session_mut();
    loop {
        let frame = match session.poll_delivery() {
            Ok(Some(f)) => f,
            Ok(None) => return Ok(()),
            Err(NatsError::NothingOwed) => {
                // Nothing owed: what came is read past (a PING is counted
                // for its answer).
                while session.poll_event()?.is_some() {}
                return Ok(());
            }
            // A confirmation answered 503: the consumer has no leader; the
            // acks owed are carried to the next connection.
            Err(e) => return Err(Some(e)),
        };
        let pull = frame.pull();
        let strays = session.strays_possible();
        let d = match session.take_delivery(frame) {
            Ok(d) => d,
            Err(NatsError::NoResponders) => {
                m.pull_unavailable(sh, Instant::now(), pull);
                continue;
            }
            Err(e) => return Err(Some(e)),
        };
        let (body, headers) = match d {
            Delivery::Msg { body, headers, .. } => {
                (body, headers.map_or(&[][..], |h| h.as_bytes()))
            }
            _ => (&[][..], &[][..]),
        };
        match m.on_delivery(sh, Instant::now(), d, pull, strays, fastrand::u64(..)) {
            Ok(JsStep::Run {
                slot,
                id,
                tube,
                attempt,
            }) => {
                cells[slot].hold(body, headers);
                cells[slot].run(id, attempt, &sh.cfg.tubes[tube]);
            }
            Ok(JsStep::Hold { slot }) => cells[slot].hold(body, headers),
            Ok(JsStep::Nothing) => {}
            Err(()) => return Err(None),
        }
    }
}

/// Opens the two connections to the cluster of `server` (its seeds from
/// the `nth` on, then those it announced) and sets the stream and the
/// consumers up on the management one.
async fn open(
    cfg: &Config,
    server: &str,
    nth: usize,
    learned: &[String],
) -> Result<(Conns, String, Vec<Tube>), ConnectionError> {
    let addr = Address::parse(server)
        .map_err(|e| ConnectionError::NotSent(std::io::Error::other(e.to_string())))?;
    let seeds = seeds(&addr, nth, learned);
    let ncfg = nats_config(cfg, &addr);
    let mut api = AsyncNatsConn::connect(&seeds, &ncfg)
        .await
        .map_err(connect_error)?;
    let nodes = api.servers().len();
    let (layout, tubes) = set_up(&mut api, cfg, server, nodes).await?;
    let jobs = AsyncNatsConn::connect(&seeds, &ncfg)
        .await
        .map_err(connect_error)?;
    let conns = Conns {
        jobs,
        api: Some(api),
    };
    Ok((conns, layout.stream().to_owned(), tubes))
}

/// The management connection, opened again when it was given up.
async fn api<'c>(
    c: &'c mut Conns,
    cfg: &Config,
    server: &str,
    learned: &[String],
) -> Result<&'c mut AsyncNatsConn, NatsError> {
    if c.api.as_ref().is_some_and(AsyncNatsConn::is_broken) {
        c.api = None;
    }
    if c.api.is_none() {
        let addr = Address::parse(server)
            .map_err(|e| NatsError::NotSent(std::io::Error::other(e.to_string())))?;
        let seeds = seeds(&addr, 0, learned);
        c.api = Some(AsyncNatsConn::connect(&seeds, &nats_config(cfg, &addr)).await?);
    }
    Ok(c.api.as_mut().expect("set above"))
}

/// Copies job `seq` to its tube's buried subject, headers and body as
/// stored, and waits for the copy's PubAck (its message id is derived from
/// the sequence: a copy made again is stored once).
async fn copy(
    c: &mut Conns,
    cfg: &Config,
    server: &str,
    learned: &[String],
    stream: &str,
    tube: &Tube,
    seq: u64,
) -> Result<(), NatsError> {
    let a = api(c, cfg, server, learned).await?;
    let stored = a.js().msg_get(stream, MsgSelect::Seq(seq)).await?;
    let extra = kept_headers(&stored.headers);
    let id = bury_copy_id(stream, seq);
    a.publish(tube.buried.as_bytes(), id.as_bytes(), &extra, &stored.data)
        .await
        .map(|_| ())
}
