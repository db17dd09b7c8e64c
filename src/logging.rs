//! The binary's log: human lines (colour only on a terminal, never with
//! `NO_COLOR`) or JSON lines (`--log-format json`), to stderr. Verbosity is
//! `RUST_LOG`. The audit log is not here: it has its own writer
//! (`auth::audit`) and, under systemd, its own file.

use std::fmt;
use std::io::IsTerminal;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
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

/// Colour escapes only for a person at a terminal (<https://no-color.org>).
pub fn colour(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Install the process's log subscriber (once, at startup).
pub fn init(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| DEFAULT_FILTER.into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
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

/// The JSON line format: no dependency beyond serde_json, which the API
/// uses already.
struct Json;

impl<S, N> FormatEvent<S, N> for Json
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let meta = event.metadata();
        let mut line = serde_json::Map::new();
        line.insert("time".into(), crate::auth::audit::now_text().into());
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

#[cfg(test)]
mod tests {
    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        assert!(super::colour(true, None));
        assert!(!super::colour(false, None), "a file or pipe gets no escapes");
        assert!(!super::colour(true, Some(OsStr::new("1"))), "NO_COLOR turns colour off");
        assert!(super::colour(true, Some(OsStr::new(""))), "an empty NO_COLOR is unset (no-color.org)");
    }
}
