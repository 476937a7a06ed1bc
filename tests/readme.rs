//! Runs every command the README shows, so the README cannot drift from the code.
//!
//! Lines of ```sh blocks run in bash against a real beanstalkd on a free loopback
//! port (`TASKQ_ADDR`), with the built `taskq` and `taskq-worker` first on PATH.
//! The two set-up commands are mapped: the demo runs with a small `-n`; the test
//! suite (which is running this test) is checked to exist. Lines of ```text blocks
//! (benchmarks, fuzzers) are too long to run here: the benches, scripts and fuzz
//! targets they name are checked to exist.

mod cli_common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cli_common::bin_dir;
use taskq_testkit::Beanstalkd;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The lines of every fenced block of the given language.
fn blocks(readme: &str, lang: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in readme.lines() {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix("```") {
            inside = !inside && rest.trim() == lang;
            continue;
        }
        if inside && !t.is_empty() && !t.starts_with('#') {
            out.push(t.to_string());
        }
    }
    out
}

/// Runs `script` in bash with a time limit; returns (status ok, stdout, stderr).
/// Past the limit bash's whole process group (what the script started too)
/// is killed.
fn run(script: &str, path: &str, addr: &str, limit: Duration) -> (bool, String, String) {
    use std::os::unix::process::CommandExt;
    let mut child = Command::new("bash")
        .process_group(0)
        .args(["-euo", "pipefail", "-c", script])
        .env("PATH", path)
        .env("TASKQ_ADDR", addr)
        .current_dir(repo())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("bash runs");
    let until = Instant::now() + limit;
    loop {
        if child.try_wait().expect("wait works").is_some() {
            break;
        }
        if Instant::now() > until {
            cli_common::kill_group(child.id());
            let out = child.wait_with_output().expect("output");
            panic!(
                "README command timed out after {limit:?}: {script}\nstdout: {}\nstderr: {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn every_readme_command_runs() {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let server = Beanstalkd::start().expect("beanstalkd starts");
    let addr = server.addr().to_string();
    let path = format!(
        "{}:{}",
        bin_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );

    let lines = blocks(&readme, "sh");
    assert!(lines.len() >= 10, "README lost its examples: {lines:?}");
    let setup: Vec<&String> = lines.iter().take(2).collect();
    assert_eq!(
        setup,
        ["cargo run --release -- demo", "scripts/test"],
        "the README's two set-up commands come first"
    );
    let mut ran = 0;
    for line in &lines {
        let (script, limit) = match line.as_str() {
            // The demo, on the embedded reference server, with a small -n.
            "cargo run --release -- demo" => ("taskq demo -n 300".to_string(), 60),
            // The suite that runs this very test.
            "scripts/test" => {
                assert!(
                    is_executable(&repo().join("scripts/test")),
                    "scripts/test missing"
                );
                continue;
            }
            // Installing and starting beanstalkd: this test has its own.
            l if l.contains("apt-get install") => {
                assert!(
                    run(
                        "command -v beanstalkd",
                        &path,
                        &addr,
                        Duration::from_secs(5)
                    )
                    .0
                );
                continue;
            }
            l if l.starts_with("beanstalkd ") => continue,
            l => (l.to_string(), 90),
        };
        let (ok, out, err) = run(&script, &path, &addr, Duration::from_secs(limit));
        assert!(
            ok,
            "README command failed: {script}\nstdout: {out}\nstderr: {err}"
        );
        if script.starts_with("taskq demo") {
            assert!(
                out.contains("lost: 0"),
                "demo report lacks 'lost: 0':\n{out}"
            );
        }
        ran += 1;
    }
    assert!(ran >= 10, "only {ran} README commands ran");

    for line in blocks(&readme, "text") {
        let words: Vec<&str> = line.split_whitespace().collect();
        if let Some(i) = words.iter().position(|w| *w == "--bench") {
            let name = words[i + 1];
            assert!(
                repo().join("benches").join(format!("{name}.rs")).exists(),
                "no bench {name}"
            );
        } else if words.first().is_some_and(|w| w.starts_with("scripts/")) {
            assert!(
                is_executable(&repo().join(words[0])),
                "no script {}",
                words[0]
            );
        } else if let Some(i) = words.iter().position(|w| *w == "run") {
            if words.contains(&"fuzz") {
                let target = words[i + 1];
                let file = repo()
                    .join("fuzz/fuzz_targets")
                    .join(format!("{target}.rs"));
                assert!(file.exists(), "no fuzz target {target}");
            }
        } else if let Some(rest) = line.split_once("FUZZ_SECONDS=") {
            let script = rest.1.split_whitespace().nth(1).unwrap_or("");
            assert!(is_executable(&repo().join(script)), "no script {script}");
        }
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.permissions().mode() & 0o111 != 0)
}
