//! The nodes a client found speaking TLS, held to it from then on (as a
//! browser holds a site to HTTPS once told to): the server's `INFO`, which
//! says whether TLS is required, comes in the clear, so without this anyone
//! on the way of a later connection could take `tls_required` out of it and
//! read the credentials of a `nats://` address in the clear.
//!
//! A node is held when a connection to it finished its handshake over TLS,
//! with the nodes that connection learned (told over TLS, so trusted as
//! much). What is held is shared by every clone of the settings (a
//! producer's or a worker's successive connections), not by the process:
//! settings made anew start with nothing held.

use std::sync::{Arc, Mutex, MutexGuard};

/// At most this many nodes are held: a client talks to a cluster or a few.
/// Past it the oldest is let go (that node is then upgraded when it asks,
/// as before it ever spoke TLS).
const MAX_HELD: usize = 1024;

/// The nodes (`IP:PORT`) held to TLS, shared by the clones of one client's
/// settings. Settings compare equal whatever their clients have seen.
#[derive(Clone, Default)]
pub struct TlsPins(Arc<Mutex<Vec<String>>>);

impl TlsPins {
    fn held(&self) -> MutexGuard<'_, Vec<String>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// True when node `addr` (`IP:PORT`) spoke TLS to this client before:
    /// a connection to it must too, whatever its `INFO` says.
    pub fn wants_tls(&self, addr: &str) -> bool {
        self.held().iter().any(|a| a == addr)
    }

    /// A connection to `addr` finished its handshake over TLS and learned
    /// `servers` over it: each of them is held to TLS from now on.
    pub fn spoke_tls(&self, addr: &str, servers: &[String]) {
        let mut held = self.held();
        for a in std::iter::once(addr).chain(servers.iter().map(String::as_str)) {
            if !held.iter().any(|x| x == a) {
                if held.len() == MAX_HELD {
                    held.remove(0);
                }
                held.push(a.to_owned());
            }
        }
    }
}

impl std::fmt::Debug for TlsPins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TlsPins({} held)", self.held().len())
    }
}

impl PartialEq for TlsPins {
    fn eq(&self, _: &TlsPins) -> bool {
        true
    }
}

impl Eq for TlsPins {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_that_spoke_tls_is_held_to_it_with_the_nodes_it_told_of() {
        let pins = TlsPins::default();
        let clone = pins.clone();
        assert!(!pins.wants_tls("192.0.2.1:4222"));
        clone.spoke_tls("192.0.2.1:4222", &["192.0.2.2:4222".to_owned()]);
        assert!(
            pins.wants_tls("192.0.2.1:4222"),
            "clones share what is held"
        );
        assert!(pins.wants_tls("192.0.2.2:4222"));
        assert!(
            !pins.wants_tls("192.0.2.1:4223"),
            "another port is another node"
        );
        assert!(
            !TlsPins::default().wants_tls("192.0.2.1:4222"),
            "new settings hold nothing"
        );
        // Bounded: the oldest goes first.
        for i in 0..MAX_HELD {
            pins.spoke_tls(&format!("198.51.100.1:{}", 1 + i), &[]);
        }
        assert!(!pins.wants_tls("192.0.2.1:4222"));
        assert!(pins.wants_tls(&format!("198.51.100.1:{MAX_HELD}")));
        assert_eq!(pins.held().len(), MAX_HELD);
    }
}
