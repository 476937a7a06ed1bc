//! The dashboard's pages, drawn on the server (maud escapes every value:
//! tube names, errors and job bodies are data, never markup), and the rate
//! charts as inline SVG.

use maud::{html, Markup, PreEscaped, DOCTYPE};

use super::hub::Seen;
use crate::jobs::JobView;
use crate::snapshot::{Rates, Snapshot, Trend, Tube};

/// How much of a job's body a page shows.
pub const BODY_SHOWN: usize = 4096;

/// A whole page: `title`, then `main`.
pub fn layout(title: &str, main: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="color-scheme" content="light dark";
                title { (title) " · taskq" }
                link rel="stylesheet" href="/assets/app.css";
                script src="/assets/app.js" defer {}
            }
            body {
                header { a href="/" { "taskq" } " " span.muted { (title) } }
                main { (main) }
            }
        }
    }
}

/// `/`: a container the script refreshes from `/overview`, holding it now.
pub fn overview_page(fragment: Markup) -> Markup {
    layout(
        "overview",
        html! { div #live data-src="/overview" { (fragment) } },
    )
}

/// A path segment with everything but unreserved bytes percent-encoded.
pub fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The link to tube `name` of server `i`.
pub fn tube_href(name: &str, i: usize) -> String {
    format!("/tubes/{}?server={i}", segment(name))
}

/// `-` for what is not known.
fn or_dash<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn rate(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"))
}

/// `45s`, `12m05s`, `3h07m`, `2d04h`.
pub fn age(secs: u64) -> String {
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m{:02}s", secs / 60, secs % 60),
        3600..86400 => format!("{}h{:02}m", secs / 3600, secs % 3600 / 60),
        _ => format!("{}d{:02}h", secs / 86400, secs % 86400 / 3600),
    }
}

/// A line chart of one or more series (each `(css class, values)`) in a
/// `w`×`h` box, scaled to the largest value, with that value named.
pub fn chart(series: &[(&str, Vec<f64>)], w: u32, h: u32, label: &str) -> Markup {
    let max = series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .fold(0.0f64, f64::max);
    let n = series.iter().map(|(_, v)| v.len()).max().unwrap_or(0);
    let points = |v: &[f64]| -> String {
        let step = if n > 1 {
            f64::from(w) / (n - 1) as f64
        } else {
            0.0
        };
        v.iter()
            .enumerate()
            .map(|(i, &y)| {
                let y = if max > 0.0 { y / max } else { 0.0 };
                format!(
                    "{:.1},{:.1}",
                    i as f64 * step,
                    f64::from(h) - 1.0 - y * f64::from(h - 2)
                )
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    html! {
        svg.chart width=(w) height=(h) viewBox={"0 0 " (w) " " (h)} role="img" aria-label=(label) {
            title { (label) ", peak " (format!("{max:.1}")) "/s" }
            line.axis x1="0" y1=(h - 1) x2=(w) y2=(h - 1) {}
            @for (class, values) in series {
                @if values.len() > 1 {
                    polyline class=(class) points=(points(values)) {}
                }
            }
        }
    }
}

/// The series a trend draws: put and done rates, or deliveries where the
/// engine counts no puts and dones (JetStream's tubes).
fn trend_series(t: &Trend) -> Vec<(&'static str, Vec<f64>)> {
    let has = |f: fn(&Rates) -> Option<f64>| t.past.iter().any(|r| f(r).is_some());
    let mut out = Vec::new();
    if has(|r| r.puts) {
        out.push(("puts", t.series(|r| r.puts)));
    }
    if has(|r| r.done) {
        out.push(("done", t.series(|r| r.done)));
    }
    if out.is_empty() && has(|r| r.delivered) {
        out.push(("delivered", t.series(|r| r.delivered)));
    }
    out
}

/// What `/overview` shows: each server's totals, charts and tubes.
pub fn overview(addrs: &[String], seen: &[Seen]) -> Markup {
    html! {
        @for (i, (addr, s)) in addrs.iter().zip(seen).enumerate() {
            section.server {
                @match &s.latest {
                    None => {
                        h2 { (addr) }
                        p.error { (s.error.as_deref().unwrap_or("reading the server…")) }
                    }
                    Some(snap) => {
                        (server_head(addr, snap, &s.history.totals))
                        @if let Some(e) = &s.error {
                            p.error { "error, retrying every second: " (e) " (figures from the last reading)" }
                        }
                        (tube_table(i, snap, s))
                    }
                }
            }
        }
    }
}

fn server_head(addr: &str, snap: &Snapshot, t: &Trend) -> Markup {
    let c = &snap.totals.jobs;
    let title = match &snap.nats {
        None => format!("beanstalkd {} at {addr}", snap.totals.version),
        Some(n) => format!(
            "JetStream stream {} at {addr} ({} replicas)",
            n.stream.name, n.stream.replicas
        ),
    };
    let (put_label, done_label) = if snap.nats.is_some() {
        ("stored/s", "removed/s")
    } else {
        ("put/s", "done/s")
    };
    html! {
        h2 { (title) }
        div.totals {
            dl {
                dt { "ready" } dd.ready { (c.ready) }
                dt { "reserved" } dd.reserved { (c.reserved) }
                dt { "delayed" } dd.delayed { (or_dash(c.delayed)) }
                dt { "buried" } dd.buried { (c.buried) }
                dt { "waiting" } dd.waiting { (c.waiting) }
                dt { (put_label) } dd { (rate(t.now.puts)) }
                dt { (done_label) } dd { (rate(t.now.done)) }
                @if let Some(n) = &snap.nats {
                    dt { "messages" } dd { (n.stream.messages) }
                    dt { "last-seq" } dd { (n.stream.last_seq) }
                    dt { "consumers" } dd { (n.stream.consumer_count) }
                }
            }
            figure {
                (chart(&[("puts", t.series(|r| r.puts)), ("done", t.series(|r| r.done))], 360, 64, &format!("{put_label} and {done_label}")))
                figcaption { span.key-puts { (put_label) } " " span.key-done { (done_label) } ", last two minutes" }
            }
        }
    }
}

fn tube_table(i: usize, snap: &Snapshot, s: &Seen) -> Markup {
    html! {
        table.tubes {
            thead {
                tr {
                    th { "tube" } th { "ready" } th { "reserved" } th { "delayed" } th { "buried" }
                    th { "put/s" } th { "done/s" } th { "next ready age" } th { "paused" } th { "rates" }
                }
            }
            tbody {
                @for t in &snap.tubes {
                    (tube_row(i, t, s.history.tube(&t.name)))
                }
            }
        }
    }
}

fn tube_row(i: usize, t: &Tube, trend: Option<&Trend>) -> Markup {
    let now = trend.map(|t| t.now).unwrap_or_default();
    let c = &t.jobs;
    html! {
        tr data-tube=(t.name) {
            td.name { a href=(tube_href(&t.name, i)) { (t.name) } }
            td.ready { (c.ready) }
            td.reserved { (c.reserved) }
            td.delayed { (or_dash(c.delayed)) }
            td.buried { (c.buried) }
            td.puts { (rate(now.puts)) }
            td.done { (rate(now.done)) }
            td.age { (t.ready_age.map_or_else(|| "-".to_owned(), age)) }
            td.paused { @if t.paused > 0 { (age(t.paused)) } @else { "-" } }
            td.trend { @if let Some(tr) = trend { (chart(&trend_series(tr), 120, 24, "rates")) } }
        }
    }
}

/// A job: its id, age, attempts, the server's figures, and the first
/// [`BODY_SHOWN`] bytes of its body (text when it is text, else a hex dump).
pub fn job(label: &str, j: &JobView) -> Markup {
    let shown = &j.body[..j.body.len().min(BODY_SHOWN)];
    let text = as_text(shown);
    html! {
        article.job data-id=(j.id) {
            h3 { (label) " " span.id { "job " (j.id) } }
            dl {
                dt { "age" } dd { (j.age.map_or_else(|| "-".to_owned(), age)) }
                dt { "attempts" } dd { (or_dash(j.attempts)) }
                @for (k, v) in &j.details {
                    dt { (k) } dd { (v) }
                }
                @for h in &j.headers {
                    dt { "header" } dd { (String::from_utf8_lossy(h)) }
                }
                dt { "bytes" } dd { (j.body.len()) }
            }
            @match text {
                Some(t) => {
                    pre.body { (t) }
                }
                None => {
                    p.binary { "binary body, " (j.body.len()) " bytes; the first " (shown.len()) " in hex:" }
                    pre.body.hex { (hex_dump(shown)) }
                }
            }
            @if shown.len() < j.body.len() {
                p.muted { "(first " (BODY_SHOWN) " bytes of " (j.body.len()) ")" }
            }
        }
    }
}

/// The bytes as text when they are UTF-8 (a character cut at the end by the
/// 4 KiB limit allowed) with no control characters but tabs and line ends.
fn as_text(b: &[u8]) -> Option<&str> {
    let valid = match std::str::from_utf8(b) {
        Ok(s) => s,
        Err(e) if e.error_len().is_none() && b.len() - e.valid_up_to() < 4 => {
            std::str::from_utf8(&b[..e.valid_up_to()]).ok()?
        }
        Err(_) => return None,
    };
    valid
        .chars()
        .all(|c| !c.is_control() || matches!(c, '\n' | '\r' | '\t'))
        .then_some(valid)
}

/// Sixteen bytes a line: offset, hex, and the printable ones.
fn hex_dump(b: &[u8]) -> String {
    let mut out = String::new();
    for (n, line) in b.chunks(16).enumerate() {
        out.push_str(&format!("{:06x} ", n * 16));
        for x in line {
            out.push_str(&format!(" {x:02x}"));
        }
        out.push_str(&"   ".repeat(16 - line.len()));
        out.push_str("  ");
        out.extend(line.iter().map(|&c| {
            if c.is_ascii_graphic() || c == b' ' {
                c as char
            } else {
                '.'
            }
        }));
        out.push('\n');
    }
    out
}

/// A notice after an action: what it did (`ok`) or why it did nothing.
pub fn notice(ok: bool, text: &str) -> Markup {
    html! {
        p.notice.ok[ok].failed[!ok] role="status" { (text) }
    }
}

/// A hidden field naming the server a form acts on.
pub fn server_field(i: usize) -> Markup {
    html! { input type="hidden" name="server" value=(i); }
}

/// Nothing: for a part a page leaves out.
pub fn nothing() -> Markup {
    PreEscaped(String::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_text_or_binary_and_always_escaped() {
        assert_eq!(as_text(b"plain\ttext\n"), Some("plain\ttext\n"));
        assert_eq!(as_text("caf\u{e9}".as_bytes()), Some("caf\u{e9}"));
        // A character cut by the limit is still text.
        assert_eq!(as_text(&"caf\u{e9}".as_bytes()[..4]), Some("caf"));
        assert_eq!(as_text(b"\x00\x01binary"), None);
        assert_eq!(as_text(b"esc \x1b[2J"), None);
        assert_eq!(as_text(b"\xff\xfe"), None);
        let j = JobView {
            id: 7,
            body: b"<script>alert(1)</script>&".to_vec(),
            ..JobView::default()
        };
        let page = job("next ready", &j).into_string();
        assert!(
            page.contains("&lt;script&gt;alert(1)&lt;/script&gt;&amp;"),
            "{page}"
        );
        assert!(!page.contains("<script>"));
        assert_eq!(
            hex_dump(b"ab\x00"),
            "000000  61 62 00                                         ab.\n"
        );
        assert_eq!(segment("a b/c+d"), "a%20b%2Fc%2Bd");
    }
}
