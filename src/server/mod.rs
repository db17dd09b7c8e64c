//! Starting and stopping a replica: open storage, start raft, serve the
//! three ports (API, raft peers, xDS), initialise the cluster when asked, and
//! shut down gracefully.

pub mod bootstrap;

use crate::api::{grpc::GrpcApi, rest};
use crate::config::ServerConfig;
use crate::node::Node;
use crate::peer::{NetworkFactory, PeerService};
use crate::replica::Replica;
use crate::store::log_store::LogStore;
use crate::store::state_machine::StateMachine;
use crate::store::types::{NodeId, NodeInfo, Raft};
use crate::tls::conn::Incoming;
use crate::tls::Port;
use crate::xds::resources::Generator;
use anyhow::Context;
use openraft::error::{InitializeError, RaftError};
use openraft::SnapshotPolicy;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// How long in-flight requests and streams get to finish on shutdown.
const DRAIN: Duration = Duration::from_secs(5);

fn raft_config(c: &ServerConfig) -> anyhow::Result<openraft::Config> {
    let config = openraft::Config {
        cluster_name: "lodestar".into(),
        heartbeat_interval: c.heartbeat_ms,
        election_timeout_min: c.election_timeout_min_ms,
        election_timeout_max: c.election_timeout_max_ms,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(c.snapshot_logs),
        max_in_snapshot_log_to_keep: c.logs_to_keep,
        // Entries can hold a whole batch of writes; keep peer messages bounded.
        max_payload_entries: 64,
        install_snapshot_timeout: 10_000,
        leader_lease: half_election_timeout_ms(c),
        append_entries_timeout: half_election_timeout_ms(c),
        ..Default::default()
    };
    Ok(config.validate()?)
}

/// Half the minimum election timeout, and at least two heartbeats: the
/// leader lease and the AppendEntries timeout (vendor/openraft's patches 2
/// and 3).
///
/// The lease: a follower that heard from the leader within it refuses to
/// vote for another candidate (a flapping node cannot depose a healthy
/// leader); one that knew a leader stands for election after the lease
/// plus its election timeout. With upstream's lease (the maximum election
/// timeout) a leader change took about two election timeouts; etcd's is
/// about one. Reads never rely on the lease: a linearizable read confirms
/// leadership with a quorum.
///
/// The AppendEntries timeout: how long the leader waits for a follower's
/// answer (to entries, heartbeats, and the heartbeats that confirm a read).
/// Upstream waits one heartbeat (100 ms), less than TCP's minimum
/// retransmission timeout (200 ms): a single lost packet failed the call
/// and its stream was opened again (see `peer`), so under 20% packet loss a
/// two-voter quorum could neither commit nor confirm a read for seconds.
/// Below the lease plus the election timeout, a follower whose answers are
/// slow still hears from the leader in time.
fn half_election_timeout_ms(c: &ServerConfig) -> u64 {
    (c.election_timeout_min_ms / 2).max(2 * c.heartbeat_ms).min(c.election_timeout_max_ms)
}

/// Run a replica until `shutdown` resolves, serving xDS with
/// [`crate::xds::default_generator`].
pub async fn run(config: ServerConfig, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let generator = crate::xds::default_generator(config.mesh_config());
    run_with(config, generator, shutdown).await
}

/// Run a replica with the given xDS generator (tests serve their own).
pub async fn run_with(config: ServerConfig, generator: Arc<dyn Generator>, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    config.validate().map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?;
    let mut config = config;
    // First: everything below is written into it.
    crate::store::create_data_dir(&config.data_dir).with_context(|| format!("creating data dir {}", config.data_dir.display()))?;
    // The management credential for the client config (see `tls::bootstrap`).
    let token = if config.acls_on() { bootstrap::ensure_management_token(&mut config)? } else { None };
    let config = Arc::new(config);
    let db = crate::store::open_db(&config.data_dir, config.store_cache_bytes)
        .with_context(|| format!("opening the store in {} (is another replica using it?)", config.data_dir.display()))?;

    // The mesh CA (workload certificates): files on this replica.
    let mesh_ca_dir = crate::ca::ensure_dir(&config)?;
    let mesh_ca = match &mesh_ca_dir {
        Some(dir) => {
            let ttl = Duration::from_secs(config.workload_cert_ttl_s);
            let ca = crate::ca::MeshCa::load(dir, &config.trust_domain, ttl, Duration::from_secs(config.workload_cert_max_ttl_s))
                .with_context(|| format!("loading the mesh CA from {}", dir.display()))?;
            tracing::info!(dir = %dir.display(), trust_domain = %config.trust_domain, "mesh CA: signing workload certificates on the xDS port");
            Some(Arc::new(ca))
        }
        None => {
            tracing::warn!("no mesh CA (a cluster of several members without mesh_ca_dir): no workload certificates from this replica");
            None
        }
    };

    // The cluster secrets key, beside the mesh CA (`secrets`).
    let secrets = match &mesh_ca_dir {
        Some(dir) => match crate::secrets::SecretsKey::load(dir).map_err(|e| anyhow::anyhow!("the cluster secrets key: {e}"))? {
            Some(key) => Some(Arc::new(key)),
            None => {
                tracing::warn!(dir = %dir.display(), "no cluster secrets key (secrets.key) beside the mesh CA: Secrets with a private key are refused; give every member the same secrets.key");
                None
            }
        },
        None => None,
    };

    // TLS first: a replica that cannot serve TLS must not start plaintext.
    let tls = if config.insecure {
        tracing::warn!("INSECURE MODE: every port is plaintext and open, with no client certificates and no credentials. Anyone who can reach the API port can rewrite the mesh; anyone who can reach the raft port can speak as a peer. For experiments only.");
        None
    } else {
        let files = bootstrap::ensure_files(&config)?;
        let mesh_root = mesh_ca_dir.as_ref().map(|d| d.join(crate::ca::ROOT_CERT));
        let tls = crate::tls::Tls::load_with_mesh_root(files, config.verify_incoming, mesh_root).context("loading the TLS certificate files")?;
        tracing::info!(serial = tls.serial(), cert = %tls.files().cert.display(), ca = %tls.files().ca.display(), "TLS on every port");
        for path in bootstrap::write_client_config(&config, tls.files(), token)? {
            tracing::info!(
                path = %path.display(),
                "first start: wrote the CLI's client config (server, CA, and the management token with ACLs on; 0600); `lodestar` on this machine uses it. From another machine: copy it there, \
                 set `server` to an address of this replica, and pass it with --client-config or LODESTAR_CONFIG"
            );
        }
        Some(tls)
    };

    let log_store = LogStore::open(&db)?;
    let (state_machine, reader) = StateMachine::open(&db, config.retention())?;
    let network = NetworkFactory { clients: crate::peer::PeerClients::new(tls.clone()) };
    let peers = network.clients.clone();
    let raft = Raft::new(config.id, Arc::new(raft_config(&config)?), network, log_store, state_machine).await?;
    let node = Node::new(config.node_options(), raft.clone(), reader, Arc::new(peers));
    let acl = crate::auth::Acl::start(&config.acl_options(), node.reader().clone()).map_err(|e| anyhow::anyhow!("ACLs: {e}"))?;
    let replica = Replica::serving(node.clone(), acl, config.clone(), secrets.clone(), Some(generator.clone()));

    // Bind everything before initialising, so peers can reach us at once.
    let api_listener = TcpListener::bind(&config.api_addr).await.with_context(|| format!("binding the API port {}", config.api_addr))?;
    let raft_listener = TcpListener::bind(&config.raft_addr).await.with_context(|| format!("binding the raft port {}", config.raft_addr))?;
    let xds_listener = TcpListener::bind(&config.xds_addr).await.with_context(|| format!("binding the xDS port {}", config.xds_addr))?;

    let (stop_tx, stop_rx) = watch::channel(false);
    let mut background_tls = None;
    let xds_stop = stop_rx.clone();
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };

    // Every port accepts through `tls::conn::Incoming` (TLS handshakes
    // off the accept loop, TCP_NODELAY set: tonic ignores its builder's
    // nodelay with an incoming stream, and replies would wait on Nagle).
    // It also holds each port to its connection limits (`config::connection_limits`).
    raise_open_file_limit(&config);
    let incoming = |listener, port| Incoming::new(listener, port, tls.clone(), config.connection_limits(port), Arc::new(ConnMetrics));
    let raft_incoming = incoming(raft_listener, Port::Raft)?;
    let api_incoming = incoming(api_listener, Port::Api)?;
    let xds_incoming = incoming(xds_listener, Port::Xds)?;
    if let Some(tls) = &tls {
        background_tls = Some(tokio::spawn(tls.clone().watch(Duration::from_millis(config.tls_reload_interval_ms.max(100)), stop_tx.subscribe())));
    }

    let peer_server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(PeerService::server(&replica, stop_tx.subscribe(), tls.is_some()))
            .serve_with_incoming_shutdown(raft_incoming.into_stream(), stopped()),
    );

    let app = rest::router(replica.clone())
        .merge(GrpcApi::router(replica.clone()))
        .fallback(rest::unrouted)
        .layer(axum::middleware::from_fn(rest::track))
        .layer(axum::middleware::from_fn_with_state(config.max_body_bytes, rest::drain_unread_body));
    let api_stopped = stopped();
    let header_timeout = (config.http_header_read_timeout_ms > 0).then(|| Duration::from_millis(config.http_header_read_timeout_ms));
    let api_server = tokio::spawn(crate::api::serve::serve(api_incoming, app, header_timeout, api_stopped));
    // /metrics and /debug/* on a local address, if one is set (loopback
    // only: `ServerConfig::validate`), plaintext and without credentials.
    let observer = match &config.metrics_addr {
        None => None,
        Some(addr) => {
            let listener = TcpListener::bind(addr).await.with_context(|| format!("binding metrics_addr {addr}"))?;
            tracing::info!(addr = %addr, "serving /metrics and /debug/* on the local observer address (no TLS, no token)");
            let app = rest::observer_router(replica.clone());
            let done = stopped();
            Some(tokio::spawn(async move { axum::serve(listener, app).with_graceful_shutdown(done).await }))
        }
    };

    // ADS for Envoys, from this replica's own applied state.
    // Key sets of RequestAuthentication jwksUris, fetched here and handed
    // to translation (see `jwks`).
    let refresh = match generator.key_cell() {
        Some(cell) => {
            let options = crate::jwks::Options { refresh: Duration::from_secs(config.jwks_refresh_interval_s), ca_file: config.jwks_ca_file.clone() };
            let (epochs, _task) = crate::jwks::spawn(node.reader().subscribe_applied(), cell, options, stop_tx.subscribe()).map_err(|e| anyhow::anyhow!(e))?;
            Some(epochs)
        }
        None => None,
    };
    let options = crate::xds::server::ServeOptions {
        fence: replica.clone(),
        max_stream_age: (config.xds_max_stream_age_s > 0).then(|| Duration::from_secs(config.xds_max_stream_age_s)),
        fence_timeout: Duration::from_millis(config.xds_fence_timeout_ms),
        latest: Some(node.reader().subscribe_applied()),
        acl: Some(replica.acl.clone() as Arc<dyn crate::xds::server::Admission>),
        mesh_ca: mesh_ca.clone().map(|ca| ca as Arc<dyn crate::xds::server::WorkloadCerts>),
        refresh,
        secrets: secrets.map(|key| key as Arc<dyn crate::xds::secrets::Unseal>),
        max_streams: config.xds_max_streams,
        max_buffered_request_bytes: config.xds_max_buffered_request_bytes,
        max_streams_per_credential: config.xds_max_streams_per_credential,
        max_streams_per_source: config.xds_max_streams_per_source,
        max_subscription_bytes: config.xds_max_subscription_bytes,
    };
    // Revisions reach the streams through the debouncer (see `xds::push`).
    let pushed = crate::xds::push::debounce(node.reader().subscribe_applied(), Duration::from_millis(config.push_debounce_ms), replica.sync.clone());
    let ca_service = Some(crate::tls::conn::Tracked(crate::ca::service::CaService::server(mesh_ca.clone(), replica.clone())));
    // The Gateway API status, computed by the leader from the streams' own
    // mesh at the revisions they are pushed, and written (`gateway_status`).
    let status_writer = tokio::spawn(crate::gateway_status::run(node.clone(), generator.clone(), config.mesh_config(), pushed.clone(), stop_tx.subscribe()));
    let xds_server = tokio::spawn(crate::xds::server::serve(xds_incoming, pushed, generator, replica.sync.clone(), options, ca_service, xds_stop));
    // Readiness, peers' status, and the spread of streams (see `ha`).
    let mut background = vec![
        status_writer,
        tokio::spawn(crate::ha::freshness(node.clone(), replica.ha.clone(), Duration::from_millis(config.ready_max_lag_ms), stop_tx.subscribe())),
        tokio::spawn(crate::ha::gossip(node.clone(), replica.ha.clone(), stop_tx.subscribe())),
        tokio::spawn(crate::ha::raft_metrics(node.clone(), stop_tx.subscribe())),
        // Every member's wire versions and the cluster version (`node::version`).
        tokio::spawn(crate::node::version::keep_current(node.clone(), stop_tx.subscribe())),
    ];
    // Cluster-wide revert of NACKed revisions (`api::revert`).
    if config.revert_on_nack {
        background.push(tokio::spawn(crate::api::revert::run(replica.clone(), stop_tx.subscribe())));
    }
    // The mesh CA's files are reloaded as the cluster TLS files are.
    if let Some(ca) = &mesh_ca {
        background.push(tokio::spawn(ca.clone().watch(Duration::from_millis(config.tls_reload_interval_ms.max(100)), stop_tx.subscribe())));
    }
    if config.xds_rebalance_interval_ms > 0 {
        background.push(tokio::spawn(crate::ha::rebalance(
            node.clone(),
            replica.ha.clone(),
            replica.sync.clone(),
            Duration::from_millis(config.xds_rebalance_interval_ms),
            Duration::from_millis(config.ready_max_lag_ms),
            stop_tx.subscribe(),
        )));
    }

    // Registry health: the leader's TTL/lease expiry, everyone's share of probes.
    let reaper = tokio::spawn(crate::health::reaper(node.clone(), replica.heartbeats.clone(), stop_tx.subscribe()));
    let prober = tokio::spawn(crate::health::prober(node.clone(), replica.checks.clone(), replica.ha.clone(), stop_tx.subscribe()));

    let adapter = config.watch_dir.clone().map(|dir| {
        let source = crate::adapters::directory::Directory::new(dir, Duration::from_millis(config.watch_dir_poll_ms.max(50)));
        tokio::spawn(crate::adapters::run(replica.clone(), Box::new(source), stop_tx.subscribe()))
    });

    initialise(&config, &raft).await?;
    tracing::info!(id = config.id, api = %config.api_addr, raft = %config.raft_addr, xds = %config.xds_addr, data = %config.data_dir.display(), "replica started");

    // Fail-stop: a replica whose raft core stopped on its own (a storage
    // error: a full or failing disk) must not go on answering as a zombie.
    // It shuts down and exits non-zero, for its supervisor to restart it
    // once the disk is fixed; what it acknowledged is on disk already.
    // And a replica whose wire versions do not include the cluster
    // version (`node::version`) stops as well, saying why: it could not
    // read what the others write, or they could not read it.
    let mut refused = None;
    let failed = tokio::select! {
        _ = shutdown => None,
        why = raft_failed(raft.clone()) => Some(why),
        why = crate::node::version::refused(node.clone()) => {
            refused = Some(why);
            None
        }
    };
    match (&failed, &refused) {
        (_, Some(why)) => tracing::error!(error = %why, "wrong version for this cluster: shutting down (ops/upgrade.md)"),
        (None, None) => tracing::info!("shutting down"),
        (Some(why), None) => {
            tracing::error!(error = %why, "the raft core stopped: this replica can no longer write its log or state; shutting down (fail-stop)")
        }
    }
    let _ = stop_tx.send(true);
    // Watch streams never end on their own: give servers DRAIN, then move
    // on; after a storage failure, a moment only (their requests fail anyway).
    let drain = if failed.is_some() { Duration::from_millis(500) } else { DRAIN };
    let _ = tokio::time::timeout(drain, async {
        let _ = api_server.await;
        let _ = peer_server.await;
        let _ = xds_server.await;
        let _ = reaper.await;
        for b in background {
            let _ = b.await;
        }
        let _ = prober.await;
        if let Some(t) = background_tls {
            let _ = t.await;
        }
        if let Some(a) = adapter {
            let _ = a.await;
        }
        if let Some(o) = observer {
            let _ = o.await;
        }
    })
    .await;
    if let Err(e) = raft.shutdown().await {
        tracing::warn!("raft shutdown: {e}");
    }
    // Raft is stopped, so nothing more is applied: write the queued state
    // now, while everything is alive, rather than when the state machine is
    // dropped (maybe as the runtime goes away, after the flush below).
    if let Err(e) = node.reader().checkpoint() {
        tracing::error!(error = %e, "writing the last state checkpoint");
    }
    drop(replica);
    drop(node);
    if let Some(why) = failed {
        let _ = db.flush_async().await;
        anyhow::bail!("replica {} stopped (fail-stop) after a storage error: {why}", config.id);
    }
    db.flush_async().await?;
    if let Some(why) = refused {
        return Err(crate::node::version::Refused(why).into());
    }
    tracing::info!("stopped");
    Ok(())
}

/// Raise the soft limit on open files to the hard limit (as Go programs
/// do): every connection is a descriptor, and a replica that runs out of
/// them can accept nobody. Warn if the ports' connection limits add up to
/// more than that.
fn raise_open_file_limit(config: &ServerConfig) {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit write or read only the struct given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return;
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit = raised;
        }
    }
    let ports = [config.api_max_connections, config.xds_max_connections, config.raft_max_connections];
    let wanted: u64 = ports.iter().map(|&n| n as u64).sum();
    // Descriptors besides connections: the store, logs, listeners, peers.
    const RESERVE: u64 = 256;
    let open_files: u64 = limit.rlim_cur;
    if ports.contains(&0) || wanted + RESERVE > open_files {
        tracing::warn!(
            open_files,
            api_max_connections = config.api_max_connections,
            xds_max_connections = config.xds_max_connections,
            raft_max_connections = config.raft_max_connections,
            "the open-file limit is below the ports' connection limits (or one is 0: none): once descriptors run out, no client can connect; \
             raise the limit (LimitNOFILE=, ulimit -n) or lower the *_max_connections settings"
        );
    }
}

/// Resolves when the raft core stops by itself (not asked to), with why.
async fn raft_failed(raft: Raft) -> String {
    let mut metrics = raft.metrics();
    loop {
        if let Err(e) = &metrics.borrow_and_update().running_state {
            return e.to_string();
        }
        if metrics.changed().await.is_err() {
            return "the raft core is gone".to_string();
        }
    }
}

async fn initialise(config: &ServerConfig, raft: &Raft) -> anyhow::Result<()> {
    if config.join {
        tracing::info!("waiting to be added to a cluster (join mode)");
        return Ok(());
    }
    if raft.is_initialized().await? {
        // The membership holds where peers and `lodestar bootstrap` find this
        // replica; it was recorded at init, add-node or `snapshot restore`.
        let recorded = raft.metrics().borrow().membership_config.membership().get_node(&config.id).cloned();
        if let Some(recorded) = recorded.filter(|r| *r != config.node_info()) {
            tracing::warn!(membership = %recorded, config = %config.node_info(), "this replica's addresses in the cluster membership differ from its configuration");
        }
        return Ok(());
    }
    let members: BTreeMap<NodeId, NodeInfo> = if config.initial_members.is_empty() {
        BTreeMap::from([(config.id, config.node_info())])
    } else {
        config.initial_members.iter().map(|m| (m.id, m.info())).collect()
    };
    // One founding member starts the first election, so that two do not
    // compete for the same term: the lowest id, once the others listen.
    // Each other one waits its turn (by rank), and starts one only if no
    // election reached it meanwhile (the ones before it are down).
    let rank = members.keys().position(|id| *id == config.id).unwrap_or(0) as u64;
    if rank == 0 {
        wait_for_founders(config).await;
    } else {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(rank * 2 * config.election_timeout_max_ms);
        while tokio::time::Instant::now() < deadline {
            if raft.is_initialized().await? {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    tracing::info!(members = %crate::logging::list(members.keys()), "initialising a new cluster");
    match raft.initialize(members).await {
        Ok(()) => Ok(()),
        // Another founding member got there first: that is the goal.
        Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Before a new cluster's first election (by the lowest founding id):
/// until the other founding members' raft ports accept connections, for at
/// most two election timeouts. Members started a moment apart
/// (`cluster/local`, a fleet booting) would otherwise fail the first vote
/// requests to the ones not listening yet; a member that stays down is
/// given up on, and the election goes ahead with the others.
async fn wait_for_founders(config: &ServerConfig) {
    let others: Vec<&str> = config.initial_members.iter().filter(|m| m.id != config.id).map(|m| m.raft_addr.as_str()).collect();
    if others.is_empty() {
        return;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_millis(2 * config.election_timeout_max_ms);
    let mut waiting = others;
    while !waiting.is_empty() && tokio::time::Instant::now() < deadline {
        let mut still = Vec::new();
        for addr in waiting {
            let up = tokio::time::timeout(Duration::from_millis(200), tokio::net::TcpStream::connect(addr)).await.is_ok_and(|r| r.is_ok());
            if !up {
                still.push(addr);
            }
        }
        waiting = still;
        if !waiting.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    if !waiting.is_empty() {
        tracing::info!(unreachable = %waiting.join(", "), "founding members not listening yet; initialising without waiting longer");
    }
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}

/// The accept path's counters (`tls::conn::ConnCounters`) in the replica's metrics.
pub struct ConnMetrics;

impl crate::tls::conn::ConnCounters for ConnMetrics {
    fn open(&self, port: crate::tls::Port, delta: i64) {
        crate::metrics::metrics().connections.with(&[port.name()]).inc_by(delta);
    }
    fn refused(&self, port: crate::tls::Port, reason: &'static str) {
        crate::metrics::metrics().connections_refused.with(&[port.name(), reason]).inc();
    }
    fn closed(&self, port: crate::tls::Port, reason: &'static str) {
        crate::metrics::metrics().connections_closed.with(&[port.name(), reason]).inc();
    }
}
