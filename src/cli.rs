//! What every command returns, in a file of its own so that the commands and
//! `main`, which dispatches to them, all take it from here.

/// Errors of the command line: printed as one line on stderr, exit status 1.
pub type CliResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;
