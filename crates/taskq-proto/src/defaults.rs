//! The one set of connection defaults every taskq part reads: the blocking
//! [`ConnectionConfig`](crate::ConnectionConfig) and
//! `taskq_connect::nats::NatsConfig`, the producers' `Builder`, the
//! worker's `Config` and the `taskq` command's flags. Each of those points
//! here instead of holding a number of its own, so that no two parts of
//! taskq disagree on how long to wait for a server.
//!
//! The fifth setting, access (credentials and TLS), has one type,
//! `taskq_connect::nats::NatsAccess`, whose default is none: no
//! credentials, TLS only when the address or the server asks for it.
//!
//! ```
//! use taskq_proto::defaults;
//! use std::time::Duration;
//!
//! assert_eq!(defaults::IO_TIMEOUT, Duration::from_secs(2));
//! assert_eq!(defaults::RECONNECT_BACKOFF.ceiling(0), Duration::from_millis(50));
//! ```

use std::time::Duration;

use crate::backoff::{Backoff, Jitter};

/// Limit on each connect attempt, per resolved address: 2 s.
///
/// A TCP connect to a live server on a LAN or in one region answers within
/// milliseconds, and a lost SYN is re-sent by the kernel after 1 s: 2 s rides
/// out one such loss, yet a node that is down is given up on soon enough to
/// try the next seed of a cluster.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Limit on each whole reply (beyond the server's own wait, for
/// `reserve-with-timeout` and a JetStream pull) and on each write: 2 s.
///
/// A timeout breaks the connection and leaves the request's outcome unknown,
/// so it must be longer than a reply can take under load, or a busy server
/// costs needless reconnects (and, for a put, an unknown outcome). A
/// beanstalkd reply takes microseconds, but a JetStream PubAck or a confirmed
/// ack on a replicated stream waits for a quorum's write, which under load
/// or while a follower catches up takes hundreds of milliseconds. 2 s leaves
/// that room twice over and still tells a silent server from a slow one
/// within a human's patience.
pub const IO_TIMEOUT: Duration = Duration::from_secs(2);

/// Waits between reconnect attempts to one server: 50 ms doubling to 2 s,
/// each spread over the upper half of its ceiling.
///
/// The first wait is short because most breaks are one server restarting or
/// one connection reset, which a reconnect 50 ms later meets healthy; the
/// doubling reaches the 2 s cap after six failures (3 s in all), so a server
/// that stays down costs about one attempt every 1-2 s per connection, not a
/// tight loop. Upper-half jitter spreads many clients cut off together
/// without making any wait much shorter than its ceiling, so the count of
/// attempts stays predictable: about 7 in the first 4 seconds.
pub const RECONNECT_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(50),
    max: Duration::from_secs(2),
    jitter: Jitter::Upper,
};

/// How long a JetStream management request (looking up or creating a stream
/// or a consumer, the operators' commands) is asked again while the cluster
/// answers that it has no leader ("no responders", 503): 10 s.
///
/// nats-server's Raft waits 4 to 9 s without a leader before it calls an
/// election, so a request that meets a cluster mid-election must be patient
/// that long to see the new leader; 10 s covers one election, and a cluster
/// that stays leaderless longer is an outage worth reporting.
pub const API_PATIENCE: Duration = Duration::from_secs(10);

/// Pause between two tries of a JetStream management request within
/// [`API_PATIENCE`]: often enough to see a new leader within a fraction of a
/// second, rarely enough to add no load to a cluster that is electing one.
pub const API_RETRY_PAUSE: Duration = Duration::from_millis(100);

/// TCP keepalive idle time: 30 s, so that a connection whose peer vanished
/// (a host powered off, a NAT entry dropped) is found dead while it idles,
/// rather than at the next request.
pub const KEEPALIVE: Option<Duration> = Some(Duration::from_secs(30));
