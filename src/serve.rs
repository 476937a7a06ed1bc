//! `taskq serve`: the reference server from taskq-testkit, for tests and demos.
//! Production uses beanstalkd.

use std::net::{SocketAddr, ToSocketAddrs};

use taskq_testkit::{ServerConfig, TestServer};

use crate::cli::CliResult;

/// Arguments of `taskq serve`.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:11300")]
    pub addr: String,
    /// Largest job body accepted, in bytes (beanstalkd's -z).
    #[arg(short = 'z', long = "max-job-size", default_value_t = taskq_proto::DEFAULT_MAX_JOB_SIZE)]
    pub max_job_size: usize,
}

/// Runs `taskq serve` until SIGINT or SIGTERM, then stops the server and exits 0.
/// The queue lives in memory and goes with the process, as beanstalkd's does
/// without a binlog.
pub fn run(args: ServeArgs) -> CliResult {
    let addr: SocketAddr = args
        .addr
        .to_socket_addrs()
        .map_err(|e| format!("bad address {}: {e}", args.addr))?
        .next()
        .ok_or_else(|| format!("address {} resolves to nothing", args.addr))?;
    if args.max_job_size > 1 << 30 {
        return Err("the maximum job size is 1 GiB (1073741824 bytes)".into());
    }
    let server = TestServer::start_with(
        ServerConfig::default()
            .addr(addr)
            .max_job_size(args.max_job_size),
    )
    .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    eprintln!(
        "taskq serve: listening on {} (max job size {} bytes); the reference server is for tests and demos",
        server.addr(),
        args.max_job_size
    );
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .map_err(|e| format!("cannot handle signals: {e}"))?;
    let signal = signals
        .forever()
        .next()
        .unwrap_or(signal_hook::consts::SIGTERM);
    let left = server.job_count();
    server.stop();
    eprintln!("taskq serve: stopped by signal {signal}; {left} jobs were in memory");
    Ok(())
}
