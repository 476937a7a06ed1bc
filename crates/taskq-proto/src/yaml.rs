//! The YAML that `stats*` and `list-tubes*` return, read in place.
//!
//! beanstalkd writes a `---` line, then `key: value` lines (stats) or `- item`
//! lines (lists). Newer servers quote string values. Unknown keys are skipped, so
//! a newer server's extra fields never break an older client.

use crate::error::YamlError;

/// Iterates the `key: value` pairs of a stats document, values unquoted.
#[derive(Debug, Clone)]
pub struct Pairs<'a> {
    rest: &'a [u8],
    line: usize,
}

/// Iterates the `- item` lines of a list document, items unquoted.
#[derive(Debug, Clone)]
pub struct Items<'a> {
    rest: &'a [u8],
    line: usize,
}

/// Starts reading the pairs of a stats document.
pub fn pairs(yaml: &[u8]) -> Result<Pairs<'_>, YamlError> {
    Ok(Pairs {
        rest: skip_header(yaml)?,
        line: 1,
    })
}

/// Starts reading the items of a `list-tubes` or `list-tubes-watched` document.
pub fn items(yaml: &[u8]) -> Result<Items<'_>, YamlError> {
    Ok(Items {
        rest: skip_header(yaml)?,
        line: 1,
    })
}

fn skip_header(yaml: &[u8]) -> Result<&[u8], YamlError> {
    let (first, rest) = split_line(yaml);
    if trim(first) != b"---" {
        return Err(YamlError::MissingHeader);
    }
    Ok(rest)
}

fn split_line(s: &[u8]) -> (&[u8], &[u8]) {
    match memchr::memchr(b'\n', s) {
        Some(i) => (&s[..i], &s[i + 1..]),
        None => (s, &[]),
    }
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = s {
        if first.is_ascii_whitespace() {
            s = rest;
        } else {
            break;
        }
    }
    while let [rest @ .., last] = s {
        if last.is_ascii_whitespace() {
            s = rest;
        } else {
            break;
        }
    }
    s
}

/// Strips one pair of matching `"` or `'` quotes.
pub fn unquote(s: &str) -> &str {
    let b = s.as_bytes();
    if b.len() >= 2 && (b[0] == b'"' || b[0] == b'\'') && b[b.len() - 1] == b[0] {
        &s[1..s.len() - 1]
    } else {
        s
    }
}

fn text(s: &[u8]) -> Result<&str, YamlError> {
    std::str::from_utf8(s).map_err(|_| YamlError::NotUtf8)
}

impl<'a> Iterator for Pairs<'a> {
    type Item = Result<(&'a str, &'a str), YamlError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.rest.is_empty() {
                return None;
            }
            let (line, rest) = split_line(self.rest);
            self.rest = rest;
            self.line += 1;
            let line = trim(line);
            if line.is_empty() {
                continue;
            }
            let Some(colon) = memchr::memchr(b':', line) else {
                self.rest = &[];
                return Some(Err(YamlError::BadLine { line: self.line }));
            };
            let key = trim(&line[..colon]);
            let value = trim(&line[colon + 1..]);
            return Some(match (text(key), text(value)) {
                (Ok(k), Ok(v)) if !k.is_empty() => Ok((k, unquote(v))),
                (Ok(_), Ok(_)) => Err(YamlError::BadLine { line: self.line }),
                _ => Err(YamlError::NotUtf8),
            });
        }
    }
}

impl<'a> Iterator for Items<'a> {
    type Item = Result<&'a str, YamlError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.rest.is_empty() {
                return None;
            }
            let (line, rest) = split_line(self.rest);
            self.rest = rest;
            self.line += 1;
            let line = trim(line);
            if line.is_empty() {
                continue;
            }
            let Some(item) = line.strip_prefix(b"-") else {
                self.rest = &[];
                return Some(Err(YamlError::BadLine { line: self.line }));
            };
            return Some(text(trim(item)).map(unquote));
        }
    }
}

fn num(key: &'static str, v: &str) -> Result<u64, YamlError> {
    crate::reply::parse_u64(v.as_bytes()).map_err(|_| YamlError::BadNumber { key })
}

fn float(key: &'static str, v: &str) -> Result<f64, YamlError> {
    v.parse::<f64>().map_err(|_| YamlError::BadNumber { key })
}

/// Declares a stats struct: its numeric fields with their keys, then the other
/// fields with a parser each. Missing fields stay at their default.
macro_rules! stats_struct {
    (
        $(#[$meta:meta])*
        pub struct $name:ident<'a> {
            numbers { $( $(#[$ndoc:meta])* $nfield:ident = $nkey:literal, )* }
            other { $( $(#[$odoc:meta])* $ofield:ident : $oty:ty = $okey:literal => $oparse:expr, )* }
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Default)]
        #[non_exhaustive]
        pub struct $name<'a> {
            $( $(#[$ndoc])* pub $nfield: u64, )*
            $( $(#[$odoc])* pub $ofield: $oty, )*
        }

        impl<'a> $name<'a> {
            /// Reads the document; unknown keys are skipped, missing ones stay default.
            pub fn parse(yaml: &'a [u8]) -> Result<Self, YamlError> {
                let mut s = Self::default();
                for pair in pairs(yaml)? {
                    let (key, value) = pair?;
                    match key {
                        $( $nkey => s.$nfield = num($nkey, value)?, )*
                        $( $okey => {
                            let parse: fn(&'static str, &'a str) -> Result<$oty, YamlError> = $oparse;
                            s.$ofield = parse($okey, value)?;
                        } )*
                        _ => {}
                    }
                }
                Ok(s)
            }
        }
    };
}

fn as_str<'a>(_: &'static str, v: &'a str) -> Result<&'a str, YamlError> {
    Ok(v)
}

/// A count of seconds left. beanstalkd prints it signed (`%PRId64`) and it can
/// dip below zero between a deadline passing and the server acting on it; that
/// means "none left", not a malformed document.
fn secs_left(key: &'static str, v: &str) -> Result<u64, YamlError> {
    match v.strip_prefix('-') {
        Some(digits) => num(key, digits).map(|_| 0),
        None => num(key, v),
    }
}

fn as_bool(key: &'static str, v: &str) -> Result<bool, YamlError> {
    match v {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(YamlError::BadNumber { key }),
    }
}

stats_struct! {
    /// The reply to `stats`: the server's own record.
    pub struct ServerStats<'a> {
        numbers {
            /// Ready jobs with priority below 1024.
            current_jobs_urgent = "current-jobs-urgent",
            /// Ready jobs.
            current_jobs_ready = "current-jobs-ready",
            /// Reserved jobs.
            current_jobs_reserved = "current-jobs-reserved",
            /// Delayed jobs.
            current_jobs_delayed = "current-jobs-delayed",
            /// Buried jobs.
            current_jobs_buried = "current-jobs-buried",
            /// `put` commands received.
            cmd_put = "cmd-put",
            /// `peek` commands received.
            cmd_peek = "cmd-peek",
            /// `peek-ready` commands received.
            cmd_peek_ready = "cmd-peek-ready",
            /// `peek-delayed` commands received.
            cmd_peek_delayed = "cmd-peek-delayed",
            /// `peek-buried` commands received.
            cmd_peek_buried = "cmd-peek-buried",
            /// `reserve` commands received.
            cmd_reserve = "cmd-reserve",
            /// `reserve-with-timeout` commands received.
            cmd_reserve_with_timeout = "cmd-reserve-with-timeout",
            /// `delete` commands received, answered `DELETED` or `NOT_FOUND`.
            cmd_delete = "cmd-delete",
            /// `release` commands received.
            cmd_release = "cmd-release",
            /// `use` commands received.
            cmd_use = "cmd-use",
            /// `watch` commands received.
            cmd_watch = "cmd-watch",
            /// `ignore` commands received.
            cmd_ignore = "cmd-ignore",
            /// `bury` commands received.
            cmd_bury = "cmd-bury",
            /// `kick` commands received.
            cmd_kick = "cmd-kick",
            /// `touch` commands received.
            cmd_touch = "cmd-touch",
            /// `stats` commands received.
            cmd_stats = "cmd-stats",
            /// `stats-job` commands received.
            cmd_stats_job = "cmd-stats-job",
            /// `stats-tube` commands received.
            cmd_stats_tube = "cmd-stats-tube",
            /// `list-tubes` commands received.
            cmd_list_tubes = "cmd-list-tubes",
            /// `list-tube-used` commands received.
            cmd_list_tube_used = "cmd-list-tube-used",
            /// `list-tubes-watched` commands received.
            cmd_list_tubes_watched = "cmd-list-tubes-watched",
            /// `pause-tube` commands received.
            cmd_pause_tube = "cmd-pause-tube",
            /// Jobs whose TTR ran out.
            job_timeouts = "job-timeouts",
            /// Jobs created.
            total_jobs = "total-jobs",
            /// The server's maximum job size.
            max_job_size = "max-job-size",
            /// Tubes that exist.
            current_tubes = "current-tubes",
            /// Open connections.
            current_connections = "current-connections",
            /// Connections that have put a job.
            current_producers = "current-producers",
            /// Connections that have reserved a job.
            current_workers = "current-workers",
            /// Connections waiting in a reserve.
            current_waiting = "current-waiting",
            /// Connections accepted since start.
            total_connections = "total-connections",
            /// The server's process id.
            pid = "pid",
            /// Seconds since start.
            uptime = "uptime",
            /// Oldest binlog file index.
            binlog_oldest_index = "binlog-oldest-index",
            /// Current binlog file index.
            binlog_current_index = "binlog-current-index",
            /// Binlog records migrated.
            binlog_records_migrated = "binlog-records-migrated",
            /// Binlog records written.
            binlog_records_written = "binlog-records-written",
            /// Binlog file size limit.
            binlog_max_size = "binlog-max-size",
        }
        other {
            /// Server version.
            version: &'a str = "version" => as_str,
            /// User CPU seconds.
            rusage_utime: f64 = "rusage-utime" => float,
            /// System CPU seconds.
            rusage_stime: f64 = "rusage-stime" => float,
            /// True in drain mode.
            draining: bool = "draining" => as_bool,
            /// The server's random id.
            id: &'a str = "id" => as_str,
            /// Host name.
            hostname: &'a str = "hostname" => as_str,
            /// Operating system (newer servers).
            os: &'a str = "os" => as_str,
            /// Machine (newer servers).
            platform: &'a str = "platform" => as_str,
        }
    }
}

stats_struct! {
    /// The reply to `stats-tube`.
    pub struct TubeStats<'a> {
        numbers {
            /// Ready jobs with priority below 1024.
            current_jobs_urgent = "current-jobs-urgent",
            /// Ready jobs.
            current_jobs_ready = "current-jobs-ready",
            /// Reserved jobs.
            current_jobs_reserved = "current-jobs-reserved",
            /// Delayed jobs.
            current_jobs_delayed = "current-jobs-delayed",
            /// Buried jobs.
            current_jobs_buried = "current-jobs-buried",
            /// Jobs created in this tube.
            total_jobs = "total-jobs",
            /// Connections using this tube.
            current_using = "current-using",
            /// Connections watching this tube.
            current_watching = "current-watching",
            /// Connections waiting for a job from this tube.
            current_waiting = "current-waiting",
            /// `delete` commands for jobs in this tube.
            cmd_delete = "cmd-delete",
            /// `pause-tube` commands for this tube.
            cmd_pause_tube = "cmd-pause-tube",
            /// Seconds the tube was paused for.
            pause = "pause",
        }
        other {
            /// Seconds left of the pause (a negative count from the server reads as 0).
            pause_time_left: u64 = "pause-time-left" => secs_left,
            /// Tube name.
            name: &'a str = "name" => as_str,
        }
    }
}

stats_struct! {
    /// The reply to `stats-job`.
    pub struct JobStats<'a> {
        numbers {
            /// Job id.
            id = "id",
            /// Priority.
            pri = "pri",
            /// Seconds since the job was put.
            age = "age",
            /// Delay in seconds.
            delay = "delay",
            /// Time to run in seconds.
            ttr = "ttr",
            /// Binlog file holding the job.
            file = "file",
            /// Times reserved.
            reserves = "reserves",
            /// Times its TTR ran out.
            timeouts = "timeouts",
            /// Times released.
            releases = "releases",
            /// Times buried.
            buries = "buries",
            /// Times kicked.
            kicks = "kicks",
        }
        other {
            /// Seconds left before the job leaves its reserved or delayed state
            /// (a negative count from the server reads as 0).
            time_left: u64 = "time-left" => secs_left,
            /// Tube name.
            tube: &'a str = "tube" => as_str,
            /// ready, delayed, reserved or buried.
            state: &'a str = "state" => as_str,
        }
    }
}
