//! One error vocabulary for the whole server.
//!
//! Every failure that can reach a client is an [`Error`] with a [`Code`]. The
//! code decides the HTTP status (REST) and the gRPC status code, in one place
//! each (`api::rest` and `api::grpc`), so the two APIs never disagree about
//! what went wrong. Errors are serializable because a follower forwards writes
//! to the leader and relays the leader's answer verbatim.

use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Code {
    /// Bad input: malformed document, wrong type, unknown kind, too large.
    InvalidArgument,
    /// The named resource does not exist.
    NotFound,
    /// An `expectedRevision` precondition did not hold.
    Conflict,
    /// A watch asked for history that has been compacted away.
    Compacted,
    /// No leader, no quorum, or the replica is shutting down: retry later.
    Unavailable,
    /// A bug or a storage failure.
    Internal,
    /// No credential, or one that is unknown, expired or revoked (ACLs).
    Unauthenticated,
    /// A valid credential that lacks a permission the request needs; the
    /// message names it (ACLs).
    PermissionDenied,
    /// The replica is at a limit it keeps to stay responsive (e.g. the
    /// mesh CA's queue): nothing was done; retry after a backoff, here or
    /// on another replica. Last, so older peers decode the others.
    ResourceExhausted,
    /// The cluster cannot do this yet: a write that needs a newer cluster
    /// version than the cluster runs (`node::version`), refused before it
    /// is proposed. Made only on the replica that the client called, so it
    /// never crosses the raft port to a peer of wire version 1 (which
    /// could not decode it).
    FailedPrecondition,
}

impl Code {
    pub fn http_status(self) -> u16 {
        match self {
            Code::InvalidArgument => 400,
            Code::NotFound => 404,
            Code::Conflict => 409,
            Code::Compacted => 410,
            Code::Unavailable => 503,
            Code::Internal => 500,
            Code::Unauthenticated => 401,
            Code::PermissionDenied => 403,
            Code::ResourceExhausted => 429,
            Code::FailedPrecondition => 412,
        }
    }

    /// The gRPC status code (its number: this module knows no tonic;
    /// `api::grpc::status_of` makes the status).
    pub fn grpc_code(self) -> i32 {
        match self {
            Code::InvalidArgument => 3,
            Code::NotFound => 5,
            Code::Conflict => 10,  // ABORTED
            Code::Compacted => 11, // OUT_OF_RANGE
            Code::Unavailable => 14,
            Code::Internal => 13,
            Code::Unauthenticated => 16,
            Code::PermissionDenied => 7,
            Code::ResourceExhausted => 8,
            Code::FailedPrecondition => 9,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Code::InvalidArgument => "InvalidArgument",
            Code::NotFound => "NotFound",
            Code::Conflict => "Conflict",
            Code::Compacted => "Compacted",
            Code::Unavailable => "Unavailable",
            Code::Internal => "Internal",
            Code::Unauthenticated => "Unauthenticated",
            Code::PermissionDenied => "PermissionDenied",
            Code::ResourceExhausted => "ResourceExhausted",
            Code::FailedPrecondition => "FailedPrecondition",
        }
    }
}

/// A problem with one field of the input, named by its path
/// (`resources[2].metadata.name`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldError {
    pub field: String,
    pub reason: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        FieldError { field: field.into(), reason: reason.into() }
    }

    /// Prefix the path, e.g. with `resources[3]`.
    pub fn under(mut self, prefix: &str) -> Self {
        self.field = if self.field.is_empty() {
            prefix.to_string()
        } else if self.field.starts_with('[') {
            format!("{prefix}{}", self.field)
        } else {
            format!("{prefix}.{}", self.field)
        };
        self
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    pub code: Code,
    pub message: String,
    /// For `InvalidArgument`: every field that is wrong, not just the first.
    pub fields: Vec<FieldError>,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Error { code, message: message.into(), fields: Vec::new() }
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }
    pub fn invalid_fields(fields: Vec<FieldError>) -> Self {
        let message = match fields.as_slice() {
            [one] => one.to_string(),
            many => {
                let list: Vec<String> = many.iter().map(|f| f.to_string()).collect();
                format!("{} invalid fields: {}", many.len(), list.join("; "))
            }
        };
        Error { code: Code::InvalidArgument, message, fields }
    }
    pub fn field(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::invalid_fields(vec![FieldError::new(field, reason)])
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(Code::NotFound, message)
    }
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(Code::Conflict, message)
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(Code::Unavailable, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Code::Internal, message)
    }
    pub fn unauthenticated(message: impl Into<String>) -> Self {
        Self::new(Code::Unauthenticated, message)
    }
    pub fn permission_denied(message: impl Into<String>) -> Self {
        Self::new(Code::PermissionDenied, message)
    }
    pub fn failed_precondition(message: impl Into<String>) -> Self {
        Error::new(Code::FailedPrecondition, message)
    }

    pub fn resource_exhausted(message: impl Into<String>) -> Self {
        Self::new(Code::ResourceExhausted, message)
    }
}
