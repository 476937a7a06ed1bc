//! The engine seam: what the worker's loop needs of a queue server, in the
//! loop's own words (reserve, settle, touch, look up), with the wire protocol
//! behind it.
//!
//! The loop (`worker::lane` and `worker::turn`) owns the accounting: tickets,
//! counters, the lane states a shutdown reads, the reconnect rule, logging.
//! An engine owns one connection's protocol: how a reserve is asked for (and
//! the tube switches of the weighted schedule), which replies are owed, how a
//! settle and the next reserve share one write, and what each reply means. The
//! loop is generic over the engine's [`Link`], so the hot path is monomorphic:
//! no boxing, no allocation, no extra write per job. [`Beanstalkd`] is the
//! first engine.

mod beanstalkd;
pub(crate) mod nats;
mod seam;

#[cfg(test)]
pub(crate) use beanstalkd::settle_reply;
pub(crate) use beanstalkd::Beanstalkd;
#[cfg_attr(not(feature = "tokio"), allow(unused_imports))]
pub(crate) use beanstalkd::{next_answer, queue_watch, skip_watching};
pub(crate) use nats::Nats;
pub(crate) use seam::{
    Ask, Carry, Fault, JobLink, Link, Pool, Req, Settle, SettleReply, Taken, Took, Unconfirmed,
    BODY_ROOM,
};
