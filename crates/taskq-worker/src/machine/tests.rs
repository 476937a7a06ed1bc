//! The machine driven by hand: requests encoded on a real protocol
//! session, replies as the server's bytes, time as given `Instant`s. No
//! socket, no clock read, no sleep.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use taskq_proto::{earliest, Limits, Session};

use super::*;
use crate::config::Config;
use crate::engine::next_answer;
use crate::machine::lease::{HOLD_MAX, TOUCH_AFTER};

const MS: Duration = Duration::from_millis(1);

/// A machine on a session, with the worker state it counts into.
struct Rig {
    sh: Arc<Shared>,
    m: Machine,
    wire: Session,
    t0: Instant,
    /// The jobs looked up and to run: (slot, attempt).
    runs: Vec<(usize, u32)>,
    /// The tube of the last job looked up.
    tube: String,
}

/// A session as the driver's connection opens it.
fn wire(sh: &Shared) -> Session {
    let mut wire = Session::new(sh.cfg.limits);
    wire.set_io_timeout(sh.cfg.io_timeout);
    wire.skip_large_jobs();
    wire
}

impl Rig {
    fn new(cfg: Config) -> Rig {
        Rig::of(Shared::new(cfg, false))
    }

    /// The blocking worker's machine: no lookup before a job starts, every
    /// job handed to the handler threads at once.
    fn blocking(mut cfg: Config) -> Rig {
        cfg.job_lookup = false;
        Rig::of(Shared::new(cfg, true))
    }

    fn of(sh: Shared) -> Rig {
        let t0 = Instant::now();
        let sh = Arc::new(sh);
        let mut m = Machine::new(&sh, 0, t0);
        assert!(m.wants_connect(&sh, t0));
        m.connected(&sh, t0);
        let wire = wire(&sh);
        Rig {
            sh,
            m,
            wire,
            t0,
            runs: Vec::new(),
            tube: String::new(),
        }
    }

    fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }

    /// What the machine sends at `ms`, as the wire's lines.
    fn send(&mut self, ms: u64) -> Vec<String> {
        let now = self.at(ms);
        self.m.transmit(&self.sh, now, &mut self.wire).unwrap();
        let bytes = self.wire.queued().to_vec();
        self.wire.queue_sent();
        // As the driver: a reply owed is waited for from now.
        self.wire.start_wait(now);
        String::from_utf8(bytes)
            .unwrap()
            .split_terminator("\r\n")
            .map(str::to_owned)
            .collect()
    }

    /// The server's bytes arrive at `ms`; the machine takes every whole
    /// reply. Returns the jobs to start, and whether the connection broke.
    fn reply(&mut self, ms: u64, bytes: &[u8]) -> (Vec<Start>, bool) {
        let now = self.at(ms);
        let room = self.wire.recv_room().unwrap();
        room[..bytes.len()].copy_from_slice(bytes);
        self.wire.received(bytes.len());
        let mut starts = Vec::new();
        loop {
            let Some(expect) = self.m.expect() else {
                // As the driver: the watch list's replies are read too.
                if let Err(e) = crate::engine::skip_watching(&mut self.wire) {
                    self.m.reply_overdue(&self.sh, now, e, 0);
                    return (starts, true);
                }
                break;
            };
            let Some(answer) = next_answer(&mut self.wire, expect, &mut self.tube) else {
                break;
            };
            match self.m.on_reply(&self.sh, now, answer, 0) {
                Ok(Step::Hold(s)) => starts.push(s),
                Ok(Step::Take(s)) => {
                    starts.push(s);
                    self.runs.push((s.slot, 0));
                }
                Ok(Step::Run { slot, attempt, .. }) => self.runs.push((slot, attempt)),
                Ok(Step::Wait { .. }) | Ok(Step::Told { .. }) => {}
                Ok(Step::Nothing) => {}
                Err(()) => return (starts, true),
            }
        }
        // As the driver: the next reply owed is waited for from now.
        self.wire.start_wait(now);
        (starts, false)
    }

    /// When the driver would wake, as of `ms`: the earlier of the
    /// machine's deadlines and the session's reply deadline.
    fn due(&self, ms: u64) -> Option<Instant> {
        earliest(
            self.m.poll_timeout(&self.sh, self.at(ms)),
            self.wire.poll_timeout(),
        )
    }

    /// The driver's deadline check at `now`: true when the reply owed was
    /// overdue and the machine gave the connection up.
    fn overdue(&mut self, now: Instant) -> bool {
        match self.wire.handle_timeout(now) {
            Ok(()) => false,
            Err(e) => {
                self.m.reply_overdue(&self.sh, now, e, 0);
                true
            }
        }
    }

    /// The jobs `bytes` brings at `ms` are looked up (each `releases`
    /// times released before) and run, as many as there are handlers (no
    /// handler busy before): their slots.
    fn take(&mut self, ms: u64, bytes: &[u8], releases: u64) -> Vec<Start> {
        let (starts, broke) = self.reply(ms, bytes);
        assert!(!broke);
        let sent = self.send(ms);
        let lookups: Vec<String> = starts
            .iter()
            .map(|s| format!("stats-job {}", s.id))
            .collect();
        assert_eq!(sent[..lookups.len()], lookups[..], "{sent:?}");
        let answers: Vec<u8> = starts.iter().flat_map(|_| stats(releases)).collect();
        self.runs.clear();
        let (more, broke) = self.reply(ms, &answers);
        assert!(more.is_empty() && !broke);
        // As many run as there are handlers (the rest wait, held).
        assert_eq!(
            self.runs.iter().map(|r| r.0).collect::<Vec<_>>(),
            starts
                .iter()
                .map(|s| s.slot)
                .take(self.sh.cfg.concurrency)
                .collect::<Vec<_>>()
        );
        starts
    }

    fn counts(&self) -> crate::Snapshot {
        self.sh.counters.snapshot()
    }
}

fn cfg(concurrency: usize) -> Config {
    Config {
        concurrency,
        ..Config::default()
    }
}

fn reserved(id: u64) -> Vec<u8> {
    format!("RESERVED {id} 4\r\nbody\r\n").into_bytes()
}

const STATS: &str = "OK 143\r\n---\nid: 7\ntube: default\nstate: reserved\npri: 9\nage: 0\ndelay: 0\nttr: 60\ntime-left: 59\nfile: 0\nreserves: 1\ntimeouts: 0\nreleases: RR\nburies: 0\n\r\n";

/// A `stats-job` reply for a job with priority 9 and `releases` releases.
fn stats(releases: u64) -> Vec<u8> {
    let yaml = STATS.split_once("\r\n").unwrap().1;
    let yaml = yaml.replace("RR", &releases.to_string());
    let body = &yaml[..yaml.len() - 2];
    format!("OK {}\r\n{body}\r\n", body.len()).into_bytes()
}

#[test]
fn the_window_is_filled_with_no_wait_reserves_and_a_job_is_done_only_on_deleted() {
    let mut r = Rig::new(cfg(3));
    assert_eq!(r.send(0), ["reserve-with-timeout 0"; 3]);
    let (held, _) = r.reply(1, &[reserved(1), reserved(2), reserved(3)].concat());
    assert_eq!(held.iter().map(|s| s.id).collect::<Vec<_>>(), [1, 2, 3]);
    // Each job is looked up before it runs: its tube and attempt.
    assert_eq!(r.send(1), ["stats-job 1", "stats-job 2", "stats-job 3"]);
    r.reply(2, &[stats(0), stats(2), stats(0)].concat());
    assert_eq!(
        r.runs,
        [(held[0].slot, 1), (held[1].slot, 3), (held[2].slot, 1)]
    );
    // Three jobs run: no room, nothing to send.
    assert!(r.send(2).is_empty());
    r.m.finished(&r.sh, held[0].slot, Outcome::Done, None);
    // The delete and the refill for its room, in one write.
    assert_eq!(r.send(3), ["delete 1", "reserve-with-timeout 0"]);
    let c = r.counts();
    assert_eq!((c.reserved, c.deleted), (3, 0), "not done before DELETED");
    let (_, broke) = r.reply(4, b"DELETED\r\nTIMED_OUT\r\n");
    assert!(!broke);
    assert_eq!(r.counts().deleted, 1);
    assert_eq!(r.m.running(), 2);
    assert_eq!(r.tube, "default", "the lookup tells the tube");
}

#[test]
fn a_dry_server_is_probed_with_a_growing_wait_while_jobs_run_and_waited_on_once_they_end() {
    let mut r = Rig::new(cfg(2));
    r.send(0);
    let starts = r.take(1, b"RESERVED 5 4\r\nbody\r\nTIMED_OUT\r\n", 0);
    assert_eq!(starts.len(), 1);
    // A job runs and the server had nothing: one probe, then none until it
    // is due, at a wait that doubles. (The probe went with the lookup.)
    r.reply(1, b"TIMED_OUT\r\n");
    assert!(
        r.send(2).is_empty(),
        "no probe before its wait: no tight loop"
    );
    let due = r.m.poll_timeout(&r.sh, r.at(0)).unwrap();
    assert_eq!(due, r.at(1) + PROBE_MIN);
    assert_eq!(r.send(11), ["reserve-with-timeout 0"]);
    r.reply(12, b"TIMED_OUT\r\n");
    assert_eq!(
        r.m.poll_timeout(&r.sh, r.at(0)).unwrap(),
        r.at(11) + 2 * PROBE_MIN
    );
    // The job ends: its delete goes alone (nothing may wait behind a
    // blocking reserve); once it is answered, one blocking reserve.
    r.m.finished(&r.sh, starts[0].slot, Outcome::Done, None);
    assert_eq!(r.send(30), ["delete 5"]);
    r.reply(31, b"DELETED\r\n");
    assert_eq!(r.send(31), ["reserve-with-timeout 1"]);
    assert!(r.send(500).is_empty());
    // The blocking reserve's deadline is the slice plus the I/O timeout.
    let io = r.sh.cfg.io_timeout;
    assert_eq!(r.due(500), Some(r.at(31) + io + Duration::from_secs(1)));
    r.reply(1031, b"TIMED_OUT\r\n");
    assert_eq!(r.counts().reserve_timeouts, 1);
    assert_eq!(r.send(1031), ["reserve-with-timeout 1"]);
}

#[test]
fn a_failure_is_released_with_the_backoff_and_buried_after_the_last_attempt() {
    let cfg = Config {
        max_attempts: 3,
        ..cfg(1)
    };
    let mut r = Rig::new(cfg);
    // Each attempt: the job comes back, is looked up, and fails; the
    // settle goes out with the refill the next attempt's job answers.
    assert_eq!(r.send(0), ["reserve-with-timeout 0"]);
    for (releases, panicked, settle) in [
        (0, false, "release 7 9 1"),
        (1, false, "release 7 9 2"),
        (2, true, "bury 7 9"),
    ] {
        let s = r.take(1, &reserved(7), releases);
        assert_eq!(r.runs[0].1, releases as u32 + 1, "the attempt");
        r.m.finished(
            &r.sh,
            s[0].slot,
            Outcome::Fail,
            panicked.then_some(crate::failure::Failure::Panicked),
        );
        // The lookup gave the numbers: the settle needs no second one.
        assert_eq!(r.send(2), [settle, "reserve-with-timeout 0"]);
        let answer: &[u8] = if settle.starts_with("bury") {
            b"BURIED\r\n"
        } else {
            b"RELEASED\r\n"
        };
        r.reply(3, answer);
    }
    let c = r.counts();
    assert_eq!((c.released, c.buried, c.deleted), (2, 1, 0));
}

#[test]
fn without_the_lookup_a_job_runs_at_once_and_only_its_failure_is_looked_up() {
    let cfg = Config {
        max_attempts: 2,
        job_lookup: false,
        ..cfg(2)
    };
    let mut r = Rig::new(cfg);
    assert_eq!(
        r.send(0),
        ["reserve-with-timeout 0", "reserve-with-timeout 0"]
    );
    let (s, broke) = r.reply(1, &[reserved(7), reserved(8)].concat());
    assert!(!broke);
    // Both run at once, their attempt not known; nothing is asked first.
    assert_eq!(r.runs, [(s[0].slot, 0), (s[1].slot, 0)]);
    assert_eq!(r.send(1), Vec::<String>::new());
    // A job done is deleted without a lookup; one that failed is looked up
    // for its settle, which its numbers decide.
    r.m.finished(&r.sh, s[0].slot, Outcome::Done, None);
    r.m.finished(&r.sh, s[1].slot, Outcome::Fail, None);
    assert_eq!(
        r.send(2),
        [
            "delete 7",
            "stats-job 8",
            "reserve-with-timeout 0",
            "reserve-with-timeout 0"
        ]
    );
    r.reply(3, b"DELETED\r\n");
    r.reply(3, &stats(1));
    // Released once before: this was its last attempt.
    assert_eq!(r.send(3), ["bury 8 9"]);
    r.reply(4, b"TIMED_OUT\r\nTIMED_OUT\r\nBURIED\r\n");
    let c = r.counts();
    assert_eq!((c.deleted, c.buried, c.released), (1, 1, 0));
}

#[test]
fn without_the_lookup_a_job_is_still_looked_up_when_several_tubes_were_watched() {
    let cfg = Config {
        tubes: vec!["a".into(), "b".into()],
        job_lookup: false,
        ..cfg(1)
    };
    let mut r = Rig::new(cfg);
    assert_eq!(r.send(0), ["reserve-with-timeout 0"]);
    let (held, _) = r.reply(1, &reserved(7));
    assert_eq!(held[0].tube, None, "either tube's");
    assert!(r.runs.is_empty(), "not run before its lookup");
    assert_eq!(r.send(1), ["stats-job 7"]);
    r.reply(2, &stats(0));
    assert_eq!(r.runs, [(held[0].slot, 1)], "run once looked up");
    assert_eq!(r.tube, "default", "its tube, as the lookup said");
}

#[test]
fn without_the_lookup_a_job_of_a_weighted_turn_starts_at_once_with_its_tube() {
    let cfg = Config {
        tubes: vec!["a".into(), "b".into()],
        weights: vec![1, 1],
        run_scale: 1,
        job_lookup: false,
        ..cfg(1)
    };
    let mut r = Rig::new(cfg);
    // Tube a's turn: it alone is watched.
    assert_eq!(r.send(0), ["ignore b", "reserve-with-timeout 0"]);
    let (s, _) = r.reply(1, b"WATCHING 1\r\nRESERVED 7 4\r\nbody\r\n");
    assert_eq!(s[0].tube, Some(0), "tube a's");
    assert_eq!(
        r.runs,
        [(s[0].slot, 0)],
        "run at once, its attempt not known"
    );
    r.runs.clear();
    r.m.finished(&r.sh, s[0].slot, Outcome::Done, None);
    // Tube b's turn, alone too; it has nothing.
    assert_eq!(
        r.send(2),
        ["delete 7", "watch b", "ignore a", "reserve-with-timeout 0"]
    );
    let (none, _) = r.reply(3, b"DELETED\r\nWATCHING 2\r\nWATCHING 1\r\nTIMED_OUT\r\n");
    assert!(none.is_empty());
    // The fallback run watches both: a job it takes is looked up first,
    // for its tube.
    assert_eq!(r.send(4), ["watch a", "reserve-with-timeout 1"]);
    let (held, _) = r.reply(5, b"WATCHING 2\r\nRESERVED 8 4\r\nbody\r\n");
    assert_eq!(held[0].tube, None);
    assert!(r.runs.is_empty(), "not run before its lookup");
    assert_eq!(r.send(6), ["stats-job 8"]);
}

#[test]
fn a_handler_asks_for_its_jobs_numbers_and_the_settle_needs_no_second_lookup() {
    let cfg = Config {
        max_attempts: 2,
        job_lookup: false,
        ..cfg(1)
    };
    let mut r = Rig::new(cfg);
    assert_eq!(r.send(0), ["reserve-with-timeout 0"]);
    let (s, _) = r.reply(1, &reserved(8));
    r.m.handler_asks(s[0].slot, 8, Asked::Stats);
    assert!(r.m.answered().is_none(), "answered on the server's reply");
    assert_eq!(r.send(2), ["stats-job 8"]);
    r.reply(3, &stats(1));
    match r.m.answered() {
        Some((slot, 8, Answered::Stats(Ok(info)))) => {
            assert_eq!(slot, s[0].slot);
            assert_eq!((info.releases, info.pri), (1, 9));
        }
        other => panic!("{other:?}"),
    }
    // Released once before: the failure buries it, by the numbers asked.
    r.m.finished(&r.sh, s[0].slot, Outcome::Fail, None);
    assert_eq!(r.send(4), ["bury 8 9", "reserve-with-timeout 0"]);
    let (s, _) = r.reply(5, &[&b"BURIED\r\n"[..], &reserved(9)].concat());
    // A job no longer ours: its lease ran out.
    r.m.handler_asks(s[0].slot, 9, Asked::Stats);
    r.send(6);
    r.reply(7, b"NOT_FOUND\r\n");
    assert!(matches!(
        r.m.answered(),
        Some((_, 9, Answered::Stats(Err(JobError::LeaseLost))))
    ));
    // Asked of a job not the slot's: refused at once.
    r.m.handler_asks(s[0].slot, 10, Asked::Stats);
    assert!(matches!(
        r.m.answered(),
        Some((_, 10, Answered::Stats(Err(JobError::Connection(_)))))
    ));
    assert_eq!(r.counts().buried, 1);
}

#[test]
fn silence_past_the_deadline_breaks_the_connection_and_counts_what_was_held() {
    let mut r = Rig::new(cfg(2));
    r.send(0);
    let s = r.take(1, &[reserved(1), reserved(2)].concat(), 0);
    r.m.finished(&r.sh, s[0].slot, Outcome::Done, None);
    assert_eq!(r.send(2), ["delete 1", "reserve-with-timeout 0"]);
    let io = r.sh.cfg.io_timeout;
    let due = r.due(2).unwrap();
    assert_eq!(due, r.at(2) + io);
    assert!(!r.overdue(due - MS));
    assert!(r.overdue(due));
    assert!(!r.m.is_up());
    assert!(r.wire.is_broken());
    let c = r.counts();
    // The delete may have been carried out; job 2's handler still runs.
    assert_eq!((c.io_timeouts, c.ack_unknown, c.lease_dropped), (1, 1, 1));
    // After progress the first reconnect is at once.
    assert!(r.m.wants_connect(&r.sh, due));
    // Job 2's handler ends on the dead connection: nothing is sent for it.
    r.m.finished(&r.sh, s[1].slot, Outcome::Done, None);
    r.wire = wire(&r.sh);
    r.m.connected(&r.sh, due);
    assert_eq!(r.send(3000), ["reserve-with-timeout 0"; 2]);
    // A connection that breaks before any reply: the next waits the backoff.
    r.m.broke(&r.sh, r.at(3001), 0);
    assert!(!r.m.wants_connect(&r.sh, r.at(3001)));
    assert!(r.m.poll_timeout(&r.sh, r.at(0)).unwrap() > r.at(3001));
    assert_eq!(r.counts().reconnects, 1);
}

#[test]
fn after_a_stop_no_reserve_goes_out_running_jobs_settle_and_a_late_job_goes_back() {
    let mut r = Rig::new(cfg(2));
    r.send(0);
    let (s, _) = r.reply(1, &reserved(1));
    assert_eq!(r.send(1), ["stats-job 1"]);
    r.reply(2, &[b"TIMED_OUT\r\n".to_vec(), stats(0)].concat());
    assert_eq!(r.runs, [(s[0].slot, 1)]);
    // Job 1 runs; the server had nothing else: a probe goes out.
    assert_eq!(r.send(2), ["reserve-with-timeout 0"]);
    r.sh.shutdown();
    // The probe brings a job after the stop: given back untouched.
    r.reply(3, &reserved(2));
    assert_eq!(r.send(3), ["stats-job 2"]);
    r.reply(4, &stats(0));
    assert_eq!(r.send(4), ["release 2 9 0"]);
    r.reply(5, b"RELEASED\r\n");
    assert_eq!(r.runs.len(), 1, "job 2 never ran");
    assert!(!r.m.is_done(&r.sh), "job 1 still runs");
    r.m.finished(&r.sh, s[0].slot, Outcome::Done, None);
    assert_eq!(r.send(6), ["delete 1"]);
    assert!(!r.m.is_done(&r.sh), "its delete is owed");
    r.reply(7, b"DELETED\r\n");
    assert!(r.m.is_done(&r.sh));
    assert!(r.send(8).is_empty());
    let c = r.counts();
    assert_eq!((c.reserved, c.deleted, c.released), (2, 1, 1));
}

#[test]
fn a_job_taken_and_not_started_before_a_stop_goes_back_untouched() {
    let mut r = Rig::new(cfg(1));
    r.send(0);
    r.reply(1, &reserved(3));
    assert_eq!(r.send(1), ["stats-job 3"]);
    r.sh.shutdown();
    r.reply(2, &stats(0));
    assert!(r.runs.is_empty(), "never run");
    assert_eq!(r.send(2), ["release 3 9 0"]);
    r.reply(3, b"RELEASED\r\n");
    assert!(r.m.is_done(&r.sh));
    assert_eq!(r.counts().released, 1);
}

#[test]
fn a_job_over_the_limit_is_buried_once_never_run() {
    let cfg = Config {
        limits: Limits {
            max_job_size: 10,
            ..Limits::default()
        },
        ..cfg(1)
    };
    let mut r = Rig::new(cfg);
    r.send(0);
    let (s, _) = r.reply(1, b"RESERVED 3 20\r\n01234567890123456789\r\n");
    assert!(s.is_empty(), "never run");
    assert_eq!(r.send(2), ["stats-job 3", "reserve-with-timeout 0"]);
    r.reply(3, &[stats(0), b"TIMED_OUT\r\n".to_vec()].concat());
    assert!(r.runs.is_empty());
    assert_eq!(r.send(3), ["bury 3 9"]);
    r.reply(4, b"BURIED\r\n");
    let c = r.counts();
    assert_eq!((c.too_big, c.buried), (1, 1));
}

#[test]
fn a_handlers_touch_goes_out_and_its_answer_comes_back_to_its_slot() {
    let mut r = Rig::new(cfg(1));
    r.send(0);
    let s = r.take(1, &reserved(4), 0);
    r.m.handler_asks(s[0].slot, 4, Asked::Touch);
    assert_eq!(r.send(2), ["touch 4"]);
    r.reply(3, b"TOUCHED\r\n");
    assert!(matches!(
        r.m.answered(),
        Some((0, 4, Answered::Touch(Ok(()))))
    ));
    r.m.handler_asks(s[0].slot, 4, Asked::Touch);
    r.send(4);
    r.reply(5, b"NOT_FOUND\r\n");
    assert!(matches!(
        r.m.answered(),
        Some((0, 4, Answered::Touch(Err(JobError::LeaseLost))))
    ));
    // A touch owed when the connection breaks is answered too.
    r.m.handler_asks(s[0].slot, 4, Asked::Touch);
    r.send(6);
    r.m.broke(&r.sh, r.at(7), 0);
    assert!(matches!(
        r.m.answered(),
        Some((0, 4, Answered::Touch(Err(JobError::Connection(_)))))
    ));
    r.m.handler_asks(s[0].slot, 4, Asked::Touch);
    assert!(matches!(
        r.m.answered(),
        Some((0, 4, Answered::Touch(Err(JobError::Connection(_)))))
    ));
    assert_eq!(r.counts().touched, 1);
}

#[test]
fn a_break_frees_the_slots_of_jobs_taken_and_not_started() {
    let mut r = Rig::new(cfg(2));
    r.send(0);
    let (s, _) = r.reply(1, &[reserved(1), reserved(2)].concat());
    assert_eq!(r.send(1), ["stats-job 1", "stats-job 2"]);
    r.reply(2, &stats(0));
    assert_eq!(r.runs, [(s[0].slot, 1)]);
    assert_eq!(r.m.running(), 2);
    // Job 2's lookup is owed when the connection breaks: no handler will
    // ever end it, so its slot is free at once; job 1's when it ends.
    r.m.broke(&r.sh, r.at(3), 0);
    assert_eq!(r.m.running(), 1);
    assert_eq!(r.counts().lease_dropped, 2);
    r.m.finished(&r.sh, s[0].slot, Outcome::Done, None);
    assert_eq!(r.m.running(), 0);
    r.m.connected(&r.sh, r.at(4));
    assert_eq!(r.send(4), ["reserve-with-timeout 0"; 2]);
}

#[test]
fn a_job_whose_lease_ran_out_before_its_lookup_is_never_run() {
    let mut r = Rig::new(cfg(1));
    r.send(0);
    r.reply(1, &reserved(4));
    assert_eq!(r.send(1), ["stats-job 4"]);
    r.reply(2, b"NOT_FOUND\r\n");
    assert!(r.runs.is_empty());
    assert_eq!(r.m.running(), 0);
    assert_eq!(r.counts().lost_lease_on_release, 1);
}

#[test]
fn garbage_and_unexpected_replies_break_the_connection_and_never_count_as_done() {
    for bytes in [
        &b"DELETED extra\r\n"[..],
        b"INSERTED 5\r\n",
        b"\xff\xfe\r\n",
    ] {
        let mut r = Rig::new(cfg(1));
        r.send(0);
        let s = r.take(1, &reserved(1), 0);
        r.m.finished(&r.sh, s[0].slot, Outcome::Done, None);
        assert_eq!(r.send(2), ["delete 1", "reserve-with-timeout 0"]);
        let (_, broke) = r.reply(3, bytes);
        assert!(broke, "{bytes:?}");
        let c = r.counts();
        assert_eq!((c.deleted, c.ack_unknown), (0, 1), "{bytes:?}");
        assert!(c.unexpected_replies >= 1, "{bytes:?}");
    }
}

#[test]
fn max_jobs_limits_the_reserves_in_flight_and_stops_at_the_count() {
    let cfg = Config {
        max_jobs: Some(2),
        ..cfg(4)
    };
    let mut r = Rig::new(cfg);
    assert_eq!(r.send(0), ["reserve-with-timeout 0"; 2]);
    let s = r.take(1, &[reserved(1), reserved(2)].concat(), 0);
    for st in &s {
        r.m.finished(&r.sh, st.slot, Outcome::Done, None);
    }
    assert_eq!(r.send(2), ["delete 1", "delete 2"]);
    r.reply(3, b"DELETED\r\nDELETED\r\n");
    assert!(r.sh.stop.load(Ordering::SeqCst));
    assert!(r.m.is_done(&r.sh));
}

#[test]
fn weighted_tubes_switch_in_the_same_write_as_the_reserves() {
    let mut cfg = cfg(2);
    cfg.set_tubes(&["vip:1", "standard:1"]).unwrap();
    cfg.run_scale = 1;
    let mut r = Rig::new(cfg);
    // Server 0 starts on the first tube: standard is ignored first.
    assert_eq!(
        r.send(0),
        [
            "ignore standard",
            "reserve-with-timeout 0",
            "watch standard",
            "ignore vip",
            "reserve-with-timeout 0"
        ]
    );
    let (s, broke) = r.reply(
        1,
        &[
            b"WATCHING 1\r\n".to_vec(),
            reserved(1),
            b"WATCHING 2\r\nWATCHING 1\r\n".to_vec(),
            reserved(2),
        ]
        .concat(),
    );
    assert!(!broke);
    assert_eq!(s.len(), 2);
}

#[test]
fn the_idle_exit_waits_for_quiet_and_no_job_held() {
    let cfg = Config {
        exit_when_idle: Some(Duration::from_millis(100)),
        ..cfg(1)
    };
    let mut r = Rig::new(cfg);
    r.send(0);
    let s = r.take(1, &reserved(1), 0);
    assert!(!r.m.is_idle(&r.sh, r.at(500)), "a job is held");
    r.m.finished(&r.sh, s[0].slot, Outcome::Done, None);
    assert_eq!(r.send(500), ["delete 1", "reserve-with-timeout 0"]);
    r.reply(501, b"DELETED\r\nTIMED_OUT\r\n");
    assert_eq!(r.send(501), ["reserve-with-timeout 1"]);
    assert!(!r.m.is_idle(&r.sh, r.at(600)), "no empty slice seen yet");
    r.reply(1501, b"TIMED_OUT\r\n");
    assert!(r.m.is_idle(&r.sh, r.at(1501)));
    // Quiet since the job was taken: the idle deadline is passed, and not
    // one the driver is woken for again.
    assert_eq!(r.m.poll_timeout(&r.sh, r.at(1501)), None);
    assert_eq!(r.m.poll_timeout(&r.sh, r.at(50)), Some(r.at(101)));
    r.sh.shutdown();
    assert!(r.m.is_done(&r.sh));
}

#[test]
fn with_max_jobs_a_machine_waiting_on_an_empty_server_leaves_the_last_ticket_to_another() {
    let cfg = Config {
        servers: vec!["127.0.0.1:1".into(), "127.0.0.1:2".into()],
        max_jobs: Some(1),
        ..cfg(1)
    };
    let mut a = Rig::new(cfg);
    let mut b = Rig {
        m: Machine::new(&a.sh, 1, a.t0),
        wire: wire(&a.sh),
        sh: a.sh.clone(),
        t0: a.t0,
        runs: Vec::new(),
        tube: String::new(),
    };
    b.m.connected(&b.sh, b.t0);
    // A takes the one ticket; B finds none and looks again soon.
    assert_eq!(a.send(0), ["reserve-with-timeout 0"]);
    assert!(b.send(0).is_empty());
    assert_eq!(
        b.m.poll_timeout(&b.sh, b.at(0)),
        Some(b.at(0) + TICKET_RETRY)
    );
    // A's server is empty: its blocking reserve holds the ticket a slice.
    a.reply(1, b"TIMED_OUT\r\n");
    assert_eq!(a.send(1), ["reserve-with-timeout 1"]);
    assert!(b.send(11).is_empty());
    a.reply(1001, b"TIMED_OUT\r\n");
    // A leaves the ticket free a while; B takes it on its next look.
    assert!(a.send(1001).is_empty());
    assert_eq!(b.send(1011), ["reserve-with-timeout 0"]);
    assert!(a.send(1051).is_empty(), "no ticket left for A");
}

#[test]
fn without_the_lookup_a_break_keeps_a_running_jobs_slot_until_its_handler_ends() {
    let cfg = Config {
        job_lookup: false,
        ..cfg(1)
    };
    let mut r = Rig::new(cfg);
    assert_eq!(r.send(0), ["reserve-with-timeout 0"]);
    let (s, _) = r.reply(1, &reserved(7));
    // Started at once, not looked up: its handler runs.
    assert_eq!(r.runs, [(s[0].slot, 0)]);
    r.m.broke(&r.sh, r.at(2), 0);
    // The handler still runs: its slot is not free, and the new connection
    // asks for no job while it runs.
    assert_eq!(r.m.running(), 1);
    r.m.connected(&r.sh, r.at(3));
    assert_eq!(r.send(3), Vec::<String>::new());
    // Its end settles nothing (the server has job 7 back) and frees the slot.
    r.m.finished(&r.sh, s[0].slot, Outcome::Done, None);
    assert_eq!(r.m.running(), 0);
    assert_eq!(r.send(4), ["reserve-with-timeout 0"]);
    let (s2, _) = r.reply(5, &reserved(8));
    r.m.finished(&r.sh, s2[0].slot, Outcome::Done, None);
    assert_eq!(r.send(6), ["delete 8", "reserve-with-timeout 0"]);
    assert_eq!(r.counts().lease_dropped, 1);
}

#[test]
fn after_a_reconnect_with_a_full_window_the_answered_watch_is_read_and_not_overdue() {
    let cfg = Config {
        job_lookup: false,
        ..cfg(1)
    };
    let mut r = Rig::new(cfg);
    assert_eq!(r.send(0), ["reserve-with-timeout 0"]);
    r.reply(1, &reserved(7));
    r.m.broke(&r.sh, r.at(2), 0);
    // As the driver reconnects: a fresh session, the watch list queued
    // first; the window is full (job 7's handler runs), so nothing else.
    r.wire = wire(&r.sh);
    crate::engine::queue_watch(&mut |c| r.wire.queue(c), &r.sh.cfg.tubes).unwrap();
    r.m.connected(&r.sh, r.at(3));
    assert_eq!(r.send(3), ["watch default"]);
    let (_, broke) = r.reply(4, b"WATCHING 1\r\n");
    assert!(!broke);
    let later = r.at(4) + r.sh.cfg.io_timeout * 3;
    assert!(!r.overdue(later), "a reply that came is not overdue");
    assert!(r.m.is_up());
    assert_eq!(r.counts().io_timeouts, 0);
}

/// A window of `prefetch` jobs on `concurrency` handlers.
fn prefetch(concurrency: usize, prefetch: usize) -> Config {
    Config {
        prefetch,
        ..cfg(concurrency)
    }
}

#[test]
fn with_prefetch_the_window_holds_more_jobs_than_run_and_each_starts_as_a_handler_frees() {
    let mut r = Rig::new(prefetch(1, 3));
    assert_eq!(r.send(0), ["reserve-with-timeout 0"; 3]);
    let s = r.take(1, &[reserved(1), reserved(2), reserved(3)].concat(), 0);
    // All three looked up; one handler: the first runs, two wait held.
    assert_eq!(r.runs, [(s[0].slot, 1)]);
    assert!(r.m.begun().is_none());
    assert!(r.send(2).is_empty(), "the window is full");
    r.m.finished(&r.sh, s[0].slot, Outcome::Done, None);
    // The oldest held job gets the free handler, with its attempt; the
    // delete and a refill for the room go out in one write.
    let b = r.m.begun().unwrap();
    assert_eq!((b.slot, b.id, b.attempt, b.tube), (s[1].slot, 2, 1, None));
    assert!(r.m.begun().is_none(), "one handler: one job at a time");
    assert_eq!(r.send(3), ["delete 1", "reserve-with-timeout 0"]);
    r.reply(4, b"DELETED\r\nTIMED_OUT\r\n");
    r.m.finished(&r.sh, s[1].slot, Outcome::Done, None);
    assert_eq!(r.m.begun().map(|b| b.id), Some(3));
    let c = r.counts();
    assert_eq!((c.reserved, c.deleted), (3, 1));
}

#[test]
fn a_held_job_is_touched_while_it_waits_and_given_back_unstarted_after_hold_max() {
    let mut r = Rig::new(prefetch(1, 2));
    r.send(0);
    let s = r.take(1, &[reserved(1), reserved(2)].concat(), 0);
    assert_eq!(r.runs.len(), 1);
    // Its lease is touched TOUCH_AFTER after the reserve was sent, once
    // until the touch is answered, then TOUCH_AFTER after that touch.
    assert_eq!(r.due(2), Some(r.at(0) + TOUCH_AFTER));
    assert!(r.send(499).is_empty());
    assert_eq!(r.send(500), ["touch 2"]);
    assert!(r.send(600).is_empty(), "one touch owed at a time");
    r.reply(601, b"TOUCHED\r\n");
    assert_eq!(r.counts().touched, 1);
    assert!(r.send(999).is_empty());
    assert_eq!(r.send(1000), ["touch 2"]);
    r.reply(1001, b"TOUCHED\r\n");
    // Held HOLD_MAX: given back unstarted (its priority from its lookup,
    // no delay), not an attempt of its own; its room refilled.
    let hold = HOLD_MAX.as_millis() as u64;
    let sent = r.send(hold);
    assert_eq!(sent[0], "release 2 9 0", "{sent:?}");
    r.reply(hold + 1, b"RELEASED\r\n");
    assert_eq!(r.counts().released, 1);
    assert!(r.m.begun().is_none());
    r.m.finished(&r.sh, s[0].slot, Outcome::Done, None);
    assert!(r.m.begun().is_none(), "given back: never started");
}

#[test]
fn held_jobs_go_back_untouched_at_a_stop_and_are_the_servers_again_at_a_break() {
    let mut r = Rig::new(prefetch(1, 3));
    r.send(0);
    let s = r.take(1, &[reserved(1), reserved(2), reserved(3)].concat(), 0);
    r.sh.shutdown();
    // The stop: both held jobs go back at once, the running one finishes.
    assert_eq!(r.send(2), ["release 2 9 0", "release 3 9 0"]);
    r.reply(3, b"RELEASED\r\nRELEASED\r\n");
    assert!(!r.m.is_done(&r.sh), "the running job is not settled yet");
    r.m.finished(&r.sh, s[0].slot, Outcome::Done, None);
    assert!(r.m.begun().is_none(), "nothing starts after a stop");
    assert_eq!(r.send(4), ["delete 1"]);
    r.reply(5, b"DELETED\r\n");
    assert!(r.m.is_done(&r.sh));

    // A break: the held jobs are the server's again, their slots free at
    // once; the running job keeps its slot until its handler ends.
    let mut r = Rig::new(prefetch(1, 3));
    r.send(0);
    let s = r.take(1, &[reserved(1), reserved(2), reserved(3)].concat(), 0);
    r.m.broke(&r.sh, r.at(2), 0);
    assert_eq!(r.counts().lease_dropped, 3);
    assert_eq!(r.m.running(), 1);
    r.m.finished(&r.sh, s[0].slot, Outcome::Done, None);
    assert!(
        r.m.begun().is_none(),
        "held jobs of a broken connection never start"
    );
    assert_eq!(r.m.running(), 0);
}

#[test]
fn handed_ahead_every_job_starts_at_once_and_its_lease_is_kept_until_its_thread_runs_it() {
    let mut r = Rig::blocking(prefetch(1, 3));
    assert_eq!(r.send(0), ["reserve-with-timeout 0"; 3]);
    let (taken, broke) = r.reply(1, &[reserved(1), reserved(2), reserved(3)].concat());
    assert!(taken.iter().all(|s| s.run) && !broke);
    // All three go to the handler threads' queue at once, one handler or not.
    assert_eq!(r.runs, [(0, 0), (1, 0), (2, 0)]);
    assert_eq!(r.m.running(), 3);
    // The thread runs job 1; jobs 2 and 3 wait in its queue, their leases
    // touched TOUCH_AFTER after their reserve, job 1's left to its handler.
    r.m.runs_now(0, 1);
    assert_eq!(r.due(2), Some(r.at(0) + TOUCH_AFTER));
    assert!(r.send(499).is_empty());
    assert_eq!(r.send(500), ["touch 2", "touch 3"]);
    r.reply(501, b"TOUCHED\r\nTOUCHED\r\n");
    // Never given back from here, however long they wait: touched on.
    let hold = HOLD_MAX.as_millis() as u64;
    assert_eq!(r.send(hold + 1000), ["touch 2", "touch 3"]);
    r.reply(hold + 1001, b"TOUCHED\r\nTOUCHED\r\n");
    // Job 2 runs: its lease is its handler's now; job 3's is still kept.
    r.m.runs_now(1, 2);
    assert_eq!(r.send(hold + 2000), ["touch 3"]);
    r.reply(hold + 2001, b"TOUCHED\r\n");
    assert_eq!(r.counts().touched, 5);
    // A stop: the machine gives back nothing its threads have; job 3's
    // thread gives it back unrun, not an attempt, and job 1 is settled.
    r.sh.shutdown();
    assert!(r.send(hold + 2002).is_empty());
    r.m.finished(&r.sh, 0, Outcome::Done, None);
    r.m.finished(&r.sh, 2, UNSTARTED, None);
    assert!(r.m.begun().is_none());
    let sent = r.send(hold + 2003);
    assert_eq!(sent, ["delete 1", "stats-job 3"], "{sent:?}");
    r.reply(hold + 2004, &[&b"DELETED\r\n"[..], &stats(0)].concat());
    assert_eq!(r.send(hold + 2005), ["release 3 9 0"]);
    r.reply(hold + 2006, b"RELEASED\r\n");
    assert!(!r.m.is_done(&r.sh), "job 2 still runs");
    r.m.finished(&r.sh, 1, Outcome::Done, None);
    assert_eq!(r.send(hold + 2007), ["delete 2"]);
    r.reply(hold + 2008, b"DELETED\r\n");
    assert!(r.m.is_done(&r.sh));
    let c = r.counts();
    assert_eq!((c.reserved, c.deleted, c.released, c.touched), (3, 2, 1, 5));
}

/// The blocking worker's machine with jobs 1 and 2 handed to a thread,
/// job 1 running, and the touch of job 2 (waiting) answered `NOT_FOUND` at
/// 501 ms: job 2 revoked.
fn job_2_lost_in_the_queue() -> Rig {
    let mut r = Rig::blocking(prefetch(1, 2));
    r.send(0);
    r.reply(1, &[reserved(1), reserved(2)].concat());
    r.m.runs_now(0, 1);
    assert_eq!(r.send(500), ["touch 2"]);
    r.reply(501, b"NOT_FOUND\r\n");
    assert_eq!(r.m.revoked(), Some((1, 2)));
    r
}

#[test]
fn handed_ahead_a_job_whose_lease_ran_out_in_the_queue_is_revoked_and_never_settled() {
    // The server no longer counts job 2 as ours: its thread is told not
    // to run it, and its slot stays taken until that thread gives it back.
    let mut r = job_2_lost_in_the_queue();
    assert_eq!(r.m.revoked(), None);
    assert_eq!(r.m.running(), 2);
    assert!(r.send(2000).is_empty(), "touched no more");
    assert_eq!(r.counts().lost_lease_on_release, 0);
    // Given back unrun: counted lost once, nothing sent for it, its room
    // asked for again.
    r.m.finished(&r.sh, 1, UNSTARTED, None);
    assert_eq!(r.counts().lost_lease_on_release, 1);
    assert_eq!(r.send(2001), ["reserve-with-timeout 0"]);
    assert_eq!(r.m.running(), 1);
    // Had its thread run it before hearing, its outcome is dropped alike.
    let mut r = job_2_lost_in_the_queue();
    r.m.runs_now(1, 2);
    r.m.finished(&r.sh, 1, Outcome::Done, None);
    assert_eq!(r.send(2001), ["reserve-with-timeout 0"]);
    let c = r.counts();
    assert_eq!((c.deleted, c.lost_lease_on_release), (0, 1));
}

#[test]
fn handed_ahead_a_deadline_soon_touches_a_job_that_waited_not_one_handed_just_now() {
    let mut r = Rig::blocking(prefetch(1, 3));
    assert_eq!(r.send(0), ["reserve-with-timeout 0"; 3]);
    // Two jobs, and the server's DEADLINE_SOON for the third reserve: the
    // jobs are on their way to a thread; a touch now would be for nothing.
    r.reply(
        1,
        &[&reserved(1)[..], &reserved(2), b"DEADLINE_SOON\r\n"].concat(),
    );
    assert_eq!(r.counts().deadline_soon, 1);
    let sent = r.send(2);
    assert!(!sent.iter().any(|l| l.starts_with("touch")), "{sent:?}");
    // Job 1 runs; job 2 still waits in the queue when the next reserve is
    // answered DEADLINE_SOON 300 ms in: touched then, before its age.
    r.m.runs_now(0, 1);
    assert!(sent.iter().any(|l| l.starts_with("reserve")), "{sent:?}");
    r.reply(300, b"DEADLINE_SOON\r\n");
    let sent = r.send(301);
    assert!(sent.iter().any(|l| l == "touch 2"), "{sent:?}");
    assert!(!sent.iter().any(|l| l == "touch 1"), "{sent:?}");
}

#[test]
fn handed_ahead_a_break_revokes_the_jobs_no_thread_has_run() {
    let mut r = Rig::blocking(prefetch(1, 3));
    r.send(0);
    r.reply(1, &[reserved(1), reserved(2), reserved(3)].concat());
    r.m.runs_now(0, 1);
    // The connection breaks: beanstalkd has every job back. Jobs 2 and 3,
    // waiting in the threads' queue, must not run; job 1 runs on.
    r.m.broke(&r.sh, r.at(2), 0);
    assert_eq!(r.m.revoked(), Some((1, 2)));
    assert_eq!(r.m.revoked(), Some((2, 3)));
    assert_eq!(r.m.revoked(), None);
    assert_eq!(r.counts().lease_dropped, 3);
    // Their slots stay taken until their threads give them back; nothing
    // is settled for any of the three (the server has them).
    assert_eq!(r.m.running(), 3);
    r.m.finished(&r.sh, 1, UNSTARTED, None);
    r.m.finished(&r.sh, 2, UNSTARTED, None);
    r.m.finished(&r.sh, 0, Outcome::Done, None);
    assert_eq!(r.m.running(), 0);
    let c = r.counts();
    assert_eq!((c.deleted, c.released, c.lost_lease_on_release), (0, 0, 0));

    // A job found lost in the queue (a touch answered NOT_FOUND), then the
    // break: counted once, with the break's.
    let mut r = job_2_lost_in_the_queue();
    r.m.broke(&r.sh, r.at(502), 0);
    r.m.finished(&r.sh, 1, UNSTARTED, None);
    r.m.finished(&r.sh, 0, Outcome::Done, None);
    let c = r.counts();
    assert_eq!((c.lease_dropped, c.lost_lease_on_release), (2, 0));
}

/// Two handlers, one job (5) running since 1 ms, and the server dry: the
/// probe that went with its lookup found nothing at 1 ms.
fn one_job_on_a_dry_server() -> (Rig, Vec<Start>) {
    let mut r = Rig::new(cfg(2));
    r.send(0);
    let starts = r.take(1, b"RESERVED 5 4\r\nbody\r\nTIMED_OUT\r\n", 0);
    r.reply(1, b"TIMED_OUT\r\n");
    (r, starts)
}

#[test]
fn a_probe_the_machine_would_not_send_is_no_deadline_gone_by() {
    // The driver wakes at the earliest deadline; one gone by that the
    // machine does not act on wakes it at once, turn after turn.
    let (mut r, starts) = one_job_on_a_dry_server();
    // A job runs on a dry server: the next probe is its deadline.
    assert_eq!(r.due(1), Some(r.at(1) + PROBE_MIN));
    // The job ends well after that: its delete goes alone, and while its
    // answer is owed the probe (not sent: nothing runs) is no deadline.
    r.m.finished(&r.sh, starts[0].slot, Outcome::Done, None);
    assert_eq!(r.send(500), ["delete 5"]);
    let io = r.sh.cfg.io_timeout;
    assert_eq!(
        r.due(500),
        Some(r.at(500) + io),
        "the delete's reply deadline"
    );
    r.reply(501, b"DELETED\r\n");
    assert_eq!(r.send(501), ["reserve-with-timeout 1"]);
}

#[test]
fn after_a_stop_a_probe_gone_by_is_no_deadline_while_a_job_drains() {
    let (mut r, starts) = one_job_on_a_dry_server();
    r.sh.shutdown();
    // Long after the probe was due, the job still runs: nothing to send
    // and nothing due (before, the gone-by probe was the deadline, and the
    // driver spun until the job ended).
    assert!(r.send(5000).is_empty());
    assert_eq!(r.due(5000), None);
    r.m.finished(&r.sh, starts[0].slot, Outcome::Done, None);
    assert_eq!(r.send(5001), ["delete 5"]);
    r.reply(5002, b"DELETED\r\n");
    assert!(r.m.is_done(&r.sh));
}

#[test]
fn a_job_reserved_again_while_its_handler_runs_is_not_run_twice() {
    // Its TTR ran out while it ran, and the server gave it to this
    // connection again.
    let (mut r, starts) = one_job_on_a_dry_server();
    assert_eq!(r.send(11), ["reserve-with-timeout 0"]);
    r.runs.clear();
    let (again, broke) = r.reply(12, &reserved(5));
    assert!(!broke);
    assert!(again.is_empty(), "not started again: {again:?}");
    assert_eq!(r.m.running(), 1, "one slot holds job 5");
    // No lookup, no run: at most a reserve for the free slot.
    let sent = r.send(12);
    assert!(
        sent.iter().all(|l| l == "reserve-with-timeout 0"),
        "{sent:?}"
    );
    r.reply(12, &b"TIMED_OUT\r\n".repeat(sent.len()));
    assert!(r.runs.is_empty());
    let c = r.counts();
    assert_eq!((c.reserved, c.lost_lease_on_release), (1, 1));
    // The run's settle settles it, once, on this connection.
    r.m.finished(&r.sh, starts[0].slot, Outcome::Done, None);
    let sent = r.send(13);
    assert_eq!(
        sent.iter().filter(|l| *l == "delete 5").count(),
        1,
        "{sent:?}"
    );
    let replies: Vec<u8> = sent
        .iter()
        .flat_map(|l| match l.as_str() {
            "delete 5" => b"DELETED\r\n".to_vec(),
            _ => b"TIMED_OUT\r\n".to_vec(),
        })
        .collect();
    r.reply(14, &replies);
    assert_eq!(r.counts().deleted, 1);
    assert_eq!(r.m.running(), 0);
}

#[test]
fn a_reserve_the_connection_refuses_gives_its_max_jobs_ticket_back() {
    let mut r = Rig::new(Config {
        max_jobs: Some(1),
        ..cfg(1)
    });
    // A connection broken before the machine heard of it refuses the
    // reserve the one ticket was taken for.
    r.wire.mark_broken();
    assert!(r.m.transmit(&r.sh, r.at(0), &mut r.wire).is_err());
    assert!(
        r.sh.take_ticket(),
        "the ticket is the worker's again, or it never reaches max_jobs"
    );
}
