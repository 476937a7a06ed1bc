//! `taskq top`: a live terminal view of one server, its totals on top and a
//! row per tube with the jobs by state, put and delete rates, the age of the
//! next ready job and a trend of the rates; `--once` prints one frame as text.

use std::collections::VecDeque;
use std::io::{self, IsTerminal};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

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
use taskq_proto::validate_tube;
use taskq_worker::table::Table;

use crate::server::{print, Conn, ServerArgs};
use crate::snapshot::{self, History, Scope, Snapshot};

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

On JetStream (a nats:// address): the stream's record on top (messages, first
and last sequence, consumers, replicas, leader) and the jobs by state summed
over the tubes. The tubes' columns are the same, read from each tube's subjects
and its consumer taskq-T: READY its pending messages, RESERVED its deliveries
not acked, DELAYED - (a delay is known only at delivery), BURIED the messages on
taskq.T.buried, READY-AGE the age of the first message the consumer has not
delivered. JetStream counts no publishes or acks per subject, so PUT/S,
DELETE/S and their trends show -. Then JetStream's own: REDELIVERED (unacked
jobs handed out more than once), STORED (messages on taskq.T), DELIVER/S
(deliveries per second) and DELIVER-TREND.

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

/// Reads the server's totals and the tubes `only` (every tube when empty).
fn sample(conn: &mut Conn, only: &[String]) -> Result<Snapshot, String> {
    let scope = Scope {
        tubes: (!only.is_empty()).then_some(only),
        ready_age: true,
    };
    snapshot::read(conn, scope)
}

/// What the view shows: the last sample, the rates, the last error.
#[derive(Debug)]
struct View {
    addr: String,
    latest: Option<Snapshot>,
    history: History,
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

/// JetStream's own columns, after [`TUBE_HEADER`].
const NATS_HEADER: [&str; 4] = ["REDELIVERED", "STORED", "DELIVER/S", "DELIVER-TREND"];

/// A count, or `-` where the engine keeps none.
fn count(v: Option<u64>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

impl View {
    fn new(addr: &str) -> View {
        View {
            addr: addr.to_owned(),
            latest: None,
            history: History::new(TREND_LEN),
            error: None,
        }
    }

    fn update(&mut self, s: Snapshot) {
        self.history.add(&s);
        self.latest = Some(s);
        self.error = None;
    }

    /// The frame's lines and which of them is the tubes' heading.
    fn lines(&self) -> (Vec<String>, Option<usize>) {
        let Some(s) = &self.latest else {
            return (Vec::new(), None);
        };
        let t = &s.totals;
        let mut totals = Table::new().left(1).left(3).left(5).left(7).left(9);
        let mut lines = Vec::new();
        let mut add = |label: &str, pairs: &[(&str, String)]| {
            let cells = pairs.iter().flat_map(|(k, v)| [k.to_string(), v.clone()]);
            totals.row(std::iter::once(label.to_string()).chain(cells));
        };
        match &s.nats {
            None => {
                lines.push(format!(
                    "beanstalkd {} at {}, up {}, {} tubes",
                    t.version,
                    self.addr,
                    duration(t.uptime.unwrap_or(0)),
                    t.tubes
                ));
                let c = |k: &str| count(t.counter(k));
                add(
                    "jobs",
                    &[
                        ("ready", t.jobs.ready.to_string()),
                        ("urgent", t.jobs.urgent.to_string()),
                        ("reserved", t.jobs.reserved.to_string()),
                        ("delayed", count(t.jobs.delayed)),
                        ("buried", t.jobs.buried.to_string()),
                    ],
                );
                add(
                    "connections",
                    &[
                        ("open", count(t.connections)),
                        ("producers", count(t.producers)),
                        ("workers", count(t.workers)),
                        ("waiting", t.jobs.waiting.to_string()),
                    ],
                );
                add(
                    "commands",
                    &[
                        ("cmd-put", c("cmd-put")),
                        ("cmd-delete", c("cmd-delete")),
                        ("total-jobs", c("total-jobs")),
                        ("timeouts", c("job-timeouts")),
                    ],
                );
            }
            Some(n) => {
                let st = &n.stream;
                lines.push(format!(
                    "JetStream stream {} at {}, {} replicas, leader {}, {} tubes",
                    st.name,
                    self.addr,
                    st.replicas,
                    st.leader.as_deref().unwrap_or("-"),
                    t.tubes
                ));
                add(
                    "jobs",
                    &[
                        ("ready", t.jobs.ready.to_string()),
                        ("reserved", t.jobs.reserved.to_string()),
                        ("buried", t.jobs.buried.to_string()),
                        ("waiting", t.jobs.waiting.to_string()),
                    ],
                );
                add(
                    "stream",
                    &[
                        ("messages", st.messages.to_string()),
                        ("first-seq", st.first_seq.to_string()),
                        ("last-seq", st.last_seq.to_string()),
                        ("consumers", st.consumer_count.to_string()),
                    ],
                );
            }
        }
        lines.extend(totals.to_string().lines().map(str::to_owned));
        lines.push(String::new());
        let header = lines.len();
        let mut tubes = Table::new().left(8).left(9).left(13);
        let nats = s.nats.is_some();
        let head = TUBE_HEADER
            .iter()
            .chain(if nats { &NATS_HEADER[..] } else { &[] });
        tubes.row(head);
        let rate = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.1}"));
        for row in &s.tubes {
            let trend = self.history.tube(&row.name);
            let now = trend.map(|r| r.now).unwrap_or_default();
            let spark = |f: fn(&snapshot::Rates) -> Option<f64>| {
                trend
                    .filter(|r| r.past.iter().any(|p| f(p).is_some()))
                    .map_or_else(|| "-".to_string(), |r| sparkline(&r.series(f).into()))
            };
            let mut cells = vec![
                row.name.clone(),
                row.jobs.ready.to_string(),
                row.jobs.reserved.to_string(),
                count(row.jobs.delayed),
                row.jobs.buried.to_string(),
                rate(now.puts),
                rate(now.done),
                row.ready_age.map_or_else(|| "-".to_string(), duration),
                spark(|r| r.puts),
                spark(|r| r.done),
            ];
            if let Some(n) = &row.nats {
                cells.extend([
                    n.redelivered().to_string(),
                    n.stored.to_string(),
                    rate(now.delivered),
                    spark(|r| r.delivered),
                ]);
            }
            tubes.row(cells);
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
    for t in &args.tubes {
        validate_tube(t).map_err(|e| format!("--tube {t:?}: {e}"))?;
        args.server.check_tube(t)?;
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
    let mut conn = args.server.open()?;
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
fn sampler(server: ServerArgs, only: Vec<String>) -> mpsc::Receiver<Result<Snapshot, String>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut conn: Option<Conn> = None;
        loop {
            let started = std::time::Instant::now();
            let result = match conn.take().map_or_else(|| server.open(), Ok) {
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
}
