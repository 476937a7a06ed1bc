//! Where a JetStream put goes and which headers it carries, for the blocking
//! and the async producer alike.
//!
//! A job put without a delay is published to its tube's subject, `taskq.T`.
//! A delayed job carries its ready time (`Taskq-Ready-At`, Unix
//! milliseconds) and is held until then by
//!
//! - the server, on a stream that allows message schedules (nats-server
//!   2.12+): it is published to a subject of its own,
//!   `taskq.T.delayed.<S>.<message id>`, with `Nats-Schedule: @at <S>` (its
//!   ready time rounded up to the whole second `S`) and
//!   `Nats-Schedule-Target: taskq.T`, and the server publishes it to
//!   `taskq.T` at `S`, once;
//! - else the client: it is published to `taskq.T` at once, and a worker
//!   handed it early gives it back with `-NAK` for the time left.
//!
//! Which of the two a connection uses is decided when it sets the stream up
//! ([`stream_and_delays`]).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use taskq_connect::nats::{ApiLink, JetStream, StreamInfo, StreamSpec};
use taskq_connect::{Layout, READY_AT_HEADER};
use taskq_proto::nats::schedule::{SCHEDULE_HEADER, SCHEDULE_TARGET_HEADER};
use taskq_proto::nats::{holds_schedules, NatsError, ScheduleAt};

/// The longest message id a producer makes (see `MsgIds`).
const MAX_MSG_ID: usize = 40;

/// Who holds a connection's delayed jobs until their time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delays {
    /// The worker: a job handed out early goes back with `-NAK`.
    Client,
    /// The server: a message schedule publishes the job at its time.
    Server,
}

/// Makes sure the stream of `spec` exists, decides who holds delays, and
/// says the stream's duplicate window.
/// A server that holds message schedules (2.12+) creates a missing stream
/// with them; an existing stream without them is updated to allow them
/// unless `keep_config`, or unless the server refuses the update (an API
/// error: the stream or the account cannot have them). Delays are the
/// server's only on such a server and such a stream.
///
/// One rule for both drivers: the blocking producer runs it with
/// `run_blocking`, the async one awaits it.
pub(crate) async fn stream_and_delays<L: ApiLink>(
    js: &mut JetStream<'_, L>,
    spec: &StreamSpec,
    keep_config: bool,
) -> Result<(Delays, Duration), NatsError> {
    let mut info: StreamInfo = js.ensure_stream_with_schedules(spec).await?;
    let window = info.duplicate_window;
    if !holds_schedules(js.0.server_version()) {
        return Ok((Delays::Client, window));
    }
    if !info.allow_msg_schedules && !keep_config {
        match js.allow_msg_schedules(&spec.name).await {
            Ok(updated) => info = updated,
            // Not allowed here: the stream stays as it was, and so does the
            // client-side way.
            Err(NatsError::Api(_)) => {}
            Err(e) => return Err(e),
        }
    }
    let delays = if info.allow_msg_schedules {
        Delays::Server
    } else {
        Delays::Client
    };
    Ok((delays, window))
}

/// Where one tube's puts go on one connection.
#[derive(Debug, Clone)]
pub(crate) struct Route {
    /// The tube's subject, `taskq.T`.
    subject: String,
    /// `taskq.T.delayed.` when the server holds delays.
    delayed: Option<String>,
    /// A delayed job's own subject, written for each put.
    scratch: String,
}

impl Route {
    /// The route of `tube`'s puts, delays held as `delays` says.
    pub(crate) fn new(layout: &Layout, tube: &str, delays: Delays) -> Route {
        let delayed = (delays == Delays::Server).then(|| layout.delayed_prefix(tube));
        // Room for the longest subject (20 digits of seconds, a dot, the
        // longest message id) now, so that no put allocates.
        let room = delayed.as_ref().map_or(0, |p| p.len() + 21 + MAX_MSG_ID);
        Route {
            subject: layout.subject(tube),
            delayed,
            scratch: String::with_capacity(room),
        }
    }
}

/// The ready time of a put made now with a delay, formatted on the stack:
/// one for a put, or for all the jobs of a batch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stamp {
    ms: [u8; 20],
    len: usize,
    at: ScheduleAt,
}

impl Stamp {
    /// The stamp of a job put now with `delay` seconds; `None` for a job
    /// ready at once.
    #[inline]
    pub(crate) fn now(delay: u32) -> Option<Stamp> {
        if delay == 0 {
            return None;
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        let ready = now + Duration::from_secs(u64::from(delay));
        Some(Stamp::at(
            u64::try_from(ready.as_millis()).unwrap_or(u64::MAX),
        ))
    }

    /// The stamp of a job ready at `ready_ms` (Unix milliseconds).
    pub(crate) fn at(ready_ms: u64) -> Stamp {
        let mut digits = itoa::Buffer::new();
        let d = digits.format(ready_ms).as_bytes();
        let mut ms = [0; 20];
        ms[..d.len()].copy_from_slice(d);
        Stamp {
            ms,
            len: d.len(),
            at: ScheduleAt::new(ready_ms),
        }
    }

    fn ready_ms(&self) -> &[u8] {
        &self.ms[..self.len]
    }
}

/// The subject and the extra headers (besides `Nats-Msg-Id`) of one put,
/// borrowed from its route and its stamp.
#[derive(Debug)]
pub(crate) struct Put<'a> {
    subject: &'a str,
    headers: [(&'a [u8], &'a [u8]); 3],
    n: usize,
}

impl<'a> Put<'a> {
    /// The put with message id `msg_id` on `route`: of a job ready at once
    /// (`stamp` `None`), or of a delayed one, held by the server or the
    /// client as the route says.
    #[inline]
    pub(crate) fn new(route: &'a mut Route, stamp: Option<&'a Stamp>, msg_id: &[u8]) -> Put<'a> {
        let Route {
            subject,
            delayed,
            scratch,
        } = route;
        let none: (&[u8], &[u8]) = (b"", b"");
        match (stamp, delayed) {
            (None, _) => Put {
                subject,
                headers: [none; 3],
                n: 0,
            },
            (Some(s), None) => Put {
                subject,
                headers: [(READY_AT_HEADER, s.ready_ms()), none, none],
                n: 1,
            },
            (Some(s), Some(prefix)) => {
                let id = std::str::from_utf8(msg_id).expect("message ids are ASCII");
                Layout::delayed_subject(prefix, s.at.secs(), id, scratch);
                Put {
                    subject: scratch,
                    headers: [
                        (READY_AT_HEADER, s.ready_ms()),
                        (SCHEDULE_HEADER, s.at.as_bytes()),
                        (SCHEDULE_TARGET_HEADER, subject.as_bytes()),
                    ],
                    n: 3,
                }
            }
        }
    }

    /// The subject it is published to.
    #[inline]
    pub(crate) fn subject(&self) -> &'a str {
        self.subject
    }

    /// Its headers besides `Nats-Msg-Id`.
    #[inline]
    pub(crate) fn extra(&self) -> &[(&'a [u8], &'a [u8])] {
        &self.headers[..self.n]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A put's subject and headers, owned.
    fn put(route: &mut Route, stamp: Option<&Stamp>, id: &str) -> (String, Vec<String>) {
        let p = Put::new(route, stamp, id.as_bytes());
        let headers = p
            .extra()
            .iter()
            .map(|(k, v)| {
                format!(
                    "{}: {}",
                    String::from_utf8_lossy(k),
                    String::from_utf8_lossy(v)
                )
            })
            .collect();
        (p.subject().to_owned(), headers)
    }

    #[test]
    fn a_put_ready_at_once_goes_to_its_tube_with_no_header_either_way() {
        let l = Layout::default();
        for delays in [Delays::Client, Delays::Server] {
            let mut r = Route::new(&l, "emails", delays);
            assert_eq!(
                put(&mut r, None, "abc-1"),
                ("taskq.emails".to_owned(), vec![])
            );
        }
    }

    #[test]
    fn a_delay_the_client_holds_is_a_ready_time_on_the_tubes_subject() {
        let mut r = Route::new(&Layout::default(), "emails", Delays::Client);
        let s = Stamp::at(1_796_171_536_360);
        assert_eq!(
            put(&mut r, Some(&s), "abc-1"),
            (
                "taskq.emails".to_owned(),
                vec!["Taskq-Ready-At: 1796171536360".to_owned()]
            )
        );
    }

    #[test]
    fn a_delay_the_server_holds_is_a_schedule_on_a_subject_of_its_own() {
        let l = Layout::new("Staging").unwrap();
        let mut r = Route::new(&l, "emails", Delays::Server);
        let s = Stamp::at(1_796_171_536_360);
        let want = |id: &str| {
            (
                format!("staging.emails.delayed.1796171537.{id}"),
                vec![
                    "Taskq-Ready-At: 1796171536360".to_owned(),
                    "Nats-Schedule: @at 2026-12-02T00:32:17Z".to_owned(),
                    "Nats-Schedule-Target: staging.emails".to_owned(),
                ],
            )
        };
        assert_eq!(put(&mut r, Some(&s), "abc-1"), want("abc-1"));
        // Each job of a batch gets its own subject, from its message id.
        assert_eq!(put(&mut r, Some(&s), "abc-12"), want("abc-12"));
        assert_eq!(put(&mut r, Some(&s), "abc-2"), want("abc-2"));
        // The subject is the stream's, and no tube consumer's.
        let (subject, _) = put(&mut r, Some(&s), "abc-3");
        assert_eq!(
            l.tube_of(&subject),
            Some((
                "emails",
                taskq_connect::SubjectKind::Delayed { at: 1_796_171_537 }
            ))
        );
        // A job whose ready time is a whole second is scheduled for it.
        let s = Stamp::at(1_796_171_537_000);
        let (subject, headers) = put(&mut r, Some(&s), "abc-4");
        assert_eq!(subject, "staging.emails.delayed.1796171537.abc-4");
        assert_eq!(headers[1], "Nats-Schedule: @at 2026-12-02T00:32:17Z");
    }

    #[test]
    fn a_stamp_made_now_is_never_scheduled_before_its_delay() {
        assert!(Stamp::now(0).is_none());
        let before = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let s = Stamp::now(3).unwrap();
        let ready: u64 = std::str::from_utf8(s.ready_ms()).unwrap().parse().unwrap();
        let earliest = before.as_millis() as u64 + 3000;
        assert!(ready >= earliest, "{ready} < {earliest}");
        assert!(s.at.secs() * 1000 >= ready);
        assert!(s.at.secs() * 1000 < ready + 1000);
    }
}
