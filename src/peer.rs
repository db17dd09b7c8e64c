//! Raft peer traffic over tonic, on the raft port: members only (mutual
//! TLS; each message must come from the member its certificate names).
//!
//! - [`PeerClients`] / [`PeerConn`]: outbound. openraft's `RaftNetwork`,
//!   and `node::Transport` (`forward`: writes, membership changes and
//!   read-index requests from a follower to the leader; `status`), so the
//!   node reaches its peers without knowing this module.
//! - [`PeerService`]: inbound, hands RPCs to the local raft or replica.
//!
//! AppendEntries go on one long-lived stream per follower
//! (`AppendEntriesStream`), answered in order, one at a time as openraft
//! sends them: no new HTTP/2 stream, headers, trailers or server task per
//! replication round trip. A peer that lacks the stream gets unary calls.
//!
//! Payloads are `store::codec` blobs of openraft's own request and response
//! types. A connection failure becomes `Unreachable`, so openraft backs off
//! and retries instead of treating it as a remote error.

use crate::error::Error;
use crate::node::{ForwardReply, ForwardRequest, NodeStatus, PeerError, Transport};
use crate::proto::peer::raft_peer_client::RaftPeerClient;
use crate::proto::peer::raft_peer_server::{RaftPeer, RaftPeerServer};
use crate::proto::peer::Payload;
use crate::replica::Replica;
use crate::store::codec;
use crate::store::types::{NodeId, NodeInfo, TypeConfig};
use crate::tls::conn::ConnInfo;
use crate::tls::pki::member_name;
use crate::tls::{ClientTlsSource, PeerConnector, Tls};
use futures::future::BoxFuture;
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

/// One lazily connected channel per peer (member id and address), shared
/// by raft and forwarding. With TLS, a channel accepts only a certificate
/// that names the member it is for: a valid certificate of member 2 at
/// member 3's address is refused.
#[derive(Clone)]
pub struct PeerClients {
    tls: Option<Arc<ClientTlsSource>>,
    channels: Arc<Mutex<HashMap<(NodeId, String), Channel>>>,
}

impl PeerClients {
    /// `tls`: this replica's configuration (its certificate as the client
    /// certificate, the CA as roots); None for plaintext (`insecure`).
    pub fn new(tls: Option<Arc<Tls>>) -> PeerClients {
        PeerClients { tls: tls.map(|t| Arc::new(ClientTlsSource::Replica(t))), channels: Default::default() }
    }

    fn channel(&self, id: NodeId, addr: &str) -> Result<Channel, PeerError> {
        let mut map = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        let key = (id, addr.to_string());
        if let Some(c) = map.get(&key) {
            return Ok(c.clone());
        }
        let unreachable = |msg: String| PeerError::Unreachable { addr: addr.into(), msg };
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| unreachable(e.to_string()))?
            .connect_timeout(Duration::from_secs(1))
            // A backstop for calls in flight to a peer that went silent
            // (paused, or a partition that drops packets): the connection
            // is declared dead within about 4 s, not left hanging until
            // each call's deadline. (A forward to a leader that is replaced
            // is dropped sooner: see `node`.)
            .http2_keep_alive_interval(Duration::from_secs(1))
            .keep_alive_timeout(Duration::from_secs(3));
        let connector = PeerConnector::new(self.tls.clone(), &member_name(id)).map_err(|e| unreachable(e.to_string()))?;
        let channel = endpoint.connect_with_connector_lazy(connector);
        map.insert(key, channel.clone());
        Ok(channel)
    }

    async fn call(&self, id: NodeId, addr: &str, method: Method, data: Vec<u8>, timeout: Duration) -> Result<Vec<u8>, PeerError> {
        let mut client = RaftPeerClient::new(self.channel(id, addr)?).max_decoding_message_size(MAX_PEER_MESSAGE).max_encoding_message_size(MAX_PEER_MESSAGE);
        let mut req = Request::new(Payload { data });
        req.set_timeout(timeout);
        let res = match method {
            Method::Append => client.append_entries(req).await,
            Method::Snapshot => client.install_snapshot(req).await,
            Method::Vote => client.vote(req).await,
            Method::Forward => client.forward(req).await,
            Method::Status => client.status(req).await,
        };
        res.map(|r| r.into_inner().data).map_err(|s| status_error(addr, &s))
    }

    async fn typed<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        id: NodeId,
        addr: &str,
        method: Method,
        req: &Req,
        timeout: Duration,
    ) -> Result<Resp, PeerError> {
        let bytes = self.call(id, addr, method, codec::encode(req), timeout).await?;
        decode_reply(addr, &bytes)
    }
}

impl Transport for PeerClients {
    fn forward<'a>(
        &'a self,
        id: NodeId,
        addr: &'a str,
        req: &'a ForwardRequest,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Result<ForwardReply, Error>, PeerError>> {
        Box::pin(self.typed(id, addr, Method::Forward, req, timeout))
    }

    fn status<'a>(&'a self, id: NodeId, addr: &'a str, timeout: Duration) -> BoxFuture<'a, Result<NodeStatus, PeerError>> {
        Box::pin(self.typed(id, addr, Method::Status, &(), timeout))
    }
}

/// A failed call's status as a transport outcome.
fn status_error(addr: &str, s: &Status) -> PeerError {
    match s.code() {
        // tonic reports connect failures as UNAVAILABLE.
        tonic::Code::Unavailable => PeerError::Unreachable { addr: addr.into(), msg: s.message().to_string() },
        _ => PeerError::Failed { addr: addr.into(), msg: format!("{}: {}", s.code(), s.message()) },
    }
}

fn decode_reply<T: DeserializeOwned>(addr: &str, bytes: &[u8]) -> Result<T, PeerError> {
    codec::decode(bytes).map_err(|e| PeerError::Failed { addr: addr.into(), msg: format!("undecodable reply: {e}") })
}

impl PeerError {
    /// As openraft sees it: `Unreachable` backs off and retries.
    fn into_rpc<E: std::error::Error>(self) -> RPCError<NodeId, NodeInfo, E> {
        match self {
            e @ PeerError::Unreachable { .. } => RPCError::Unreachable(Unreachable::new(&e)),
            e @ PeerError::Failed { .. } => RPCError::Network(NetworkError::new(&e)),
        }
    }
}

/// openraft's view of the network.
#[derive(Clone)]
pub struct NetworkFactory {
    pub clients: PeerClients,
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerConn;

    async fn new_client(&mut self, target: NodeId, node: &NodeInfo) -> PeerConn {
        PeerConn { target, addr: node.raft_addr.clone(), clients: self.clients.clone(), append: None, unary: false }
    }
}

pub struct PeerConn {
    target: NodeId,
    addr: String,
    clients: PeerClients,
    /// The AppendEntries stream to this peer, once opened; dropped on any
    /// error or timeout (a late answer must never be taken for the next
    /// request's), and opened again by the next request. Also dropped when
    /// a call was cancelled while its request was out (openraft wraps every
    /// AppendEntries in its own timeout and drops the future when it
    /// fires): see [`AppendStream::waiting`].
    append: Option<AppendStream>,
    /// The peer does not serve the stream (an older replica, during a
    /// rolling upgrade): AppendEntries go as unary calls.
    unary: bool,
}

struct AppendStream {
    tx: tokio::sync::mpsc::Sender<Payload>,
    rx: tonic::Streaming<Payload>,
    /// Requests sent whose answers have not been read. Above one during a
    /// call, earlier calls were cancelled midway (openraft's timeout) and
    /// their answers, still to come first, are read and thrown away. (Taken
    /// as this call's, an earlier request's answer made a leader count a
    /// follower's acceptance of entries it did not have, and commit them
    /// without a quorum: found by tests/e2e/faults.rs.) Keeping the stream,
    /// rather than opening another, matters under packet loss: a new
    /// connection's lost SYN waits a second to be sent again.
    owed: usize,
}

/// Cancelled calls whose answers a stream may still owe before it is
/// given up for a new one (a peer that stopped answering).
const MAX_OWED: usize = 4;

type RpcResult<T, E> = Result<T, RPCError<NodeId, NodeInfo, RaftError<NodeId, E>>>;

impl PeerConn {
    /// One request and its answer on the AppendEntries stream, opening the
    /// stream first if there is none.
    async fn append_on_stream(&mut self, data: Vec<u8>) -> Result<Vec<u8>, PeerError> {
        let closed = |addr: &str| PeerError::Unreachable { addr: addr.into(), msg: "AppendEntries stream closed".into() };
        if self.append.as_ref().is_some_and(|s| s.owed >= MAX_OWED) {
            self.append = None;
        }
        if let Some(stream) = &mut self.append {
            // Counted once sent (no await between the two: a cancelled
            // send sent nothing).
            if stream.tx.send(Payload { data }).await.is_err() {
                self.append = None;
                return Err(closed(&self.addr));
            }
            stream.owed += 1;
        } else {
            let mut client = RaftPeerClient::new(self.clients.channel(self.target, &self.addr)?)
                .max_decoding_message_size(MAX_PEER_MESSAGE)
                .max_encoding_message_size(MAX_PEER_MESSAGE);
            let (tx, rx) = tokio::sync::mpsc::channel(1);
            let call = client.append_entries_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
            // The first request goes with the call: the server answers the
            // call once it has it.
            tx.send(Payload { data }).await.map_err(|_| closed(&self.addr))?;
            let rx = match call.await {
                Ok(r) => r.into_inner(),
                Err(s) if s.code() == tonic::Code::Unimplemented => {
                    self.unary = true;
                    return Err(PeerError::Unreachable { addr: self.addr.clone(), msg: "no AppendEntries stream: unary calls from now on".into() });
                }
                Err(s) => return Err(status_error(&self.addr, &s)),
            };
            self.append = Some(AppendStream { tx, rx, owed: 1 });
        }
        let stream = self.append.as_mut().expect("opened above");
        // Answers come in the order of the requests: the last one owed is
        // this call's. (`message` is cancel-safe: an answer is either
        // taken and counted here or left on the stream.)
        loop {
            let answer = stream.rx.message().await;
            let Ok(Some(p)) = answer else {
                self.append = None;
                return Err(match answer {
                    Err(s) => status_error(&self.addr, &s),
                    _ => PeerError::Failed { addr: self.addr.clone(), msg: "AppendEntries stream ended".into() },
                });
            };
            stream.owed -= 1;
            if stream.owed == 0 {
                return Ok(p.data);
            }
        }
    }

    async fn raft_rpc<Req, T, E>(&self, method: Method, req: &Req, option: &RPCOption) -> RpcResult<T, E>
    where
        Req: Serialize,
        T: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let reply: Result<T, RaftError<NodeId, E>> =
            self.clients.typed(self.target, &self.addr, method, req, option.hard_ttl()).await.map_err(PeerError::into_rpc)?;
        reply.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for PeerConn {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, openraft::error::Infallible> {
        if self.unary {
            return self.raft_rpc(Method::Append, &rpc, &option).await;
        }
        match tokio::time::timeout(option.hard_ttl(), self.append_on_stream(codec::encode(&rpc))).await {
            Ok(Ok(bytes)) => match decode_reply::<Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>>(&self.addr, &bytes) {
                Ok(r) => r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e))),
                Err(e) => {
                    self.append = None;
                    Err(e.into_rpc())
                }
            },
            // The stream failed (and was dropped), or is not served.
            Ok(Err(_)) if self.unary => self.raft_rpc(Method::Append, &rpc, &option).await,
            Ok(Err(e)) => Err(e.into_rpc()),
            // The answer is still owed; the stream is kept (see `AppendStream::owed`).
            Err(_) => Err(PeerError::Failed { addr: self.addr.clone(), msg: format!("no AppendEntries answer within {:?}", option.hard_ttl()) }.into_rpc()),
        }
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

/// Inbound peer RPCs. Holds the replica weakly: the server must not keep a
/// shut-down replica alive.
pub struct PeerService {
    replica: Weak<Replica>,
    /// Becomes true when the replica shuts down: AppendEntries streams end
    /// then, so that they do not hold up the server's graceful shutdown.
    stop: tokio::sync::watch::Receiver<bool>,
    /// Mutual TLS: every call must come with a certificate naming a member.
    tls: bool,
}

/// Refuses a call whose client certificate names no member before its
/// message is read: the service would otherwise receive and decode up to
/// [`MAX_PEER_MESSAGE`] from anyone with a certificate of the cluster CA
/// (which may also sign certificates that name no member).
#[derive(Clone, Copy)]
pub struct MembersOnly {
    tls: bool,
}

impl tonic::service::Interceptor for MembersOnly {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        match member_of(self.tls, req.extensions()) {
            Ok(_) => Ok(req),
            Err(s) => {
                let remote = req.extensions().get::<ConnInfo>().map(|c| c.remote);
                tracing::warn!(?remote, reason = s.message(), "raft port: refused a call before reading it");
                Err(s)
            }
        }
    }
}

impl PeerService {
    pub fn server(
        replica: &Arc<Replica>,
        stop: tokio::sync::watch::Receiver<bool>,
        tls: bool,
    ) -> tonic::service::interceptor::InterceptedService<RaftPeerServer<PeerService>, MembersOnly> {
        let server = RaftPeerServer::new(PeerService { replica: Arc::downgrade(replica), stop, tls })
            .max_decoding_message_size(MAX_PEER_MESSAGE)
            .max_encoding_message_size(MAX_PEER_MESSAGE);
        tonic::service::interceptor::InterceptedService::new(server, MembersOnly { tls })
    }

    fn replica(&self) -> Result<Arc<Replica>, Status> {
        live(&self.replica)
    }

    fn raft(&self) -> Result<crate::store::types::Raft, Status> {
        Ok(self.replica()?.node.raft().clone())
    }

    /// Who is calling: with TLS, the member its certificate names (the
    /// handshake already checked the CA; the CA may also sign certificates
    /// that name no member, and those are refused here). None without TLS.
    fn caller<T>(&self, req: &Request<T>) -> Result<Option<NodeId>, Status> {
        member_of(self.tls, req.extensions())
    }
}

/// The member a call's client certificate names (see [`PeerService`]'s
/// `caller`); an error for one that names none, or none at all.
fn member_of(tls: bool, extensions: &tonic::Extensions) -> Result<Option<NodeId>, Status> {
    if !tls {
        return Ok(None);
    }
    let cert = extensions.get::<ConnInfo>().and_then(|c| c.cert.clone());
    match cert.as_deref().map(|c| (c.member(), c)) {
        Some((Some(id), _)) => Ok(Some(id)),
        Some((None, c)) => Err(Status::permission_denied(format!("the raft port is for members: the certificate of {} names none", c.identity()))),
        None => Err(Status::unauthenticated("the raft port requires a member's client certificate")),
    }
}

/// A raft message speaks for the member in its vote (the leader or
/// candidate); with TLS (`caller` set), that must be the member the
/// caller's certificate names.
fn check_sender(caller: Option<NodeId>, claimed: Option<NodeId>) -> Result<(), Status> {
    match caller {
        Some(cert) if claimed != Some(cert) => {
            let claimed = claimed.map_or_else(|| "none".to_string(), |c| c.to_string());
            tracing::warn!(cert, %claimed, "raft: refused a message whose sender is not the member its certificate names");
            Err(Status::permission_denied(format!("the certificate names member {cert}, the message claims member {claimed}")))
        }
        _ => Ok(()),
    }
}

/// A forwarded write's request ids name the replica that first sent it,
/// and the leader deduplicates on them (`store::dedup`): with TLS that
/// must be the member the caller's certificate names. A member forging
/// another's ids could otherwise have its own write taken for the other's
/// (whose real write, sent later under that id, would then be answered
/// with the forger's results and never applied).
fn check_origins(caller: Option<NodeId>, fwd: &ForwardRequest) -> Result<(), Status> {
    let (Some(cert), ForwardRequest::Write(crate::store::types::Command::Groups(groups))) = (caller, fwd) else { return Ok(()) };
    match groups.iter().filter_map(|g| g.id).find(|id| id.origin != cert) {
        Some(id) => {
            tracing::warn!(cert, origin = id.origin, "raft: refused a forwarded write whose request id names another member");
            Err(Status::permission_denied(format!("the certificate names member {cert}, a forwarded write's request id names member {}", id.origin)))
        }
        None => Ok(()),
    }
}

fn live(replica: &Weak<Replica>) -> Result<Arc<Replica>, Status> {
    replica.upgrade().ok_or_else(|| Status::unavailable("shutting down"))
}

fn decode_payload<T: DeserializeOwned>(p: &Payload) -> Result<T, Status> {
    codec::decode(&p.data).map_err(|e| Status::invalid_argument(format!("{}: {e}", crate::node::version::V1_ANSWER)))
}

fn decode_req<T: DeserializeOwned>(req: Request<Payload>) -> Result<T, Status> {
    decode_payload(req.get_ref())
}

fn payload<T: Serialize>(value: &T) -> Payload {
    Payload { data: codec::encode(value) }
}

fn reply<T: Serialize>(value: &T) -> Result<Response<Payload>, Status> {
    Ok(Response::new(payload(value)))
}

#[tonic::async_trait]
impl RaftPeer for PeerService {
    async fn append_entries(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        let rpc: AppendEntriesRequest<TypeConfig> = decode_payload(req.get_ref())?;
        check_sender(self.caller(&req)?, rpc.vote.leader_id().voted_for())?;
        reply(&self.raft()?.append_entries(rpc).await)
    }

    type AppendEntriesStreamStream = tokio_stream::wrappers::ReceiverStream<Result<Payload, Status>>;

    async fn append_entries_stream(&self, req: Request<tonic::Streaming<Payload>>) -> Result<Response<Self::AppendEntriesStreamStream>, Status> {
        let caller = self.caller(&req)?;
        let replica = self.replica.clone();
        let mut stop = self.stop.clone();
        let mut requests = req.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tokio::spawn(async move {
            // One at a time, in order: the answer to a request is the next
            // message on the stream.
            loop {
                let p = tokio::select! {
                    m = requests.message() => match m {
                        Ok(Some(p)) => p,
                        _ => return,
                    },
                    _ = stop.wait_for(|s| *s) => return,
                };
                let rpc =
                    decode_payload::<AppendEntriesRequest<TypeConfig>>(&p).and_then(|rpc| check_sender(caller, rpc.vote.leader_id().voted_for()).map(|_| rpc));
                let answer = match (rpc, live(&replica)) {
                    (Ok(rpc), Ok(replica)) => Ok(payload(&replica.node.raft().append_entries(rpc).await)),
                    (Err(e), _) | (_, Err(e)) => Err(e),
                };
                let last = answer.is_err();
                if tx.send(answer).await.is_err() || last {
                    return;
                }
            }
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }

    async fn install_snapshot(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        let rpc: InstallSnapshotRequest<TypeConfig> = decode_payload(req.get_ref())?;
        check_sender(self.caller(&req)?, rpc.vote.leader_id().voted_for())?;
        reply(&self.raft()?.install_snapshot(rpc).await)
    }

    async fn vote(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        let rpc: VoteRequest<NodeId> = decode_payload(req.get_ref())?;
        check_sender(self.caller(&req)?, rpc.vote.leader_id().voted_for())?;
        reply(&self.raft()?.vote(rpc).await)
    }

    async fn forward(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        let caller = self.caller(&req)?;
        let fwd: ForwardRequest = decode_req(req)?;
        check_origins(caller, &fwd)?;
        reply(&self.replica()?.handle_peer(fwd).await)
    }

    async fn status(&self, req: Request<Payload>) -> Result<Response<Payload>, Status> {
        self.caller(&req)?;
        reply(&self.replica()?.local_status())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::types::{Command, Group, RequestId};

    /// A peer whose AppendEntries stream answers each request with its own
    /// bytes, those starting "slow" after 300 ms; counts the streams opened.
    #[derive(Clone, Default)]
    struct Echo(Arc<std::sync::atomic::AtomicUsize>);

    #[tonic::async_trait]
    impl RaftPeer for Echo {
        async fn append_entries(&self, _: Request<Payload>) -> Result<Response<Payload>, Status> {
            Err(Status::unimplemented("stream only"))
        }

        type AppendEntriesStreamStream = tokio_stream::wrappers::ReceiverStream<Result<Payload, Status>>;

        async fn append_entries_stream(&self, req: Request<tonic::Streaming<Payload>>) -> Result<Response<Self::AppendEntriesStreamStream>, Status> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut requests = req.into_inner();
            let (tx, rx) = tokio::sync::mpsc::channel(1);
            tokio::spawn(async move {
                while let Ok(Some(p)) = requests.message().await {
                    if p.data.starts_with(b"slow") {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                    }
                    if tx.send(Ok(p)).await.is_err() {
                        return;
                    }
                }
            });
            Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(rx)))
        }

        async fn install_snapshot(&self, _: Request<Payload>) -> Result<Response<Payload>, Status> {
            Err(Status::unimplemented(""))
        }

        async fn vote(&self, _: Request<Payload>) -> Result<Response<Payload>, Status> {
            Err(Status::unimplemented(""))
        }

        async fn forward(&self, _: Request<Payload>) -> Result<Response<Payload>, Status> {
            Err(Status::unimplemented(""))
        }

        async fn status(&self, _: Request<Payload>) -> Result<Response<Payload>, Status> {
            Err(Status::unimplemented(""))
        }
    }

    /// openraft drops an AppendEntries future when its own timeout fires.
    /// The answer to that request must not be taken for the next one's: a
    /// leader took a follower's answer to an earlier request as acceptance
    /// of later entries and committed them without a quorum (tests/e2e/faults.rs,
    /// a replica's raft core panicked on `has_log_id`'s check that a
    /// committed index matches the new leader's log). The late answers are
    /// thrown away on the same stream; one that owes too many is replaced.
    #[tokio::test]
    async fn a_cancelled_append_does_not_shift_the_answers() {
        let echo = Echo::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RaftPeerServer::new(echo.clone()))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let mut conn = PeerConn { target: 2, addr, clients: PeerClients::new(None), append: None, unary: false };
        async fn call(conn: &mut PeerConn, data: String, wait: u64) -> Result<String, tokio::time::error::Elapsed> {
            let answer = tokio::time::timeout(Duration::from_millis(wait), conn.append_on_stream(data.into_bytes())).await?;
            Ok(String::from_utf8_lossy(&answer.unwrap()).into_owned())
        }
        // Two calls whose answers come late: both are dropped.
        for n in 1..3 {
            assert!(call(&mut conn, format!("slow {n}"), 100).await.is_err());
        }
        // Each later call gets its own answer, on the same stream.
        for n in 3..6 {
            assert_eq!(call(&mut conn, format!("request {n}"), 5000).await, Ok(format!("request {n}")));
        }
        assert_eq!(echo.0.load(std::sync::atomic::Ordering::SeqCst), 1, "the stream was kept");
        // A stream that owes MAX_OWED answers is given up for a new one.
        for n in 0..MAX_OWED {
            assert!(call(&mut conn, format!("slow {n}"), 10).await.is_err());
        }
        assert_eq!(call(&mut conn, "after".into(), 5000).await, Ok("after".into()));
        assert_eq!(echo.0.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[test]
    fn forwarded_request_ids_must_name_the_caller() {
        let groups = |origins: &[NodeId]| {
            let mut g: Vec<Group> = origins.iter().map(|&origin| Group { id: Some(RequestId { origin, seq: 7 }), txns: Vec::new() }).collect();
            g.push(Group { id: None, txns: Vec::new() });
            ForwardRequest::Write(Command::Groups(g))
        };
        assert!(check_origins(Some(2), &groups(&[2, 2])).is_ok());
        let e = check_origins(Some(2), &groups(&[2, 1])).unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(e.message().contains("names member 1"), "{}", e.message());
        // Without TLS there is no certificate to check against; other
        // requests carry no ids.
        assert!(check_origins(None, &groups(&[1])).is_ok());
        assert!(check_origins(Some(2), &ForwardRequest::ReadIndex).is_ok());
        assert!(check_origins(Some(2), &ForwardRequest::Write(Command::Batch(Vec::new()))).is_ok());
    }
}
