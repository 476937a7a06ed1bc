//! Lock-free counters: one relaxed atomic add per event, nothing allocated.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($( $(#[doc = $doc:literal])* $field:ident, )*) => {
        /// Live counters of a worker, shared by its threads.
        #[derive(Debug, Default)]
        pub struct Counters {
            $( $(#[doc = $doc])* pub $field: AtomicU64, )*
        }

        /// A copy of the counters at one moment.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
        #[non_exhaustive]
        pub struct Snapshot {
            $( $(#[doc = $doc])* pub $field: u64, )*
        }

        /// Each counter's name and what it counts (its doc comment), in the
        /// order of [`Snapshot::pairs`].
        pub const COUNTER_HELP: [(&str, &str); counters!(@count $($field)*)] =
            [ $( (stringify!($field), concat!($($doc, " "),*)), )* ];

        impl Counters {
            /// Reads every counter.
            pub fn snapshot(&self) -> Snapshot {
                Snapshot { $( $field: self.$field.load(Ordering::Relaxed), )* }
            }
        }

        impl Snapshot {
            /// Each counter's name and value, in a fixed order.
            pub fn pairs(&self) -> [(&'static str, u64); counters!(@count $($field)*)] {
                [ $( (stringify!($field), self.$field), )* ]
            }
        }
    };
    (@count) => { 0 };
    (@count $head:ident $($tail:ident)*) => { 1 + counters!(@count $($tail)*) };
}

counters! {
    /// Jobs the server handed out (`RESERVED`).
    reserved,
    /// Jobs deleted: the server answered `DELETED`. Only these are done.
    deleted,
    /// Jobs released back to the queue (`RELEASED`).
    released,
    /// Jobs buried (`BURIED`), after too many failed attempts or on request,
    /// and jobs larger than the limit set aside (see `too_big`; on JetStream
    /// those are terminated, not copied).
    buried,
    /// Jobs larger than the worker's limit (`max_job_size`), never run and
    /// settled once: buried on beanstalkd, terminated (`+TERM`) on
    /// JetStream. Each is also counted in `buried`.
    too_big,
    /// Handler calls that panicked. Each is a failed attempt, settled as
    /// `Outcome::Fail` is: released with the retry backoff, or buried after
    /// the last attempt; the thread goes on working.
    panicked,
    /// Touches the server confirmed (`TOUCHED`).
    touched,
    /// Deletes answered `NOT_FOUND`: the lease had run out and the job went
    /// back, so another worker may run it again. The `cmd-delete` bracket of
    /// docs/reliability.md counts these deletes: `deleted + lost_lease <= cmd-delete
    /// <= deleted + lost_lease + ack_unknown`.
    lost_lease,
    /// Releases and buries answered `NOT_FOUND`, or whose `stats-job` lookup
    /// was, and prefetched jobs whose lease ran out before they started (a
    /// touch answered `NOT_FOUND`; never run): the lease had run out first and
    /// the job went back by itself. No delete was sent for these.
    lost_lease_on_release,
    /// Deletes sent (or maybe sent) whose reply never came: maybe deleted, maybe not.
    /// On JetStream only once the job's ack wait ended: until then the ack
    /// is sent again on each new connection (see `acks_resent`).
    ack_unknown,
    /// JetStream: settles (acks) whose confirmation never came on the
    /// connection they went out on, sent again on a later connection and
    /// confirmed there. Each is also counted as what it did (`deleted`,
    /// `released`, `buried`).
    acks_resent,
    /// Held jobs let go without a reply because the connection broke (while the
    /// handler ran, or before a release or bury was answered), or whose delete
    /// surely never left: the server puts them back by itself when it notices.
    lease_dropped,
    /// `DEADLINE_SOON` replies to a reserve.
    deadline_soon,
    /// Connections opened again after a failure.
    reconnects,
    /// Connect attempts that failed.
    connect_failures,
    /// Replies that missed their deadline.
    io_timeouts,
    /// Reserve replies `TIMED_OUT`: a slice passed with no job.
    reserve_timeouts,
    /// Replies that cannot answer the command sent, or server errors.
    unexpected_replies,
    /// Write system calls on the worker's connections (each carries one request
    /// or several pipelined ones).
    writes,
    /// Read system calls on the worker's connections.
    reads,
}

impl Counters {
    #[inline]
    pub(crate) fn add(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

impl Snapshot {
    /// One flat JSON object with every counter at the top level.
    pub fn to_json(&self) -> String {
        let mut s = String::from("{");
        for (i, (k, v)) in self.pairs().iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            s.push('"');
            s.push_str(k);
            s.push_str("\":");
            s.push_str(&v.to_string());
        }
        s.push('}');
        s
    }

    /// Jobs reserved whose outcome is settled one way or another.
    pub fn settled(&self) -> u64 {
        self.deleted
            + self.released
            + self.buried
            + self.lost_lease
            + self.lost_lease_on_release
            + self.ack_unknown
            + self.lease_dropped
    }
}

impl Snapshot {
    /// A two-column table, one counter a line, for people.
    pub fn table(&self) -> String {
        let mut t = crate::table::Table::new();
        for (k, v) in self.pairs() {
            t.row([k.to_string(), v.to_string()]);
        }
        t.to_string()
    }
}

/// One line: `reserved 10 deleted 9 ...`, for a summary on stderr.
impl fmt::Display for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (k, v)) in self.pairs().iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{k} {v}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_flat_and_complete() {
        let c = Counters::default();
        Counters::add(&c.deleted);
        Counters::add(&c.deleted);
        Counters::add(&c.io_timeouts);
        let j = c.snapshot().to_json();
        assert!(j.starts_with("{\"reserved\":0,\"deleted\":2,"), "{j}");
        assert!(j.contains("\"io_timeouts\":1"), "{j}");
        assert_eq!(j.matches(':').count(), c.snapshot().pairs().len());
        assert_eq!(
            c.snapshot().to_string().split(' ').count(),
            2 * c.snapshot().pairs().len()
        );
        let table = c.snapshot().table();
        assert_eq!(table.lines().count(), c.snapshot().pairs().len());
        assert!(table.lines().nth(1).unwrap().starts_with("deleted "));
        assert!(table.lines().nth(1).unwrap().ends_with(" 2"));
        assert!(COUNTER_HELP.iter().all(|(_, h)| !h.trim().is_empty()));
        assert_eq!(COUNTER_HELP[1].0, "deleted");
    }
}
