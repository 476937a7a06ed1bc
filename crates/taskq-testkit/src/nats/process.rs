//! Signals to a node's process, and what the kernel says of its threads:
//! kill(2) only queues a signal, so a node is known stopped (or running
//! again) once `/proc` shows every thread of it so.

use std::io;
use std::time::Duration;

/// How long [`NatsCluster::stop`](super::NatsCluster::stop) and
/// [`NatsCluster::cont`](super::NatsCluster::cont) wait for the kernel to stop
/// or resume every thread of a node.
pub(super) const SIGNAL_WAIT: Duration = Duration::from_secs(5);

/// Sends signal `sig` to process `pid` with kill(2).
pub(super) fn kill(pid: u32, sig: libc::c_int) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(io::Error::other)?;
    // SAFETY: kill(2) reads no memory of ours; it takes a pid and a signal number.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::kill(pid, sig) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The state letter of each thread of process `pid` (the field after the
/// command name in `/proc/PID/task/TID/stat`: `T` when stopped).
pub(super) fn thread_states(pid: u32) -> io::Result<Vec<u8>> {
    let mut states = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let stat = match std::fs::read(task?.path().join("stat")) {
            Ok(stat) => stat,
            // A thread that ended between the listing and the read.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        // The command name is in parentheses and may hold spaces: the state
        // follows the last ')'.
        let state = stat
            .iter()
            .rposition(|&b| b == b')')
            .and_then(|end| stat.get(end + 2).copied())
            .ok_or_else(|| io::Error::other("unreadable /proc stat line"))?;
        states.push(state);
    }
    Ok(states)
}

#[cfg(test)]
mod tests {
    use std::process::Command;
    use std::time::Instant;

    use super::*;

    #[test]
    fn thread_states_tell_a_stopped_process_from_a_running_one() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = libc::pid_t::try_from(child.id()).unwrap();
        let wait_for = |want: u8| {
            let until = Instant::now() + SIGNAL_WAIT;
            loop {
                let states = thread_states(child.id()).unwrap();
                if states.iter().all(|&s| s == want) && !states.is_empty() {
                    return states;
                }
                assert!(Instant::now() < until, "states {states:?}, want {want}");
                std::thread::sleep(Duration::from_millis(2));
            }
        };
        // SAFETY: kill(2) on our own child, with valid signal numbers.
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(pid, libc::SIGSTOP)
        };
        assert_eq!(wait_for(b'T'), b"T");
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(pid, libc::SIGCONT)
        };
        assert_eq!(wait_for(b'S'), b"S");
        child.kill().unwrap();
        child.wait().unwrap();
        let me = thread_states(std::process::id()).unwrap();
        assert!(!me.is_empty() && !me.contains(&b'T'), "{me:?}");
    }
}
