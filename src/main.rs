//! The `taskq` command, on beanstalkd and NATS JetStream: put, stats, the
//! operators' commands (top among them), the exporter and the dashboard, bench,
//! serve (the reference server, beanstalkd's protocol) and demo.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod access;
mod admin;
mod bench;
mod cli;
mod clock;
#[cfg(test)]
mod defaults_agree;
mod demo;
mod exporter;
mod jetstream;
mod jobs;
mod put;
mod serve;
mod server;
mod snapshot;
mod stats;
mod top;
mod web;

/// Work queues on beanstalkd and NATS JetStream (`about` is the package description).
#[derive(Parser, Debug)]
#[command(name = "taskq", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
    #[command(flatten)]
    nats: taskq_worker::nats_cli::NatsArgs,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Put jobs: each BODY is a job, or each line of standard input.
    #[command(after_help = put::EXIT_STATUS_HELP)]
    Put(put::PutArgs),
    /// Show the server's or a tube's statistics.
    Stats(stats::StatsArgs),
    /// List every tube with its counts.
    Tubes(admin::TubesArgs),
    /// Show the next ready, delayed or buried job of a tube: id, stats and body.
    Peek(admin::PeekArgs),
    /// Move a tube's buried jobs (or, when none is buried, its delayed ones) back to ready.
    Kick(admin::KickArgs),
    /// Move buried or delayed jobs, by id, back to ready.
    KickJob(admin::JobsArgs),
    /// Delete jobs by id.
    Delete(admin::JobsArgs),
    /// Hand out no job of a tube for SECS seconds (JetStream: nats-server 2.11+).
    Pause(admin::PauseArgs),
    /// A live view of the server: totals, and per tube jobs by state, rates and trends.
    #[command(after_help = top::TOP_HELP)]
    Top(top::TopArgs),
    /// Serve servers' statistics at /metrics in the Prometheus text format.
    Exporter(exporter::ExporterArgs),
    /// Serve a dashboard of servers (both engines) on a loopback address, behind a token.
    Web(web::WebArgs),
    /// Measure enqueue throughput and latency.
    Bench(bench::BenchArgs),
    /// Run the reference server (for tests and demos; production uses beanstalkd).
    Serve(serve::ServeArgs),
    /// Enqueue a batch, work it off with one in-process worker, and report.
    Demo(demo::DemoArgs),
}

fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(warning) = taskq_worker::nats_cli::secrets_on_argv(&argv) {
        eprintln!("taskq: warning: {warning}");
    }
    let argv = access::lift(argv);
    let cli = match Cli::try_parse_from(argv) {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version are not failures.
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    if let Err(e) = access::init(&cli.nats) {
        eprintln!("taskq: {e}");
        return ExitCode::FAILURE;
    }
    let result = match cli.command {
        Cmd::Put(a) => return put::run(a),
        Cmd::Stats(a) => stats::run(a),
        Cmd::Tubes(a) => admin::tubes(a),
        Cmd::Peek(a) => admin::peek(a),
        Cmd::Kick(a) => admin::kick(a),
        Cmd::KickJob(a) => admin::kick_job(a),
        Cmd::Delete(a) => admin::delete(a),
        Cmd::Pause(a) => admin::pause(a),
        Cmd::Top(a) => return top::run(a),
        Cmd::Exporter(a) => exporter::run(a),
        Cmd::Web(a) => web::run(a),
        Cmd::Bench(a) => bench::run(a),
        Cmd::Serve(a) => serve::run(a),
        Cmd::Demo(a) => demo::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("taskq: {e}");
            ExitCode::FAILURE
        }
    }
}
