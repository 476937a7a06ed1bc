//! `taskq serve`.

use crate::CliResult;

/// Arguments of `taskq serve`.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Server address; defaults to $TASKQ_ADDR, then 127.0.0.1:11300.
    #[arg(long)]
    pub addr: Option<String>,
    /// Limit on each reply, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub io_timeout: u64,
}

/// Runs `taskq serve`.
pub fn run(_args: ServeArgs) -> CliResult {
    Err("not implemented yet".into())
}
