//! How `Node` reaches its peers: a trait, so the core names no transport.
//! `peer::PeerClients` implements it over tonic on the raft port; the
//! arrow points from the transport to the core, never back.

use super::messages::{ForwardReply, ForwardRequest, NodeStatus};
use crate::error::Error;
use crate::store::types::NodeId;
use futures::future::BoxFuture;
use std::time::Duration;

/// Transport outcome of one peer call.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// Not connected: the request was not delivered.
    #[error("peer {addr} unreachable: {msg}")]
    Unreachable { addr: String, msg: String },
    /// Sent, but no (valid) answer: the outcome is unknown.
    #[error("peer {addr}: {msg}")]
    Failed { addr: String, msg: String },
}

/// Calls to another replica: member `id` at its raft address (with TLS, the
/// transport checks that the peer's certificate names that member).
pub trait Transport: Send + Sync + 'static {
    /// Send a request to another replica's node; the reply is that
    /// replica's answer (its own errors inside, transport errors outside).
    fn forward<'a>(
        &'a self,
        id: NodeId,
        addr: &'a str,
        req: &'a ForwardRequest,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Result<ForwardReply, Error>, PeerError>>;

    /// Another replica's status (`replica::Replica::local_status`).
    fn status<'a>(&'a self, id: NodeId, addr: &'a str, timeout: Duration) -> BoxFuture<'a, Result<NodeStatus, PeerError>>;
}
