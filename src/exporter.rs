//! `taskq exporter`: several servers' statistics at `/metrics` in the
//! Prometheus text format, read from the servers at each scrape.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use taskq_proto::{yaml, Command, Reply};
use taskq_worker::metrics::MetricsServer;

use crate::admin::{all_tubes, connect_to, ready_ages, request, unexpected, TubeRow};
use crate::CliResult;

/// Arguments of `taskq exporter`.
#[derive(clap::Args, Debug)]
pub struct ExporterArgs {
    /// Address to serve `/metrics` on.
    #[arg(long, value_name = "HOST:PORT")]
    listen: String,
    /// A server to read (repeat for several); defaults to $TASKQ_ADDR, then 127.0.0.1:11300.
    #[arg(
        long,
        value_name = "HOST:PORT",
        env = "TASKQ_ADDR",
        value_delimiter = ',',
        default_value = "127.0.0.1:11300"
    )]
    addr: Vec<String>,
    /// Limit on connecting to a server and on each reply, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    io_timeout: u64,
}

/// What one server said at one scrape.
#[derive(Debug, Default)]
struct Reading {
    /// `cmd-*` counters and `total-jobs`, `job-timeouts`, `total-connections`, by key.
    counters: Vec<(String, u64)>,
    tubes: Vec<TubeRow>,
    /// Per tube (same order), the age in seconds of the job `peek-ready` shows.
    oldest_ready: Vec<Option<u64>>,
}

fn read(addr: &str, io_timeout: u64) -> Result<Reading, String> {
    let mut conn = connect_to(addr, io_timeout)?;
    let counters = request(&mut conn, &Command::Stats, |r| match r {
        Reply::Ok { yaml } => yaml::pairs(yaml)
            .and_then(|p| p.collect::<Result<Vec<_>, _>>())
            .map(|pairs| {
                pairs
                    .into_iter()
                    .filter(|(k, _)| {
                        k.starts_with("cmd-")
                            || matches!(*k, "total-jobs" | "job-timeouts" | "total-connections")
                    })
                    .filter_map(|(k, v)| Some((k.to_owned(), v.parse().ok()?)))
                    .collect()
            })
            .map_err(|e| format!("reading stats: {e}")),
        other => Err(unexpected(&Command::Stats, &other)),
    })?;
    let tubes = all_tubes(&mut conn)?;
    let oldest_ready = ready_ages(&mut conn, &tubes)?;
    Ok(Reading {
        counters,
        tubes,
        oldest_ready,
    })
}

#[derive(Debug)]
struct Servers {
    addrs: Vec<String>,
    io_timeout: u64,
}

type Labels<'a> = Vec<(&'a str, &'a str)>;

impl Collector for Servers {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let readings: Vec<(&str, Result<Reading, String>)> = self
            .addrs
            .iter()
            .map(|a| (a.as_str(), read(a, self.io_timeout)))
            .collect();
        let ok = || {
            readings
                .iter()
                .filter_map(|(a, r)| r.as_ref().ok().map(|r| (*a, r)))
        };
        let gauge = |enc: &mut DescriptorEncoder<'_>,
                     name: &str,
                     help: &str,
                     rows: Vec<(Labels<'_>, i64)>|
         -> Result<(), std::fmt::Error> {
            let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (labels, v) in rows {
                ConstGauge::new(v).encode(m.encode_family(&labels)?)?;
            }
            Ok(())
        };
        let up = readings
            .iter()
            .map(|(a, r)| (vec![("server", *a)], i64::from(r.is_ok())))
            .collect();
        gauge(&mut enc, "up", "1 when the server answered this scrape", up)?;
        let mut jobs = Vec::new();
        let mut waiting = Vec::new();
        let mut paused = Vec::new();
        let mut age = Vec::new();
        for (a, r) in ok() {
            for (t, oldest) in r.tubes.iter().zip(&r.oldest_ready) {
                for (state, n) in [
                    ("ready", t.ready),
                    ("urgent", t.urgent),
                    ("reserved", t.reserved),
                    ("delayed", t.delayed),
                    ("buried", t.buried),
                ] {
                    jobs.push((
                        vec![("server", a), ("tube", t.name.as_str()), ("state", state)],
                        n as i64,
                    ));
                }
                let l = vec![("server", a), ("tube", t.name.as_str())];
                waiting.push((l.clone(), t.waiting as i64));
                paused.push((l.clone(), t.paused as i64));
                age.push((l, oldest.unwrap_or(0) as i64));
            }
        }
        gauge(
            &mut enc,
            "tube_jobs",
            "Current jobs of the tube, by state",
            jobs,
        )?;
        gauge(
            &mut enc,
            "tube_waiting",
            "Connections waiting for a job of the tube",
            waiting,
        )?;
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
        let mut m = enc.encode_descriptor(
            "server",
            "The server's counters since it started (cmd-* by command)",
            None,
            MetricType::Counter,
        )?;
        for (a, r) in ok() {
            for (key, v) in &r.counters {
                let labels = vec![("server", a), ("counter", key.as_str())];
                ConstCounter::new(*v).encode(m.encode_family(&labels)?)?;
            }
        }
        let mut m = enc.encode_descriptor(
            "tube_created_jobs",
            "Jobs created in the tube since the server started",
            None,
            MetricType::Counter,
        )?;
        for (a, r) in ok() {
            for t in &r.tubes {
                let labels = vec![("server", a), ("tube", t.name.as_str())];
                ConstCounter::new(t.total_jobs).encode(m.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// The text of one scrape of `addrs`.
fn render(addrs: &[String], io_timeout: u64) -> String {
    let mut registry = Registry::with_prefix("beanstalkd");
    registry.register_collector(Box::new(Servers {
        addrs: addrs.to_vec(),
        io_timeout,
    }));
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
    out
}

/// Runs `taskq exporter` until killed.
pub fn run(args: ExporterArgs) -> CliResult {
    if args.addr.iter().any(|a| crate::jetstream::is_nats(a)) {
        return Err(crate::jetstream::Unsupported::nats(
            "exporter",
            "it serves beanstalkd's statistics; JetStream's are at nats-server's monitoring port",
        )
        .into());
    }
    let (addrs, io_timeout) = (args.addr, args.io_timeout);
    let server = MetricsServer::serve(&args.listen, move || render(&addrs, io_timeout))
        .map_err(|e| format!("listening on {}: {e}", args.listen))?;
    eprintln!("taskq exporter: serving http://{}/metrics", server.addr());
    loop {
        std::thread::park();
    }
}
