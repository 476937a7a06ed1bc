//! `taskq stats`: the server's or a tube's statistics, as a table or as JSON.

use std::io::Write;
use std::time::Duration;

use taskq_proto::{yaml, Command, Config, Connection, Reply};

use crate::CliResult;

/// Arguments of `taskq stats`.
#[derive(clap::Args, Debug)]
pub struct StatsArgs {
    /// Server address.
    #[arg(long, env = "TASKQ_ADDR", default_value = "127.0.0.1:11300")]
    pub addr: String,
    /// Limit on connecting and on each reply, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub io_timeout: u64,
    /// Show this tube's statistics instead of the server's.
    #[arg(long)]
    pub tube: Option<String>,
    /// Print one JSON object (numbers as JSON numbers) instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs `taskq stats`.
pub fn run(args: StatsArgs) -> CliResult {
    let t = Duration::from_millis(args.io_timeout.max(1));
    let cfg = Config {
        connect_timeout: t,
        io_timeout: t,
        ..Config::default()
    };
    let mut conn =
        Connection::connect(args.addr.as_str(), cfg).map_err(|e| format!("{}: {e}", args.addr))?;
    let cmd = match &args.tube {
        Some(tube) => Command::StatsTube { tube },
        None => Command::Stats,
    };
    let yaml = match conn
        .request(&cmd)
        .map_err(|e| format!("{}: {e}", cmd.kind().name()))?
    {
        Reply::Ok { yaml } => yaml,
        Reply::NotFound => {
            return Err(format!("no tube named {:?}", args.tube.unwrap_or_default()).into())
        }
        other => {
            return Err(format!("{}: server answered {}", cmd.kind().name(), other.word()).into())
        }
    };
    let pairs = yaml::pairs(yaml)
        .and_then(|p| p.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("reading the statistics: {e}"))?;
    let text = if args.json {
        to_json(&pairs)
    } else {
        to_table(&pairs)
    };
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| format!("writing: {e}"))?;
    Ok(())
}

/// `key  value` lines, the values aligned.
fn to_table(pairs: &[(&str, &str)]) -> String {
    let width = pairs.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    pairs
        .iter()
        .map(|(k, v)| format!("{k:<width$}  {v}\n"))
        .collect()
}

/// One JSON object in the server's order: numbers and booleans typed, the rest strings.
fn to_json(pairs: &[(&str, &str)]) -> String {
    let fields: Vec<String> = pairs
        .iter()
        .map(|(k, v)| {
            let value = if TEXT_KEYS.contains(k) {
                serde_json::Value::from(*v)
            } else {
                json_value(v)
            };
            format!("{}:{}", serde_json::Value::from(*k), value)
        })
        .collect();
    format!("{{{}}}\n", fields.join(","))
}

/// Fields that are text even when they look like numbers (a version "1.12", an id of digits).
const TEXT_KEYS: &[&str] = &[
    "version", "id", "hostname", "os", "platform", "name", "tube", "state",
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
