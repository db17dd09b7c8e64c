//! The audit log: one JSON line per write and per refusal (who, what, the
//! revision, the outcome), to a file or stderr.
//!
//! Off the write path: requests hand events to a bounded channel without
//! waiting, and a thread of its own writes them (blocking file IO has no
//! business on the runtime's workers). When the channel is full the event
//! is dropped and `lodestar_audit_dropped_total` counts it. Events carry
//! accessor ids and certificate identities, never a secret.

use serde::Serialize;
use std::io::Write;
use std::path::Path;
use tokio::sync::mpsc;

/// Events waiting for the writer before new ones are dropped.
const QUEUE: usize = 4096;

/// One line of the audit log.
#[derive(Debug, Clone, Serialize)]
pub struct AuditEvent {
    /// RFC 3339 UTC, milliseconds.
    pub time: String,
    /// The replica that received the request.
    pub replica: u64,
    /// `token:<accessor>`, `identity:<name>`, `initial-management`,
    /// `unknown-token` or `anonymous`.
    pub who: String,
    /// The route (`POST /v1/apply`) or gRPC method.
    pub op: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verb: Option<&'static str>,
    /// What was touched: `kind/namespace/name` keys, or permissions.
    pub resources: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
    /// `ok`, `failed` (allowed, but the write failed), `unauthenticated`,
    /// `denied`.
    pub outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl AuditEvent {
    /// An event stamped now; set the other fields with struct update syntax.
    pub fn new(who: String, op: &str, outcome: &'static str) -> AuditEvent {
        AuditEvent { time: now_text(), replica: 0, who, op: op.to_string(), verb: None, resources: Vec::new(), revision: None, outcome, reason: None }
    }
}

/// The sending side; cheap to share.
#[derive(Clone)]
pub struct AuditLog {
    tx: mpsc::Sender<AuditEvent>,
}

impl AuditLog {
    /// Start the writer: append to `path`, or stderr when it is `None`.
    pub fn start(path: Option<&Path>) -> std::io::Result<AuditLog> {
        let mut out: Box<dyn Write + Send> = match path {
            Some(p) => Box::new(std::fs::OpenOptions::new().create(true).append(true).open(p)?),
            None => Box::new(std::io::stderr()),
        };
        let (tx, mut rx) = mpsc::channel::<AuditEvent>(QUEUE);
        std::thread::Builder::new().name("audit-log".into()).spawn(move || {
            // Ends when every sender is gone (the replica stopped).
            while let Some(first) = rx.blocking_recv() {
                let mut buf = Vec::new();
                let mut next = Some(first);
                while let Some(e) = next {
                    if serde_json::to_writer(&mut buf, &e).is_ok() {
                        buf.push(b'\n');
                    }
                    next = rx.try_recv().ok();
                }
                if let Err(e) = out.write_all(&buf).and_then(|_| out.flush()) {
                    tracing::error!(error = %e, "writing the audit log");
                }
            }
        })?;
        Ok(AuditLog { tx })
    }

    /// Queue an event; never waits.
    pub fn record(&self, event: AuditEvent) {
        if self.tx.try_send(event).is_err() {
            crate::metrics::metrics().audit_dropped.inc();
        }
    }
}

// Now, as the audit log (and the JSON log) writes it: with the log lines,
// so that `logging` needs no `auth`; its old path stays.
pub use crate::logging::now_text;
