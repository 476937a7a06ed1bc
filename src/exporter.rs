//! `taskq exporter`: several servers' statistics at `/metrics` in the
//! Prometheus text format, read from the servers at each scrape.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelValue, EncodeMetric, LabelValueEncoder,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use taskq_worker::metrics::MetricsServer;

use crate::cli::CliResult;
use crate::jetstream::{self, StreamArgs};
use crate::server::ServersArgs;
use crate::snapshot::{self, Scope, Snapshot};

/// Arguments of `taskq exporter`.
#[derive(clap::Args, Debug)]
pub struct ExporterArgs {
    /// Address to serve `/metrics` on.
    #[arg(long, value_name = "HOST:PORT")]
    listen: String,
    #[command(flatten)]
    servers: ServersArgs,
}

/// Each server's snapshot at one scrape, with its address.
type Readings = Vec<(String, Result<Snapshot, String>)>;

/// Reads every server, each on a connection of its own.
fn read_all(addrs: &[String], io_timeout: u64, js: &StreamArgs) -> Readings {
    addrs
        .iter()
        .map(|a| {
            let s = crate::server::open(a, io_timeout, js)
                .and_then(|mut c| snapshot::read(&mut c, Scope::everything()));
            (a.clone(), s)
        })
        .collect()
}

/// The series of one engine's servers: beanstalkd's under the names
/// dashboards know (`beanstalkd_*`), JetStream's under `taskq_*` with the
/// same labels and JetStream's own beside them.
#[derive(Debug)]
struct Servers {
    readings: Readings,
    nats: bool,
}

type Labels<'a> = Vec<(&'a str, &'a str)>;

/// A label value as the text format wants it: `\`, `"` and a line feed
/// escaped. The encoder writes values as given, and a tube name is anyone's
/// who may publish (`taskq.x"`): unescaped, it would make the whole scrape
/// invalid and every series stale.
#[derive(Debug, Clone, Copy)]
struct Escaped<'a>(&'a str);

impl EncodeLabelValue for Escaped<'_> {
    fn encode(&self, enc: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        use std::fmt::Write;
        for c in self.0.chars() {
            match c {
                '\\' => enc.write_str("\\\\")?,
                '"' => enc.write_str("\\\"")?,
                '\n' => enc.write_str("\\n")?,
                c => enc.write_char(c)?,
            }
        }
        Ok(())
    }
}

/// `labels` with their values escaped.
fn escaped<'a>(labels: &[(&'a str, &'a str)]) -> Vec<(&'a str, Escaped<'a>)> {
    labels.iter().map(|&(k, v)| (k, Escaped(v))).collect()
}

fn gauge(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: Vec<(Labels<'_>, i64)>,
) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in rows {
        ConstGauge::new(v).encode(m.encode_family(&escaped(&labels))?)?;
    }
    Ok(())
}

fn counter(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: Vec<(Labels<'_>, u64)>,
) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in rows {
        ConstCounter::new(v).encode(m.encode_family(&escaped(&labels))?)?;
    }
    Ok(())
}

impl Collector for Servers {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let ok = || {
            self.readings
                .iter()
                .filter_map(|(a, r)| r.as_ref().ok().map(|r| (a.as_str(), r)))
        };
        let up = self
            .readings
            .iter()
            .map(|(a, r)| (vec![("server", a.as_str())], i64::from(r.is_ok())))
            .collect();
        gauge(&mut enc, "up", "1 when the server answered this scrape", up)?;
        let mut jobs = Vec::new();
        let mut waiting = Vec::new();
        let mut paused = Vec::new();
        let mut age = Vec::new();
        for (a, r) in ok() {
            for t in &r.tubes {
                let states = [
                    ("ready", Some(t.jobs.ready)),
                    ("urgent", Some(t.jobs.urgent)),
                    ("reserved", Some(t.jobs.reserved)),
                    ("delayed", t.jobs.delayed),
                    ("buried", Some(t.jobs.buried)),
                ];
                for (state, n) in states {
                    if let Some(n) = n {
                        jobs.push((
                            vec![("server", a), ("tube", t.name.as_str()), ("state", state)],
                            n as i64,
                        ));
                    }
                }
                let l = vec![("server", a), ("tube", t.name.as_str())];
                waiting.push((l.clone(), t.jobs.waiting as i64));
                paused.push((l.clone(), t.paused as i64));
                age.push((l, t.ready_age.unwrap_or(0) as i64));
            }
        }
        gauge(
            &mut enc,
            "tube_jobs",
            "Current jobs of the tube, by state",
            jobs,
        )?;
        let waiting_help = if self.nats {
            "Pull requests waiting for a job of the tube"
        } else {
            "Connections waiting for a job of the tube"
        };
        gauge(&mut enc, "tube_waiting", waiting_help, waiting)?;
        gauge(
            &mut enc,
            "tube_pause_left_seconds",
            "Seconds of pause left, 0 when not paused",
            paused,
        )?;
        gauge(
            &mut enc,
            "tube_oldest_ready_age_seconds",
            "Age of the next ready job of the tube (0 when none is ready)",
            age,
        )?;
        if self.nats {
            return nats_series(&mut enc, ok().collect());
        }
        let mut rows = Vec::new();
        for (a, r) in ok() {
            for (key, v) in &r.totals.pairs {
                let counts = key.starts_with("cmd-")
                    || matches!(
                        key.as_str(),
                        "total-jobs" | "job-timeouts" | "total-connections"
                    );
                if let (true, Ok(v)) = (counts, v.parse::<u64>()) {
                    rows.push((vec![("server", a), ("counter", key.as_str())], v));
                }
            }
        }
        counter(
            &mut enc,
            "server",
            "The server's counters since it started (cmd-* by command)",
            rows,
        )?;
        let mut rows = Vec::new();
        for (a, r) in ok() {
            for t in &r.tubes {
                if let Some(n) = t.jobs.puts {
                    rows.push((vec![("server", a), ("tube", t.name.as_str())], n));
                }
            }
        }
        counter(
            &mut enc,
            "tube_created_jobs",
            "Jobs created in the tube since the server started",
            rows,
        )
    }
}

/// JetStream's own series: per tube the stored and redelivered messages and
/// the consumer's deliveries; per stream its record.
fn nats_series(
    enc: &mut DescriptorEncoder<'_>,
    ok: Vec<(&str, &Snapshot)>,
) -> Result<(), std::fmt::Error> {
    let (mut stored, mut redelivered, mut delivered) = (Vec::new(), Vec::new(), Vec::new());
    for (a, r) in &ok {
        for t in &r.tubes {
            let Some(n) = &t.nats else { continue };
            let l = vec![("server", *a), ("tube", t.name.as_str())];
            stored.push((l.clone(), n.stored as i64));
            redelivered.push((l.clone(), n.redelivered() as i64));
            if let Some(d) = t.delivered() {
                delivered.push((l, d));
            }
        }
    }
    gauge(
        enc,
        "tube_stored",
        "Messages stored on the tube's subject (ready and reserved jobs, and delayed ones the client holds)",
        stored,
    )?;
    gauge(
        enc,
        "tube_redelivered",
        "Unacked jobs of the tube handed out more than once",
        redelivered,
    )?;
    counter(
        enc,
        "tube_delivered",
        "Deliveries by the tube's consumer since it was made",
        delivered,
    )?;
    let mut stream = Vec::new();
    for (a, r) in &ok {
        let Some(n) = &r.nats else { continue };
        let st = &n.stream;
        let l = vec![("server", *a), ("stream", st.name.as_str())];
        stream.push((l, st));
    }
    let field = |f: fn(&taskq_connect::nats::StreamInfo) -> u64| {
        stream
            .iter()
            .map(|(l, st)| (l.clone(), f(st) as i64))
            .collect()
    };
    gauge(
        enc,
        "stream_messages",
        "Messages in the stream",
        field(|s| s.messages),
    )?;
    gauge(
        enc,
        "stream_first_seq",
        "Sequence of the stream's first message",
        field(|s| s.first_seq),
    )?;
    gauge(
        enc,
        "stream_last_seq",
        "Sequence of the stream's last message (messages ever stored)",
        field(|s| s.last_seq),
    )?;
    gauge(
        enc,
        "stream_consumers",
        "Consumers of the stream",
        field(|s| s.consumer_count),
    )
}

/// The text of one scrape of `addrs`.
fn render(addrs: &[String], io_timeout: u64, js: &StreamArgs) -> String {
    let (nats, beanstalkd): (Readings, Readings) = read_all(addrs, io_timeout, js)
        .into_iter()
        .partition(|(a, _)| jetstream::is_nats(a));
    let mut registry = Registry::default();
    for (prefix, readings, nats) in [("beanstalkd", beanstalkd, false), ("taskq", nats, true)] {
        if !readings.is_empty() {
            registry
                .sub_registry_with_prefix(prefix)
                .register_collector(Box::new(Servers { readings, nats }));
        }
    }
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
    out
}

/// Runs `taskq exporter` until killed.
pub fn run(args: ExporterArgs) -> CliResult {
    let addrs = args.servers.addrs()?;
    let (io_timeout, js) = (args.servers.io_timeout, args.servers.js);
    let server = MetricsServer::serve(&args.listen, move || render(&addrs, io_timeout, &js))
        .map_err(|e| format!("listening on {}: {e}", args.listen))?;
    eprintln!("taskq exporter: serving http://{}/metrics", server.addr());
    loop {
        std::thread::park();
    }
}
