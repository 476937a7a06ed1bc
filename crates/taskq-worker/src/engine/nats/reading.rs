//! How the JetStream link reads: confirmations awaited while deliveries
//! come, deliveries taken as jobs (or sent back when early), pulls sent and
//! answered, the consumers asked whether jobs are still out, and the copy a
//! bury stores before its ack.

use std::time::Instant;

use taskq_connect::nats::{run_blocking, MsgSelect};
use taskq_proto::nats::{AckKind, Delivery, NatsError};
use taskq_proto::ConnectionError;

use super::parts::{
    bury_copy_id, conn_error, jobs_out, keep_early, kept_headers, not_ready, Early, End, Held,
};
use super::Nats;
use crate::engine::seam::{Fault, Took};

impl Nats {
    pub(super) fn tube_of(&self, subject: &[u8]) -> Option<usize> {
        self.tubes
            .iter()
            .position(|t| t.subject.as_bytes() == subject)
    }

    pub(super) fn held_index(&self, seq: u64) -> Option<usize> {
        self.held.iter().position(|h| h.seq == seq)
    }

    /// Reads the next delivery on the jobs' connection and keeps it: a
    /// confirmation among those come, a message (or a pull's status) for
    /// its pull or the early queue. `Ok(Some(t))` is confirmation `t`, not
    /// kept, for the caller that waits for it; an error is the caller's
    /// (a `503` means something else to each).
    pub(super) fn read_one(&mut self, wanted: Option<u64>) -> Result<Option<u64>, NatsError> {
        self.strays.heard(self.conn.strays_possible());
        match self.conn.next_delivery()? {
            Delivery::Confirmed(t) if Some(t) == wanted => return Ok(Some(t)),
            Delivery::Confirmed(t) => self.confirmed.push(t),
            d => keep_early(
                d,
                self.pulls.front_mut(),
                &mut self.strays,
                &mut self.early,
                &mut self.bufs,
            ),
        }
        Ok(None)
    }

    /// Reads until the confirmation `token` came, keeping what comes before.
    pub(super) fn confirm(&mut self, token: u64) -> Result<(), Fault> {
        if let Some(i) = self.confirmed.iter().position(|&t| t == token) {
            self.confirmed.swap_remove(i);
            return Ok(());
        }
        loop {
            match self.read_one(Some(token)) {
                Ok(Some(_)) => return Ok(()),
                Ok(None) => {}
                Err(NatsError::NoResponders) => return Err(Fault::Unexpected("503")),
                Err(e) => return Err(Fault::Conn(conn_error(e))),
            }
        }
    }

    /// The pull under way was answered `503`: the stream or its consumer
    /// has no leader now.
    pub(super) fn pull_unavailable(&mut self) {
        tracing::debug!("pull answered 503: no responders");
        if let Some(p) = self.pulls.front_mut() {
            p.ended = Some(End::Unavailable);
        }
    }

    /// Takes a delivery as a held job; `None` when it is not ready yet (it
    /// went back with `-NAK` for the time left) or not one of our tubes.
    pub(super) fn take(&mut self, e: &Early) -> Result<bool, Fault> {
        let (ack, seq, delivered, ready_at) = (&e.ack[..], e.seq, e.delivered, e.ready_at);
        let Some(tube) = self.tube_of(&e.subject) else {
            // A consumer filters on its tube's subject: this cannot happen.
            return Err(Fault::Unexpected("MSG"));
        };
        if let Some(delay) = not_ready(ready_at) {
            self.conn
                .queue_ack(ack, AckKind::Nak { delay: Some(delay) }, false)
                .and_then(|_| self.conn.flush())
                .map_err(|e| Fault::Conn(conn_error(e)))?;
            self.given_back.note(seq);
            return Ok(false);
        }
        let buf = self.bufs.names.copy(ack);
        if let Some(i) = self.held_index(seq) {
            // Its lease ran out while held here and it came back to us.
            let old = std::mem::replace(&mut self.held[i].ack, buf);
            self.bufs.names.give(old);
            self.held[i].delivered = delivered;
            self.held[i].leased = e.pulled;
            self.held[i].too_big = e.too_big.is_some();
        } else {
            let early =
                self.given_back
                    .early_deliveries(e.seq, e.delivered, e.ready_at, e.scheduled);
            self.held.push(Held {
                seq,
                tube,
                ack: buf,
                delivered,
                early,
                leased: e.pulled,
                too_big: e.too_big.is_some(),
            });
        }
        Ok(true)
    }

    /// What an ask that a pull answered without a job comes to. A wait
    /// that ended empty is idle only when the consumers have nothing out.
    pub(super) fn empty(&mut self, no_wait: bool, end: End) -> Result<Took<'static>, Fault> {
        Ok(match end {
            End::Unavailable => Took::Unavailable,
            End::Empty if no_wait => Took::TurnEmpty,
            End::Empty if self.check_idle => self.outstanding()?,
            End::Empty => Took::TimedOut,
        })
    }

    /// [`Took::Outstanding`] while a tube's consumer has messages not yet
    /// delivered or deliveries not acknowledged (held by a worker, or lost
    /// with a connection and due again when their ack wait runs out), else
    /// [`Took::TimedOut`]. An answer the connection survives but that
    /// cannot tell (replies still owed, an API error) is not idle either.
    pub(super) fn outstanding(&mut self) -> Result<Took<'static>, Fault> {
        match run_blocking(jobs_out(&mut self.conn, &self.stream, &self.tubes)) {
            Ok(false) => Ok(Took::TimedOut),
            Ok(true) => Ok(Took::Outstanding),
            Err(NatsError::NoResponders) => Ok(Took::Unavailable),
            Err(e) if self.conn.is_broken() => Err(Fault::Conn(conn_error(e))),
            Err(e) => {
                tracing::debug!(error = %e, "cannot read the consumers' info");
                Ok(Took::Outstanding)
            }
        }
    }

    /// Counts one ask of the pull under way answered; returns whether that
    /// pull waited. A pull with all its asks answered is over.
    pub(super) fn answered(&mut self) -> bool {
        let Some(p) = self.pulls.front_mut() else {
            return false;
        };
        p.left = p.left.saturating_sub(1);
        let no_wait = p.no_wait;
        if p.left == 0 {
            self.pulls.pop_front();
        }
        no_wait
    }

    /// Sends the oldest pull if it is not under way yet.
    pub(super) fn send_pull(&mut self) -> Result<(), Fault> {
        let Some(p) = self.pulls.front_mut() else {
            return Err(Fault::Conn(ConnectionError::NothingOwed));
        };
        if p.sent {
            return Ok(());
        }
        // The asks of later writes for the same tube go into this pull too:
        // a window refilled job by job is pulled for in one request.
        let (tube, no_wait, scan) = (p.tube, p.no_wait, p.scan);
        while self
            .pulls
            .get(1)
            .is_some_and(|q| q.tube == tube && q.no_wait == no_wait && q.scan == scan)
        {
            let q = self.pulls.remove(1).expect("checked above");
            self.pulls[0].left += q.left;
        }
        let p = &mut self.pulls[0];
        p.sent = true;
        p.at = Instant::now();
        let (batch, waits) = (p.left, p.waits());
        let consumer = &self.tubes[tube].consumer;
        let r = if !waits {
            self.conn.pull_no_wait(&self.stream, consumer, batch)
        } else {
            self.conn
                .pull(&self.stream, consumer, batch, self.expiry, None)
        };
        r.map_err(|e| Fault::Conn(conn_error(e)))
    }

    /// Copies job `seq` to its tube's buried subject and waits for the copy's
    /// PubAck. Anything owed is read first (into the early queues): the copy
    /// needs the connection to itself.
    pub(super) fn bury_copy(&mut self, seq: u64, tube: usize) -> Result<(), ConnectionError> {
        // Acks a window gathered and has not written yet are owed
        // confirmations too: they go out first.
        self.conn.flush().map_err(conn_error)?;
        while self.conn.pulling() {
            match self.read_one(None) {
                Ok(_) => {}
                Err(NatsError::NoResponders) => self.pull_unavailable(),
                Err(e) => return Err(conn_error(e)),
            }
        }
        while self.conn.confirms_owed() > 0 {
            // A message for a pull ended first is kept, to be run.
            self.read_one(None).map_err(conn_error)?;
        }
        let stored = self
            .conn
            .msg_get(&self.stream, MsgSelect::Seq(seq))
            .map_err(conn_error)?;
        let extra = kept_headers(&stored.headers);
        let id = bury_copy_id(&self.stream, seq);
        self.conn
            .publish_with(
                &self.tubes[tube].buried,
                id.as_bytes(),
                &extra,
                &stored.data,
            )
            .map(|_| ())
            .map_err(conn_error)
    }
}
