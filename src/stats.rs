//! `taskq stats`: the server's or a tube's statistics, as a table or as JSON.

use std::io::Write;

use taskq_proto::{yaml, Command, Reply};
use taskq_worker::table::Table;

use crate::admin::{request, unexpected, ServerArgs};
use crate::CliResult;

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
    let mut conn = args.server.connect()?;
    let cmd = match &args.tube {
        Some(tube) => Command::StatsTube { tube },
        None => Command::Stats,
    };
    let text = request(&mut conn, &cmd, |r| {
        let yaml = match r {
            Reply::Ok { yaml } => yaml,
            Reply::NotFound => {
                return Err(format!(
                    "no tube named {:?}",
                    args.tube.clone().unwrap_or_default()
                ))
            }
            other => return Err(unexpected(&cmd, &other)),
        };
        let pairs = yaml::pairs(yaml)
            .and_then(|p| p.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("reading the statistics: {e}"))?;
        Ok(if args.json {
            to_json(&pairs)
        } else {
            to_table(&pairs)
        })
    })?;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| format!("writing: {e}"))?;
    Ok(())
}

/// `key  value` lines, the values aligned.
fn to_table(pairs: &[(&str, &str)]) -> String {
    let mut t = Table::new().left(1);
    for (k, v) in pairs {
        t.row([k, v]);
    }
    t.to_string()
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
