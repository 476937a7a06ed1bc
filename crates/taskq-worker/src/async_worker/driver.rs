//! The tokio driver of one server's machine: it owns the socket and the
//! clock, and does what the machine says. Each turn of its loop:
//! 1. takes the slots' messages (handlers ended, touches asked) and the
//!    stop flags to the machine, and the touches' answers to the slots;
//! 2. connects when the machine wants it (its reconnect rule);
//! 3. queues what the machine says to send, written in one write as the
//!    socket takes it, while replies are read;
//! 4. waits for bytes, a slot's message, a stop, or the machine's next
//!    deadline, whichever comes first (never a busy loop: with nothing
//!    owed and nothing due it sleeps until woken);
//! 5. gives every whole reply to the machine, keeping a taken job's body
//!    for its slot and starting the job once looked up;
//! 6. acts on the deadlines: the session's reply deadline (a reply
//!    overdue breaks the connection, `Machine::reply_overdue`) and the
//!    machine's (an idle spell stops the worker).

use std::pin::pin;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use taskq_proto::earliest;
use tokio::time::Sleep;

use super::conn::Conn;
use super::slot::{Inbox, SlotCell};
use super::Woke;
use crate::engine::{next_answer, queue_watch, skip_watching, Took};
use crate::machine::{Answer, Machine, Step};
use crate::shared::Shared;

/// Runs server `server`'s machine until the worker stops and the machine
/// is done.
pub(super) async fn drive(
    sh: Arc<Shared>,
    server: usize,
    cells: Vec<Arc<SlotCell>>,
    inbox: Arc<Inbox>,
    idle: Arc<[AtomicBool]>,
) {
    let addr = sh.cfg.servers[server].clone();
    let mut m = Machine::new(&sh, server, Instant::now());
    let mut conn: Option<Conn> = None;
    let mut tube = String::new();
    let mut aborted = false;
    // One kept timer, moved to each deadline.
    let mut sleep: std::pin::Pin<&mut Sleep> =
        pin!(tokio::time::sleep_until(tokio::time::Instant::now()));
    loop {
        // Registered before the flags are read: a stop cannot slip between.
        let mut stopped = pin!(sh.stop_wake.notified());
        stopped.as_mut().enable();
        super::hand_over(&sh, &mut m, &cells, &inbox, &mut aborted);
        if m.is_done(&sh) {
            break;
        }
        if conn.is_none() && m.wants_connect(&sh, Instant::now()) {
            match Conn::open(&sh.cfg, &addr).await {
                Ok(mut c) => {
                    // The watch list goes out with the first reserves.
                    let watch = queue_watch(&mut |cmd| c.session.queue(cmd), &sh.cfg.tubes);
                    match watch {
                        Ok(()) => {
                            m.connected(&sh, Instant::now());
                            inbox.connected_to(c.peer_addr());
                            conn = Some(c);
                        }
                        Err(e) => m.connect_failed(&sh, Instant::now(), &e, fastrand::u64(..)),
                    }
                }
                Err(e) => m.connect_failed(&sh, Instant::now(), &e, fastrand::u64(..)),
            }
            continue;
        }
        let mut reply_due = None;
        if let Some(c) = conn.as_mut() {
            let now = Instant::now();
            if let Err(e) = m.transmit(&sh, now, &mut c.session) {
                crate::worker::account::failed(&sh, &addr, None, &e);
                m.broke(&sh, Instant::now(), fastrand::u64(..));
                conn = None;
                continue;
            }
            // A reply owed is waited for from now, unless its wait began
            // already (at its write, or when the reply before it came).
            c.session.start_wait(now);
            reply_due = c.session.poll_timeout();
        }
        let due = earliest(m.poll_timeout(&sh, Instant::now()), reply_due);
        let woke = super::wait(&inbox, stopped, sleep.as_mut(), due, |cx| {
            let Some(c) = conn.as_mut() else {
                return Poll::Pending;
            };
            // What was queued goes out as the socket takes it, while
            // replies are read.
            if let Poll::Ready(Err(e)) = c.poll_write(cx, &sh.counters) {
                return Poll::Ready(Err(e));
            }
            c.poll_read(cx, &sh.counters)
        })
        .await;
        match woke {
            Woke::Read(Ok(_)) => {
                if let Some(c) = conn.as_mut() {
                    if !take_replies(&sh, &mut m, c, &cells, &mut tube) {
                        conn = None;
                    }
                }
            }
            Woke::Read(Err(e)) => {
                crate::worker::account::failed(&sh, &addr, None, &e);
                m.broke(&sh, Instant::now(), fastrand::u64(..));
                conn = None;
            }
            Woke::Told | Woke::Due => {}
        }
        let now = Instant::now();
        if let Some(Err(e)) = conn.as_mut().map(|c| c.session.handle_timeout(now)) {
            m.reply_overdue(&sh, now, e, fastrand::u64(..));
            conn = None;
        }
        super::idle_exit(&sh, &idle, server, m.is_idle(&sh, now));
    }
    // Closing the connection gives back any job the server handed out to
    // a reserve still owed.
    m.close(&sh);
    drop(conn);
}

/// Gives every whole reply on `c` to the machine. False when the machine
/// gave the connection up.
fn take_replies(
    sh: &Shared,
    m: &mut Machine,
    c: &mut Conn,
    cells: &[Arc<SlotCell>],
    tube: &mut String,
) -> bool {
    loop {
        let Some(expect) = m.expect() else {
            // Nothing of the machine's owed: the watch list's replies may
            // still be (a connection that opened with no room to reserve),
            // and read, so that they are not taken for overdue.
            if let Err(e) = skip_watching(&mut c.session) {
                m.reply_overdue(sh, Instant::now(), e, fastrand::u64(..));
                return false;
            }
            return true;
        };
        let Some(answer) = next_answer(&mut c.session, expect, tube) else {
            return true;
        };
        // A job's body lies in the session's buffer until the next read.
        let body: &[u8] = match &answer {
            Answer::Took(Ok(Took::Job { body, .. })) => body,
            _ => &[],
        };
        match m.on_reply(sh, Instant::now(), answer, fastrand::u64(..)) {
            Ok(Step::Hold(start)) => cells[start.slot].hold(body, &[]),
            Ok(Step::Take(start)) => {
                cells[start.slot].hold(body, &[]);
                let watched = start.tube.map_or("", |k| sh.cfg.tubes[k].as_str());
                cells[start.slot].run(start.id, 0, watched);
            }
            Ok(Step::Run { slot, id, attempt }) => cells[slot].run(id, attempt, tube),
            Ok(Step::Wait { slot }) => cells[slot].keep_tube(tube),
            Ok(Step::Told { slot }) => cells[slot].tell_tube(tube),
            Ok(Step::Nothing) => {}
            Err(()) => return false,
        }
    }
}
