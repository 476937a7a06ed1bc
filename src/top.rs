//! `taskq top`: a live terminal view of one server, its totals on top and a
//! row per tube with the jobs by state, put and delete rates, the age of the
//! next ready job and a trend of the rates; `--once` prints one frame as text.

use std::collections::{BTreeMap, VecDeque};
use std::io::{self, IsTerminal};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use crossterm::terminal::{
    disable_raw_mode, enable_raw_mode, EnterAlternateScreen, LeaveAlternateScreen,
};
use crossterm::{cursor, execute};
use ratatui::backend::CrosstermBackend;
use ratatui::style::{Color, Modifier, Style};
use ratatui::symbols::bar;
use ratatui::text::Line;
use ratatui::widgets::Paragraph;
use ratatui::Terminal;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use taskq_proto::{validate_tube, Command, Connection, Reply, ServerStats};
use taskq_worker::table::Table;

use crate::admin::{
    all_tubes, print, ready_ages, request, tube_stats, unexpected, ServerArgs, TubeRow,
};

/// The text after `taskq top --help`.
pub const TOP_HELP: &str = "\
The view, refreshed every second:
  On top, the server's totals: current jobs by state, connections (open,
  producers, workers, waiting in a reserve), the cmd-put and cmd-delete
  counters, jobs created, TTR timeouts, and the server's uptime.
  Then a row per tube: READY RESERVED DELAYED BURIED as stats-tube counts them;
  PUT/S and DELETE/S, jobs created in the tube and delete commands for its jobs
  per second between the last two samples; READY-AGE, the age of the tube's
  next ready job, the one the next reserve gets (priority first, then the
  oldest: a ready job with a lower priority can be older), - when none is
  ready; PUT-TREND and DELETE-TREND, the last 12 rates, each scaled to its own
  largest. A tube named with --tube that the server does not have (no job,
  nobody using it) shows 0.

Keys: q, Esc or Ctrl-C quits (status 0); SIGTERM, SIGINT or SIGHUP quits with
status 128 + the signal. Either way, and on a panic, the terminal is left as it
was found: the normal screen back, the cursor shown, raw mode off. When the
server cannot be reached the view says so and tries again every second.

--once takes two samples a second apart and prints the second frame as plain
text (no escape codes), so its rates are over that second. It exits 0, or 1
with a message when the server cannot be reached.";

/// Arguments of `taskq top`.
#[derive(clap::Args, Debug)]
pub struct TopArgs {
    #[command(flatten)]
    server: ServerArgs,
    /// Show this tube (repeat for several; default: every tube the server lists).
    #[arg(long = "tube", value_name = "T")]
    tubes: Vec<String>,
    /// Print one frame as plain text and exit (takes two samples, a second apart).
    #[arg(long)]
    once: bool,
}

/// Time between samples.
const PERIOD: Duration = Duration::from_secs(1);
/// Rates kept for a trend.
const TREND_LEN: usize = 12;

/// The server's totals at one sample.
#[derive(Debug, Clone, Default)]
struct Totals {
    version: String,
    uptime: u64,
    ready: u64,
    urgent: u64,
    reserved: u64,
    delayed: u64,
    buried: u64,
    connections: u64,
    producers: u64,
    workers: u64,
    waiting: u64,
    tubes: u64,
    cmd_put: u64,
    cmd_delete: u64,
    total_jobs: u64,
    job_timeouts: u64,
}

impl From<&ServerStats<'_>> for Totals {
    fn from(s: &ServerStats<'_>) -> Totals {
        Totals {
            version: s.version.to_owned(),
            uptime: s.uptime,
            ready: s.current_jobs_ready,
            urgent: s.current_jobs_urgent,
            reserved: s.current_jobs_reserved,
            delayed: s.current_jobs_delayed,
            buried: s.current_jobs_buried,
            connections: s.current_connections,
            producers: s.current_producers,
            workers: s.current_workers,
            waiting: s.current_waiting,
            tubes: s.current_tubes,
            cmd_put: s.cmd_put,
            cmd_delete: s.cmd_delete,
            total_jobs: s.total_jobs,
            job_timeouts: s.job_timeouts,
        }
    }
}

/// What the server said at one moment.
#[derive(Debug, Clone)]
struct Sample {
    at: Instant,
    totals: Totals,
    tubes: Vec<TubeRow>,
    /// Per tube (same order), the age of its next ready job.
    ready_age: Vec<Option<u64>>,
}

/// Reads the server's totals and the tubes `only` (every tube when empty).
fn sample(conn: &mut Connection, only: &[String]) -> Result<Sample, String> {
    let totals = request(conn, &Command::Stats, |r| match r {
        Reply::Ok { yaml } => ServerStats::parse(yaml)
            .map(|s| Totals::from(&s))
            .map_err(|e| format!("reading stats: {e}")),
        other => Err(unexpected(&Command::Stats, &other)),
    })?;
    let tubes = if only.is_empty() {
        all_tubes(conn)?
    } else {
        let mut rows = Vec::with_capacity(only.len());
        for name in only {
            rows.push(tube_stats(conn, name)?.unwrap_or_else(|| TubeRow {
                name: name.clone(),
                ..TubeRow::default()
            }));
        }
        rows
    };
    let at = Instant::now();
    let ready_age = ready_ages(conn, &tubes)?;
    Ok(Sample {
        at,
        totals,
        tubes,
        ready_age,
    })
}

/// One tube's rates over the samples seen.
#[derive(Debug, Default)]
struct Rates {
    /// `total-jobs`, `cmd-delete` and when they were read, at the last sample.
    last: Option<(u64, u64, Instant)>,
    /// Jobs put and deleted per second between the last two samples.
    now: Option<(f64, f64)>,
    puts: VecDeque<f64>,
    deletes: VecDeque<f64>,
}

impl Rates {
    fn add(&mut self, total_jobs: u64, deletes: u64, at: Instant) {
        self.now = match self.last {
            Some((p, d, then)) if total_jobs >= p && deletes >= d && at > then => {
                let secs = (at - then).as_secs_f64();
                Some(((total_jobs - p) as f64 / secs, (deletes - d) as f64 / secs))
            }
            // The first sample, or the tube was made anew and its counters restarted.
            _ => None,
        };
        if let Some((p, d)) = self.now {
            for (trend, v) in [(&mut self.puts, p), (&mut self.deletes, d)] {
                if trend.len() == TREND_LEN {
                    trend.pop_front();
                }
                trend.push_back(v);
            }
        }
        self.last = Some((total_jobs, deletes, at));
    }
}

/// What the view shows: the last sample, each tube's rates, the last error.
#[derive(Debug)]
struct View {
    addr: String,
    latest: Option<Sample>,
    rates: BTreeMap<String, Rates>,
    error: Option<String>,
}

/// The heading of the tubes' table.
const TUBE_HEADER: [&str; 10] = [
    "TUBE",
    "READY",
    "RESERVED",
    "DELAYED",
    "BURIED",
    "PUT/S",
    "DELETE/S",
    "READY-AGE",
    "PUT-TREND",
    "DELETE-TREND",
];

impl View {
    fn new(addr: &str) -> View {
        View {
            addr: addr.to_owned(),
            latest: None,
            rates: BTreeMap::new(),
            error: None,
        }
    }

    fn update(&mut self, s: Sample) {
        let mut rates = BTreeMap::new();
        for t in &s.tubes {
            let mut r = self.rates.remove(&t.name).unwrap_or_default();
            r.add(t.total_jobs, t.deletes, s.at);
            rates.insert(t.name.clone(), r);
        }
        self.rates = rates;
        self.latest = Some(s);
        self.error = None;
    }

    /// The frame's lines and which of them is the tubes' heading.
    fn lines(&self) -> (Vec<String>, Option<usize>) {
        let Some(s) = &self.latest else {
            return (Vec::new(), None);
        };
        let t = &s.totals;
        let mut lines = vec![format!(
            "beanstalkd {} at {}, up {}, {} tubes",
            t.version,
            self.addr,
            duration(t.uptime),
            t.tubes
        )];
        let mut totals = Table::new().left(1).left(3).left(5).left(7).left(9);
        for (label, pairs) in [
            (
                "jobs",
                &[
                    ("ready", t.ready),
                    ("urgent", t.urgent),
                    ("reserved", t.reserved),
                    ("delayed", t.delayed),
                    ("buried", t.buried),
                ][..],
            ),
            (
                "connections",
                &[
                    ("open", t.connections),
                    ("producers", t.producers),
                    ("workers", t.workers),
                    ("waiting", t.waiting),
                ],
            ),
            (
                "commands",
                &[
                    ("cmd-put", t.cmd_put),
                    ("cmd-delete", t.cmd_delete),
                    ("total-jobs", t.total_jobs),
                    ("timeouts", t.job_timeouts),
                ],
            ),
        ] {
            let cells = pairs
                .iter()
                .flat_map(|(k, v)| [k.to_string(), v.to_string()]);
            totals.row(std::iter::once(label.to_string()).chain(cells));
        }
        lines.extend(totals.to_string().lines().map(str::to_owned));
        lines.push(String::new());
        let header = lines.len();
        let mut tubes = Table::new().left(8).left(9);
        tubes.row(TUBE_HEADER);
        for (row, age) in s.tubes.iter().zip(&s.ready_age) {
            let rates = self.rates.get(&row.name);
            let now = rates.and_then(|r| r.now);
            let rate = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.1}"));
            tubes.row([
                row.name.clone(),
                row.ready.to_string(),
                row.reserved.to_string(),
                row.delayed.to_string(),
                row.buried.to_string(),
                rate(now.map(|n| n.0)),
                rate(now.map(|n| n.1)),
                age.map_or_else(|| "-".to_string(), duration),
                rates.map_or_else(|| "-".to_string(), |r| sparkline(&r.puts)),
                rates.map_or_else(|| "-".to_string(), |r| sparkline(&r.deletes)),
            ]);
        }
        lines.extend(tubes.to_string().lines().map(str::to_owned));
        (lines, Some(header))
    }
}

/// `45s`, `12m05s`, `3h07m`, `2d04h`.
fn duration(secs: u64) -> String {
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m{:02}s", secs / 60, secs % 60),
        3600..86400 => format!("{}h{:02}m", secs / 3600, secs % 3600 / 60),
        _ => format!("{}d{:02}h", secs / 86400, secs % 86400 / 3600),
    }
}

/// The values as bars of eight heights scaled to the largest (0 is the lowest bar);
/// `-` when there are none yet.
fn sparkline(values: &VecDeque<f64>) -> String {
    let levels = [
        bar::ONE_EIGHTH,
        bar::ONE_QUARTER,
        bar::THREE_EIGHTHS,
        bar::HALF,
        bar::FIVE_EIGHTHS,
        bar::THREE_QUARTERS,
        bar::SEVEN_EIGHTHS,
        bar::FULL,
    ];
    if values.is_empty() {
        return "-".to_string();
    }
    let max = values.iter().copied().fold(0.0, f64::max);
    values
        .iter()
        .map(|&v| {
            let level = if max > 0.0 {
                (v / max * 7.0).ceil() as usize
            } else {
                0
            };
            levels[level.min(7)]
        })
        .collect()
}

/// Runs `taskq top`; errors are printed here.
pub fn run(args: TopArgs) -> ExitCode {
    match top(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("taskq: {e}");
            ExitCode::FAILURE
        }
    }
}

fn top(args: TopArgs) -> Result<ExitCode, String> {
    args.server
        .beanstalkd_only(
            "top",
            "the live view reads beanstalkd's per-tube counters; use taskq stats or taskq tubes",
        )
        .map_err(|e| e.to_string())?;
    for t in &args.tubes {
        validate_tube(t).map_err(|e| format!("--tube {t:?}: {e}"))?;
    }
    if args.once {
        once(&args)?;
        Ok(ExitCode::SUCCESS)
    } else {
        live(args)
    }
}

/// Two samples a second apart; the second frame as plain text.
fn once(args: &TopArgs) -> Result<(), String> {
    let mut conn = args.server.connect()?;
    let mut view = View::new(&args.server.addr);
    view.update(sample(&mut conn, &args.tubes)?);
    std::thread::sleep(PERIOD);
    view.update(sample(&mut conn, &args.tubes)?);
    let mut text = view.lines().0.join("\n");
    text.push('\n');
    print(text.as_bytes()).map_err(|e| e.to_string())
}

/// Samples every [`PERIOD`] on its own thread (so a slow or dead server never
/// holds up the keys), reconnecting after any error, until the receiver goes.
fn sampler(server: ServerArgs, only: Vec<String>) -> mpsc::Receiver<Result<Sample, String>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut conn: Option<Connection> = None;
        loop {
            let started = Instant::now();
            let result = match conn.take().map_or_else(|| server.connect(), Ok) {
                Ok(mut c) => {
                    let r = sample(&mut c, &only);
                    if r.is_ok() {
                        conn = Some(c);
                    }
                    r
                }
                Err(e) => Err(e),
            };
            if tx.send(result).is_err() {
                return;
            }
            std::thread::sleep(PERIOD.saturating_sub(started.elapsed()));
        }
    });
    rx
}

/// Whether the terminal is in the view's state (raw mode, alternate screen).
static TAKEN: AtomicBool = AtomicBool::new(false);

/// Puts the terminal back, once: raw mode off, normal screen, cursor shown.
fn restore() {
    if TAKEN.swap(false, Ordering::SeqCst) {
        let _ = disable_raw_mode();
        let _ = execute!(io::stdout(), LeaveAlternateScreen, cursor::Show);
    }
}

/// The terminal taken for the view; given back on drop and on a panic.
struct Screen;

impl Screen {
    fn take() -> Result<Screen, String> {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            previous(info);
        }));
        enable_raw_mode().map_err(|e| format!("terminal: {e}"))?;
        TAKEN.store(true, Ordering::SeqCst);
        let screen = Screen;
        execute!(io::stdout(), EnterAlternateScreen, cursor::Hide)
            .map_err(|e| format!("terminal: {e}"))?;
        Ok(screen)
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        restore();
    }
}

/// The live view until a quit key or signal.
fn live(args: TopArgs) -> Result<ExitCode, String> {
    if !io::stdout().is_terminal() || !io::stdin().is_terminal() {
        return Err("the live view needs a terminal; --once prints one frame as text".into());
    }
    let signal = Arc::new(AtomicUsize::new(0));
    for sig in [SIGTERM, SIGINT, SIGHUP] {
        let value = usize::try_from(sig).unwrap_or(1);
        signal_hook::flag::register_usize(sig, Arc::clone(&signal), value)
            .map_err(|e| format!("installing a signal handler: {e}"))?;
    }
    let samples = sampler(args.server.clone(), args.tubes.clone());
    let mut view = View::new(&args.server.addr);
    let _screen = Screen::take()?;
    watch_for_the_end(Arc::clone(&signal));
    let mut terminal =
        Terminal::new(CrosstermBackend::new(io::stdout())).map_err(|e| format!("terminal: {e}"))?;
    let mut dirty = true;
    loop {
        let sig = signal.load(Ordering::SeqCst);
        if sig != 0 {
            return Ok(ExitCode::from(u8::try_from(128 + sig).unwrap_or(1)));
        }
        loop {
            match samples.try_recv() {
                Ok(Ok(s)) => view.update(s),
                Ok(Err(e)) => view.error = Some(e),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => return Err("sampling stopped".into()),
            }
            dirty = true;
        }
        if dirty {
            terminal
                .draw(|f| f.render_widget(Paragraph::new(screen_lines(&view)), f.area()))
                .map_err(|e| format!("drawing: {e}"))?;
            dirty = false;
        }
        if !event::poll(Duration::from_millis(100)).map_err(|e| format!("terminal: {e}"))? {
            continue;
        }
        match event::read().map_err(|e| format!("terminal: {e}"))? {
            Event::Key(k) if k.kind != KeyEventKind::Release => match k.code {
                KeyCode::Char('q' | 'Q') | KeyCode::Esc => return Ok(ExitCode::SUCCESS),
                KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => {
                    return Ok(ExitCode::SUCCESS)
                }
                _ => {}
            },
            Event::Resize(..) => dirty = true,
            _ => {}
        }
    }
}

/// Ends the process on a signal, or when the terminal goes away, even while
/// the main loop is inside the terminal library: on a terminal that was
/// closed (its window shut, its tmux server killed) the library's read of
/// standard input returns end-of-file over and over without returning, which
/// would spin a core and never see the signal flag.
fn watch_for_the_end(signal: Arc<AtomicUsize>) {
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_millis(100));
        let sig = signal.load(Ordering::SeqCst);
        let hung_up = !io::stdin().is_terminal();
        if sig != 0 || hung_up {
            restore();
            let sig = if sig != 0 {
                sig
            } else {
                usize::try_from(SIGHUP).unwrap_or(1)
            };
            std::process::exit(i32::try_from(128 + sig).unwrap_or(1));
        }
    });
}

/// The frame as styled lines, with a status line under it.
fn screen_lines(view: &View) -> Vec<Line<'static>> {
    let (text, header) = view.lines();
    let mut lines: Vec<Line<'static>> = text
        .into_iter()
        .enumerate()
        .map(|(i, l)| {
            if Some(i) == header {
                Line::styled(l, Style::new().add_modifier(Modifier::BOLD))
            } else {
                Line::raw(l)
            }
        })
        .collect();
    lines.push(Line::raw(""));
    let red = Style::new().fg(Color::Red);
    match (&view.error, &view.latest) {
        (Some(e), latest) => {
            lines.push(Line::styled(
                format!("error, retrying every second: {e}"),
                red,
            ));
            if latest.is_some() {
                lines.push(Line::styled(
                    "(the figures above are from the last sample read)",
                    red,
                ));
            }
        }
        (None, None) => lines.push(Line::raw(format!("taskq top: reading {}", view.addr))),
        (None, Some(_)) => lines.push(Line::styled(
            "q, Esc or Ctrl-C quits; refreshed every second",
            Style::new().add_modifier(Modifier::DIM),
        )),
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_sparklines() {
        assert_eq!(duration(0), "0s");
        assert_eq!(duration(59), "59s");
        assert_eq!(duration(725), "12m05s");
        assert_eq!(duration(3 * 3600 + 7 * 60 + 5), "3h07m");
        assert_eq!(duration(2 * 86400 + 4 * 3600), "2d04h");
        assert_eq!(sparkline(&VecDeque::new()), "-");
        assert_eq!(sparkline(&[0.0, 0.0].into()), "▁▁");
        assert_eq!(sparkline(&[0.0, 1.0, 4.0, 8.0].into()), "▁▂▅█");
    }

    #[test]
    fn rates_come_from_successive_samples() {
        let t0 = Instant::now();
        let mut r = Rates::default();
        r.add(10, 2, t0);
        assert_eq!(r.now, None);
        r.add(30, 7, t0 + Duration::from_secs(2));
        assert_eq!(r.now, Some((10.0, 2.5)));
        // A tube made anew restarts its counters: no rate for that sample.
        r.add(1, 0, t0 + Duration::from_secs(3));
        assert_eq!(r.now, None);
        assert_eq!(r.puts, [10.0]);
        for i in 0..20 {
            r.add(1 + i, 0, t0 + Duration::from_secs(4 + i));
        }
        assert_eq!(r.puts.len(), TREND_LEN);
    }
}
