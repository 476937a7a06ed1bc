//! `taskq web`: a dashboard of one or more servers, both engines, served by
//! this command (assets in the binary, nothing fetched elsewhere).
//!
//! `/` shows each server's totals, its rates over the last two minutes and
//! a row per tube, and refreshes itself every second from `/overview` while
//! the tab is visible; every tab shares one snapshot per server per second
//! (see [`hub`]). `/tubes/{name}` shows a tube's next ready, delayed and
//! buried job, a job looked up by id, and the actions: kick, kick one job,
//! delete one job, pause, resume, each a POST answered with what it did.
//! [`guard`] says what every request must pass.

mod guard;
mod hub;
mod pages;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Form, Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use maud::{html, Markup};
use taskq_proto::Secret;

use crate::cli::CliResult;
use crate::jetstream::{self, StreamArgs};
use crate::jobs::{self, JobView, Which};
use crate::server::{self, Conn, ServersArgs};
use crate::snapshot::{self, Scope, Tube};
use guard::{refuse, Rules};
use hub::Hub;
use pages::{layout, nothing, notice, segment, server_field};

/// Arguments of `taskq web`.
#[derive(clap::Args, Debug)]
pub struct WebArgs {
    /// Address to serve the dashboard on (default: port 8080 of a random
    /// loopback address, 127.X.Y.Z, whose cookie no other local server is
    /// sent; 127.0.0.1:8080 where the system has no such address).
    #[arg(long, value_name = "HOST:PORT")]
    listen: Option<String>,
    #[command(flatten)]
    servers: ServersArgs,
    /// Show no action and refuse every change (kick, delete, pause) in the server.
    #[arg(long)]
    read_only: bool,
    /// The token every request must carry (default: $TASKQ_WEB_TOKEN, else a
    /// random one, printed in the address to open).
    #[arg(long, env = "TASKQ_WEB_TOKEN", hide_env_values = true)]
    token: Option<Secret>,
}

/// What the handlers share.
struct App {
    hub: Hub,
    io_timeout: u64,
    js: StreamArgs,
    read_only: bool,
}

/// `N` random bytes from the kernel.
fn random_bytes<const N: usize>() -> Result<[u8; N], String> {
    use std::io::Read;
    let mut b = [0u8; N];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| format!("reading /dev/urandom: {e}"))?;
    Ok(b)
}

/// A fresh random token: 128 bits from the kernel, in hex.
fn random_token() -> Result<String, String> {
    let b = random_bytes::<16>().map_err(|e| format!("making a token: {e}"))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// The dashboard's listener, and the address it was asked for (the one
/// chosen when none was given).
///
/// A browser sends a host's cookies to every port of that host, so the
/// token's cookie set by `127.0.0.1:8080` would reach any other server the
/// operator opens on 127.0.0.1. Unless told otherwise the dashboard listens
/// on a loopback address of its own, 127.X.Y.Z at random (Linux answers on
/// all of 127.0.0.0/8): its cookie goes to that address only (any port of
/// it, which only a program that looks the address up would use). Port 8080,
/// else any free port there; 127.0.0.1:8080, with a warning, on a system
/// without those addresses.
fn listen_on(listen: Option<&str>) -> Result<(std::net::TcpListener, String), String> {
    use std::io::ErrorKind;
    use std::net::{Ipv4Addr, TcpListener};
    let bind =
        |at: &str| TcpListener::bind(at).map_err(|e| (e.kind(), format!("listening on {at}: {e}")));
    if let Some(at) = listen {
        return bind(at).map(|l| (l, at.to_owned())).map_err(|(_, e)| e);
    }
    let [x, y, z] = random_bytes::<3>()?;
    let host = Ipv4Addr::new(127, 1 + x % 254, y, 1 + z % 254);
    for port in [8080, 0] {
        match bind(&format!("{host}:{port}")) {
            Ok(l) => {
                let at = l
                    .local_addr()
                    .map_err(|e| format!("listening on {host}: {e}"))?;
                return Ok((l, at.to_string()));
            }
            Err((ErrorKind::AddrInUse, _)) => continue,
            Err((ErrorKind::AddrNotAvailable, _)) => break,
            Err((_, e)) => return Err(e),
        }
    }
    eprintln!(
        "taskq web: no loopback address of its own here: on 127.0.0.1, whose \
         cookies a browser also sends to the other servers on 127.0.0.1"
    );
    let at = "127.0.0.1:8080";
    bind(at).map(|l| (l, at.to_owned())).map_err(|(_, e)| e)
}

/// Runs `taskq web` until killed.
pub fn run(args: WebArgs) -> CliResult {
    let addrs = args.servers.addrs()?;
    let (token, printed) = match args.token.clone().filter(|t| !t.is_empty()) {
        Some(t) => (t, false),
        None => (Secret::new(random_token()?), true),
    };
    let (listener, listen) = listen_on(args.listen.as_deref())?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("listening on {listen}: {e}"))?;
    let bound = listener
        .local_addr()
        .map_err(|e| format!("listening on {listen}: {e}"))?;
    let rules = Arc::new(Rules::new(
        &listen,
        bound.port(),
        token.clone(),
        args.read_only,
    ));
    let app = Arc::new(App {
        hub: Hub::start(addrs, args.servers.io_timeout, args.servers.js.clone()),
        io_timeout: args.servers.io_timeout,
        js: args.servers.js,
        read_only: args.read_only,
    });
    let router = Router::new()
        .route("/", get(overview_page))
        .route("/overview", get(overview_fragment))
        .route("/tubes/{name}", get(tube_page))
        .route("/tubes/{name}/{action}", post(act))
        .route("/assets/app.js", get(script))
        .route("/assets/app.css", get(style))
        .with_state(Arc::clone(&app))
        .layer(axum::middleware::from_fn_with_state(rules, guard::guard));
    let url = format!("http://{bound}/");
    let mode = if args.read_only { " (read-only)" } else { "" };
    if printed {
        // The one place the token is shown: the address the operator opens.
        println!("taskq web: {url}?token={}{mode}", token.expose());
    } else {
        println!("taskq web: {url}{mode} (token from --token or $TASKQ_WEB_TOKEN)");
    }
    crate::server::print(b"").map_err(|e| e.to_string())?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting the server: {e}"))?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        axum::serve(listener, router).await
    })
    .map_err(|e| format!("serving {url}: {e}").into())
}

async fn script() -> Response {
    asset(
        "text/javascript; charset=utf-8",
        include_str!("assets/app.js"),
    )
}

async fn style() -> Response {
    asset("text/css; charset=utf-8", include_str!("assets/app.css"))
}

fn asset(kind: &'static str, text: &'static str) -> Response {
    ([(header::CONTENT_TYPE, kind)], text).into_response()
}

/// The overview of every server, read from the samplers (off the async thread).
async fn overview_markup(app: &Arc<App>) -> Markup {
    let app = Arc::clone(app);
    tokio::task::spawn_blocking(move || {
        let seen = app.hub.seen(Duration::from_secs(3));
        pages::overview(&app.hub.addrs, &seen)
    })
    .await
    .unwrap_or_else(|_| html! { p.error { "reading the servers failed" } })
}

async fn overview_page(State(app): State<Arc<App>>) -> Html<String> {
    Html(pages::overview_page(overview_markup(&app).await).into_string())
}

async fn overview_fragment(State(app): State<Arc<App>>) -> Html<String> {
    Html(overview_markup(&app).await.into_string())
}

/// `?server=N&job=ID` of a tube page.
#[derive(serde::Deserialize)]
struct TubeQuery {
    server: Option<usize>,
    job: Option<String>,
}

async fn tube_page(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    Query(q): Query<TubeQuery>,
) -> Response {
    let i = q.server.unwrap_or(0);
    if let Some(refused) = bad_tube(&app, i, &name) {
        return refused;
    }
    let job = q.job.filter(|j| !j.trim().is_empty());
    blocking(&app, i, move |app, conn, addr| {
        let job = match job.map(|j| j.trim().parse::<u64>()) {
            Some(Ok(id)) => Some((id, jobs::job(conn, id)?)),
            Some(Err(_)) => {
                return Ok(tube_view(
                    app,
                    i,
                    addr,
                    conn,
                    &name,
                    Some(&notice(false, "a job id is a number")),
                ))
            }
            None => None,
        };
        Ok(tube_view_with(app, i, addr, conn, &name, None, job))
    })
    .await
}

/// The form of an action.
#[derive(serde::Deserialize)]
struct ActForm {
    server: usize,
    count: Option<u32>,
    id: Option<u64>,
    secs: Option<u32>,
}

async fn act(
    State(app): State<Arc<App>>,
    Path((name, action)): Path<(String, String)>,
    Form(f): Form<ActForm>,
) -> Response {
    // The guard refuses every POST of a read-only dashboard; this is the second lock.
    if app.read_only {
        return refuse(StatusCode::FORBIDDEN, "403: this dashboard is read-only");
    }
    if let Some(refused) = bad_tube(&app, f.server, &name) {
        return refused;
    }
    blocking(&app, f.server, move |app, conn, addr| {
        let (ok, text) = match (action.as_str(), f.count, f.id, f.secs) {
            ("kick", Some(count), _, _) => match jobs::kick(conn, &name, count)? {
                0 => (
                    false,
                    format!("Nothing kicked: tube {name} has no buried job to kick"),
                ),
                n => (
                    true,
                    format!("Kicked {n} job{} of tube {name} back to ready", plural(n)),
                ),
            },
            ("kick-job", _, Some(id), _) => match jobs::kick_job(conn, id)? {
                Ok(()) => (true, format!("Kicked job {id} back to ready")),
                Err(why) => (false, format!("Job {id} not kicked: {why}")),
            },
            ("delete", _, Some(id), _) => match jobs::delete(conn, id)? {
                Ok(()) => (true, format!("Deleted job {id}")),
                Err(why) => (false, format!("Job {id} not deleted: {why}")),
            },
            ("pause", _, _, Some(secs)) if secs > 0 => match jobs::pause(conn, &name, secs, None) {
                Ok(()) => (true, format!("Paused tube {name} for {secs} s")),
                Err(e) => (false, format!("Tube {name} not paused: {e}")),
            },
            ("resume", ..) => match jobs::pause(conn, &name, 0, None) {
                Ok(()) => (true, format!("Resumed tube {name}")),
                Err(e) => (false, format!("Tube {name} not resumed: {e}")),
            },
            _ => return Err(format!("no such action {action:?} with these fields")),
        };
        Ok(tube_view(
            app,
            f.server,
            addr,
            conn,
            &name,
            Some(&notice(ok, &text)),
        ))
    })
    .await
}

/// A 400 for a name that is no JetStream tube (a wildcard, `*` or `>`,
/// would read or move every tube's jobs), on a JetStream server.
fn bad_tube(app: &App, i: usize, name: &str) -> Option<Response> {
    let nats = app.hub.addrs.get(i).is_some_and(|a| jetstream::is_nats(a));
    let e = jetstream::check_tube(name).err().filter(|_| nats)?;
    Some(refuse(StatusCode::BAD_REQUEST, &format!("400: {e}")))
}

fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// Runs `f` on a fresh connection to server `i`, off the async thread; an
/// error becomes a page saying so (502), an unknown server 404.
async fn blocking(
    app: &Arc<App>,
    i: usize,
    f: impl FnOnce(&App, &mut Conn, &str) -> Result<Markup, String> + Send + 'static,
) -> Response {
    let Some(addr) = app.hub.addrs.get(i).cloned() else {
        return refuse(StatusCode::NOT_FOUND, "404: no such server");
    };
    let app = Arc::clone(app);
    let done = tokio::task::spawn_blocking(move || {
        let mut conn = server::open(&addr, app.io_timeout, &app.js)?;
        f(&app, &mut conn, &addr)
    })
    .await;
    match done {
        Ok(Ok(page)) => Html(page.into_string()).into_response(),
        Ok(Err(e)) => {
            let page = layout("error", html! { p.error { (e) } });
            (StatusCode::BAD_GATEWAY, Html(page.into_string())).into_response()
        }
        Err(_) => refuse(StatusCode::INTERNAL_SERVER_ERROR, "500: the request failed"),
    }
}

fn tube_view(
    app: &App,
    i: usize,
    addr: &str,
    conn: &mut Conn,
    name: &str,
    top: Option<&Markup>,
) -> Markup {
    tube_view_with(app, i, addr, conn, name, top.cloned(), None)
}

/// A tube's page: its counts, its next jobs, a looked-up job, the actions.
fn tube_view_with(
    app: &App,
    i: usize,
    addr: &str,
    conn: &mut Conn,
    name: &str,
    top: Option<Markup>,
    looked_up: Option<(u64, Option<JobView>)>,
) -> Markup {
    let page = (|| -> Result<Markup, String> {
        let only = [name.to_owned()];
        let snap = snapshot::read(conn, Scope::only(&only))?;
        let t = snap
            .tubes
            .first()
            .cloned()
            .unwrap_or_else(|| Tube::unknown(name));
        let nats = snap.nats.is_some();
        // A stream without message schedules keeps no delayed jobs apart.
        let apart = snap
            .nats
            .as_ref()
            .is_none_or(|n| n.stream.allow_msg_schedules);
        let mut shown = Vec::new();
        for which in [Which::Ready, Which::Delayed, Which::Buried] {
            let j = if !apart && which == Which::Delayed {
                None
            } else {
                jobs::peek(conn, name, which)?
            };
            shown.push((which, j));
        }
        Ok(tube_body(app, i, addr, &t, nats, &shown, looked_up))
    })();
    let body = page.unwrap_or_else(|e| html! { p.error { (e) } });
    layout(
        &format!("tube {name}"),
        html! { (top.unwrap_or_else(nothing)) (body) },
    )
}

fn tube_body(
    app: &App,
    i: usize,
    addr: &str,
    t: &Tube,
    nats: bool,
    shown: &[(Which, Option<JobView>)],
    looked_up: Option<(u64, Option<JobView>)>,
) -> Markup {
    let name = &t.name;
    let c = &t.jobs;
    let action = |what: &str| format!("/tubes/{}/{what}", segment(name));
    let job_actions = |j: &JobView, kickable: bool| {
        html! {
            @if !app.read_only {
                div.actions {
                    @if kickable {
                        form method="post" action=(action("kick-job")) {
                            (server_field(i)) input type="hidden" name="id" value=(j.id);
                            button type="submit" { "Kick job " (j.id) }
                        }
                    }
                    form method="post" action=(action("delete")) {
                        (server_field(i)) input type="hidden" name="id" value=(j.id);
                        button.danger type="submit" { "Delete job " (j.id) }
                    }
                }
            }
        }
    };
    html! {
        h2 { "tube " span.tube-name { (name) } " on " (addr) }
        @if !t.known { p.muted { "The server has no tube of this name (no job, nobody using it)." } }
        dl.counts {
            dt { "ready" } dd.ready { (c.ready) }
            dt { "reserved" } dd.reserved { (c.reserved) }
            dt { "delayed" } dd.delayed { (c.delayed.map_or_else(|| "-".to_owned(), |d| d.to_string())) }
            dt { "buried" } dd.buried { (c.buried) }
            dt { "waiting" } dd { (c.waiting) }
            dt { "paused" } dd.paused { @if t.paused > 0 { (pages::age(t.paused)) " left" } @else { "no" } }
        }
        @if !app.read_only {
            div.actions {
                form method="post" action=(action("kick")) {
                    (server_field(i))
                    label { "buried jobs to kick " input type="number" name="count" min="1" value=(c.buried.max(1)); }
                    button type="submit" { "Kick" }
                }
                form method="post" action=(action("pause")) {
                    (server_field(i))
                    label { "seconds " input type="number" name="secs" min="1" value="60"; }
                    button type="submit" { "Pause" }
                }
                form method="post" action=(action("resume")) {
                    (server_field(i))
                    button type="submit" { "Resume" }
                }
            }
        }
        @for (which, j) in shown {
            section.peek data-state=(which.name()) {
                @match j {
                    Some(j) => {
                        (pages::job(&format!("next {}", which.name()), j))
                        (job_actions(j, *which != Which::Ready))
                    }
                    None if nats && *which == Which::Delayed && t.jobs.delayed.is_none() => {
                        h3 { "next delayed" }
                        p.muted { "This stream holds no delayed jobs apart (no message schedules: nats-server before 2.12, or a stream kept as it was): a delayed job counts as ready until a worker is handed it early and gives it back." }
                    }
                    None => {
                        h3 { "next " (which.name()) }
                        p.muted { "none" }
                    }
                }
            }
        }
        section.lookup {
            form method="get" action=(format!("/tubes/{}", segment(name))) {
                (server_field(i))
                label { "job id " input type="text" inputmode="numeric" name="job"; }
                button type="submit" { "Look up" }
            }
            @if let Some((id, j)) = looked_up {
                @match j {
                    Some(j) => {
                        (pages::job("looked up", &j))
                        (job_actions(&j, j.state == "buried" || j.state == "delayed"))
                    }
                    None => { p.notice.failed { "No job " (id) " on this server." } }
                }
            }
        }
        p { a href="/" { "back to the overview" } }
    }
}
