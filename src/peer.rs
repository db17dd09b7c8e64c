//! Raft peer traffic over tonic, on the raft port. TRUSTED PEERS ONLY.
//!
//! - [`PeerClients`] / [`PeerConn`]: outbound. openraft's `RaftNetwork`,
//!   plus `forward` (writes, membership changes and read-index requests from a
//!   follower to the leader) and `status`.
//! - [`PeerService`]: inbound, hands RPCs to the local raft or node.
//!
//! Payloads are `store::codec` blobs of openraft's own request and response
//! types. A connection failure becomes `Unreachable`, so openraft backs off
//! and retries instead of treating it as a remote error.

use crate::error::Error;
use crate::node::{ForwardReply, ForwardRequest, Node, NodeStatus};
use crate::proto::peer::raft_peer_client::RaftPeerClient;
use crate::proto::peer::raft_peer_server::{RaftPeer, RaftPeerServer};
use crate::proto::peer::Payload;
use crate::store::codec;
use crate::store::types::{NodeId, NodeInfo, TypeConfig};
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest, VoteResponse};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

/// Peer messages can hold many log entries or a snapshot chunk.
pub const MAX_PEER_MESSAGE: usize = 64 * 1024 * 1024;

#[derive(Debug, Clone, Copy)]
enum Method {
    Append,
    Snapshot,
    Vote,
    Forward,
    Status,
}

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

/// One lazily connected channel per peer address, shared by raft and
/// forwarding.
#[derive(Clone, Default)]
pub struct PeerClients {
    channels: Arc<Mutex<HashMap<String, Channel>>>,
}

impl PeerClients {
    fn channel(&self, addr: &str) -> Result<Channel, PeerError> {
        let mut map = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = map.get(addr) {
            return Ok(c.clone());
        }
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| PeerError::Unreachable { addr: addr.into(), msg: e.to_string() })?
            .connect_timeout(Duration::from_secs(1))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5));
        let channel = endpoint.connect_lazy();
        map.insert(addr.to_string(), channel.clone());
        Ok(channel)
    }

    async fn call(&self, addr: &str, method: Method, data: Vec<u8>, timeout: Duration) -> Result<Vec<u8>, PeerError> {
        let mut client = RaftPeerClient::new(self.channel(addr)?).max_decoding_message_size(MAX_PEER_MESSAGE).max_encoding_message_size(MAX_PEER_MESSAGE);
        let mut req = Request::new(Payload { data });
        req.set_timeout(timeout);
        let res = match method {
            Method::Append => client.append_entries(req).await,
            Method::Snapshot => client.install_snapshot(req).await,
            Method::Vote => client.vote(req).await,
            Method::Forward => client.forward(req).await,
            Method::Status => client.status(req).await,
        };
        match res {
            Ok(r) => Ok(r.into_inner().data),
            // tonic reports connect failures as UNAVAILABLE.
            Err(s) if s.code() == tonic::Code::Unavailable => Err(PeerError::Unreachable { addr: addr.into(), msg: s.message().to_string() }),
            Err(s) => Err(PeerError::Failed { addr: addr.into(), msg: format!("{}: {}", s.code(), s.message()) }),
        }
    }

    async fn typed<Req: Serialize, Resp: DeserializeOwned>(&self, addr: &str, method: Method, req: &Req, timeout: Duration) -> Result<Resp, PeerError> {
        let bytes = self.call(addr, method, codec::encode(req), timeout).await?;
        codec::decode(&bytes).map_err(|e| PeerError::Failed { addr: addr.into(), msg: format!("undecodable reply: {e}") })
    }

    /// Send a request to the leader's node; the reply is the leader's.
    pub async fn forward(&self, addr: &str, req: &ForwardRequest, timeout: Duration) -> Result<Result<ForwardReply, Error>, PeerError> {
        self.typed(addr, Method::Forward, req, timeout).await
    }

    pub async fn status(&self, addr: &str, timeout: Duration) -> Result<NodeStatus, PeerError> {
        self.typed(addr, Method::Status, &(), timeout).await
    }
}

/// openraft's view of the network.
#[derive(Clone, Default)]
pub struct NetworkFactory {
    pub clients: PeerClients,
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerConn;

    async fn new_client(&mut self, target: NodeId, node: &NodeInfo) -> PeerConn {
        PeerConn { target, addr: node.raft_addr.clone(), clients: self.clients.clone() }
    }
}

pub struct PeerConn {
    target: NodeId,
    addr: String,
    clients: PeerClients,
}

type RpcResult<T, E> = Result<T, RPCError<NodeId, NodeInfo, RaftError<NodeId, E>>>;

impl PeerConn {
    async fn raft_rpc<Req, T, E>(&self, method: Method, req: &Req, option: &RPCOption) -> RpcResult<T, E>
    where
        Req: Serialize,
        T: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let reply: Result<T, RaftError<NodeId, E>> = match self.clients.typed(&self.addr, method, req, option.hard_ttl()).await {
            Ok(r) => r,
            Err(e @ PeerError::Unreachable { .. }) => return Err(RPCError::Unreachable(Unreachable::new(&e))),
            Err(e @ PeerError::Failed { .. }) => return Err(RPCError::Network(NetworkError::new(&e))),
        };
        reply.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for PeerConn {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, openraft::error::Infallible> {
        self.raft_rpc(Method::Append, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        self.raft_rpc(Method::Snapshot, &rpc, &option).await
    }

    async fn vote(&mut self, rpc: VoteRequest<NodeId>, option: RPCOption) -> RpcResult<VoteResponse<NodeId>, openraft::error::Infallible> {
        self.raft_rpc(Method::Vote, &rpc, &option).await
    }
}

/// Inbound peer RPCs. Holds the node weakly: the server must not keep a
/// shut-down node alive.
pub struct PeerService {
    node: Weak<Node>,
}

impl PeerService {
    pub fn server(node: &Arc<Node>) -> RaftPeerServer<PeerService> {
        RaftPeerServer::new(PeerService { node: Arc::downgrade(node) }).max_decoding_message_size(MAX_PEER_MESSAGE).max_encoding_message_size(MAX_PEER_MESSAGE)
    }

    fn node(&self) -> Result<Arc<Node>, Status> {
        self.node.upgrade().ok_or_else(|| Status::unavailable("shutting down"))
    }
}

fn decode_req<T: DeserializeOwned>(req: Request<Payload>) -> Result<T, Status> {
    codec::decode(&req.into_inner().data).map_err(|e| Status::invalid_argument(format!("undecodable peer payload: {e}")))
}

fn reply<T: Serialize>(value: &T) -> Result<Response<Payload>, Status> {
    Ok(Response::new(Payload { data: codec::encode(value) }))
}

#[tonic::async_trait]
impl RaftPeer for PeerService {
    async fn append_entries(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        let rpc: AppendEntriesRequest<TypeConfig> = decode_req(req)?;
        reply(&self.node()?.raft.append_entries(rpc).await)
    }

    async fn install_snapshot(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        let rpc: InstallSnapshotRequest<TypeConfig> = decode_req(req)?;
        reply(&self.node()?.raft.install_snapshot(rpc).await)
    }

    async fn vote(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        let rpc: VoteRequest<NodeId> = decode_req(req)?;
        reply(&self.node()?.raft.vote(rpc).await)
    }

    async fn forward(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        let fwd: ForwardRequest = decode_req(req)?;
        reply(&self.node()?.handle_forward(fwd).await)
    }

    async fn status(&self, _req: Request<Payload>) -> Result<Response<Payload>, Status> {
        reply(&self.node()?.local_status())
    }
}
