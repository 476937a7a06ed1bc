//! Bytes made safe to show on a terminal or in a log: the one rule every
//! part of taskq uses for text it did not write itself (a server's error
//! text, a job body, a tube or stream name read back).
//!
//! A terminal takes control characters as commands (`ESC [2J` clears it, an
//! OSC sequence can set its title or write to the clipboard), and a log
//! reader takes `\n` as the start of another record: a hostile server could
//! forge either through an error text. So valid UTF-8 is kept, every control
//! character is escaped as Rust escapes it (`\u{1b}`, `\n`), and bytes that
//! are not UTF-8 are shown as `\xNN`.

/// The longest server text kept in an error, in characters; what is past it
/// is cut and marked with `…`.
pub const MAX_PEER_TEXT: usize = 512;

/// Appends `bytes` to `out` with its control characters escaped and its
/// invalid UTF-8 as `\xNN`; with `quoted`, `"` and `\` are escaped too (for
/// text shown inside quotes). Stops after `max` characters of `bytes` and
/// marks the cut with `…`.
pub fn push_printable(out: &mut String, bytes: &[u8], quoted: bool, max: usize) {
    let mut left = max;
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if left == 0 {
                out.push('…');
                return;
            }
            left -= 1;
            if c.is_control() || (quoted && (c == '"' || c == '\\')) {
                out.extend(c.escape_default());
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            if left == 0 {
                out.push('…');
                return;
            }
            left -= 1;
            out.push_str("\\x");
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 15)]));
        }
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// A server's text (an `-ERR` line, an API error's description) as an error
/// or a log may hold it: control characters escaped, at most
/// [`MAX_PEER_TEXT`] characters.
pub fn peer_text(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len().min(MAX_PEER_TEXT) + 8);
    push_printable(&mut s, bytes, false, MAX_PEER_TEXT);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_servers_text_cannot_command_a_terminal_or_forge_a_log_line() {
        let hostile = b"Authorization Violation\x1b]52;c;aGk=\x07\x1b[2J\r\nlevel=INFO forged";
        let shown = peer_text(hostile);
        assert!(!shown.chars().any(char::is_control), "{shown:?}");
        assert_eq!(
            shown,
            "Authorization Violation\\u{1b}]52;c;aGk=\\u{7}\\u{1b}[2J\\r\\nlevel=INFO forged"
        );
    }

    #[test]
    fn plain_text_is_kept_and_invalid_bytes_are_shown_as_hex() {
        assert_eq!(
            peer_text(b"Permissions Violation for Publish to \"x\""),
            "Permissions Violation for Publish to \"x\""
        );
        assert_eq!(
            peer_text("stream née \u{2603}".as_bytes()),
            "stream née \u{2603}"
        );
        assert_eq!(peer_text(b"a\xffb\xc3"), "a\\xffb\\xc3");
        let mut q = String::new();
        push_printable(&mut q, b"say \"hi\" \\ \t", true, 100);
        assert_eq!(q, "say \\\"hi\\\" \\\\ \\t");
    }

    #[test]
    fn a_long_text_is_cut_at_the_bound() {
        let long = vec![b'x'; 10 * MAX_PEER_TEXT];
        let shown = peer_text(&long);
        assert_eq!(shown.chars().count(), MAX_PEER_TEXT + 1);
        assert!(shown.ends_with('…'));
        let bad = vec![0xffu8; 2 * MAX_PEER_TEXT];
        assert!(peer_text(&bad).ends_with("\\xff…"));
        assert_eq!(
            peer_text(&long[..MAX_PEER_TEXT]).chars().count(),
            MAX_PEER_TEXT
        );
    }
}
