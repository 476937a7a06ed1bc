//! The beanstalkd engine: the worker machine's requests as beanstalkd
//! commands on a protocol session, and what each reply says.

use taskq_proto::{Command, CommandKind, ConnectionError, JobStats, Reply, ReplyError, Session};

use super::seam::{Ask, Fault, Req, Settle, SettleReply, Took};
use crate::fair::Want;
use crate::job_info::JobInfo;
use crate::machine::{Answer, Expect};

/// What a reserve's reply says; `timeout` is the reserve's own (0: a
/// no-wait reserve, whose `TIMED_OUT` means its tube had nothing ready).
pub(crate) fn took_reply(
    reply: Result<Reply<'_>, ConnectionError>,
    timeout: u32,
) -> Result<Took<'_>, Fault> {
    match reply {
        Ok(Reply::Reserved { id, body }) => Ok(Took::Job { id, body }),
        Ok(Reply::ReservedTooBig { id, len }) => Ok(Took::TooBig { id, len }),
        Ok(Reply::TimedOut) if timeout == 0 => Ok(Took::TurnEmpty),
        Ok(Reply::TimedOut) => Ok(Took::TimedOut),
        Ok(Reply::DeadlineSoon) => Ok(Took::DeadlineSoon),
        Ok(r) => Err(Fault::Unexpected(r.word())),
        Err(e) => Err(Fault::Conn(e)),
    }
}

/// What a `stats-job` reply says: the job's numbers (and its tube's name
/// into `tube`, when asked), or `None` when the job is no longer ours.
pub(crate) fn info_reply(
    reply: Result<Reply<'_>, ConnectionError>,
    tube: Option<&mut String>,
) -> Result<Option<JobInfo>, Fault> {
    match reply {
        Ok(Reply::Ok { yaml }) => {
            let s = JobStats::parse(yaml).map_err(|_| Fault::Unexpected("OK"))?;
            if let Some(t) = tube {
                t.clear();
                t.push_str(s.tube);
            }
            Ok(Some(JobInfo {
                pri: u32::try_from(s.pri).unwrap_or(u32::MAX),
                ttr: s.ttr,
                time_left: s.time_left,
                reserves: s.reserves,
                timeouts: s.timeouts,
                releases: s.releases,
                buries: s.buries,
            }))
        }
        Ok(Reply::NotFound) => Ok(None),
        Ok(r) => Err(Fault::Unexpected(r.word())),
        Err(e) => Err(Fault::Conn(e)),
    }
}

/// Queues the commands of one of the loop's requests through `queue` (the
/// session's queue).
pub(crate) fn queue_req(
    queue: &mut dyn FnMut(&Command<'_>) -> Result<(), ConnectionError>,
    req: Req<'_>,
) -> Result<(), ConnectionError> {
    match req {
        Req::Settle(id, s) => queue(&match s {
            Settle::Delete => Command::Delete { id },
            Settle::Release { pri, delay } => Command::Release { id, pri, delay },
            Settle::Bury { pri } => Command::Bury { id, pri },
        }),
        Req::Touch(id) => queue(&Command::Touch { id }),
        Req::Ask(ask) => queue_reserve(queue, ask),
    }
}

/// What a touch's reply says: `false` when the job is no longer ours.
pub(crate) fn touch_reply(reply: Result<Reply<'_>, ConnectionError>) -> Result<bool, Fault> {
    match reply {
        Ok(Reply::Touched) => Ok(true),
        Ok(Reply::NotFound) => Ok(false),
        Ok(r) => Err(Fault::Unexpected(r.word())),
        Err(e) => Err(Fault::Conn(e)),
    }
}

/// What a settle command's reply says.
pub(crate) fn settle_reply(
    reply: Result<Reply<'_>, ConnectionError>,
) -> Result<SettleReply, Fault> {
    match reply {
        Ok(Reply::Deleted) => Ok(SettleReply::Deleted),
        Ok(Reply::Released) => Ok(SettleReply::Released),
        Ok(Reply::Buried) => Ok(SettleReply::Buried),
        Ok(Reply::NotFound) => Ok(SettleReply::NotFound),
        Ok(r) => Err(Fault::Unexpected(r.word())),
        Err(e) => Err(Fault::Conn(e)),
    }
}

/// Queues the next reserve: in strict mode one `reserve-with-timeout` for a
/// slice; with weighted tubes, the `watch`/`ignore` commands the schedule needs
/// first (in the same write) and a reserve that waits only in a fallback run.
fn queue_reserve(
    queue: &mut dyn FnMut(&Command<'_>) -> Result<(), ConnectionError>,
    ask: Ask<'_>,
) -> Result<(), ConnectionError> {
    let Ask {
        sched,
        tubes,
        slice,
    } = ask;
    let timeout = match sched {
        None => slice,
        Some(s) => {
            let want = s.want();
            s.switch(want, |watch, k| {
                let tube = tubes[k].as_str();
                queue(&if watch {
                    Command::Watch { tube }
                } else {
                    Command::Ignore { tube }
                })
            })?;
            if want == Want::All {
                slice
            } else {
                0
            }
        }
    };
    queue(&Command::ReserveWithTimeout { timeout })
}

/// Queues, through `queue`, the commands that set a new connection up for
/// `tubes`: watch each, and ignore `default` unless it is one of them.
pub(crate) fn queue_watch(
    queue: &mut dyn FnMut(&Command<'_>) -> Result<(), ConnectionError>,
    tubes: &[String],
) -> Result<(), ConnectionError> {
    for t in tubes {
        queue(&Command::Watch { tube: t })?;
    }
    if !tubes.iter().any(|t| t == "default") {
        queue(&Command::Ignore { tube: "default" })?;
    }
    Ok(())
}

/// The worker machine's requests encoded on a session, queued for one write.
impl crate::machine::Sink for Session {
    fn req(&mut self, req: Req<'_>) -> Result<(), ConnectionError> {
        queue_req(&mut |c| self.queue(c), req)
    }

    fn info(&mut self, id: u64) -> Result<(), ConnectionError> {
        self.queue(&Command::StatsJob { id })
    }
}

/// Takes the `WATCHING` replies owed to a weighted schedule's tube
/// switches (queued before their reserve), as far as they have come.
/// `Ok(true)` once the next owed reply is the machine's.
#[cfg_attr(not(feature = "tokio"), allow(dead_code))]
pub(crate) fn skip_watching(s: &mut Session) -> Result<bool, ConnectionError> {
    while let Some(CommandKind::Watch | CommandKind::Ignore) = s.next_owed() {
        let Some(f) = s.frame_reply()? else {
            return Ok(false);
        };
        match s.take_reply(f) {
            Reply::Watching { .. } => {}
            r => {
                let word = r.word();
                s.mark_broken();
                return Err(ConnectionError::Protocol(ReplyError::UnexpectedReply {
                    word,
                }));
            }
        }
    }
    Ok(true)
}

/// The next whole reply on `s`, decoded as the machine's answer of the
/// kind it `expect`s, or `None` until more bytes come. A reply that does
/// not decode is an answer too: a fault of its kind. A lookup's reply
/// leaves the job's tube name in `tube`.
#[cfg_attr(not(feature = "tokio"), allow(dead_code))]
pub(crate) fn next_answer<'s>(
    s: &'s mut Session,
    expect: Expect,
    tube: &mut String,
) -> Option<Answer<'s>> {
    let decoded = match skip_watching(s) {
        Ok(true) => {
            let kind = s.next_owed();
            match s.frame_reply() {
                Ok(Some(f)) => Ok((kind, s.take_reply(f))),
                Ok(None) => return None,
                Err(e) => Err(e),
            }
        }
        Ok(false) => return None,
        Err(e) => Err(e),
    };
    let (kind, reply) = match decoded {
        Ok((kind, reply)) => (kind, Ok(reply)),
        Err(e) => (None, Err(e)),
    };
    Some(match (expect, kind) {
        (Expect::Took, Some(CommandKind::ReserveWithTimeout { timeout })) => {
            Answer::Took(took_reply(reply, timeout))
        }
        (Expect::Settled, Some(CommandKind::Delete | CommandKind::Release | CommandKind::Bury)) => {
            Answer::Settled(settle_reply(reply))
        }
        (Expect::Touched, Some(CommandKind::Touch)) => Answer::Touched(touch_reply(reply)),
        (Expect::Info, Some(CommandKind::StatsJob)) => Answer::Info(info_reply(reply, Some(tube))),
        // Undecodable, or a reply to a request the machine did not make.
        (expect, _) => {
            let f = Fault::Conn(reply.err().unwrap_or(ConnectionError::Broken));
            match expect {
                Expect::Took => Answer::Took(Err(f)),
                Expect::Settled => Answer::Settled(Err(f)),
                Expect::Touched => Answer::Touched(Err(f)),
                Expect::Info => Answer::Info(Err(f)),
            }
        }
    })
}
