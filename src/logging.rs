//! The process's log (tracing to stderr), one event per line whatever the
//! events carry.
//!
//! Log fields carry strings from clients: node ids, node metadata, NACK
//! texts, request paths, token descriptions, certificate identities and the
//! error messages that quote them. A newline in one would start a line
//! that looks like the replica's own; an ANSI sequence would rewrite the
//! terminal of whoever reads the log. So every field (the message
//! included, of spans and events alike) is written through [`EscapedFields`],
//! which escapes control characters as Rust's `Debug` does (`\n`,
//! `\u{1b}`), at the one place they reach the log, instead of at each of the
//! many call sites that may pass client text.

use std::fmt;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::{DefaultFields, Writer};
use tracing_subscriber::fmt::FormatFields;

/// Logs to stderr, filtered by `RUST_LOG` (else `default_filter`), with
/// every field escaped ([`EscapedFields`]); coloured only on a terminal.
pub fn init(default_filter: &str) {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| default_filter.into()))
        .fmt_fields(EscapedFields::default())
        // Colours only for a terminal: a log file or journald would keep
        // the escape sequences as they are.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
}

/// tracing-subscriber's field format (`message key=value ...`), with control
/// characters and text-direction overrides in any of it escaped.
#[derive(Default)]
pub struct EscapedFields(DefaultFields);

impl<'w> FormatFields<'w> for EscapedFields {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut escaping = Escaping(&mut writer);
        // A writer without ANSI styling: nothing in the fields is ours to
        // colour, so any escape character in them is the client's.
        self.0.format_fields(Writer::new(&mut escaping), fields)
    }
}

/// Writes through to `W`, escaping what [`needs_escape`].
struct Escaping<'a, W: fmt::Write>(&'a mut W);

impl<W: fmt::Write> fmt::Write for Escaping<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut rest = s;
        while let Some((i, c)) = rest.char_indices().find(|(_, c)| needs_escape(*c)) {
            self.0.write_str(&rest[..i])?;
            match c.escape_debug() {
                // escape_debug leaves some format characters as they are.
                e if e.len() == 1 => write!(self.0, "{}", c.escape_unicode())?,
                e => write!(self.0, "{e}")?,
            }
            rest = &rest[i + c.len_utf8()..];
        }
        self.0.write_str(rest)
    }
}

/// Control characters (C0, DEL, C1: newlines, ESC), the line and
/// paragraph separators, and the bidirectional overrides that make a
/// terminal show text in another order than it is written.
fn needs_escape(c: char) -> bool {
    c.is_control() || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A node id that tries to end the line and forge the next one, and to
    /// colour the terminal, stays one escaped line, in a Display field, a
    /// Debug field, a span field and the message.
    #[test]
    fn control_characters_in_fields_cannot_forge_lines() {
        let out = Buffer::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::fmt().fmt_fields(EscapedFields::default()).with_ansi(false).with_writer(move || writer.clone()).finish();
        let id = "evil\n2026-01-01T00:00:00Z  INFO lodestar: forged\x1b[31m\u{202e}";
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("stream", node = %id);
            let _in = span.enter();
            tracing::warn!(proxy = %id, debug = ?id, "opened {id}");
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(!text.contains('\x1b') && !text.contains('\u{202e}'), "{text:?}");
        assert!(text.contains(r"proxy=evil\n2026-01-01T00:00:00Z  INFO lodestar: forged\u{1b}[31m\u{202e}"), "{text}");
        assert!(text.contains(r"opened evil\n2026"), "{text}");
        assert!(text.contains(r"stream{node=evil\n2026"), "{text}");
    }

    #[test]
    fn plain_text_is_written_as_it_is() {
        let mut out = String::new();
        fmt::Write::write_str(&mut Escaping(&mut out), "proxy=sidecar~10.0.0.1~a.b~b.svc.cluster.local é ✓").unwrap();
        assert_eq!(out, "proxy=sidecar~10.0.0.1~a.b~b.svc.cluster.local é ✓");
        out.clear();
        fmt::Write::write_str(&mut Escaping(&mut out), "a\tb\rc\u{7f}d\u{85}e").unwrap();
        assert_eq!(out, r"a\tb\rc\u{7f}d\u{85}e");
    }
}
