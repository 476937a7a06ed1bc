//! Fault plans: what the reference server does wrong, and to which connection.
//!
//! Requests are counted per connection from 1, from the moment the connection
//! opened or the plan was installed, whichever came later. "After N" means N
//! requests were answered normally first.

use std::time::Duration;

/// One way of misbehaving on a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Answer `after` requests, then close the connection (FIN) without reading
    /// the next one. Client symptom: `Error::Closed` on the next reply.
    CloseAfter {
        /// Requests answered first.
        after: u64,
    },
    /// Answer `after` requests, then reset the connection (RST: `SO_LINGER` 0).
    /// Client symptom: `Error::Io` (connection reset) or `Error::Closed`.
    ResetAfter {
        /// Requests answered first.
        after: u64,
    },
    /// Carry out request `after + 1`, send only the first `bytes` bytes of its
    /// reply, then close. Client symptom: `Error::Closed` with the outcome unknown
    /// (the command did take effect).
    CutReply {
        /// Requests answered first.
        after: u64,
        /// Bytes of the reply that are sent.
        bytes: usize,
    },
    /// Carry out request `after + 1` and never answer it; read nothing more and
    /// keep the socket open until the client closes it. Client symptom:
    /// `Error::Timeout` with the outcome unknown.
    NoReply {
        /// Requests answered first.
        after: u64,
    },
    /// After `after` requests, read and answer nothing for `duration`, then carry
    /// on. Client symptom: `Error::Timeout` when `duration` exceeds its deadline.
    Silence {
        /// Requests answered first.
        after: u64,
        /// How long to stay silent.
        duration: Duration,
    },
    /// Hold every reply back for `delay` before sending it.
    DelayReplies {
        /// Added to each reply.
        delay: Duration,
    },
    /// Send every reply after the first `after` one byte at a time, `interval`
    /// apart. Client symptom: `Error::Timeout` when the whole reply takes longer
    /// than its deadline, even though bytes keep coming.
    Trickle {
        /// Requests answered normally first.
        after: u64,
        /// Pause between bytes.
        interval: Duration,
    },
    /// Write `bytes` (a garbage line, or an unsolicited reply) just before the
    /// reply to request `after + 1`. Client symptom: `Error::Protocol`, or, for a
    /// plausible line, a reply that answers the wrong request.
    Inject {
        /// Requests answered first.
        after: u64,
        /// What to write.
        bytes: Vec<u8>,
    },
    /// Read request `after + 1` and answer it with `bytes` *instead of* carrying
    /// it out (a well-formed request only; a malformed one is refused as usual).
    /// The ledger counts the request and nothing else: a `put` answered with a
    /// replaced `BURIED 7` queued nothing, whatever the reply claims. For the
    /// real "inserted but buried" see [`Fault::BuryPut`]. Client symptom: the
    /// typed result of whatever `bytes` say, or `Error::Protocol` for garbage.
    Replace {
        /// Requests answered first.
        after: u64,
        /// The reply sent in place of the real one.
        bytes: Vec<u8>,
    },
    /// If request `after + 1` is a `put` that inserts a job, bury the new job
    /// and answer `BURIED <id>`, as beanstalkd does when it is short of memory.
    /// The ledger records the job as put (and acknowledged once the reply is
    /// written): it is in the queue, buried. Any other request is served normally.
    BuryPut {
        /// Requests answered first.
        after: u64,
    },
}

/// Which connections a fault applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Target {
    /// Every connection, open or yet to come.
    All,
    /// The n-th connection accepted after the plan was installed (from 1).
    Nth(u64),
    /// The connection with this id (the ids in the ledger's report).
    Id(u64),
}

/// A fault and where it applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Which connections.
    pub target: Target,
    /// What goes wrong.
    pub fault: Fault,
}

/// Random faults from a seed, so that a failing run can be replayed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RandomFaults {
    /// The seed; each connection draws from `seed` mixed with its id.
    pub seed: u64,
    /// Chance that any one request meets a fault (0.0 to 1.0).
    pub probability: f64,
    /// Longest silence a random `NoReply`-like fault keeps before closing.
    pub max_silence: Duration,
}

/// What goes wrong on which connection. The default plan has no faults.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FaultPlan {
    pub(crate) rules: Vec<Rule>,
    pub(crate) random: Option<RandomFaults>,
}

impl FaultPlan {
    /// No faults.
    pub fn none() -> FaultPlan {
        FaultPlan::default()
    }

    /// One fault on every connection.
    pub fn all(fault: Fault) -> FaultPlan {
        FaultPlan::none().with(Target::All, fault)
    }

    /// One fault on the n-th connection accepted after the plan is installed (from 1).
    pub fn nth(n: u64, fault: Fault) -> FaultPlan {
        FaultPlan::none().with(Target::Nth(n), fault)
    }

    /// Adds a rule. When several rules hit one request, the first added wins.
    pub fn with(mut self, target: Target, fault: Fault) -> FaultPlan {
        self.rules.push(Rule { target, fault });
        self
    }

    /// Random faults on every request of every connection with `probability`:
    /// close, reset, a cut reply, a missing reply (silence, then close) or a
    /// garbage line, drawn from `seed`.
    pub fn random(seed: u64, probability: f64) -> FaultPlan {
        FaultPlan {
            rules: Vec::new(),
            random: Some(RandomFaults {
                seed,
                probability,
                max_silence: Duration::from_millis(300),
            }),
        }
    }

    /// A random plan whose seed comes from `TASKQ_FAULT_SEED`, or else from the
    /// clock. The seed is printed on stderr, so a failing run can be replayed.
    pub fn random_from_env(probability: f64) -> FaultPlan {
        let seed = std::env::var("TASKQ_FAULT_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
            });
        eprintln!(
            "taskq-testkit: random faults with seed {seed} (replay: TASKQ_FAULT_SEED={seed})"
        );
        FaultPlan::random(seed, probability)
    }

    /// The seed of the random part of the plan, if any.
    pub fn seed(&self) -> Option<u64> {
        self.random.map(|r| r.seed)
    }

    /// True when the plan does nothing.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty() && self.random.is_none()
    }

    /// The rules that apply to a connection: its id, and its place in the
    /// accept order since the plan was installed.
    pub(crate) fn for_connection(&self, id: u64, nth: u64) -> ConnFaults {
        let rules = self
            .rules
            .iter()
            .filter(|r| match r.target {
                Target::All => true,
                Target::Nth(n) => n == nth,
                Target::Id(i) => i == id,
            })
            .map(|r| r.fault.clone())
            .collect();
        let random = self.random.map(|r| {
            (
                r,
                fastrand::Rng::with_seed(r.seed ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
            )
        });
        ConnFaults { rules, random }
    }
}

/// What a connection must do with one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Close (or reset) before reading the request.
    Close { reset: bool },
    /// Stay silent for a while before reading the request.
    Silence(Duration),
    /// Read and carry out the request, then misbehave with its reply.
    Reply(ReplyFault),
}

/// How one reply goes wrong.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct ReplyFault {
    pub(crate) delay: Duration,
    pub(crate) trickle: Option<Duration>,
    pub(crate) inject: Option<Vec<u8>>,
    pub(crate) cut: Option<usize>,
    /// Sent instead of carrying the request out.
    pub(crate) replace: Option<Vec<u8>>,
    /// A put's new job is buried and answered `BURIED <id>`.
    pub(crate) bury_put: bool,
    pub(crate) withhold: bool,
    /// For a random withheld reply: close after this long.
    pub(crate) withhold_for: Option<Duration>,
}

/// The faults of one connection.
#[derive(Debug)]
pub(crate) struct ConnFaults {
    rules: Vec<Fault>,
    random: Option<(RandomFaults, fastrand::Rng)>,
}

impl ConnFaults {
    /// Decides the fate of request number `n` (from 1), before it is read.
    pub(crate) fn before(&mut self, n: u64) -> Option<Action> {
        let answered = n - 1;
        for f in &self.rules {
            match *f {
                Fault::CloseAfter { after } if after == answered => {
                    return Some(Action::Close { reset: false })
                }
                Fault::ResetAfter { after } if after == answered => {
                    return Some(Action::Close { reset: true })
                }
                Fault::Silence { after, duration } if after == answered => {
                    return Some(Action::Silence(duration))
                }
                _ => {}
            }
        }
        if let Some((r, rng)) = &mut self.random {
            if rng.f64() < r.probability {
                return Some(match rng.u8(0..5) {
                    0 => Action::Close { reset: false },
                    1 => Action::Close { reset: true },
                    2 => Action::Reply(ReplyFault {
                        cut: Some(rng.usize(0..8)),
                        ..ReplyFault::default()
                    }),
                    3 => Action::Reply(ReplyFault {
                        withhold: true,
                        withhold_for: Some(r.max_silence.mul_f64(rng.f64())),
                        ..ReplyFault::default()
                    }),
                    _ => Action::Reply(ReplyFault {
                        inject: Some(b"GARBAGE\r\n".to_vec()),
                        ..ReplyFault::default()
                    }),
                });
            }
        }
        let mut rf = ReplyFault::default();
        let mut any = false;
        for f in &self.rules {
            match f {
                Fault::CutReply { after, bytes } if *after == answered => {
                    rf.cut = Some(*bytes);
                    any = true;
                }
                Fault::NoReply { after } if *after == answered => {
                    rf.withhold = true;
                    any = true;
                }
                Fault::DelayReplies { delay } => {
                    rf.delay += *delay;
                    any = true;
                }
                Fault::Trickle { after, interval } if *after <= answered => {
                    rf.trickle = Some(*interval);
                    any = true;
                }
                Fault::Inject { after, bytes } if *after == answered => {
                    rf.inject = Some(bytes.clone());
                    any = true;
                }
                Fault::Replace { after, bytes } if *after == answered => {
                    rf.replace = Some(bytes.clone());
                    any = true;
                }
                Fault::BuryPut { after } if *after == answered => {
                    rf.bury_put = true;
                    any = true;
                }
                _ => {}
            }
        }
        any.then_some(Action::Reply(rf))
    }
}
