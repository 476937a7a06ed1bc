//! Rates from two snapshots, and the trend of each over the last few.

use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

use super::model::{Snapshot, Tube};

/// Per second between two samples: jobs put, jobs done and (JetStream) deliveries.
/// `None` where the engine keeps no such count, on the first sample, or when
/// a counter went back (the tube was made anew).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Rates {
    /// Jobs put per second.
    pub puts: Option<f64>,
    /// Jobs done (deleted; on a JetStream stream, removed) per second.
    pub done: Option<f64>,
    /// Deliveries per second (JetStream's consumers).
    pub delivered: Option<f64>,
}

/// The counters rates come from, at one sample.
#[derive(Debug, Clone, Copy)]
struct Counters {
    at: Instant,
    puts: Option<u64>,
    done: Option<u64>,
    delivered: Option<u64>,
}

impl Counters {
    fn rates(&self, before: &Counters) -> Rates {
        let secs = self.at.saturating_duration_since(before.at).as_secs_f64();
        let per = |now: Option<u64>, then: Option<u64>| match (now, then) {
            (Some(n), Some(t)) if n >= t && secs > 0.0 => Some((n - t) as f64 / secs),
            _ => None,
        };
        Rates {
            puts: per(self.puts, before.puts),
            done: per(self.done, before.done),
            delivered: per(self.delivered, before.delivered),
        }
    }
}

/// The last rates of one series (a tube or the server's totals), oldest first.
#[derive(Debug, Clone, Default)]
pub struct Trend {
    last: Option<Counters>,
    /// The rates between the last two samples.
    pub now: Rates,
    /// Up to the history's length of past rates, oldest first.
    pub past: VecDeque<Rates>,
}

impl Trend {
    fn add(&mut self, c: Counters, len: usize) {
        self.now = self.last.map(|l| c.rates(&l)).unwrap_or_default();
        if self.last.is_some() {
            if self.past.len() == len {
                self.past.pop_front();
            }
            self.past.push_back(self.now);
        }
        self.last = Some(c);
    }

    /// One series of the past rates (`f` picks it); a missing rate reads 0.
    pub fn series(&self, f: impl Fn(&Rates) -> Option<f64>) -> Vec<f64> {
        self.past.iter().map(|r| f(r).unwrap_or(0.0)).collect()
    }
}

/// The rates of one server's totals and of each of its tubes over the
/// snapshots seen, each trend `len` long.
#[derive(Debug, Clone)]
pub struct History {
    len: usize,
    /// The server's totals.
    pub totals: Trend,
    /// Each tube seen in the last snapshot, by name.
    pub tubes: BTreeMap<String, Trend>,
}

impl History {
    /// An empty history keeping `len` rates per series.
    pub fn new(len: usize) -> History {
        History {
            len: len.max(1),
            totals: Trend::default(),
            tubes: BTreeMap::new(),
        }
    }

    /// Adds a snapshot; tubes no longer in it are forgotten.
    pub fn add(&mut self, s: &Snapshot) {
        let counters = |t: &Tube| Counters {
            at: s.at,
            puts: t.jobs.puts,
            done: t.jobs.done,
            delivered: t.delivered(),
        };
        self.totals.add(
            Counters {
                at: s.at,
                puts: s.totals.jobs.puts,
                done: s.totals.jobs.done,
                // JetStream: every consumer's deliveries (a tube without one has made none).
                delivered: s
                    .nats
                    .as_ref()
                    .map(|_| s.tubes.iter().filter_map(Tube::delivered).sum()),
            },
            self.len,
        );
        let mut tubes = BTreeMap::new();
        for t in &s.tubes {
            let mut trend = self.tubes.remove(&t.name).unwrap_or_default();
            trend.add(counters(t), self.len);
            tubes.insert(t.name.clone(), trend);
        }
        self.tubes = tubes;
    }

    /// The trend of tube `name`.
    pub fn tube(&self, name: &str) -> Option<&Trend> {
        self.tubes.get(name)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(t0: Instant, secs: u64, puts: u64, done: u64) -> Counters {
        Counters {
            at: t0 + Duration::from_secs(secs),
            puts: Some(puts),
            done: Some(done),
            delivered: None,
        }
    }

    #[test]
    fn rates_come_from_successive_samples() {
        let t0 = Instant::now();
        let mut t = Trend::default();
        t.add(at(t0, 0, 10, 2), 12);
        assert_eq!(t.now, Rates::default());
        assert!(t.past.is_empty());
        t.add(at(t0, 2, 30, 7), 12);
        assert_eq!(
            (t.now.puts, t.now.done, t.now.delivered),
            (Some(10.0), Some(2.5), None)
        );
        // A tube made anew restarts its counters: no rate for that sample.
        t.add(at(t0, 3, 1, 0), 12);
        assert_eq!(t.now.puts, None);
        assert_eq!(t.series(|r| r.puts), [10.0, 0.0]);
        for i in 0..20 {
            t.add(at(t0, 4 + i, 1 + i, 0), 12);
        }
        assert_eq!(t.past.len(), 12);
        assert_eq!(t.now.puts, Some(1.0));
    }
}
