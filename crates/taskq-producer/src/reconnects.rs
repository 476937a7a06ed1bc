//! The reconnect bookkeeping both producers share: the rule (immediate after a
//! healthy spell, then backoff), its policy, and the count of connections
//! opened. The drivers differ only in how they wait and connect.

use std::time::{Duration, Instant};

use taskq_proto::{Backoff, Reconnect};

use crate::error::Error;

/// One server's reconnect state, as a producer keeps it.
#[derive(Debug)]
pub(crate) struct Reconnects {
    rule: Reconnect,
    backoff: Backoff,
    opened: u64,
}

impl Reconnects {
    pub(crate) fn new(backoff: Backoff) -> Reconnects {
        Reconnects {
            rule: Reconnect::new(),
            backoff,
            opened: 0,
        }
    }

    /// True once a reply came on the current connection: the steady state.
    #[inline]
    pub(crate) fn made_progress(&self) -> bool {
        self.rule.made_progress()
    }

    /// A reply came on the current connection.
    #[inline]
    pub(crate) fn progress(&mut self) {
        self.rule.progress();
    }

    /// What is left of the backoff before the next connect may go, if anything.
    pub(crate) fn wait_left(&self) -> Option<Duration> {
        self.rule.wait_left(Instant::now())
    }

    /// Connections opened so far.
    pub(crate) fn count(&self) -> u64 {
        self.opened
    }

    /// Records a connect attempt's result; an opened connection goes into `slot`.
    pub(crate) fn opened<'s, C>(
        &mut self,
        slot: &'s mut Option<C>,
        attempt: Result<C, Error>,
    ) -> Result<&'s mut C, Error> {
        match attempt {
            Ok(c) => {
                self.opened += 1;
                self.rule.opened();
                Ok(slot.insert(c))
            }
            Err(e) => {
                self.rule
                    .connect_failed(&self.backoff, Instant::now(), fastrand::u64(..));
                Err(e)
            }
        }
    }

    /// The connection in `slot` broke: drops it and applies the rule.
    pub(crate) fn broke<C>(&mut self, slot: &mut Option<C>) {
        *slot = None;
        self.rule
            .broke(&self.backoff, Instant::now(), fastrand::u64(..));
    }
}
