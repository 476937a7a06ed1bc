//! Keeping a server and a bench off each other's CPU, so that a ratio
//! measured on a small machine is the client's cost, not the scheduler's.

/// Runs `pid` (all its threads) on CPU `cpu` only; false when that failed.
pub fn pin(pid: u32, cpu: usize) -> bool {
    std::process::Command::new("taskset")
        .args(["-a", "-pc", &cpu.to_string(), &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
