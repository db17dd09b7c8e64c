//! The binary's log: human lines (colour only on a terminal, never with
//! `NO_COLOR`) or JSON lines (`--log-format json`), to stderr, one event
//! per line whatever the events carry. Verbosity is `RUST_LOG`. The audit
//! log is not here: it has its own writer (`auth::audit`) and, under
//! systemd, its own file.
//!
//! Log fields carry strings from clients: node ids, node metadata, NACK
//! texts, request paths, token descriptions, certificate identities and the
//! error messages that quote them. A newline in one would start a line
//! that looks like the replica's own; an ANSI sequence would rewrite the
//! terminal of whoever reads the log. So in the text format every field
//! (the message included, of spans and events alike) is written through
//! [`EscapedFields`], which escapes control characters as Rust's `Debug`
//! does (`\n`, `\u{1b}`), at the one place they reach the log, instead of
//! at each of the many call sites that may pass client text. The JSON
//! format escapes them as JSON does (`\n`, `\u001b`): each event stays one
//! line, and a field is the client's text, whole, once parsed.

use std::fmt;
use std::io::IsTerminal;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::{DefaultFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// `--log-format`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One line per event for people: time, level, module, message, fields.
    #[default]
    Text,
    /// One JSON object per line: `time`, `level`, `target`, `message`, the
    /// event's fields, and `spans` (names, outermost first).
    Json,
}

/// The default verbosity when `RUST_LOG` is unset.
pub const DEFAULT_FILTER: &str = "info,openraft=warn,sled=warn";

/// Colour escapes only for a person at a terminal (<https://no-color.org>):
/// a log file or journald would keep the escape sequences as they are.
pub fn colour(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Install the process's log subscriber (once, at startup): stderr,
/// filtered by `RUST_LOG` (else [`DEFAULT_FILTER`]), every field escaped.
pub fn init(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| DEFAULT_FILTER.into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).fmt_fields(EscapedFields::default()).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(colour(std::io::stderr().is_terminal(), std::env::var_os("NO_COLOR").as_deref())).init(),
        LogFormat::Json => builder.with_ansi(false).event_format(Json).init(),
    }
}

/// Items for a log field, `a, b, c`: a list's Rust Debug form (`[1, 2]`,
/// `["x"]`) is not for people.
pub fn list<T: fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
    items.into_iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
}

/// A duration for a log line: `5s`, `0.25s`.
pub fn secs(d: std::time::Duration) -> String {
    format!("{}s", d.as_secs_f64())
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

/// The JSON line format: no dependency beyond serde_json, which the API
/// uses already. serde_json escapes control characters in strings, so an
/// event is one line whatever its fields hold.
struct Json;

impl<S, N> FormatEvent<S, N> for Json
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let meta = event.metadata();
        let mut line = serde_json::Map::new();
        line.insert("time".into(), now_text().into());
        line.insert("level".into(), meta.level().as_str().into());
        line.insert("target".into(), meta.target().into());
        event.record(&mut Fields(&mut line));
        if let Some(scope) = ctx.event_scope() {
            let spans: Vec<serde_json::Value> = scope.from_root().map(|s| s.name().into()).collect();
            if !spans.is_empty() {
                line.insert("spans".into(), spans.into());
            }
        }
        writeln!(writer, "{}", serde_json::Value::Object(line))
    }
}

/// An event's fields as JSON values: numbers and booleans as such,
/// everything else as its text (`%` Display, `?` Debug, as logged).
struct Fields<'a>(&'a mut serde_json::Map<String, serde_json::Value>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().to_string(), format!("{value:?}").into());
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_string(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_string(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_string(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().to_string(), value.into());
    }
}

/// Now, as the JSON log and the audit log write it (RFC 3339, UTC,
/// milliseconds).
pub fn now_text() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let t = crate::model::acl::format_rfc3339(now.as_secs());
    format!("{}.{:03}Z", t.trim_end_matches('Z'), now.subsec_millis())
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

    impl Buffer {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    /// A node id that tries to end the line, forge the next one, colour
    /// the terminal and reverse the text.
    const EVIL: &str = "evil\n2026-01-01T00:00:00Z  INFO lodestar: forged\x1b[31m\u{202e}";

    /// The log [`EVIL`] makes through the subscriber `init` installs: text
    /// (with or without colour) or JSON.
    fn log_evil(format: LogFormat, ansi: bool) -> String {
        let out = Buffer::default();
        let writer = out.clone();
        let builder = tracing_subscriber::fmt().fmt_fields(EscapedFields::default()).with_ansi(ansi).with_writer(move || writer.clone());
        let log = || {
            let span = tracing::info_span!("stream", node = %EVIL);
            let _in = span.enter();
            tracing::warn!(proxy = %EVIL, debug = ?EVIL, "opened {EVIL}");
        };
        match format {
            LogFormat::Text => tracing::subscriber::with_default(builder.finish(), log),
            LogFormat::Json => tracing::subscriber::with_default(builder.event_format(Json).finish(), log),
        }
        out.text()
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        assert!(colour(true, None));
        assert!(!colour(false, None), "a file or pipe gets no escapes");
        assert!(!colour(true, Some(OsStr::new("1"))), "NO_COLOR turns colour off");
        assert!(colour(true, Some(OsStr::new(""))), "an empty NO_COLOR is unset (no-color.org)");
    }

    /// The node id stays one escaped line, in a Display field, a Debug
    /// field, a span field and the message; with colour on (a terminal)
    /// too: the only escape sequences are then the subscriber's styling.
    #[test]
    fn control_characters_in_fields_cannot_forge_lines() {
        for ansi in [false, true] {
            let text = log_evil(LogFormat::Text, ansi);
            assert_eq!(text.lines().count(), 1, "{text}");
            assert!(!text.contains("\x1b[31m") && !text.contains('\u{202e}') && (ansi || !text.contains('\x1b')), "{text:?}");
            assert!(text.contains(r"evil\n2026-01-01T00:00:00Z  INFO lodestar: forged\u{1b}[31m\u{202e}"), "{text}");
            assert!(text.contains(r"opened evil\n2026"), "{text}");
        }
        let text = log_evil(LogFormat::Text, false);
        assert!(text.contains(r"proxy=evil\n2026"), "{text}");
        assert!(text.contains(r"stream{node=evil\n2026"), "{text}");
    }

    /// `--log-format json`: one JSON object per event; control characters
    /// are JSON's escapes, and the parsed field is the client's text whole.
    #[test]
    fn json_lines_hold_the_text_whole() {
        let text = log_evil(LogFormat::Json, false);
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(!text.contains('\x1b'), "{text:?}");
        let line: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(line["proxy"], EVIL);
        assert_eq!(line["debug"], format!("{EVIL:?}"));
        assert_eq!(line["message"], format!("opened {EVIL}"));
        assert_eq!(line["level"], "WARN");
        assert_eq!(line["spans"], serde_json::json!(["stream"]));
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
