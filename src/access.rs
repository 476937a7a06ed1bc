//! Credentials and TLS for every subcommand that connects to NATS, read once
//! in `main`: the `nats` CLI's flags, environment and context
//! ([`NatsArgs`]), and the user info of `nats://USER:PASS@HOST` addresses.
//!
//! Before the arguments are parsed, the user info is taken out of every
//! address on the command line and in `$TASKQ_ADDR` and kept here, so that
//! no address a subcommand holds, prints, labels a metric with or puts in
//! JSON carries a secret. Connections get it back through [`for_address`].

use std::ffi::OsString;
use std::sync::OnceLock;

use taskq_connect::nats::NatsAccess;
use taskq_connect::Address;
use taskq_worker::nats_cli::NatsArgs;

/// Addresses given with user info: each as it is left without it, and as given.
static LIFTED: OnceLock<Vec<(Address, Address)>> = OnceLock::new();
/// From the flags, the environment and the context.
static BASE: OnceLock<NatsAccess> = OnceLock::new();

/// Takes the user info out of the addresses in `argv` (`--addr A`,
/// `--addr=A`) and in `$TASKQ_ADDR`, and, when a `nats` CLI context with a
/// url is selected and no address is given, makes that url `$TASKQ_ADDR`.
/// Returns the arguments to parse. Runs before any thread starts.
pub fn lift(argv: Vec<OsString>) -> Vec<OsString> {
    let mut lifted = Vec::new();
    let given = argv.iter().any(|a| {
        a.to_str()
            .is_some_and(|s| s == "--addr" || s.starts_with("--addr="))
    }) || std::env::var_os("TASKQ_ADDR").is_some_and(|v| !v.is_empty());
    if !given {
        if let Some(url) = context_url(&argv) {
            set_addr_env(&taskq_worker::nats_cli::context_address(&url));
        }
    }
    if let Ok(env) = std::env::var("TASKQ_ADDR") {
        let clean = strip(&env, &mut lifted);
        if clean != env {
            set_addr_env(&clean);
        }
    }
    let mut out = Vec::with_capacity(argv.len());
    let mut next_is_addr = false;
    for a in argv {
        let Some(s) = a.to_str() else {
            out.push(a);
            next_is_addr = false;
            continue;
        };
        let s = if next_is_addr {
            strip(s, &mut lifted)
        } else if let Some(v) = s.strip_prefix("--addr=") {
            format!("--addr={}", strip(v, &mut lifted))
        } else {
            s.to_owned()
        };
        next_is_addr = s == "--addr";
        out.push(OsString::from(s));
    }
    let _ = LIFTED.set(lifted);
    out
}

/// `$TASKQ_ADDR` for this process (read by the subcommands' `--addr`).
fn set_addr_env(v: &str) {
    // Single-threaded here: `main` calls `lift` before anything else runs.
    std::env::set_var("TASKQ_ADDR", v);
}

/// `addr` without user info (kept in `lifted`); anything else as it is.
/// An address with user info that does not parse ends the command here,
/// named redacted: passed on, it would be split or echoed, its password
/// with it, by whatever reads it next.
fn strip(addr: &str, lifted: &mut Vec<(Address, Address)>) -> String {
    match Address::parse(addr) {
        Ok(a) if a.user_info().is_some() => {
            let clean = a.without_credentials();
            let shown = clean.to_string();
            lifted.push((clean, a));
            shown
        }
        Err(e) if addr.contains('@') => {
            eprintln!("taskq: {}: {e}", taskq_connect::redact_address(addr));
            std::process::exit(2);
        }
        _ => addr.to_owned(),
    }
}

/// The url of the context `--context NAME` (or `$NATS_CONTEXT`) selects.
fn context_url(argv: &[OsString]) -> Option<String> {
    let mut name = std::env::var("NATS_CONTEXT").ok().filter(|s| !s.is_empty());
    let mut it = argv.iter().filter_map(|a| a.to_str());
    while let Some(a) = it.next() {
        if a == "--context" {
            name = it.next().map(str::to_owned);
        } else if let Some(v) = a.strip_prefix("--context=") {
            name = Some(v.to_owned());
        }
    }
    let env = |k: &str| std::env::var(k).ok();
    taskq_worker::nats_cli::Context::load(&name?, &env)
        .ok()?
        .url
}

/// Reads the flags, the environment and the context into the settings
/// every connection starts from.
pub fn init(args: &NatsArgs) -> Result<(), String> {
    let (base, _) = args.from_env()?;
    BASE.set(base)
        .map_err(|_| "the NATS settings were read twice".to_owned())
}

/// The settings for a connection to `addr`: the flags', environment's and
/// context's, with the user info of the address as it was given.
pub fn for_address(addr: &Address) -> NatsAccess {
    let base = BASE.get().cloned().unwrap_or_default();
    let given = LIFTED
        .get()
        .and_then(|l| l.iter().find(|(clean, _)| clean == addr))
        .map_or(addr, |(_, given)| given);
    base.for_address(given)
}

/// The settings for the address string `addr` (see [`for_address`]).
pub fn for_str(addr: &str) -> NatsAccess {
    match Address::parse(addr) {
        Ok(a) => for_address(&a),
        Err(_) => BASE.get().cloned().unwrap_or_default(),
    }
}
