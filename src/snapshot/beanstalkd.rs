//! A snapshot of a beanstalkd server: `stats`, `list-tubes`, `stats-tube`
//! per tube, and `peek-ready` + `stats-job` per tube with a ready job.

use std::time::Instant;

use taskq_proto::{yaml, Command, Connection, JobStats, Reply, ServerStats, TubeStats};

use super::model::{too_many_tubes, Counts, Scope, Snapshot, Totals, Tube, MAX_TUBES};
use crate::server::{request, unexpected, use_tube};

/// Reads the server's totals and the tubes of `scope`.
pub fn read(conn: &mut Connection, scope: Scope<'_>) -> Result<Snapshot, String> {
    let totals = totals(conn)?;
    let names = match scope.tubes {
        Some(names) => names.to_vec(),
        None => tube_names(conn)?,
    };
    if names.len() > MAX_TUBES {
        return Err(too_many_tubes("list-tubes"));
    }
    // A tube's `stats-tube` pairs are kept only for the tubes asked for by
    // name (`taskq stats --tube`): every tube's would be up to a reply's
    // limit each.
    let pairs = scope.tubes.is_some();
    let mut tubes = Vec::with_capacity(names.len());
    for name in &names {
        match tube(conn, name, pairs)? {
            Some(t) => tubes.push(t),
            // Gone between listing and asking: left out of a full listing.
            None if scope.tubes.is_none() => {}
            None => {
                let mut t = Tube::unknown(name);
                t.jobs.delayed = Some(0);
                tubes.push(t);
            }
        }
    }
    let at = Instant::now();
    if scope.ready_age {
        for t in tubes.iter_mut().filter(|t| t.jobs.ready > 0) {
            t.ready_age = ready_age(conn, &t.name)?;
        }
    }
    Ok(Snapshot {
        at,
        totals,
        tubes,
        nats: None,
    })
}

/// The counts `stats` and `stats-tube` both give, under the same names, with
/// the counters of puts and of jobs done.
macro_rules! counts {
    ($s:expr, $puts:expr, $done:expr) => {
        Counts {
            ready: $s.current_jobs_ready,
            urgent: $s.current_jobs_urgent,
            reserved: $s.current_jobs_reserved,
            delayed: Some($s.current_jobs_delayed),
            buried: $s.current_jobs_buried,
            waiting: $s.current_waiting,
            puts: Some($puts),
            done: Some($done),
        }
    };
}

/// The pairs of a YAML dictionary, owned.
fn owned_pairs(yaml: &[u8], what: &str) -> Result<Vec<(String, String)>, String> {
    yaml::pairs(yaml)
        .and_then(|p| {
            p.map(|r| r.map(|(k, v)| (k.to_owned(), v.to_owned())))
                .collect()
        })
        .map_err(|e| format!("reading {what}: {e}"))
}

fn totals(conn: &mut Connection) -> Result<Totals, String> {
    request(conn, &Command::Stats, |r| match r {
        Reply::Ok { yaml } => {
            let s = ServerStats::parse(yaml).map_err(|e| format!("reading stats: {e}"))?;
            Ok(Totals {
                version: s.version.to_owned(),
                uptime: Some(s.uptime),
                tubes: s.current_tubes,
                jobs: counts!(s, s.cmd_put, s.cmd_delete),
                connections: Some(s.current_connections),
                producers: Some(s.current_producers),
                workers: Some(s.current_workers),
                pairs: owned_pairs(yaml, "stats")?,
            })
        }
        other => Err(unexpected(&Command::Stats, &other)),
    })
}

/// One tube's statistics, `None` when the server has no such tube.
fn tube(conn: &mut Connection, name: &str, pairs: bool) -> Result<Option<Tube>, String> {
    let cmd = Command::StatsTube { tube: name };
    request(conn, &cmd, |r| match r {
        Reply::Ok { yaml } => {
            let s =
                TubeStats::parse(yaml).map_err(|e| format!("reading stats-tube {name}: {e}"))?;
            Ok(Some(Tube {
                name: s.name.to_owned(),
                known: true,
                jobs: counts!(s, s.total_jobs, s.cmd_delete),
                paused: s.pause_time_left,
                ready_age: None,
                pairs: if pairs {
                    owned_pairs(yaml, "stats-tube")?
                } else {
                    Vec::new()
                },
                nats: None,
            }))
        }
        Reply::NotFound => Ok(None),
        other => Err(unexpected(&cmd, &other)),
    })
}

/// Every tube's name, in the server's order.
fn tube_names(conn: &mut Connection) -> Result<Vec<String>, String> {
    let cmd = Command::ListTubes;
    request(conn, &cmd, |r| match r {
        Reply::Ok { yaml } => yaml::items(yaml)
            .and_then(|items| {
                items
                    .map(|i| i.map(|s| yaml::unquote(s).to_owned()))
                    .collect()
            })
            .map_err(|e| format!("reading list-tubes: {e}")),
        other => Err(unexpected(&cmd, &other)),
    })
}

/// The age in seconds of the next ready job of `tube`, the one a reserve
/// would get (`None` when none is ready). Leaves the connection using `tube`.
fn ready_age(conn: &mut Connection, tube: &str) -> Result<Option<u64>, String> {
    use_tube(conn, tube)?;
    let Some(id) = request(conn, &Command::PeekReady, |r| match r {
        Reply::Found { id, .. } => Ok(Some(id)),
        Reply::NotFound => Ok(None),
        other => Err(unexpected(&Command::PeekReady, &other)),
    })?
    else {
        return Ok(None);
    };
    let stats = Command::StatsJob { id };
    request(conn, &stats, |r| match r {
        Reply::Ok { yaml } => JobStats::parse(yaml)
            .map(|s| Some(s.age))
            .map_err(|e| format!("reading stats-job: {e}")),
        Reply::NotFound => Ok(None),
        other => Err(unexpected(&stats, &other)),
    })
}
