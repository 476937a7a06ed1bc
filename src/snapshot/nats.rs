//! A snapshot of a JetStream cluster in taskq's layout.
//!
//! A tube is the union of what the stream holds on `taskq.T`,
//! `taskq.T.buried` and `taskq.T.delayed.>` and of the durable consumer
//! `taskq-T`: its ready jobs are the consumer's pending messages (or, before
//! any worker made the consumer, the messages stored on `taskq.T`), its
//! reserved jobs the consumer's deliveries not yet acked, its buried jobs the
//! messages on `taskq.T.buried`, its delayed jobs the message schedules the
//! server holds for it (on a stream that allows them; elsewhere delayed jobs
//! wait among the ready ones and the count is unknown), its pause the
//! consumer's (nats-server 2.11+). The age of the next ready
//! job is that of the first message on `taskq.T` the consumer has not
//! delivered, read by sequence (which does not disturb the queue).

use std::collections::BTreeMap;
use std::time::{Instant, SystemTime};

use taskq_connect::SubjectKind;

use super::model::{
    too_many_tubes, ConsumerRow, Counts, NatsRecord, NatsTube, Scope, Snapshot, Totals, Tube,
    MAX_TUBES,
};
use crate::clock;
use crate::jetstream::Js;

/// Messages of one tube on the stream, by subject.
#[derive(Debug, Clone, Copy, Default)]
struct Stored {
    /// On `taskq.T`.
    tube: u64,
    /// On `taskq.T.buried`.
    buried: u64,
    /// On `taskq.T.delayed.>`: schedules the server holds.
    delayed: u64,
}

/// Every tube's messages, from the count of each subject of the stream.
fn stored_by_tube(js: &mut Js) -> Result<BTreeMap<String, Stored>, String> {
    let layout = js.layout().clone();
    let mut tubes: BTreeMap<String, Stored> = BTreeMap::new();
    let mut over = false;
    // Folded by tube as the pages come: a stream holds a subject for each
    // delayed job, and only the tubes are kept, no more than `MAX_TUBES`.
    js.fold_subject_counts(&layout.capture(), |subject, n| {
        if let Some((t, kind)) = layout.tube_of(subject) {
            let full = tubes.len() >= MAX_TUBES;
            let s = match tubes.get_mut(t) {
                Some(s) => s,
                None if full => {
                    over = true;
                    return;
                }
                None => tubes.entry(t.to_owned()).or_default(),
            };
            match kind {
                SubjectKind::Tube => s.tube += n,
                SubjectKind::Buried => s.buried += n,
                SubjectKind::Delayed { .. } => s.delayed += n,
            }
        }
    })?;
    if over {
        return Err(too_many_tubes("the stream's subjects"));
    }
    Ok(tubes)
}

/// What one tube's counts come to, from its subjects' counts and its
/// consumer; `schedules`: the stream allows message schedules, so its
/// delayed jobs are known.
fn tube_of(name: &str, s: Stored, schedules: bool, consumer: Option<ConsumerRow>) -> Tube {
    let c = consumer.as_ref();
    let (stored, buried) = (s.tube, s.buried);
    Tube {
        name: name.to_owned(),
        known: c.is_some() || stored + buried + s.delayed > 0,
        jobs: Counts {
            // Jobs no worker holds: the consumer's pending messages, or every
            // stored one before there is a consumer.
            ready: c.map_or(stored, |c| c.pending),
            urgent: 0,
            reserved: c.map_or(0, |c| c.ack_pending),
            delayed: schedules.then_some(s.delayed),
            buried,
            waiting: c.map_or(0, |c| c.waiting),
            puts: None,
            done: None,
        },
        paused: c.map_or(0, |c| c.pause_left),
        ready_age: None,
        pairs: Vec::new(),
        nats: Some(NatsTube { consumer, stored }),
    }
}

/// Reads the stream, the consumers and the tubes of `scope`; a missing
/// stream is an error naming it.
pub fn read(js: &mut Js, scope: Scope<'_>) -> Result<Snapshot, String> {
    let Some(stream) = js.stream_info()? else {
        return Err(js.no_stream());
    };
    let schedules = stream.allow_msg_schedules;
    let (mut tubes, consumers) = match scope.tubes {
        None => {
            let consumers = js.consumers()?;
            (every_tube(js, &consumers, schedules)?, consumers)
        }
        Some(names) => {
            let stored = stored_by_tube(js)?;
            let mut tubes = Vec::with_capacity(names.len());
            let mut consumers = Vec::new();
            for name in names {
                let consumer = js.consumer(name)?;
                consumers.extend(consumer.clone());
                let s = stored.get(name.as_str()).copied().unwrap_or_default();
                tubes.push(tube_of(name, s, schedules, consumer));
            }
            (tubes, consumers)
        }
    };
    let (at, wall) = (Instant::now(), SystemTime::now());
    if scope.ready_age {
        for t in tubes.iter_mut().filter(|t| t.jobs.ready > 0) {
            t.ready_age = ready_age(js, t, wall)?;
        }
    }
    let sum = |f: fn(&Counts) -> u64| tubes.iter().map(|t| f(&t.jobs)).sum::<u64>();
    let totals = Totals {
        version: String::new(),
        uptime: None,
        tubes: tubes.iter().filter(|t| t.known).count() as u64,
        jobs: Counts {
            ready: sum(|c| c.ready),
            urgent: 0,
            reserved: sum(|c| c.reserved),
            delayed: schedules.then(|| sum(|c| c.delayed.unwrap_or(0))),
            buried: sum(|c| c.buried),
            waiting: sum(|c| c.waiting),
            puts: Some(stream.last_seq),
            done: Some(stream.last_seq.saturating_sub(stream.messages)),
        },
        connections: None,
        producers: None,
        workers: None,
        pairs: Vec::new(),
    };
    Ok(Snapshot {
        at,
        totals,
        tubes,
        nats: Some(NatsRecord { stream, consumers }),
    })
}

/// Every tube: those with messages on the stream and those with a consumer, by name.
fn every_tube(
    js: &mut Js,
    consumers: &[ConsumerRow],
    schedules: bool,
) -> Result<Vec<Tube>, String> {
    let mut tubes: BTreeMap<String, (Stored, Option<ConsumerRow>)> = stored_by_tube(js)?
        .into_iter()
        .map(|(name, s)| (name, (s, None)))
        .collect();
    for c in consumers {
        if let Some(t) = c.tube() {
            tubes.entry(t.to_owned()).or_default().1 = Some(c.clone());
        }
    }
    Ok(tubes
        .into_iter()
        .map(|(name, (s, c))| tube_of(&name, s, schedules, c))
        .collect())
}

/// The age of the first message on `taskq.T` the tube's consumer has not
/// delivered (the first stored one before there is a consumer).
fn ready_age(js: &mut Js, t: &Tube, now: SystemTime) -> Result<Option<u64>, String> {
    let from = t
        .nats
        .as_ref()
        .and_then(|n| n.consumer.as_ref())
        .map_or(1, |c| c.delivered_stream.saturating_add(1));
    let subject = js.layout().subject(&t.name);
    Ok(js
        .first_on(&subject, from)?
        .and_then(|m| clock::parse_rfc3339(&m.time))
        .map(|stored| clock::secs_between(stored, now)))
}
