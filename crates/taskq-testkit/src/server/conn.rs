//! One connection: read commands, run them against the state, write replies,
//! and misbehave as the fault plan says.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use taskq_proto::server::{parse_command, skip_line, CommandError, Skip};
use taskq_proto::{Command, RecvBuf, Reply, Status, MAX_LINE};

use super::faults::{Action, ConnFaults, ReplyFault};
use super::shared::{lock, Shared};
use super::state::{push_reply, Outcome};

/// How often a waiting reserve looks at its socket and the stop flag.
const POLL: Duration = Duration::from_millis(50);
/// Replies gathered from pipelined commands are written once they reach this size.
const OUT_FLUSH: usize = 64 * 1024;

/// Why the connection ends.
enum End {
    /// The peer closed, or the socket failed.
    Peer,
    /// We close it: quit, a fault, or the server stops.
    Close,
    /// We reset it (RST).
    Reset,
}

struct Conn {
    shared: Arc<Shared>,
    id: u64,
    stream: TcpStream,
    /// Commands received and not yet carried out: the codec's receive buffer.
    inbuf: RecvBuf,
    out: Vec<u8>,
    /// Puts whose `INSERTED` sits in `out`, acknowledged once written.
    acks: Vec<u64>,
    faults: ConnFaults,
    generation: u64,
    requests: u64,
}

pub(crate) fn serve(shared: Arc<Shared>, id: u64, stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let (faults, generation) = {
        let mut slot = lock(&shared.plan);
        slot.accepted += 1;
        (slot.plan.for_connection(id, slot.accepted), slot.generation)
    };
    let cap = MAX_LINE + shared.max_job_size + 2;
    let mut c = Conn {
        inbuf: RecvBuf::new(16 * 1024, cap),
        out: Vec::with_capacity(4096),
        acks: Vec::new(),
        faults,
        generation,
        requests: 0,
        shared,
        id,
        stream,
    };
    let end = c.run();
    if matches!(end, End::Reset) {
        let _ = socket2::SockRef::from(&c.stream).set_linger(Some(Duration::ZERO));
    }
    {
        let mut st = c.shared.lock();
        // Leases that ran out while nothing else ran on the server expired
        // first, as beanstalkd's own timer has them: a job whose TTR passed
        // counts as a timeout, not as given back by the close.
        st.tick(Instant::now());
        st.close(id);
    }
    c.shared.cond.notify_all();
    c.shared.forget_sock(id);
    if !matches!(end, End::Reset) {
        let _ = c.stream.shutdown(std::net::Shutdown::Both);
    }
}

impl Conn {
    fn run(&mut self) -> End {
        loop {
            if self.shared.stopped() {
                return End::Close;
            }
            self.refresh_faults();
            // Only the frame's length is kept, so the buffer is free for the fault handling below.
            let parsed = match parse_command(self.inbuf.data(), self.shared.max_job_size) {
                Ok(Status::Complete(_, n)) => Ok(Status::Complete((), n)),
                Ok(Status::Partial) => Ok(Status::Partial),
                Err(e) => Err(e),
            };
            let complete = !matches!(parsed, Ok(Status::Partial));
            if !complete {
                if let Err(e) = self.flush() {
                    return e;
                }
                if let Err(e) = self.fill() {
                    return e;
                }
                continue;
            }
            self.requests += 1;
            let mut fault = ReplyFault::default();
            let mut faulty = false;
            match self.faults.before(self.requests) {
                Some(Action::Close { reset }) => {
                    let _ = self.flush();
                    return if reset { End::Reset } else { End::Close };
                }
                Some(Action::Silence(d)) => {
                    if let Err(e) = self.flush() {
                        return e;
                    }
                    if !self.shared.sleep(d) {
                        return End::Close;
                    }
                }
                Some(Action::Reply(rf)) => {
                    if let Err(e) = self.flush() {
                        return e;
                    }
                    fault = rf;
                    faulty = true;
                }
                None => {}
            }
            let mark = self.out.len();
            let acks_mark = self.acks.len();
            self.shared.lock().book.request(self.id);
            let outcome = match parsed {
                Ok(Status::Complete(_, n)) if fault.replace.is_some() => {
                    // Answered with the fault's bytes; the command is not carried out.
                    self.inbuf.consume(n);
                    if let Some(bytes) = fault.replace.take() {
                        self.out.extend_from_slice(&bytes);
                    }
                    Outcome::Replied
                }
                Ok(Status::Complete(_, n)) => {
                    // Parse again so the borrow of the buffer does not outlive the match.
                    let input = &self.inbuf.data()[..n];
                    let Ok(Status::Complete(cmd, _)) =
                        parse_command(input, self.shared.max_job_size)
                    else {
                        return End::Close;
                    };
                    let mut st = self.shared.lock();
                    let outcome = st.execute(self.id, &cmd, Instant::now(), &mut self.out);
                    if let (true, Outcome::Inserted(id)) = (fault.bury_put, &outcome) {
                        // Short of memory: the job is kept, but buried.
                        st.unqueue(*id);
                        st.bury_job(*id);
                        self.out.truncate(mark);
                        push_reply(&mut self.out, &Reply::InsertedBuried { id: *id });
                    }
                    if cmd == Command::Reserve && input.starts_with(b"reserve-with-timeout") {
                        // The codec reads a negative timeout as a plain reserve;
                        // beanstalkd still counts the command it was sent.
                        st.count_as_reserve_with_timeout();
                    }
                    let wake = st.stats.waiting > 0;
                    drop(st);
                    if wake {
                        self.shared.cond.notify_all();
                    }
                    self.inbuf.consume(n);
                    outcome
                }
                Ok(Status::Partial) => unreachable!("handled above"),
                Err(e) => match self.refuse(e) {
                    Ok(()) => Outcome::Replied,
                    Err(end) => return end,
                },
            };
            match outcome {
                Outcome::Replied => {}
                Outcome::Inserted(id) => self.acks.push(id),
                Outcome::Quit => {
                    let _ = self.flush();
                    return End::Close;
                }
                Outcome::Wait(deadline) => {
                    if let Err(e) = self.flush() {
                        return e;
                    }
                    if let Err(e) = self.wait_for_job(deadline) {
                        return e;
                    }
                }
            }
            if faulty {
                if let Err(e) = self.send_faulty(mark, acks_mark, &fault) {
                    return e;
                }
            } else if self.out.len() >= OUT_FLUSH {
                if let Err(e) = self.flush() {
                    return e;
                }
            }
        }
    }

    /// A new plan applies to this connection at once, its requests counted afresh.
    fn refresh_faults(&mut self) {
        let g = self.shared.plan_generation.load(Ordering::Acquire);
        if g != self.generation {
            let slot = lock(&self.shared.plan);
            self.faults = slot.plan.for_connection(self.id, 0);
            self.generation = slot.generation;
            self.requests = 0;
        }
    }

    /// Answers a command the codec refused, dropping the bytes beanstalkd drops.
    fn refuse(&mut self, e: CommandError) -> Result<(), End> {
        if let Some(kind) = e.counted_as() {
            let spent = matches!(e, CommandError::ExpectedCrlf { .. });
            self.shared.lock().refused(self.id, kind, spent);
        }
        self.inbuf.consume(e.consumed().min(self.inbuf.len()));
        if let CommandError::LineTooLong = e {
            loop {
                match skip_line(self.inbuf.data()) {
                    Skip::Done(n) => {
                        self.inbuf.consume(n);
                        break;
                    }
                    Skip::More(n) => {
                        self.inbuf.consume(n);
                        self.flush()?;
                        self.fill()?;
                    }
                }
            }
        }
        if let CommandError::JobTooBig { discard, .. } = e {
            let mut left = discard;
            loop {
                let here = (self.inbuf.len() as u64).min(left);
                self.inbuf.consume(here as usize);
                left -= here;
                if left == 0 {
                    break;
                }
                self.flush()?;
                self.fill()?;
            }
        }
        push_reply(&mut self.out, &e.reply());
        Ok(())
    }

    /// Waits in a reserve until a job comes, a held job nears its TTR, the
    /// deadline passes, the peer hangs up or the server stops.
    fn wait_for_job(&mut self, deadline: Option<Instant>) -> Result<(), End> {
        loop {
            let mut st = self.shared.lock();
            let now = Instant::now();
            if st.try_reserve(self.id, now, deadline, &mut self.out) {
                return Ok(());
            }
            let mut wake = now + POLL;
            if let Some(t) = st.next_event() {
                wake = wake.min(t);
            }
            if let Some(t) = st.deadline_soon_at(self.id) {
                wake = wake.min(t);
            }
            if let Some(d) = deadline {
                wake = wake.min(d);
            }
            let (st, _) = self
                .shared
                .cond
                .wait_timeout(st, wake.saturating_duration_since(now))
                .unwrap_or_else(|e| e.into_inner());
            drop(st);
            if self.shared.stopped() || self.peer_gone() {
                self.shared.lock().set_waiting(self.id, false);
                return Err(End::Peer);
            }
        }
    }

    /// True when the peer has closed its end, as beanstalkd sees a hang-up
    /// while a reserve waits: what it sent before closing (a command
    /// pipelined behind the reserve) is read into the input, kept for after
    /// the reserve, and the close behind it is seen too.
    fn peer_gone(&mut self) -> bool {
        if self.stream.set_nonblocking(true).is_err() {
            return true;
        }
        let gone = loop {
            // A full input cannot tell a close: taken for alive until the
            // reserve ends and the input is read.
            let Ok(room) = self.inbuf.spare() else {
                break false;
            };
            match self.stream.read(room) {
                Ok(0) => break true,
                Ok(n) => self.inbuf.filled(n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break e.kind() != io::ErrorKind::WouldBlock,
            }
        };
        let _ = self.stream.set_nonblocking(false);
        gone
    }

    /// Reads more input, making room first.
    fn fill(&mut self) -> Result<(), End> {
        // The codec completes or refuses any frame within the buffer's cap,
        // so a full buffer cannot happen; it never grows past the limit.
        let Ok(room) = self.inbuf.spare() else {
            return Err(End::Close);
        };
        loop {
            match self.stream.read(room) {
                Ok(0) => return Err(End::Peer),
                Ok(n) => {
                    self.inbuf.filled(n);
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Err(End::Peer),
            }
        }
    }

    /// Writes every gathered reply. The puts among them are acknowledged in the
    /// ledger just before the write (so a client that has read its reply finds
    /// the ledger up to date) and taken back if the write fails.
    fn flush(&mut self) -> Result<(), End> {
        if self.out.is_empty() {
            return Ok(());
        }
        self.ack(0, true);
        let r = self.stream.write_all(&self.out);
        self.out.clear();
        if r.is_err() {
            self.ack(0, false);
            self.acks.clear();
            return Err(End::Peer);
        }
        self.acks.clear();
        Ok(())
    }

    fn ack(&mut self, from: usize, yes: bool) {
        if self.acks.len() > from {
            let mut st = self.shared.lock();
            for &id in &self.acks[from..] {
                st.book.acknowledge(id, yes);
            }
        }
    }

    /// Sends the reply at `out[mark..]` the way the fault says.
    fn send_faulty(&mut self, mark: usize, acks_mark: usize, f: &ReplyFault) -> Result<(), End> {
        let reply: Vec<u8> = self.out.split_off(mark);
        if !f.delay.is_zero() && !self.shared.sleep(f.delay) {
            return Err(End::Close);
        }
        if let Some(bytes) = &f.inject {
            self.stream.write_all(bytes).map_err(|_| End::Peer)?;
        }
        if f.withhold {
            self.acks.truncate(acks_mark);
            return Err(self.stay_silent(f.withhold_for));
        }
        let cut = f.cut.map(|k| k.min(reply.len()));
        let whole = cut.is_none();
        // A cut at or past the reply's length still sends it in full (then closes).
        if cut.is_some_and(|k| k < reply.len()) {
            self.acks.truncate(acks_mark);
        }
        self.ack(acks_mark, true);
        let bytes = &reply[..cut.unwrap_or(reply.len())];
        let r = match f.trickle {
            Some(interval) => bytes.iter().try_for_each(|b| {
                self.stream.write_all(std::slice::from_ref(b))?;
                if self.shared.sleep(interval) {
                    Ok(())
                } else {
                    Err(io::Error::other("server stopping"))
                }
            }),
            None => self.stream.write_all(bytes),
        };
        if r.is_err() {
            self.ack(acks_mark, false);
            self.acks.truncate(acks_mark);
            return Err(End::Peer);
        }
        self.acks.truncate(acks_mark);
        if whole {
            Ok(())
        } else {
            Err(End::Close)
        }
    }

    /// Answers nothing more: reads and drops input until the peer closes, the
    /// server stops, or `limit` passes.
    fn stay_silent(&mut self, limit: Option<Duration>) -> End {
        let until = limit.map(|d| Instant::now() + d);
        let _ = self.stream.set_read_timeout(Some(POLL));
        let mut sink = [0u8; 4096];
        loop {
            if self.shared.stopped() || until.is_some_and(|u| Instant::now() >= u) {
                return End::Close;
            }
            match self.stream.read(&mut sink) {
                Ok(0) => return End::Peer,
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) => {}
                Err(_) => return End::Peer,
            }
        }
    }
}
