//! A link that records what is queued and answers from a script, for the
//! window's tests.

use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddr};

use taskq_proto::{ConnectionError, Interrupter, IoCounts};

use crate::config::Config;
use crate::engine::{Carry, Fault, JobLink, Link, Req, SettleReply, Took};
use crate::job_info::JobInfo;

/// A reply the scripted link gives, in order.
pub(super) enum Say {
    Settled(SettleReply),
    Job(u64),
    Empty,
    Soon,
    Touched(bool),
    Info(u32),
    /// The server cannot serve the reserve now.
    Unavailable,
    /// Past the script (see [`Scripted::jobs`]).
    Auto,
}

/// A link that records what is queued and answers from a script: the
/// window's bookkeeping without a socket or a clock. `G`: it gathers
/// ([`Link::GATHER`]).
#[derive(Default)]
pub(super) struct Scripted<const G: bool = false> {
    pub(super) script: VecDeque<Say>,
    pub(super) queued: Vec<String>,
    pub(super) writes: usize,
    pub(super) broken: bool,
    /// Past the script: jobs handed out, numbered from 1, and each
    /// settle answered done (the queue holds `jobs`; then nothing is
    /// ready).
    pub(super) jobs: u64,
    pub(super) handed: u64,
    /// What each write carried.
    pub(super) sent: Vec<Vec<String>>,
}

impl<const G: bool> Scripted<G> {
    pub(super) fn next(&mut self) -> Result<Say, Fault> {
        if self.script.is_empty() && self.jobs > 0 {
            return Ok(Say::Auto);
        }
        self.script
            .pop_front()
            .ok_or(Fault::Conn(ConnectionError::Closed))
    }
}

impl<const G: bool> JobLink for Scripted<G> {
    fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, 11300))
    }
    fn is_broken(&self) -> bool {
        self.broken
    }
    fn mark_broken(&mut self) {
        self.broken = true;
    }
    fn touch(&mut self, _: u64) -> Result<bool, Fault> {
        unreachable!("the window queues its touches")
    }
    fn info(&mut self, _: u64, _: Option<&mut String>) -> Result<Option<JobInfo>, Fault> {
        match self.next()? {
            Say::Info(pri) => Ok(Some(JobInfo {
                pri,
                ..JobInfo::default()
            })),
            _ => Err(Fault::Unexpected("script")),
        }
    }
}

impl<const G: bool> Link for Scripted<G> {
    const GATHER: bool = G;

    fn connect(
        _: &Config,
        _: &str,
        _: usize,
        _: &[String],
        _: &mut Carry,
    ) -> Result<Self, ConnectionError> {
        Ok(Scripted::default())
    }
    fn io_counts(&self) -> IoCounts {
        IoCounts::default()
    }
    fn interrupter(&self) -> Option<Interrupter> {
        None
    }
    fn queue(&mut self, req: Req<'_>) -> Result<(), ConnectionError> {
        self.queued.push(match req {
            Req::Settle(id, s) => format!("{s:?} {id}"),
            Req::Touch(id) => format!("touch {id}"),
            Req::Ask(a) => format!("reserve {}", a.slice),
        });
        Ok(())
    }
    fn flush(&mut self) -> Result<(), ConnectionError> {
        let done = self.sent.iter().map(Vec::len).sum::<usize>();
        let batch = self.queued[done..].to_vec();
        if !batch.is_empty() {
            self.writes += 1;
            self.sent.push(batch);
        }
        Ok(())
    }
    fn discard(&mut self) {}
    fn settled(&mut self) -> Result<SettleReply, Fault> {
        match self.next()? {
            Say::Settled(r) => Ok(r),
            Say::Auto => Ok(SettleReply::Deleted),
            _ => Err(Fault::Unexpected("script")),
        }
    }
    fn reserved(&mut self) -> Result<Took<'_>, Fault> {
        match self.next()? {
            Say::Job(id) => Ok(Took::Job {
                id,
                body: b"body",
                headers: &[],
            }),
            Say::Empty => Ok(Took::TurnEmpty),
            Say::Soon => Ok(Took::DeadlineSoon),
            Say::Unavailable => Ok(Took::Unavailable),
            Say::Auto if self.handed < self.jobs => {
                self.handed += 1;
                Ok(Took::Job {
                    id: self.handed,
                    body: b"body",
                    headers: &[],
                })
            }
            Say::Auto => Ok(Took::TurnEmpty),
            _ => Err(Fault::Unexpected("script")),
        }
    }
    fn touched(&mut self) -> Result<bool, Fault> {
        match self.next()? {
            Say::Touched(t) => Ok(t),
            _ => Err(Fault::Unexpected("script")),
        }
    }
    fn quit(self) {}
}
