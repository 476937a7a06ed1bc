//! Looking at jobs and moving them, on either engine: the next ready,
//! delayed or buried job of a tube, a job by id, kicks, deletes and pauses.
//! The operators' commands print what these return; `taskq web` shows it.

use std::time::{Duration, SystemTime};

use taskq_connect::nats::StoredMsg;
use taskq_connect::{Engine, SubjectKind};
use taskq_proto::nats::HeaderBlock;
use taskq_proto::{Command, Connection, JobStats, Reply};

use crate::clock;
use crate::jetstream::{Js, Unsupported};
use crate::server::{request, unexpected, use_tube, Conn};

/// Which job of a tube to look at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// The job the next reserve would get.
    Ready,
    /// The delayed job that becomes ready first.
    Delayed,
    /// The oldest buried job.
    Buried,
}

impl Which {
    /// Its state's name.
    pub fn name(self) -> &'static str {
        match self {
            Which::Ready => "ready",
            Which::Delayed => "delayed",
            Which::Buried => "buried",
        }
    }
}

/// A job as the server holds it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobView {
    /// Its id (on JetStream, its stream sequence).
    pub id: u64,
    /// Its tube, when known.
    pub tube: Option<String>,
    /// Its state (`gone` when it went between two requests).
    pub state: String,
    /// Seconds since it was put (JetStream: since this copy was stored).
    pub age: Option<u64>,
    /// Times it was handed out (beanstalkd's reserves; JetStream keeps no
    /// count for a stored message).
    pub attempts: Option<u64>,
    /// The server's other figures of it, by name, for display.
    pub details: Vec<(String, String)>,
    /// Its headers (JetStream), each as `Name: value`.
    pub headers: Vec<Vec<u8>>,
    /// Its body.
    pub body: Vec<u8>,
}

/// The job `which` of `tube`, `Ok(None)` when there is none. On JetStream
/// the next delayed job is the schedule of the tube that fires first, on a
/// stream that allows message schedules; elsewhere it is refused
/// ([`delayed_on_nats`]).
pub fn peek(conn: &mut Conn, tube: &str, which: Which) -> Result<Option<JobView>, String> {
    match conn {
        Conn::Beanstalkd(c) => {
            use_tube(c, tube)?;
            let cmd = match which {
                Which::Ready => Command::PeekReady,
                Which::Delayed => Command::PeekDelayed,
                Which::Buried => Command::PeekBuried,
            };
            beanstalkd_job(c, &cmd)
        }
        Conn::Nats(js) => {
            let m = match which {
                Which::Ready => js.next_ready(tube)?,
                Which::Buried => {
                    let buried = js.layout().buried_subject(tube);
                    js.first_on(&buried, 1)?
                }
                Which::Delayed => next_delayed(js, tube)?,
            };
            Ok(m.map(|m| nats_job(js, m, Some(which))))
        }
    }
}

/// The delayed job of `tube` that the server makes ready first: of the
/// tube's schedules (`taskq.T.delayed.<S>.<ID>`), the one with the earliest
/// second `S`. Refused on a stream without message schedules.
fn next_delayed(js: &mut Js, tube: &str) -> Result<Option<StoredMsg>, String> {
    let Some(stream) = js.stream_info()? else {
        return Err(js.no_stream());
    };
    if !stream.allow_msg_schedules {
        return Err(delayed_on_nats().to_string());
    }
    // Only the earliest is kept as the pages come: a tube may hold
    // millions of delayed jobs, each on a subject of its own.
    let layout = js.layout().clone();
    let mut first: Option<(u64, String)> = None;
    js.fold_subject_counts(&layout.delayed_filter(tube), |s, _| {
        if let Some((_, SubjectKind::Delayed { at })) = layout.tube_of(s) {
            if first.as_ref().is_none_or(|(t, _)| at < *t) {
                first = Some((at, s.to_owned()));
            }
        }
    })?;
    match first {
        Some((_, subject)) => js.first_on(&subject, 1),
        None => Ok(None),
    }
}

/// Why a stream without message schedules has no "next delayed job".
pub fn delayed_on_nats() -> Unsupported {
    Unsupported::nats(
        "peek --delayed",
        "this stream has no message schedules (nats-server before 2.12, or a stream kept as it was with --keep-stream-config), so delayed jobs wait among the ready ones, unordered, until a worker is handed one early and gives it back",
    )
}

/// Job `id`, `Ok(None)` when the server has none.
pub fn job(conn: &mut Conn, id: u64) -> Result<Option<JobView>, String> {
    match conn {
        Conn::Beanstalkd(c) => beanstalkd_job(c, &Command::Peek { id }),
        Conn::Nats(js) => Ok(js.job(id)?.map(|m| nats_job(js, m, None))),
    }
}

/// Sends a peek and reads the job it finds with `stats-job`.
fn beanstalkd_job(c: &mut Connection, peek: &Command<'_>) -> Result<Option<JobView>, String> {
    let Some((id, body)) = request(c, peek, |r| match r {
        Reply::Found { id, body } => Ok(Some((id, body.to_vec()))),
        Reply::NotFound => Ok(None),
        other => Err(unexpected(peek, &other)),
    })?
    else {
        return Ok(None);
    };
    let stats = Command::StatsJob { id };
    let mut v = JobView {
        id,
        body,
        ..JobView::default()
    };
    request(c, &stats, |r| match r {
        Reply::Ok { yaml } => {
            let s = JobStats::parse(yaml).map_err(|e| format!("reading stats-job: {e}"))?;
            v.tube = Some(s.tube.to_owned());
            v.state = s.state.to_owned();
            v.age = Some(s.age);
            v.attempts = Some(s.reserves);
            v.details = [
                ("tube", s.tube.to_string()),
                ("state", s.state.to_string()),
                ("pri", s.pri.to_string()),
                ("age", format!("{} s", s.age)),
                ("delay", format!("{} s", s.delay)),
                ("ttr", format!("{} s", s.ttr)),
                ("reserves", s.reserves.to_string()),
                ("releases", s.releases.to_string()),
                ("buries", s.buries.to_string()),
                ("timeouts", s.timeouts.to_string()),
                ("kicks", s.kicks.to_string()),
            ]
            .map(|(k, v)| (k.to_owned(), v))
            .into();
            Ok(())
        }
        // Deleted or reserved away between the peek and the lookup.
        Reply::NotFound => {
            v.state = "gone".into();
            v.details = vec![("state".into(), "gone (deleted since the peek)".into())];
            Ok(())
        }
        other => Err(unexpected(&stats, &other)),
    })?;
    Ok(Some(v))
}

/// A stored message as a job: its tube from its subject, its state the one
/// it was looked up as (else told by its subject: buried, or stored).
fn nats_job(js: &Js, m: StoredMsg, which: Option<Which>) -> JobView {
    let kind = js.layout().tube_of(&m.subject);
    let (tube, state) = match kind {
        Some((t, SubjectKind::Buried)) => (Some(t.to_owned()), "buried"),
        Some((t, SubjectKind::Delayed { .. })) => (Some(t.to_owned()), "delayed"),
        Some((t, SubjectKind::Tube)) => (Some(t.to_owned()), "stored"),
        None => (None, "not a taskq job"),
    };
    let state = which.map_or(state, Which::name);
    let mut details = vec![
        ("tube".to_owned(), tube.clone().unwrap_or_default()),
        ("state".to_owned(), state.to_owned()),
        ("subject".to_owned(), m.subject.clone()),
        ("stored".to_owned(), m.time.clone()),
    ];
    if let Some((_, SubjectKind::Delayed { at })) = kind {
        let ready = SystemTime::UNIX_EPOCH + Duration::from_secs(at);
        details.push(("ready at".to_owned(), clock::format_rfc3339(ready)));
    }
    let headers = HeaderBlock::parse(&m.headers)
        .map(|h| h.iter().map(|(k, v)| [k, b": ", v].concat()).collect())
        .unwrap_or_default();
    JobView {
        id: m.seq,
        tube,
        state: state.to_owned(),
        age: clock::parse_rfc3339(&m.time).map(|t| clock::secs_between(t, SystemTime::now())),
        attempts: None,
        details,
        headers,
        body: m.data,
    }
}

/// Moves up to `bound` of `tube`'s buried jobs (on beanstalkd, when none is
/// buried, its delayed ones) back to ready; how many.
pub fn kick(conn: &mut Conn, tube: &str, bound: u32) -> Result<u64, String> {
    match conn {
        Conn::Beanstalkd(c) => {
            use_tube(c, tube)?;
            let cmd = Command::Kick { bound };
            request(c, &cmd, |r| match r {
                Reply::Kicked { count } => Ok(count),
                other => Err(unexpected(&cmd, &other)),
            })
        }
        Conn::Nats(js) => js.kick(tube, u64::from(bound)),
    }
}

/// Moves job `id`, buried (or, on beanstalkd, delayed), back to ready:
/// `Ok(Err(why))` when it is not such a job.
pub fn kick_job(conn: &mut Conn, id: u64) -> Result<Result<(), String>, String> {
    const MISSING: &str = "not found, or neither buried nor delayed";
    match conn {
        Conn::Beanstalkd(c) => settle(c, &Command::KickJob { id }, MISSING),
        Conn::Nats(js) => {
            let Some(m) = js.job(id)? else {
                return Ok(Err(MISSING.to_owned()));
            };
            match js.layout().tube_of(&m.subject) {
                Some((tube, SubjectKind::Buried)) => {
                    let tube = tube.to_owned();
                    js.kick_one(&m, &tube).map(|_| Ok(()))
                }
                _ => Ok(Err(Unsupported::nats(
                    "kick-job of a job that is not buried",
                    "a ready or reserved job is held by its tube's consumer, and a delayed one waits there for its time",
                )
                .to_string())),
            }
        }
    }
}

/// Deletes job `id`: `Ok(Err(why))` when there is no such job to delete. On
/// JetStream only messages of taskq's layout are deleted.
pub fn delete(conn: &mut Conn, id: u64) -> Result<Result<(), String>, String> {
    match conn {
        Conn::Beanstalkd(c) => settle(
            c,
            &Command::Delete { id },
            "not found, or reserved by another connection",
        ),
        Conn::Nats(js) => {
            let Some(m) = js.job(id)? else {
                return Ok(Err("not found".to_owned()));
            };
            if js.layout().tube_of(&m.subject).is_none() {
                return Ok(Err(format!("not a taskq job (subject {})", m.subject)));
            }
            Ok(if js.delete(id)? {
                Ok(())
            } else {
                Err("not found".to_owned())
            })
        }
    }
}

/// Sends `cmd` about one job: `Ok(Err(missing))` when the server has no
/// such job (in a state the command acts on).
fn settle(
    c: &mut Connection,
    cmd: &Command<'_>,
    missing: &str,
) -> Result<Result<(), String>, String> {
    request(c, cmd, |r| match r {
        Reply::KickedJob | Reply::Deleted => Ok(Ok(())),
        Reply::NotFound => Ok(Err(missing.to_owned())),
        other => Err(unexpected(cmd, &other)),
    })
}

/// Hands out no job of `tube` for `secs` seconds (0 ends a pause). On
/// JetStream the tube's consumer is paused (nats-server 2.11+; refused,
/// naming the server's version, on older servers), and created first, with
/// `ack_wait` as a worker's, when no worker has made it yet.
pub fn pause(
    conn: &mut Conn,
    tube: &str,
    secs: u32,
    ack_wait: Option<Duration>,
) -> Result<(), String> {
    match conn {
        Conn::Beanstalkd(c) => {
            let cmd = Command::PauseTube { tube, delay: secs };
            request(c, &cmd, |r| match r {
                Reply::Paused => Ok(()),
                Reply::NotFound => Err(format!("no tube named {tube}")),
                other => Err(unexpected(&cmd, &other)),
            })
        }
        Conn::Nats(js) => {
            let until = (secs > 0).then(|| SystemTime::now() + Duration::from_secs(secs.into()));
            js.pause(tube, until, ack_wait)
        }
    }
}

/// The engine a connection reaches.
pub fn engine(conn: &Conn) -> Engine {
    match conn {
        Conn::Beanstalkd(_) => Engine::Beanstalkd,
        Conn::Nats(_) => Engine::Nats,
    }
}
