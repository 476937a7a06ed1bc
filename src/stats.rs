//! `taskq stats`: the server's or a tube's statistics, as a table or as JSON.

use taskq_worker::table::Table;

use crate::cli::CliResult;
use crate::server::{print, ServerArgs};
use crate::snapshot::{self, ConsumerRow, Counts, NatsRecord, Scope, Snapshot, Tube};

/// Arguments of `taskq stats`.
#[derive(clap::Args, Debug)]
pub struct StatsArgs {
    #[command(flatten)]
    server: ServerArgs,
    /// Show this tube's statistics instead of the server's.
    #[arg(long)]
    pub tube: Option<String>,
    /// Print one JSON object (numbers as JSON numbers) instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs `taskq stats`.
pub fn run(args: StatsArgs) -> CliResult {
    if let Some(t) = &args.tube {
        args.server.check_tube(t)?;
    }
    let mut conn = args.server.open()?;
    let text = match &args.tube {
        Some(name) => {
            let only = [name.clone()];
            let s = snapshot::read(&mut conn, Scope::only(&only))?;
            let t = s.tubes.first().filter(|t| t.known);
            let Some(t) = t else {
                return Err(format!("no tube named {name:?}").into());
            };
            let pairs = tube_pairs(t);
            if args.json {
                to_json(&pairs)
            } else {
                to_table(&pairs)
            }
        }
        None => {
            let s = match &conn {
                crate::server::Conn::Beanstalkd(_) => snapshot::read(&mut conn, Scope::only(&[]))?,
                crate::server::Conn::Nats(_) => snapshot::read(
                    &mut conn,
                    Scope {
                        tubes: None,
                        ready_age: false,
                    },
                )?,
            };
            server_text(&s, args.json)
        }
    };
    print(text.as_bytes())
}

/// The server's statistics: beanstalkd's `stats` pairs; on JetStream the
/// stream's record and a table (or array) of its consumers.
fn server_text(s: &Snapshot, json: bool) -> String {
    let Some(n) = &s.nats else {
        return if json {
            to_json(&s.totals.pairs)
        } else {
            to_table(&s.totals.pairs)
        };
    };
    let pairs = stream_pairs(s, n);
    if json {
        let consumers: Vec<String> = n
            .consumers
            .iter()
            .map(|c| format!("{{{}}}", json_fields(&consumer_pairs(c)).join(",")))
            .collect();
        let mut fields = json_fields(&pairs);
        fields.push(format!("\"consumers\":[{}]", consumers.join(",")));
        format!("{{{}}}\n", fields.join(","))
    } else {
        let mut t = Table::new().left(1);
        t.row([
            "CONSUMER",
            "TUBE",
            "PENDING",
            "ACK-PENDING",
            "REDELIVERED",
            "WAITING",
            "ACK-WAIT",
        ]);
        for c in &n.consumers {
            t.row([
                c.name.clone(),
                c.tube().unwrap_or("-").to_owned(),
                c.pending.to_string(),
                c.ack_pending.to_string(),
                c.redelivered.to_string(),
                c.waiting.to_string(),
                format!("{}s", c.ack_wait.as_secs()),
            ]);
        }
        format!("{}\n{t}", to_table(&pairs))
    }
}

/// The stream's record, with beanstalkd's `current-*` totals over taskq's tubes.
fn stream_pairs(s: &Snapshot, n: &NatsRecord) -> Vec<(&'static str, String)> {
    let (st, t) = (&n.stream, &s.totals);
    [
        ("engine", "nats".to_owned()),
        ("stream", st.name.clone()),
        ("subjects", st.subjects.join(",")),
        ("retention", st.retention.clone()),
        ("replicas", st.replicas.to_string()),
        ("leader", st.leader.clone().unwrap_or_default()),
        ("messages", st.messages.to_string()),
        ("first-seq", st.first_seq.to_string()),
        ("last-seq", st.last_seq.to_string()),
        ("consumer-count", st.consumer_count.to_string()),
        ("allow-msg-schedules", st.allow_msg_schedules.to_string()),
        ("current-tubes", t.tubes.to_string()),
    ]
    .into_iter()
    .chain(count_pairs(&t.jobs))
    .collect()
}

/// Counts under beanstalkd's `current-*` names (JetStream has no urgent
/// count, and a delayed count only on a stream with message schedules).
fn count_pairs(c: &Counts) -> Vec<(&'static str, String)> {
    let delayed = c.delayed.map(|d| ("current-jobs-delayed", d.to_string()));
    [
        Some(("current-jobs-ready", c.ready.to_string())),
        Some(("current-jobs-reserved", c.reserved.to_string())),
        delayed,
        Some(("current-jobs-buried", c.buried.to_string())),
        Some(("current-waiting", c.waiting.to_string())),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// A consumer's record, under its own names.
fn consumer_pairs(c: &ConsumerRow) -> Vec<(&'static str, String)> {
    vec![
        ("consumer", c.name.clone()),
        ("tube", c.tube().unwrap_or_default().to_owned()),
        ("filter-subject", c.filter.clone()),
        ("num-pending", c.pending.to_string()),
        ("num-ack-pending", c.ack_pending.to_string()),
        ("num-redelivered", c.redelivered.to_string()),
        ("num-waiting", c.waiting.to_string()),
        ("delivered", c.delivered.to_string()),
        ("ack-wait", c.ack_wait.as_secs().to_string()),
        ("max-deliver", c.max_deliver.to_string()),
        ("leader", c.leader.clone().unwrap_or_default()),
    ]
}

/// One tube: beanstalkd's `stats-tube` pairs; on JetStream the same names
/// for its counts, then its consumer's record.
fn tube_pairs(t: &Tube) -> Vec<(String, String)> {
    let Some(n) = &t.nats else {
        return t.pairs.clone();
    };
    let mut pairs = vec![("name", t.name.clone())];
    pairs.extend(count_pairs(&t.jobs));
    pairs.push(("stored", n.stored.to_string()));
    if let Some(c) = &n.consumer {
        pairs.extend(consumer_pairs(c).into_iter().filter(|(k, _)| *k != "tube"));
    }
    pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// `key  value` lines, the values aligned.
fn to_table<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> String {
    let mut t = Table::new().left(1);
    for (k, v) in pairs {
        t.row([k.as_ref(), v.as_ref()]);
    }
    t.to_string()
}

/// One JSON object in the server's order: numbers and booleans typed, the rest strings.
fn to_json<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> String {
    format!("{{{}}}\n", json_fields(pairs).join(","))
}

/// The `"key":value` members of [`to_json`]'s object.
fn json_fields<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> Vec<String> {
    pairs
        .iter()
        .map(|(k, v)| {
            let (k, v) = (k.as_ref(), v.as_ref());
            let value = if TEXT_KEYS.contains(&k) {
                serde_json::Value::from(v)
            } else {
                json_value(v)
            };
            format!("{}:{}", serde_json::Value::from(k), value)
        })
        .collect()
}

/// Fields that are text even when they look like numbers (a version "1.12",
/// an id of digits; on JetStream the names of streams, consumers, subjects and nodes).
const TEXT_KEYS: &[&str] = &[
    "version",
    "id",
    "hostname",
    "os",
    "platform",
    "name",
    "tube",
    "state",
    "engine",
    "stream",
    "subjects",
    "retention",
    "leader",
    "consumer",
    "filter-subject",
];

fn json_value(v: &str) -> serde_json::Value {
    if let Ok(n) = v.parse::<u64>() {
        return n.into();
    }
    if let Ok(n) = v.parse::<i64>() {
        return n.into();
    }
    match v {
        "true" => return true.into(),
        "false" => return false.into(),
        _ => {}
    }
    // Decimal numbers such as rusage-utime; never "inf" or "nan", which JSON cannot hold.
    if v.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && v.bytes().filter(|&b| b == b'.').count() == 1
    {
        if let Some(n) = v.parse::<f64>().ok().and_then(serde_json::Number::from_f64) {
            return n.into();
        }
    }
    v.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_types_numbers_booleans_and_strings() {
        let pairs = [
            ("current-jobs-ready", "12"),
            ("rusage-utime", "0.004000"),
            ("draining", "false"),
            ("version", "1.12"),
            ("hostname", "box \"one\""),
            ("id", "12345"),
        ];
        let v: serde_json::Value = serde_json::from_str(&to_json(&pairs)).unwrap();
        assert_eq!(v["current-jobs-ready"], 12);
        assert_eq!(v["rusage-utime"], 0.004);
        assert_eq!(v["draining"], false);
        assert_eq!(v["version"], "1.12");
        assert_eq!(v["hostname"], "box \"one\"");
        assert_eq!(v["id"], "12345");
        assert_eq!(
            to_table(&pairs[..2]),
            "current-jobs-ready  12\nrusage-utime        0.004000\n"
        );
    }
}
