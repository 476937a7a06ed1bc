//! The statistics YAML: real server documents, quoting, unknown keys, errors.

use taskq_proto::yaml::{items, pairs};
use taskq_proto::{JobStats, ServerStats, TubeStats, YamlError};

/// `stats` as beanstalkd 1.12 (Debian) prints it: version quoted, os unquoted
/// and holding a `#` and spaces.
const STATS_1_12: &[u8] = b"---\ncurrent-jobs-urgent: 1\ncurrent-jobs-ready: 2\ncurrent-jobs-reserved: 3\ncurrent-jobs-delayed: 4\ncurrent-jobs-buried: 5\ncmd-put: 6\ncmd-peek: 7\ncmd-peek-ready: 8\ncmd-peek-delayed: 9\ncmd-peek-buried: 10\ncmd-reserve: 11\ncmd-reserve-with-timeout: 12\ncmd-delete: 13\ncmd-release: 14\ncmd-use: 15\ncmd-watch: 16\ncmd-ignore: 17\ncmd-bury: 18\ncmd-kick: 19\ncmd-touch: 20\ncmd-stats: 21\ncmd-stats-job: 22\ncmd-stats-tube: 23\ncmd-list-tubes: 24\ncmd-list-tube-used: 25\ncmd-list-tubes-watched: 26\ncmd-pause-tube: 27\njob-timeouts: 28\ntotal-jobs: 29\nmax-job-size: 65535\ncurrent-tubes: 30\ncurrent-connections: 31\ncurrent-producers: 32\ncurrent-workers: 33\ncurrent-waiting: 34\ntotal-connections: 35\npid: 10101\nversion: \"1.12\"\nrusage-utime: 0.003951\nrusage-stime: 1.500000\nuptime: 36\nbinlog-oldest-index: 37\nbinlog-current-index: 38\nbinlog-records-migrated: 39\nbinlog-records-written: 40\nbinlog-max-size: 10485760\ndraining: false\nid: 4ae65dca4aaf6a9d\nhostname: vm\nos: #1 SMP PREEMPT_DYNAMIC @0\nplatform: x86_64\n";

#[test]
fn server_stats_every_field() {
    let s = ServerStats::parse(STATS_1_12).unwrap();
    #[rustfmt::skip]
    let numbers: &[(u64, u64)] = &[
        (s.current_jobs_urgent, 1), (s.current_jobs_ready, 2), (s.current_jobs_reserved, 3),
        (s.current_jobs_delayed, 4), (s.current_jobs_buried, 5), (s.cmd_put, 6), (s.cmd_peek, 7),
        (s.cmd_peek_ready, 8), (s.cmd_peek_delayed, 9), (s.cmd_peek_buried, 10), (s.cmd_reserve, 11),
        (s.cmd_reserve_with_timeout, 12), (s.cmd_delete, 13), (s.cmd_release, 14), (s.cmd_use, 15),
        (s.cmd_watch, 16), (s.cmd_ignore, 17), (s.cmd_bury, 18), (s.cmd_kick, 19), (s.cmd_touch, 20),
        (s.cmd_stats, 21), (s.cmd_stats_job, 22), (s.cmd_stats_tube, 23), (s.cmd_list_tubes, 24),
        (s.cmd_list_tube_used, 25), (s.cmd_list_tubes_watched, 26), (s.cmd_pause_tube, 27),
        (s.job_timeouts, 28), (s.total_jobs, 29), (s.max_job_size, 65535), (s.current_tubes, 30),
        (s.current_connections, 31), (s.current_producers, 32), (s.current_workers, 33),
        (s.current_waiting, 34), (s.total_connections, 35), (s.pid, 10101), (s.uptime, 36),
        (s.binlog_oldest_index, 37), (s.binlog_current_index, 38), (s.binlog_records_migrated, 39),
        (s.binlog_records_written, 40), (s.binlog_max_size, 10485760),
    ];
    for (i, (got, want)) in numbers.iter().enumerate() {
        assert_eq!(got, want, "field #{i}");
    }
    assert_eq!(s.version, "1.12");
    assert_eq!(s.rusage_utime, 0.003951);
    assert_eq!(s.rusage_stime, 1.5);
    assert!(!s.draining);
    assert_eq!(s.id, "4ae65dca4aaf6a9d");
    assert_eq!(s.hostname, "vm");
    assert_eq!(s.os, "#1 SMP PREEMPT_DYNAMIC @0");
    assert_eq!(s.platform, "x86_64");
}

#[test]
fn tube_and_job_stats_every_field() {
    let t = TubeStats::parse(b"---\nname: \"jobs\"\ncurrent-jobs-urgent: 1\ncurrent-jobs-ready: 2\ncurrent-jobs-reserved: 3\ncurrent-jobs-delayed: 4\ncurrent-jobs-buried: 5\ntotal-jobs: 6\ncurrent-using: 7\ncurrent-watching: 8\ncurrent-waiting: 9\ncmd-delete: 10\ncmd-pause-tube: 11\npause: 12\npause-time-left: 13\n").unwrap();
    #[rustfmt::skip]
    let numbers = [t.current_jobs_urgent, t.current_jobs_ready, t.current_jobs_reserved, t.current_jobs_delayed,
        t.current_jobs_buried, t.total_jobs, t.current_using, t.current_watching, t.current_waiting,
        t.cmd_delete, t.cmd_pause_tube, t.pause, t.pause_time_left];
    assert_eq!(numbers, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]);
    assert_eq!(t.name, "jobs");

    let j = JobStats::parse(b"---\nid: 1\ntube: default\nstate: reserved\npri: 2\nage: 3\ndelay: 4\nttr: 5\ntime-left: 6\nfile: 7\nreserves: 8\ntimeouts: 9\nreleases: 10\nburies: 11\nkicks: 12\n").unwrap();
    #[rustfmt::skip]
    let numbers = [j.id, j.pri, j.age, j.delay, j.ttr, j.time_left, j.file, j.reserves, j.timeouts, j.releases, j.buries, j.kicks];
    assert_eq!(numbers, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
    assert_eq!((j.tube, j.state), ("default", "reserved"));
}

#[test]
fn tolerant_reading() {
    #[rustfmt::skip]
    let cases: &[(&[u8], &str, u64)] = &[
        (b"---\nname: 'single'\n", "single", 0),
        (b"---\nname: \"double\"\n", "double", 0),
        (b"---\nname: bare\n", "bare", 0),
        (b"---\r\nname: crlf\r\ntotal-jobs: 3\r\n", "crlf", 3),
        (b"--- \nname:  spaced  \ntotal-jobs:   4\n\n\n", "spaced", 4),
        (b"---\nfuture-field: \"x: y\"\nname: n\nwho-knows: 12\ntotal-jobs: 5\n", "n", 5),
        (b"---\nname: \"\"\n", "", 0),
        (b"---\nname: \"unclosed\n", "\"unclosed", 0),
        (b"---\n", "", 0),
        (b"---", "", 0),
    ];
    for (doc, name, total) in cases {
        let t = TubeStats::parse(doc)
            .unwrap_or_else(|e| panic!("{:?}: {e}", String::from_utf8_lossy(doc)));
        assert_eq!(
            (t.name, t.total_jobs),
            (*name, *total),
            "{:?}",
            String::from_utf8_lossy(doc)
        );
    }
}

#[test]
fn negative_seconds_left_read_as_zero() {
    // beanstalkd prints time-left and pause-time-left signed.
    let j = JobStats::parse(b"---\ntime-left: -1\n").unwrap();
    assert_eq!(j.time_left, 0);
    let t = TubeStats::parse(b"---\npause-time-left: -3\n").unwrap();
    assert_eq!(t.pause_time_left, 0);
    assert_eq!(
        JobStats::parse(b"---\ntime-left: -x\n"),
        Err(YamlError::BadNumber { key: "time-left" })
    );
    assert_eq!(
        JobStats::parse(b"---\nreserves: -1\n"),
        Err(YamlError::BadNumber { key: "reserves" })
    );
}

#[test]
fn yaml_errors() {
    #[rustfmt::skip]
    let cases: &[(&[u8], YamlError)] = &[
        (b"", YamlError::MissingHeader),
        (b"name: x\n", YamlError::MissingHeader),
        (b"--\nname: x\n", YamlError::MissingHeader),
        (b"---\nno colon here\n", YamlError::BadLine { line: 2 }),
        (b"---\nname: x\n: empty key\n", YamlError::BadLine { line: 3 }),
        (b"---\nname: \xff\n", YamlError::NotUtf8),
        (b"---\ntotal-jobs: many\n", YamlError::BadNumber { key: "total-jobs" }),
        (b"---\ntotal-jobs: 18446744073709551616\n", YamlError::BadNumber { key: "total-jobs" }),
        (b"---\ntotal-jobs:\n", YamlError::BadNumber { key: "total-jobs" }),
    ];
    for (doc, want) in cases {
        assert_eq!(
            TubeStats::parse(doc),
            Err(*want),
            "{:?}",
            String::from_utf8_lossy(doc)
        );
    }
    assert_eq!(
        ServerStats::parse(b"---\ndraining: maybe\n"),
        Err(YamlError::BadNumber { key: "draining" })
    );
    assert_eq!(
        ServerStats::parse(b"---\nrusage-utime: fast\n"),
        Err(YamlError::BadNumber {
            key: "rusage-utime"
        })
    );
}

#[test]
fn pairs_and_items() {
    let got: Vec<_> = pairs(b"---\na: 1\nb: \"two\"\n\nc:\n")
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(got, [("a", "1"), ("b", "two"), ("c", "")]);
    #[rustfmt::skip]
    let lists: &[(&[u8], &[&str])] = &[
        (b"---\n- default\n- jobs\n", &["default", "jobs"]),
        (b"---\n- \"quoted\"\n-bare\n", &["quoted", "bare"]),
        (b"---\n", &[]),
        (b"---\r\n- crlf\r\n", &["crlf"]),
    ];
    for (doc, want) in lists {
        let got: Vec<_> = items(doc).unwrap().collect::<Result<_, _>>().unwrap();
        assert_eq!(got, *want);
    }
    let mut bad = items(b"---\n- ok\nnot an item\n- after\n").unwrap();
    assert_eq!(bad.next(), Some(Ok("ok")));
    assert_eq!(bad.next(), Some(Err(YamlError::BadLine { line: 3 })));
    assert_eq!(bad.next(), None, "an error ends the iteration");
    assert!(matches!(items(b"- x\n"), Err(YamlError::MissingHeader)));
}
