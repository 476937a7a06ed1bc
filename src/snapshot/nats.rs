//! A snapshot of a JetStream cluster in taskq's layout.
//!
//! A tube is the union of what the stream holds on `taskq.T` and
//! `taskq.T.buried` and of the durable consumer `taskq-T`: its ready jobs are
//! the consumer's pending messages (or, before any worker made the consumer,
//! the messages stored on `taskq.T`), its reserved jobs the consumer's
//! deliveries not yet acked, its buried jobs the messages on `taskq.T.buried`,
//! its pause the consumer's (nats-server 2.11+). The age of the next ready
//! job is that of the first message on `taskq.T` the consumer has not
//! delivered, read by sequence (which does not disturb the queue).

use std::collections::BTreeMap;
use std::time::{Instant, SystemTime};

use super::model::{ConsumerRow, Counts, NatsRecord, NatsTube, Scope, Snapshot, Totals, Tube};
use crate::clock;
use crate::jetstream::Js;

/// What one tube's counts come to, from its subjects' counts and its consumer.
fn tube_of(name: &str, stored: u64, buried: u64, consumer: Option<ConsumerRow>) -> Tube {
    let c = consumer.as_ref();
    Tube {
        name: name.to_owned(),
        known: c.is_some() || stored + buried > 0,
        jobs: Counts {
            // Jobs no worker holds: the consumer's pending messages, or every
            // stored one before there is a consumer.
            ready: c.map_or(stored, |c| c.pending),
            urgent: 0,
            reserved: c.map_or(0, |c| c.ack_pending),
            delayed: None,
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
    let (mut tubes, consumers) = match scope.tubes {
        None => {
            let consumers = js.consumers()?;
            (every_tube(js, &consumers)?, consumers)
        }
        Some(names) => {
            let counts = js.subject_counts(&js.layout().capture())?;
            let mut tubes = Vec::with_capacity(names.len());
            let mut consumers = Vec::new();
            for name in names {
                let consumer = js.consumer(name)?;
                consumers.extend(consumer.clone());
                let on = |subject: String| counts.get(&subject).copied().unwrap_or(0);
                let (stored, buried) = (
                    on(js.layout().subject(name)),
                    on(js.layout().buried_subject(name)),
                );
                tubes.push(tube_of(name, stored, buried, consumer));
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
            delayed: None,
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
fn every_tube(js: &mut Js, consumers: &[ConsumerRow]) -> Result<Vec<Tube>, String> {
    let counts = js.subject_counts(&js.layout().capture())?;
    // name -> (stored, buried, consumer)
    let mut tubes: BTreeMap<String, (u64, u64, Option<ConsumerRow>)> = BTreeMap::new();
    for (subject, n) in &counts {
        match js.layout().tube_of(subject) {
            Some((t, true)) => tubes.entry(t.to_owned()).or_default().1 += n,
            Some((t, false)) => tubes.entry(t.to_owned()).or_default().0 += n,
            None => {}
        }
    }
    for c in consumers {
        if let Some(t) = c.tube() {
            tubes.entry(t.to_owned()).or_default().2 = Some(c.clone());
        }
    }
    Ok(tubes
        .into_iter()
        .map(|(name, (stored, buried, c))| tube_of(&name, stored, buried, c))
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
