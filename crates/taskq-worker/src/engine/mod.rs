//! The engine seam: what the worker's machines need of a queue server, in
//! their own words (reserve, settle, touch, look up), with the wire
//! protocol behind it: beanstalkd's commands and replies (`beanstalkd`),
//! JetStream's set-up and parts (`nats`), and the types both share
//! (`seam`).

mod beanstalkd;
pub(crate) mod nats;
mod seam;

#[cfg(test)]
pub(crate) use beanstalkd::settle_reply;
pub(crate) use beanstalkd::{next_answer, queue_watch, skip_watching};
pub(crate) use seam::{
    Ask, Carry, Fault, JobLink, Pool, Req, Settle, SettleReply, Took, Unconfirmed, BODY_ROOM,
};
