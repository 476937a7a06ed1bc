//! What every request to the dashboard passes before a page sees it:
//!
//! 1. its `Host` is the listen address or `localhost` at its port (a page
//!    elsewhere that rebinds its own name to this machine is refused);
//! 2. it carries the token: `?token=` (answered with an HttpOnly,
//!    SameSite=Strict cookie and a redirect to the same page without it;
//!    refused, before the token is looked at, when another site's page sent
//!    it), the cookie, or `Authorization: Bearer`; else 401 with no queue data;
//! 3. a state change is a POST, refused when cross-site (`Sec-Fetch-Site`,
//!    else `Origin` against `Host`) or when the dashboard is read-only;
//!
//! and every answer carries a strict Content-Security-Policy.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use taskq_proto::Secret;

/// The cookie the token is kept in.
pub const COOKIE: &str = "taskq_web_token";

/// Scripts and styles from this server only, no inline script, no frames,
/// forms posting here only, nothing fetched elsewhere.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// What the guard checks against.
#[derive(Debug)]
pub struct Rules {
    /// The `Host` values accepted (lower case).
    pub hosts: Vec<String>,
    /// The token.
    pub token: Secret,
    /// No state changes at all.
    pub read_only: bool,
}

impl Rules {
    /// The rules for a dashboard listening on `listen` (as given) and bound to `port`.
    pub fn new(listen: &str, port: u16, token: Secret, read_only: bool) -> Rules {
        let mut hosts = vec![listen.to_ascii_lowercase(), format!("localhost:{port}")];
        if let Some((host, _)) = listen.rsplit_once(':') {
            hosts.push(format!("{}:{port}", host.to_ascii_lowercase()));
            if port == 80 {
                hosts.extend([host.to_ascii_lowercase(), "localhost".to_owned()]);
            }
        }
        hosts.sort();
        hosts.dedup();
        Rules {
            hosts,
            token,
            read_only,
        }
    }
}

/// Equal without telling by its timing how much of `given` matched.
fn same(given: &[u8], token: &[u8]) -> bool {
    let mut diff = given.len() ^ token.len();
    for (i, t) in token.iter().enumerate() {
        diff |= usize::from(given.get(i).copied().unwrap_or(0) ^ t);
    }
    diff == 0
}

/// The token a request carries, if any, and whether it came in the query.
fn token_of(h: &HeaderMap, query: Option<&str>) -> (Option<String>, bool) {
    if let Some(q) = query {
        for pair in q.split('&') {
            if let Some(v) = pair.strip_prefix("token=") {
                return (Some(percent_decode(v)), true);
            }
        }
    }
    let bearer = h
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|v| v.trim().to_owned());
    if bearer.is_some() {
        return (bearer, false);
    }
    let cookie = h
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| {
            let (k, v) = c.trim().split_once('=')?;
            (k == COOKIE).then(|| v.to_owned())
        });
    (cookie, false)
}

/// `%XX` and `+` decoded (a token is usually plain).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match b[i] {
            b'%' => match (
                b.get(i + 1).and_then(|&c| hex(c)),
                b.get(i + 2).and_then(|&c| hex(c)),
            ) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// True when the browser says another site's page sent the request
/// (`Sec-Fetch-Site` other than `same-origin` or `none`, the address bar;
/// one that cannot be read counts as another site).
fn sent_by_another_site(h: &HeaderMap) -> bool {
    h.get("sec-fetch-site")
        .is_some_and(|v| !matches!(v.to_str(), Ok("same-origin" | "none")))
}

/// True when a state-changing request comes from another site.
fn cross_site(h: &HeaderMap) -> bool {
    if h.contains_key("sec-fetch-site") {
        return sent_by_another_site(h);
    }
    match h.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
        // No browser sent it (curl with a bearer token): nothing cross-site.
        None => false,
        Some(origin) => {
            let host = h.get(header::HOST).and_then(|v| v.to_str().ok());
            host.is_none_or(|host| !origin.eq_ignore_ascii_case(&format!("http://{host}")))
        }
    }
}

/// A plain-text answer with `status`.
pub fn refuse(status: StatusCode, text: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{text}\n"),
    )
        .into_response()
}

/// The middleware: the checks above, then the page, then the headers every answer gets.
pub async fn guard(State(rules): State<Arc<Rules>>, req: Request<Body>, next: Next) -> Response {
    let mut res = check(&rules, req, next).await;
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

async fn check(rules: &Rules, req: Request<Body>, next: Next) -> Response {
    let h = req.headers();
    let host = h
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_ascii_lowercase);
    if !host.is_some_and(|host| rules.hosts.contains(&host)) {
        return refuse(
            StatusCode::FORBIDDEN,
            "403: this dashboard answers only to its listen address or localhost",
        );
    }
    let (token, in_query) = token_of(h, req.uri().query());
    if in_query && sent_by_another_site(h) {
        // Checked before the token, so that another site's page cannot try
        // guesses and tell a right one by its answer.
        return refuse(
            StatusCode::FORBIDDEN,
            "403: a token in the address is taken only as the operator opens it, not from another site",
        );
    }
    if !token.is_some_and(|t| same(t.as_bytes(), rules.token.expose().as_bytes())) {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "401: this dashboard needs its token: open the address taskq web printed",
        );
    }
    let method = req.method().clone();
    if in_query && method == Method::GET {
        // Trade the token in the address for a cookie, and drop it from the address.
        let rest: Vec<&str> = req
            .uri()
            .query()
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.starts_with("token=") && !p.is_empty())
            .collect();
        let mut to = req.uri().path().to_owned();
        if !rest.is_empty() {
            to = format!("{to}?{}", rest.join("&"));
        }
        let cookie = format!(
            "{COOKIE}={}; Path=/; HttpOnly; SameSite=Strict",
            rules.token.expose()
        );
        let mut res = StatusCode::SEE_OTHER.into_response();
        if let (Ok(to), Ok(cookie)) = (HeaderValue::from_str(&to), HeaderValue::from_str(&cookie)) {
            res.headers_mut().insert(header::LOCATION, to);
            res.headers_mut().insert(header::SET_COOKIE, cookie);
        }
        return res;
    }
    match method {
        Method::GET | Method::HEAD => next.run(req).await,
        Method::POST => {
            if cross_site(req.headers()) {
                return refuse(
                    StatusCode::FORBIDDEN,
                    "403: a change asked for from another site is refused",
                );
            }
            if rules.read_only {
                return refuse(
                    StatusCode::FORBIDDEN,
                    "403: this dashboard is read-only (taskq web --read-only)",
                );
            }
            next.run(req).await
        }
        _ => refuse(StatusCode::METHOD_NOT_ALLOWED, "405: GET or POST only"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole_and_decode() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abd", b"abc"));
        assert!(!same(b"ab", b"abc"));
        assert!(!same(b"abcd", b"abc"));
        assert!(!same(b"", b"abc"));
        assert_eq!(percent_decode("a%2Fb+c%"), "a/b c%");
        let r = Rules::new("127.0.0.1:8080", 8080, "t".into(), false);
        assert_eq!(r.hosts, ["127.0.0.1:8080", "localhost:8080"]);
        let r = Rules::new("127.0.0.1:0", 41000, "t".into(), false);
        assert_eq!(
            r.hosts,
            ["127.0.0.1:0", "127.0.0.1:41000", "localhost:41000"]
        );
    }

    #[test]
    fn cross_site_by_fetch_metadata_else_origin() {
        let h = |pairs: &[(&'static str, &'static str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in pairs {
                m.insert(*k, HeaderValue::from_static(v));
            }
            m
        };
        assert!(!cross_site(&h(&[("sec-fetch-site", "same-origin")])));
        assert!(cross_site(&h(&[("sec-fetch-site", "cross-site")])));
        assert!(cross_site(&h(&[("sec-fetch-site", "same-site")])));
        assert!(!cross_site(&h(&[
            ("host", "localhost:1"),
            ("origin", "http://localhost:1")
        ])));
        assert!(cross_site(&h(&[
            ("host", "localhost:1"),
            ("origin", "http://evil.test")
        ])));
        assert!(!cross_site(&h(&[("host", "localhost:1")])));
        // Fetch metadata that cannot be read is another site's, whatever
        // the Origin says.
        let mut odd = h(&[("host", "localhost:1"), ("origin", "http://localhost:1")]);
        odd.insert(
            "sec-fetch-site",
            HeaderValue::from_bytes(b"same-origin\xff").unwrap(),
        );
        assert!(cross_site(&odd) && sent_by_another_site(&odd));
        assert!(!sent_by_another_site(&h(&[("sec-fetch-site", "none")])));
        assert!(!sent_by_another_site(&h(&[("host", "localhost:1")])));
    }
}
