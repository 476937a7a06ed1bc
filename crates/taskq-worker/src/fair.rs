//! Weighted tubes: which tube a connection reserves from next.
//!
//! beanstalkd serves the tubes a connection watches by strict priority (then
//! age), so a steady stream of urgent jobs in one tube starves the others. With
//! weights, each connection follows its own schedule instead and watches only
//! the tube whose turn it is:
//!
//! 1. The schedule is a cycle over the tubes in the order given: tube `i` gets a
//!    run of `weight[i] * run_scale` jobs in a row, then the next tube has its
//!    turn. Runs keep the `watch`/`ignore` switches rare: two commands per
//!    switch, sent in the same write as the previous job's `delete` and the next
//!    reserve, so they cost no round trip.
//! 2. During tube `i`'s run the connection watches `i` alone and reserves with
//!    `reserve-with-timeout 0`, which answers at once.
//! 3. When that answers `TIMED_OUT` (tube `i` has no ready job), the rest of the
//!    run is a *fallback run*: the connection watches every weighted tube and
//!    makes ordinary blocking reserves (server order: priority, then age), so an
//!    idle tube's share goes to the others and an empty queue costs one reserve
//!    per slice, as in strict mode. The fallback run ends after as many jobs as
//!    were left of tube `i`'s run; then the next tube has its turn.
//!
//! So while every tube has ready jobs, tube `i` gets `weight[i] / sum(weights)`
//! of the jobs each connection takes, whatever their priorities and ages; a tube
//! with nothing ready costs one immediate `TIMED_OUT` per cycle.

/// What the connection should watch for its next reserve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Want {
    /// Watch only this tube and try it without waiting.
    Try(usize),
    /// Watch every weighted tube and wait for a job.
    All,
}

/// One connection's place in the weighted cycle.
#[derive(Debug, Clone)]
pub(crate) struct Schedule {
    runs: Vec<u32>,
    turn: usize,
    left: u32,
    fallback: bool,
    /// The tube watched alone, or `None` when every weighted tube is watched.
    watching: Option<usize>,
}

impl Schedule {
    /// A schedule over tubes with these weights (each at least 1), starting at
    /// tube `start` (each connection's machine passes its server's index, so
    /// servers start at different tubes to spread the switches).
    pub(crate) fn new(weights: &[u32], run_scale: u32, start: usize) -> Schedule {
        let runs: Vec<u32> = weights
            .iter()
            .map(|w| w.max(&1).saturating_mul(run_scale.max(1)))
            .collect();
        let turn = start % runs.len().max(1);
        Schedule {
            left: runs.get(turn).copied().unwrap_or(1),
            runs,
            turn,
            fallback: false,
            watching: None,
        }
    }

    /// The next reserve's tube choice.
    pub(crate) fn want(&self) -> Want {
        if self.fallback {
            Want::All
        } else {
            Want::Try(self.turn)
        }
    }

    /// A job was reserved under the current choice.
    pub(crate) fn taken(&mut self) {
        self.left = self.left.saturating_sub(1);
        if self.left == 0 {
            self.next_turn();
        }
    }

    /// The tube tried had no ready job: the rest of its run is a fallback run.
    /// Jobs left in this turn (what one pull for the turn's tube asks at most).
    pub(crate) fn left(&self) -> u32 {
        self.left
    }

    pub(crate) fn empty(&mut self) {
        self.fallback = true;
    }

    fn next_turn(&mut self) {
        self.turn = (self.turn + 1) % self.runs.len();
        self.left = self.runs[self.turn];
        self.fallback = false;
    }

    /// The connection was opened again and watches every weighted tube.
    pub(crate) fn watching_all(&mut self) {
        self.watching = None;
    }

    /// The `watch`/`ignore` commands that bring the watch list to `want`, in a
    /// safe order (watch before ignore, so the list is never empty), passed to
    /// `emit` as (is_watch, tube index). Records the new watch list.
    pub(crate) fn switch(
        &mut self,
        want: Want,
        mut emit: impl FnMut(bool, usize) -> Result<(), taskq_proto::ConnectionError>,
    ) -> Result<usize, taskq_proto::ConnectionError> {
        let n = self.runs.len();
        let mut sent = 0;
        match (self.watching, want) {
            (Some(cur), Want::Try(t)) if cur == t => {}
            (None, Want::All) => {}
            (Some(cur), Want::Try(t)) => {
                emit(true, t)?;
                emit(false, cur)?;
                sent = 2;
            }
            (None, Want::Try(t)) => {
                for k in (0..n).filter(|&k| k != t) {
                    emit(false, k)?;
                    sent += 1;
                }
            }
            (Some(cur), Want::All) => {
                for k in (0..n).filter(|&k| k != cur) {
                    emit(true, k)?;
                    sent += 1;
                }
            }
        }
        self.watching = match want {
            Want::Try(t) => Some(t),
            Want::All => None,
        };
        Ok(sent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which tube each of `jobs` reservations comes from when every tube has
    /// ready jobs except those in `idle`.
    fn simulate(weights: &[u32], idle: &[usize], jobs: usize) -> Vec<usize> {
        let mut s = Schedule::new(weights, 2, 0);
        let mut got = Vec::new();
        let mut steps = 0;
        while got.len() < jobs {
            steps += 1;
            assert!(steps < 10 * jobs + 100, "no progress");
            match s.want() {
                Want::Try(t) if idle.contains(&t) => s.empty(),
                Want::Try(t) => {
                    got.push(t);
                    s.taken();
                }
                // The server's order among the busy tubes: the first busy one.
                Want::All => {
                    let t = (0..weights.len()).find(|t| !idle.contains(t)).unwrap();
                    got.push(t);
                    s.taken();
                }
            }
        }
        got
    }

    #[test]
    fn shares_follow_weights_while_all_are_busy() {
        let got = simulate(&[4, 1], &[], 1000);
        let standard = got.iter().filter(|&&t| t == 1).count();
        assert_eq!(standard, 200);
        // Runs: 8 then 2.
        assert_eq!(got[..10], [0, 0, 0, 0, 0, 0, 0, 0, 1, 1]);
        let got = simulate(&[3, 2, 1], &[], 600);
        let share = |k| got.iter().filter(|&&t| t == k).count();
        assert_eq!((share(0), share(1), share(2)), (300, 200, 100));
    }

    #[test]
    fn an_idle_tubes_share_goes_to_the_others() {
        let got = simulate(&[4, 1], &[0], 100);
        assert!(got.iter().all(|&t| t == 1));
        let got = simulate(&[4, 1], &[1], 100);
        assert!(got.iter().all(|&t| t == 0));
    }

    #[test]
    fn switches_are_two_commands_and_watch_comes_first() {
        let mut s = Schedule::new(&[4, 1, 1], 1, 0);
        let mut log = Vec::new();
        let mut rec = |w: bool, t: usize| {
            log.push((w, t));
            Ok(())
        };
        assert_eq!(s.switch(Want::Try(0), &mut rec).unwrap(), 2);
        assert_eq!(s.switch(Want::Try(0), &mut rec).unwrap(), 0);
        assert_eq!(s.switch(Want::Try(2), &mut rec).unwrap(), 2);
        assert_eq!(s.switch(Want::All, &mut rec).unwrap(), 2);
        assert_eq!(s.switch(Want::All, &mut rec).unwrap(), 0);
        assert_eq!(
            log,
            [
                (false, 1),
                (false, 2),
                (true, 2),
                (false, 0),
                (true, 0),
                (true, 1)
            ]
        );
    }
}
