//! The `lodestar` command line: `server`, the kubectl-style client commands,
//! cluster management and backups (`snapshot`). Client commands
//! use the REST API of whichever replica `--server` (or `LODESTAR_SERVER`)
//! names, with the credential `client::Access` picks.

mod acl;
mod agent;
mod analyze;
mod authz;
mod bootstrap;
mod history;
mod nacks;
// The client side (REST client, its config, progress bars) is its own
// module below the CLI and the agent; its old path stays.
pub use crate::client;
use crate::client::progress;
mod proxy;
mod registry;
mod snapshot;

use crate::config::{Member, ServerConfig};
use crate::model::documents::parse_documents;
use crate::model::Kind;
use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use client::Client;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// `lodestar get KIND`'s help: every kind the server stores.
fn kinds_help() -> String {
    format!("The kind: {}", Kind::cli_names_help())
}

/// Where `--help` lists the options every client command takes.
const CLIENT_OPTIONS: &str = "Client options (every command that talks to a cluster)";

#[derive(Parser)]
#[command(name = "lodestar", version, about = "Lodestar: an Envoy control plane for Istio traffic rules, without Kubernetes")]
pub struct Cli {
    /// A replica's API URL, e.g. https://127.0.0.1:8470; a bare HOST:PORT
    /// is https (default: the client config's `server` and `servers`,
    /// tried in turn while one is down; else https://127.0.0.1:8470).
    #[arg(long = "server", value_name = "URL", global = true, env = "LODESTAR_SERVER", action = clap::ArgAction::Append, help_heading = CLIENT_OPTIONS)]
    servers: Vec<String>,
    /// Client config (servers, CA, token) as `lodestar server` writes it on
    /// first start. Default: ./lodestar-data/client.toml if there is one,
    /// else ~/.config/lodestar/client.toml.
    #[arg(long = "client-config", value_name = "FILE", global = true, env = "LODESTAR_CONFIG", help_heading = CLIENT_OPTIONS)]
    client_config: Option<PathBuf>,
    /// CA bundle (PEM) to check the server's certificate against (default:
    /// the client config's).
    #[arg(long, value_name = "FILE", global = true, env = "LODESTAR_CACERT", help_heading = CLIENT_OPTIONS)]
    ca_file: Option<PathBuf>,
    /// API token (default: the client config's).
    #[arg(long, global = true, env = "LODESTAR_TOKEN", hide_env_values = true, help_heading = CLIENT_OPTIONS)]
    token: Option<String>,
    /// Client commands: send the token to an http:// server too, in the
    /// clear (refused otherwise). `server`: plaintext on every port and no
    /// credentials at all, for experiments only (logged loudly).
    #[arg(long, global = true)]
    insecure: bool,
    #[command(subcommand)]
    command: Command,
}

/// The client options' ids, hidden from the commands that take none.
const CLIENT_ARGS: [&str; 4] = ["servers", "client_config", "ca_file", "token"];

/// The command line, with the client options hidden from `--help` of the
/// commands that never talk to a cluster: `server` (where `--server` would
/// read like a listen address), `tls ca create` and the offline
/// `snapshot restore` and `snapshot status`; `--insecure` too from the
/// offline ones (it means something to `server` and the client commands).
pub fn command() -> clap::Command {
    let cmd = Cli::command();
    // A subcommand that has an argument of a global's id keeps its own
    // (clap does not propagate over it): give these hidden copies. Added
    // to `tls`, they reach its subcommands the same way.
    let hidden =
        |ids: &[&str]| -> Vec<clap::Arg> { cmd.get_arguments().filter(|a| ids.contains(&a.get_id().as_str())).map(|a| a.clone().hide(true)).collect() };
    let (client, offline) = (hidden(&CLIENT_ARGS), hidden(&[&CLIENT_ARGS[..], &["insecure"]].concat()));
    let hide = move |c: clap::Command| c.args(offline.clone());
    let (h1, h2) = (hide.clone(), hide.clone());
    cmd.mut_subcommand("server", move |c| c.args(client))
        .mut_subcommand("tls", h1)
        .mut_subcommand("snapshot", move |s| s.mut_subcommand("restore", h2).mut_subcommand("status", hide))
}

/// Parse the process's arguments (clap's exit on errors and `--help`).
pub fn parse() -> Cli {
    let matches = command().get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

impl Cli {
    /// The log format asked for (`--log-format` of `server` and `agent`).
    pub fn log_format(&self) -> crate::logging::LogFormat {
        match &self.command {
            Command::Server(a) => a.log_format,
            Command::Agent(a) => a.log_format,
            _ => Default::default(),
        }
    }

    /// A command that runs until stopped and owns its output (a replica, an
    /// agent); the others are short-lived tools whose output may be piped.
    pub fn is_daemon(&self) -> bool {
        matches!(self.command, Command::Server(_) | Command::Agent(_))
    }
}

/// A short-lived command ends quietly when its output is closed (`lodestar
/// get vs | head -1`), as Unix tools do: SIGPIPE's default action, which
/// Rust's runtime sets to ignore (then `println!` panics on EPIPE). Sockets
/// are unaffected: Rust sends on them with MSG_NOSIGNAL.
pub fn exit_quietly_on_closed_pipe() {
    // SAFETY: resets one signal's disposition to the default, at startup,
    // before any thread is started.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run a replica. With no flags: a single-node cluster in ./lodestar-data.
    Server(ServerArgs),
    /// Create or update resources from files, directories or stdin, atomically.
    Apply {
        /// A file, a directory (recursively: *.yaml, *.yml, *.json) or - for stdin.
        #[arg(short = 'f', long = "filename", required = true)]
        files: Vec<String>,
        /// Namespace for resources that do not name one.
        #[arg(short, long)]
        namespace: Option<String>,
        /// Then wait until every connected proxy has ACKed the write.
        #[arg(long)]
        wait: bool,
        /// A change message, recorded with the revision and shown by
        /// `history` (needs cluster version 2: ops/upgrade.md).
        #[arg(short, long)]
        message: Option<String>,
        /// With --wait: how long, e.g. 30s.
        #[arg(long, default_value = "30s")]
        timeout: String,
        /// With --wait: also wait for this proxy (NAME.NAMESPACE) to be
        /// connected, e.g. an Envoy just started; repeat for more.
        #[arg(long = "proxy", value_name = "NAME.NAMESPACE", requires = "wait")]
        proxies: Vec<String>,
        /// Preview: what would change, field by field, at the current
        /// revision; nothing is written.
        #[arg(long, conflicts_with = "wait")]
        dry_run: bool,
        /// Apply only if nothing the files name changed after this
        /// revision (a dry run's); refused otherwise, naming what changed.
        #[arg(long, value_name = "REVISION")]
        expected_revision: Option<u64>,
        /// With --dry-run: json for pipelines (default: a summary).
        #[arg(short, long, requires = "dry_run")]
        output: Option<Output>,
        /// With --wait: if a proxy rejects the write (NACK), roll what it
        /// changed back as one new revision, wait for that, and fail.
        #[arg(long, requires = "wait")]
        revert_on_nack: bool,
        /// Fields a kind does not have: warn (drop them, warning about
        /// each: Kubernetes' default) or strict (refuse the file).
        #[arg(long, value_name = "warn|strict", default_value = "warn")]
        validate: String,
    },
    /// Check resources as `apply` would (parsing, validation,
    /// authorization, the store's preconditions, the same warnings) and
    /// write nothing; no proxy is translated (`--dry-run` does that).
    Validate {
        /// A file, a directory (recursively: *.yaml, *.yml, *.json) or - for stdin.
        #[arg(short = 'f', long = "filename", required = true)]
        files: Vec<String>,
        /// Namespace for resources that do not name one.
        #[arg(short, long)]
        namespace: Option<String>,
        /// Fields a kind does not have: warn or strict, as `apply`'s.
        #[arg(long, value_name = "warn|strict", default_value = "warn")]
        validate: String,
    },
    /// Wait until every proxy connected to any replica has ACKed a revision
    /// (or newer); fails listing NACKs, or the proxies still behind. On a
    /// terminal it shows which proxies are still behind.
    Wait {
        /// The revision to wait for (`apply` prints it); default: the
        /// cluster's current one.
        #[arg(long)]
        revision: Option<u64>,
        /// How long, e.g. 30s.
        #[arg(long, default_value = "30s")]
        timeout: String,
        /// Also wait for this proxy (NAME.NAMESPACE) to be connected, e.g.
        /// an Envoy just started; repeat for more.
        #[arg(long = "proxy", value_name = "NAME.NAMESPACE")]
        proxies: Vec<String>,
    },
    /// Show resources.
    Get {
        #[arg(help = kinds_help())]
        kind: String,
        /// One object by name (default: a list).
        name: Option<String>,
        /// The namespace (default: default).
        #[arg(short, long)]
        namespace: Option<String>,
        /// Every namespace.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
        /// Only objects whose labels match, e.g. app=reviews,version!=v1.
        #[arg(short = 'l', long)]
        selector: Option<String>,
        /// yaml, json, or wide (a table with more columns).
        #[arg(short, long, value_enum)]
        output: Option<Output>,
        /// Serve from the replica's local state instead of a linearizable read.
        #[arg(long)]
        stale: bool,
        /// Instances only: those of this service.
        #[arg(short = 's', long)]
        service: Option<String>,
    },
    /// Delete resources by kind and name, or those in files (as kubectl:
    /// every one found is deleted, and each one not found is reported).
    Delete {
        /// The kind (`lodestar get --help` lists them).
        kind: Option<String>,
        /// The object's name.
        name: Option<String>,
        /// The namespace of KIND NAME, and of file objects that name none
        /// (default: default).
        #[arg(short, long)]
        namespace: Option<String>,
        /// A file, a directory (recursively) or - for stdin; repeat for more.
        #[arg(short = 'f', long = "filename")]
        files: Vec<String>,
        /// Succeed when an object is not there.
        #[arg(long)]
        ignore_not_found: bool,
    },
    /// Cluster membership and status.
    Cluster {
        #[command(subcommand)]
        command: ClusterCommand,
    },
    /// Register a service instance (an `Instance` resource) with a health check.
    Register(registry::RegisterArgs),
    /// Remove a service instance.
    Deregister {
        /// The instance's name (`lodestar get instances`).
        name: String,
        /// Its namespace (default: default).
        #[arg(short, long)]
        namespace: Option<String>,
    },
    /// Renew an instance's TTL check: once, or every INTERVAL.
    Heartbeat(registry::Renew),
    /// Who may call whom, from routes, Sidecars and AuthorizationPolicies
    /// (no traffic data): one line per caller -> callee, with the verdict.
    Topology {
        /// Only edges with an end in this namespace.
        #[arg(short, long)]
        namespace: Option<String>,
        /// json: the API's answer (default: a table).
        #[arg(short, long, value_enum)]
        output: Option<Output>,
    },
    /// Every connected proxy on every replica, and how far each type is in sync.
    ProxyStatus,
    /// The config a replica serves a proxy (NAME.NAMESPACE or the full node id).
    ProxyConfig {
        /// Which part of its config.
        #[arg(value_enum)]
        kind: proxy::ConfigType,
        /// NAME.NAMESPACE, or the full node id.
        proxy: String,
        /// json: the resources as served (default: a table).
        #[arg(short, long, value_enum)]
        output: Option<Output>,
    },
    /// Leases: sessions that own instances.
    Lease {
        #[command(subcommand)]
        command: registry::LeaseCommand,
    },
    /// Print an Envoy bootstrap (YAML or JSON) that connects to the replicas' xDS ports.
    Bootstrap(bootstrap::BootstrapArgs),
    /// A workload's identity on its host: its key, its certificate from the
    /// mesh CA (first with a join token, then renewed with itself), SDS for
    /// its Envoy (secrets default and ROOTCA on a Unix socket).
    Agent(Box<agent::AgentArgs>),
    /// Backups: save one from a running cluster, restore one into a new
    /// cluster's data directory, check a file.
    Snapshot {
        #[command(subcommand)]
        command: snapshot::SnapshotCommand,
    },
    /// Certificates: a cluster CA for the members of a new cluster.
    Tls {
        #[command(subcommand)]
        command: TlsCommand,
    },
    /// ACL tokens: create (the secret is shown once), list, read, revoke.
    Token {
        #[command(subcommand)]
        command: acl::TokenCommand,
    },
    /// ACL policies: verbs over kinds and namespaces.
    Policy {
        #[command(subcommand)]
        command: acl::PolicyCommand,
    },
    /// ACL roles: policies for tokens and client-certificate identities.
    Role {
        #[command(subcommand)]
        command: acl::RoleCommand,
    },
    /// ACL setup (`bootstrap`: the first management token).
    Acl {
        #[command(subcommand)]
        command: acl::AclCommand,
    },
    /// Check resources as istioctl analyze does, with Istio's codes: files
    /// offline, the live store, or files laid over the live store.
    Analyze(analyze::AnalyzeArgs),
    /// The revisions that touched the mesh, or one kind or object, newest
    /// first (the store's own history).
    History(history::HistoryArgs),
    /// What changed between two revisions (default: to now), field by field.
    Diff(history::DiffArgs),
    /// Restore the mesh, or the objects named, to their state at a
    /// revision: one new revision, previewed with --dry-run.
    Rollback(history::RollbackArgs),
    /// Every NACK (a proxy rejecting its config) as it arrives, from every
    /// replica: the proxy, the type, the rejected revision, Envoy's error.
    Nacks(nacks::NacksArgs),
    /// The mesh CA's deny list: revoke workload certificates by SPIFFE id
    /// or serial (CertificateRevocation objects; admin only).
    Cert {
        #[command(subcommand)]
        command: acl::CertCommand,
    },
    /// Authorization: why a request is allowed or denied at a proxy.
    Authz {
        #[command(subcommand)]
        command: authz::AuthzCommand,
    },
}

#[derive(Subcommand)]
enum TlsCommand {
    /// Create a cluster CA (ca.pem, and ca-key.pem readable by its owner
    /// only) in DIR, once. Give every member tls_ca_file = DIR/ca.pem and
    /// tls_ca_key_file = DIR/ca-key.pem: each issues its own certificate
    /// from it on first start.
    Ca {
        #[command(subcommand)]
        command: CaCommand,
    },
}

#[derive(Subcommand)]
enum CaCommand {
    /// Create a CA (a new key and self-signed certificate) in DIR.
    Create {
        /// Where to write it (created if missing).
        #[arg(long)]
        dir: PathBuf,
        /// The mesh CA instead, for workload certificates, in Istio's
        /// cacerts layout (ca-cert.pem, ca-key.pem, cert-chain.pem,
        /// root-cert.pem): give every member mesh_ca_dir = DIR.
        #[arg(long)]
        mesh: bool,
        /// The mesh CA's trust domain (its root names it, as Istio's does).
        #[arg(long, default_value = "cluster.local", requires = "mesh")]
        trust_domain: String,
    },
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Members, leader, term, and each replica's applied revision.
    Status {
        /// yaml or json (default: a table).
        #[arg(short, long, value_enum)]
        output: Option<Output>,
    },
    /// Add a replica: it joins as a learner, catches up, then becomes a voter.
    /// Start it first with `lodestar server --join ...`.
    AddNode {
        /// Its member id (unique, never reused).
        #[arg(long)]
        id: u64,
        /// Its raft peer address, HOST:PORT.
        #[arg(long)]
        raft_addr: String,
        /// Its API address, HOST:PORT.
        #[arg(long)]
        api_addr: String,
        /// Its xDS address, HOST:PORT.
        #[arg(long)]
        xds_addr: String,
    },
    /// Remove a replica from the cluster.
    RemoveNode {
        /// Its member id (`lodestar cluster status`).
        id: u64,
    },
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub(crate) enum Output {
    Yaml,
    Json,
    Wide,
}

#[derive(Args)]
pub struct ServerArgs {
    /// TOML config file; flags override it.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// This replica's member id (default 1).
    #[arg(long)]
    id: Option<u64>,
    /// Where it keeps its store, certificates and tokens (default
    /// ./lodestar-data).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// REST and gRPC client API (default 127.0.0.1:8470).
    #[arg(long)]
    api_addr: Option<String>,
    /// Raft peer port, for trusted peers only (default 127.0.0.1:8471).
    #[arg(long)]
    raft_addr: Option<String>,
    /// xDS (ADS) port for Envoys (default 127.0.0.1:8472).
    #[arg(long)]
    xds_addr: Option<String>,
    /// A founding member, ID=RAFT_ADDR,API_ADDR,XDS_ADDR; repeat for each.
    #[arg(long = "initial-member", value_parser = Member::parse)]
    initial_members: Vec<Member>,
    /// Start empty and wait for `lodestar cluster add-node`.
    #[arg(long)]
    join: bool,
    /// Keep the store in step with this directory of YAML/JSON resources.
    #[arg(long)]
    watch_dir: Option<PathBuf>,
    /// Serve /metrics and /debug/* also here, without TLS or a token
    /// (a loopback address only), e.g. for a local Prometheus.
    #[arg(long)]
    metrics_addr: Option<String>,
    /// History retention: at least this many revisions (default 10000)...
    #[arg(long)]
    pub(crate) history_revisions: Option<u64>,
    /// ...or every revision younger than this many seconds (default 30
    /// days), whichever keeps more.
    #[arg(long)]
    pub(crate) history_max_age_s: Option<u64>,
    /// Roll back, as a new revision, any revision a proxy NACKs within
    /// --revert-on-nack-window-s of its write (cluster-wide; default off).
    #[arg(long)]
    pub(crate) revert_on_nack: bool,
    /// Seconds after a write during which a NACK reverts it (default 300).
    #[arg(long)]
    pub(crate) revert_on_nack_window_s: Option<u64>,
    /// text (colour on a terminal, unless NO_COLOR is set) or json (one
    /// object per line).
    #[arg(long, value_enum, default_value = "text", env = "LODESTAR_LOG_FORMAT")]
    pub log_format: crate::logging::LogFormat,
}

impl ServerArgs {
    /// The configuration: the file, overridden by the flags; `insecure`
    /// is the global `--insecure`.
    pub fn into_config(self, insecure: bool) -> Result<ServerConfig> {
        let mut c = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
                ServerConfig::from_toml(&text).map_err(|e| anyhow!("{}: {e}", path.display()))?
            }
            None => ServerConfig::default(),
        };
        if let Some(v) = self.id {
            c.id = v;
        }
        if let Some(v) = self.data_dir {
            c.data_dir = v;
        }
        if let Some(v) = self.api_addr {
            c.api_addr = v;
        }
        if let Some(v) = self.raft_addr {
            c.raft_addr = v;
        }
        if let Some(v) = self.xds_addr {
            c.xds_addr = v;
        }
        if !self.initial_members.is_empty() {
            c.initial_members = self.initial_members;
        }
        c.join |= self.join;
        c.insecure |= insecure;
        if self.metrics_addr.is_some() {
            c.metrics_addr = self.metrics_addr;
        }
        if self.watch_dir.is_some() {
            c.watch_dir = self.watch_dir;
        }
        if let Some(v) = self.history_revisions {
            c.history_revisions = v;
        }
        if let Some(v) = self.history_max_age_s {
            c.history_max_age_s = v;
        }
        c.revert_on_nack |= self.revert_on_nack;
        if let Some(v) = self.revert_on_nack_window_s {
            c.revert_on_nack_window_s = v;
        }
        Ok(c)
    }
}

/// Every member's id and API address, as the replica asked lists them.
pub(crate) async fn members(client: &Client) -> Result<Vec<(u64, String)>> {
    let cluster = client.get("/v1/cluster").await?;
    Ok(cluster["members"].as_array().into_iter().flatten().filter_map(|m| Some((m["id"].as_u64()?, m["info"]["api_addr"].as_str()?.to_string()))).collect())
}

/// A dry run on the replica the CLI talks to, then on every other member
/// for the proxies connected there; a member that cannot answer is named
/// in the preview's warnings, not fatal.
pub(crate) async fn dry_run_everywhere(client: &Client, path: &str, body: &Value) -> Result<Value> {
    let mut preview = client.post(path, body).await?;
    if preview.get("proxies").is_none_or(|p| p.get("hidden").is_some()) {
        return Ok(preview);
    }
    let here = preview["proxies"]["replicas"][0].as_u64();
    let mut notes = Vec::new();
    for (id, addr) in members(client).await?.into_iter().filter(|(id, _)| Some(*id) != here) {
        let answer = client.with_server(&addr).post(path, body).await.map_err(|e| e.to_string());
        if let Err(why) = answer.and_then(|a| crate::api::dryrun::merge_proxies(&mut preview, &a)) {
            notes.push(Value::from(format!("proxies of replica {id} ({addr}) not previewed: {why}")));
        }
    }
    if let Some(w) = preview.as_object_mut().map(|o| o.entry("warnings").or_insert_with(|| json!([]))) {
        w.as_array_mut().into_iter().for_each(|a| a.extend(notes.iter().cloned()));
    }
    Ok(preview)
}

pub async fn run(cli: Cli) -> Result<()> {
    let Cli { servers, client_config, ca_file, token, insecure, command } = cli;
    if servers.len() > 1 {
        bail!("--server given {} times; this command talks to one replica", servers.len());
    }
    match command {
        Command::Server(args) => {
            let config = args.into_config(insecure)?;
            return crate::server::run(config, crate::server::shutdown_signal()).await;
        }
        Command::Tls { command: TlsCommand::Ca { command: CaCommand::Create { dir, mesh: true, trust_domain } } } => {
            crate::ca::create_dir(&dir, &trust_domain)?;
            println!(
                "created a mesh CA in {} (ca-cert.pem, ca-key.pem, cert-chain.pem, root-cert.pem) and the cluster secrets key (secrets.key); give every member mesh_ca_dir = {:?}",
                dir.display(),
                dir
            );
            return Ok(());
        }
        Command::Tls { command: TlsCommand::Ca { command: CaCommand::Create { dir, .. } } } => {
            crate::tls::pki::create_ca_dir(&dir, "Lodestar cluster CA")?;
            println!("created a cluster CA in {} (ca.pem, ca-key.pem)", dir.display());
            return Ok(());
        }
        // Files alone need no server, nor credentials.
        Command::Analyze(args) if !args.live() => return analyze::run(None, args).await,
        _ => {}
    }
    let access = client::Access { insecure, ..client::Access::resolve(servers.into_iter().next(), client_config, ca_file, token)? };
    let client = access.client()?;
    match command {
        Command::Server(_) | Command::Tls { .. } => unreachable!("handled above"),
        Command::Apply { files, namespace, wait: w, message, timeout, proxies, dry_run, expected_revision, output, revert_on_nack, validate } => {
            let client = client.with_message(message);
            let query = query(&[
                ("dryRun", dry_run.then_some("true")),
                ("expectedRevision", expected_revision.map(|r| r.to_string()).as_deref()),
                ("fieldValidation", strict_fields(&validate)?.then_some("Strict")),
            ]);
            if dry_run {
                let body = json!({ "resources": apply_documents(&files, namespace.as_deref())? });
                let preview = dry_run_everywhere(&client, &format!("/v1/apply{query}"), &body).await?;
                match output {
                    Some(Output::Json) => println!("{}", serde_json::to_string_pretty(&preview)?),
                    _ => print!("{}", crate::api::dryrun::render(&preview)),
                }
                return Ok(());
            }
            if revert_on_nack {
                let docs = apply_documents(&files, namespace.as_deref())?;
                let revision = apply_docs(&client, &docs, &query).await?;
                return match wait(&client, revision, &timeout, &proxies).await {
                    Err(e) if e.downcast_ref::<Nacked>().is_some() => revert(&client, &docs, revision, &timeout, e).await,
                    other => other,
                };
            }
            let revision = apply(&client, &files, namespace.as_deref(), &query).await?;
            if w {
                wait(&client, revision, &timeout, &proxies).await?;
            }
            Ok(())
        }
        Command::Validate { files, namespace, validate } => {
            let docs = apply_documents(&files, namespace.as_deref())?;
            let q = query(&[("fieldValidation", strict_fields(&validate)?.then_some("Strict"))]);
            let answer = client.post(&format!("/v1/validate{q}"), &json!({ "resources": docs })).await?;
            for w in answer.get("warnings").and_then(Value::as_array).into_iter().flatten() {
                eprintln!("Warning: {}", w.as_str().unwrap_or(""));
            }
            if answer["valid"] != true {
                bail!("{}", client::render_error(200, &answer));
            }
            println!("valid: {} resource(s), checked at revision {}", docs.len(), answer["revision"]);
            Ok(())
        }
        Command::Wait { revision, timeout, proxies } => {
            let revision = match revision {
                Some(r) => r,
                None => current_revision(&client).await?,
            };
            wait(&client, revision, &timeout, &proxies).await
        }
        Command::Get { kind, name, namespace, all_namespaces, selector, output, stale, service } => {
            let k = parse_kind(&kind)?;
            if k == Kind::Service && name.is_none() && selector.is_none() && output.is_none() {
                let ns = if all_namespaces { None } else { Some(namespace.as_deref().unwrap_or(crate::model::DEFAULT_NAMESPACE)) };
                return registry::services_table(&client, ns).await;
            }
            let filter = GetFilter { selector: selector.as_deref(), service: service.as_deref() };
            get(&client, &kind, name.as_deref(), namespace.as_deref(), all_namespaces, filter, output, stale).await
        }
        Command::Register(args) => registry::register(&client, args).await,
        Command::Deregister { name, namespace } => registry::deregister(&client, &name, &namespace).await,
        Command::Heartbeat(r) => registry::heartbeat(&client, "instances", &r).await,
        Command::Lease { command } => registry::lease(&client, command).await,
        Command::ProxyStatus => proxy::status(&client).await,
        Command::Topology { namespace, output } => registry::topology_table(&client, namespace.as_deref(), output == Some(Output::Json)).await,
        Command::Authz { command } => authz::run(&client, command).await,
        Command::Analyze(args) => analyze::run(Some(&client), args).await,
        Command::History(args) => history::history(&client, args).await,
        Command::Diff(args) => history::diff(&client, args).await,
        Command::Rollback(args) => history::rollback(&client, args).await.map(|_| ()),
        Command::Nacks(args) => nacks::run(&client, args).await,
        Command::ProxyConfig { kind, proxy: p, output } => proxy::config(&client, kind, &p, output == Some(Output::Json)).await,
        Command::Delete { kind, name, namespace, files, ignore_not_found } => delete(&client, kind, name, namespace, &files, ignore_not_found).await,
        Command::Cluster { command } => cluster(&client, command).await,
        Command::Bootstrap(args) => bootstrap::run(&client, access.ca_pem.as_deref(), args).await,
        Command::Agent(args) => agent::run(&client, access.ca_pem.as_deref(), *args).await,
        Command::Snapshot { command } => snapshot::run(&client, command).await,
        Command::Token { command } => acl::token(&client, command).await,
        Command::Policy { command } => acl::policy(&client, command).await,
        Command::Role { command } => acl::role(&client, command).await,
        Command::Acl { command } => acl::acl(&client, command).await,
        Command::Cert { command } => acl::cert(&client, command).await,
    }
}

/// Read resource documents from files, directories (recursively, sorted) or stdin.
fn read_documents(files: &[String]) -> Result<Vec<Value>> {
    let mut paths = Vec::new();
    for f in files {
        if f == "-" {
            paths.push(PathBuf::from("-"));
        } else {
            collect(Path::new(f), &mut paths)?;
        }
    }
    let mut docs = Vec::new();
    for p in paths {
        let (name, text) = if p.as_os_str() == "-" {
            ("stdin".to_string(), std::io::read_to_string(std::io::stdin())?)
        } else {
            (p.display().to_string(), std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?)
        };
        docs.extend(parse_documents(&text, &name).map_err(|e| anyhow!("{e}"))?);
    }
    Ok(docs)
}

/// A directory's resource files as the server's watched directory finds
/// them (`adapters::directory`: links below it are not followed, bounded
/// depth and count); any other path as given.
fn collect(path: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let meta = std::fs::metadata(path).with_context(|| format!("{}", path.display()))?;
    if meta.is_dir() {
        let walk = crate::adapters::directory::resource_files(path, &Default::default()).map_err(|e| anyhow!(e))?;
        for link in &walk.skipped_links {
            eprintln!("warning: {}: a symbolic link, not followed (name the file itself to apply it)", link.display());
        }
        out.extend(walk.files.into_iter().map(|f| f.0));
    } else {
        out.push(path.to_path_buf());
    }
    Ok(())
}

pub(crate) fn print_write_result(result: &Value) {
    if let Some(items) = result.get("items").and_then(Value::as_array) {
        for item in items {
            let kind = item["kind"].as_str().unwrap_or("").to_ascii_lowercase();
            println!("{kind}/{} {}", item["name"].as_str().unwrap_or(""), item["action"].as_str().unwrap_or(""));
        }
    }
    for w in result.get("warnings").and_then(Value::as_array).into_iter().flatten() {
        eprintln!("Warning: {}", w.as_str().unwrap_or(""));
    }
    eprintln!("revision {}", result["revision"]);
}

/// The cluster's newest revision (its replicas' highest applied one).
async fn current_revision(client: &Client) -> Result<u64> {
    let status = client.get("/v1/cluster").await?;
    status["members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["status"]["revision"].as_u64())
        .max()
        .ok_or_else(|| anyhow!("no replica reported its revision"))
}

/// `lodestar wait` (and `apply --wait`): until each of `proxies` is
/// connected, then until every connected proxy has ACKed `revision`; on a
/// terminal, with a line saying what is still awaited.
async fn wait(client: &Client, revision: u64, timeout: &str, proxies: &[String]) -> Result<()> {
    let limit = crate::model::istio::duration::parse_duration(timeout).map_err(|e| anyhow!("--timeout: {e}"))?;
    let deadline = std::time::Instant::now() + limit;
    let mut progress = progress::Progress::new();
    let since_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    for p in proxies {
        loop {
            match proxy::presence(client, p, since_ms.saturating_sub(limit.as_millis() as u64)).await? {
                proxy::Presence::Connected => break,
                presence if std::time::Instant::now() >= deadline => {
                    progress.clear();
                    let why = match presence {
                        proxy::Presence::Refused(why) => format!("; refused: {why}"),
                        _ => String::new(),
                    };
                    bail!("proxy {p} did not connect to any replica within {timeout}{why} (lodestar proxy-status lists the connected and the refused)")
                }
                proxy::Presence::Refused(why) => progress.show(&format!("waiting for proxy {p} to connect (refused: {why})")),
                proxy::Presence::Absent => progress.show(&format!("waiting for proxy {p} to connect")),
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }
    // Ask in short rounds, so the line can show who is still behind.
    let (status, r) = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let round = left.min(std::time::Duration::from_secs(1));
        let (status, r) = client.get_any(&format!("/v1/wait?revision={revision}&timeout={}ms", round.as_millis().max(1))).await?;
        if status != 503 || r.get("error").is_some() || left <= round {
            break (status, r);
        }
        let pending: Vec<&str> = r["pending"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        progress.show(&format!("revision {revision}: {} of {} proxies in sync; behind: {}", r["synced"], r["proxies"], pending.join(", ")));
    };
    progress.clear();
    if r.get("error").is_some() {
        bail!("{}", client::render_error(status, &r));
    }
    let list = |k: &str| r[k].as_array().map(|a| a.iter().filter_map(Value::as_str).map(String::from).collect::<Vec<_>>()).unwrap_or_default();
    for u in list("unreachable") {
        eprintln!("warning: {u}");
    }
    match status {
        200 => {
            println!("revision {revision}: {} of {} proxies in sync", r["synced"], r["proxies"]);
            Ok(())
        }
        409 => Err(Nacked(format!("revision {revision} rejected:\n  {}", list("nacked").join("\n  "))).into()),
        503 => {
            bail!("revision {revision}: {} of {} proxies in sync after {timeout}; still behind:\n  {}", r["synced"], r["proxies"], list("pending").join("\n  "))
        }
        _ => bail!("{}", client::render_error(status, &r)),
    }
}

/// `wait`'s failure when a proxy rejected the revision (NACK).
#[derive(Debug)]
struct Nacked(String);

impl std::fmt::Display for Nacked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Nacked {}

/// `apply --wait --revert-on-nack`, after a proxy rejected `revision`: one
/// rollback of the write's objects to the revision before it (audited as
/// a rollback), awaited, then the failure that names the NACKs.
async fn revert(client: &Client, docs: &[Value], revision: u64, timeout: &str, nacked: anyhow::Error) -> Result<()> {
    let resources: Vec<Value> = docs
        .iter()
        .map(|d| json!({"kind": d["kind"].as_str().unwrap_or("").to_lowercase(), "namespace": d["metadata"]["namespace"], "name": d["metadata"]["name"]}))
        .collect();
    let back = client.post("/v1/rollback", &json!({"revision": revision - 1, "resources": resources})).await?;
    print_write_result(&back);
    let reverted = back["revision"].as_u64().unwrap_or(revision);
    wait(client, reverted, timeout, &[]).await?;
    bail!("{nacked}\nrolled back (--revert-on-nack): revision {reverted} restores what the write changed as it was at revision {}", revision - 1)
}

async fn apply(client: &Client, files: &[String], namespace: Option<&str>, query: &str) -> Result<u64> {
    let docs = apply_documents(files, namespace)?;
    apply_docs(client, &docs, query).await
}

async fn apply_docs(client: &Client, docs: &[Value], query: &str) -> Result<u64> {
    let result = client.post(&format!("/v1/apply{query}"), &json!({ "resources": docs })).await?;
    print_write_result(&result);
    result["revision"].as_u64().ok_or_else(|| anyhow!("the server answered no revision"))
}

/// `--validate warn|strict`: whether unknown fields are refused.
fn strict_fields(validate: &str) -> Result<bool> {
    match crate::model::FieldValidation::parse(validate) {
        Some(v) => Ok(v == crate::model::FieldValidation::Strict),
        None => bail!("--validate {validate:?}: expected warn or strict"),
    }
}

/// The files' documents, those without a namespace given `namespace`.
fn apply_documents(files: &[String], namespace: Option<&str>) -> Result<Vec<Value>> {
    let mut docs = read_documents(files)?;
    if docs.is_empty() {
        bail!("no resources found in {}", files.join(", "));
    }
    if let Some(ns) = namespace {
        // Cluster-scoped kinds (policies, roles) have no namespace to set.
        let scoped = |d: &Value| d["kind"].as_str().and_then(Kind::from_kind_field).is_none_or(|k| !k.is_cluster_scoped());
        for d in docs.iter_mut().filter(|d| scoped(d)) {
            if let Some(meta) = d.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.entry("namespace").or_insert_with(|| json!(ns));
            }
        }
    }
    Ok(docs)
}

fn parse_kind(kind: &str) -> Result<Kind> {
    Kind::from_cli_name(kind).ok_or_else(|| anyhow!("unknown kind {kind:?}; known kinds: {}", Kind::cli_names_help()))
}

pub(crate) struct GetFilter<'a> {
    selector: Option<&'a str>,
    /// Instances of this service only (`-s`).
    service: Option<&'a str>,
}

pub(crate) fn query(pairs: &[(&str, Option<&str>)]) -> String {
    let parts: Vec<String> = pairs.iter().filter_map(|(k, v)| v.filter(|v| !v.is_empty()).map(|v| format!("{k}={}", urlencode(v)))).collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

pub(crate) fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
async fn get(
    client: &Client,
    kind: &str,
    name: Option<&str>,
    namespace: Option<&str>,
    all: bool,
    filter: GetFilter<'_>,
    output: Option<Output>,
    stale: bool,
) -> Result<()> {
    let kind = parse_kind(kind)?;
    let selector = filter.selector;
    let namespace = if kind.is_cluster_scoped() { Some(kind.default_namespace()) } else { namespace };
    let consistency = stale.then_some("stale");
    let items: Vec<Value> = match name {
        Some(name) => {
            let ns = namespace.unwrap_or(crate::model::DEFAULT_NAMESPACE);
            let path = format!("/v1/resources/{}/{}/{}{}", kind.plural(), ns, name, query(&[("consistency", consistency)]));
            vec![client.get(&path).await?]
        }
        None => {
            let ns = if all { None } else { Some(namespace.unwrap_or(crate::model::DEFAULT_NAMESPACE)) };
            let path = format!("/v1/resources/{}{}", kind.plural(), query(&[("namespace", ns), ("labelSelector", selector), ("consistency", consistency)]));
            let list = client.get(&path).await?;
            let mut items = list["items"].as_array().cloned().unwrap_or_default();
            if let Some(svc) = filter.service {
                if kind != Kind::Instance {
                    bail!("-s/--service applies to instances only");
                }
                items.retain(|i| i["spec"]["service"].as_str() == Some(svc));
            }
            items
        }
    };
    let doc = if name.is_some() { items[0].clone() } else { json!({"apiVersion": "v1", "kind": "List", "items": items}) };
    match output {
        Some(Output::Json) => println!("{}", serde_json::to_string_pretty(&doc)?),
        Some(Output::Yaml) => print!("{}", yaml_serde::to_string(&doc)?),
        table => {
            if items.is_empty() {
                eprintln!("No resources found.");
                return Ok(());
            }
            print_table(kind, &items, table == Some(Output::Wide));
        }
    }
    Ok(())
}

fn print_table(kind: Kind, items: &[Value], wide: bool) {
    if kind == Kind::Instance {
        return print_instances(items, wide);
    }
    let mut rows = vec![vec!["NAMESPACE".to_string(), "NAME".into(), "REVISION".into(), summary_header(kind).into()]];
    if wide {
        rows[0].push("LABELS".into());
    }
    for it in items {
        let meta = &it["metadata"];
        let mut row = vec![
            meta["namespace"].as_str().unwrap_or("").to_string(),
            meta["name"].as_str().unwrap_or("").to_string(),
            meta["resourceVersion"].as_str().unwrap_or("").to_string(),
            summary(kind, it),
        ];
        if wide {
            let labels = meta["labels"]
                .as_object()
                .map(|l| l.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or(""))).collect::<Vec<_>>().join(","))
                .unwrap_or_default();
            row.push(labels);
        }
        rows.push(row);
    }
    print_rows(rows);
}

fn labels_text(meta: &Value) -> String {
    meta["labels"].as_object().map(|l| l.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or(""))).collect::<Vec<_>>().join(",")).unwrap_or_default()
}

fn print_instances(items: &[Value], wide: bool) {
    let mut header: Vec<String> = ["NAMESPACE", "NAME", "SERVICE", "ADDRESS", "HEALTH", "REVISION"].map(String::from).to_vec();
    if wide {
        header.extend(["CHECK", "REASON", "CHECKED-BY", "LEASE", "LABELS"].map(String::from));
    }
    let mut rows = vec![header];
    for it in items {
        let (meta, spec) = (&it["metadata"], &it["spec"]);
        let s = |v: &Value| v.as_str().unwrap_or("").to_string();
        let mut row =
            vec![s(&meta["namespace"]), s(&meta["name"]), s(&spec["service"]), s(&spec["address"]), registry::instance_health(it), s(&meta["resourceVersion"])];
        if wide {
            let c = &spec["healthCheck"];
            let check = [("ttl", &c["ttl"]), ("http", &c["http"]), ("tcp", &c["tcp"])]
                .iter()
                .find_map(|(k, v)| v.as_str().map(|v| format!("{k} {v}")))
                .unwrap_or_default();
            row.extend([
                check,
                s(&it["status"]["reason"]),
                it["status"]["checkedBy"].as_u64().map_or(String::new(), |n| n.to_string()),
                s(&spec["lease"]),
                labels_text(meta),
            ]);
        }
        rows.push(row);
    }
    print_rows(rows);
}

pub(crate) fn print_rows(rows: Vec<Vec<String>>) {
    let widths: Vec<usize> = (0..rows[0].len()).map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0)).collect();
    for r in rows {
        let line: Vec<String> = r.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        println!("{}", line.join("   ").trim_end());
    }
}

fn summary_header(kind: Kind) -> &'static str {
    match kind {
        Kind::DestinationRule => "HOST",
        Kind::VirtualService | Kind::ServiceEntry | Kind::Gateway => "HOSTS",
        Kind::WorkloadEntry => "ADDRESS",
        Kind::KubeGateway | Kind::ListenerSet => "LISTENERS (ATTACHED ROUTES)",
        Kind::HttpRoute | Kind::GrpcRoute | Kind::TcpRoute | Kind::TlsRoute => "PARENTS (ACCEPTED)",
        Kind::BackendTlsPolicy => "ANCESTORS (ACCEPTED)",
        _ => "",
    }
}

/// `NAME(REASON)` of each parent (or ancestor) in a route's (or policy's)
/// status, the reason its `Accepted` condition gives.
fn accepted_by(list: &Value, reference: &str) -> String {
    list.as_array()
        .map(|ps| {
            ps.iter()
                .map(|p| {
                    let accepted = p["conditions"].as_array().into_iter().flatten().find(|c| c["type"] == "Accepted");
                    let reason = accepted.map_or("", |c| c["reason"].as_str().unwrap_or(""));
                    format!("{}({reason})", p[reference]["name"].as_str().unwrap_or(""))
                })
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default()
}

fn summary(kind: Kind, item: &Value) -> String {
    let spec = &item["spec"];
    let list = |v: &Value| v.as_array().map(|a| a.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(",")).unwrap_or_default();
    let status = &item["status"];
    match kind {
        // From the status a read computes: why a route is not attached.
        Kind::KubeGateway | Kind::ListenerSet => status["listeners"]
            .as_array()
            .map(|ls| ls.iter().map(|l| format!("{}({})", l["name"].as_str().unwrap_or(""), l["attachedRoutes"])).collect::<Vec<_>>().join(","))
            .unwrap_or_default(),
        Kind::HttpRoute | Kind::GrpcRoute | Kind::TcpRoute | Kind::TlsRoute => accepted_by(&status["parents"], "parentRef"),
        Kind::BackendTlsPolicy => accepted_by(&status["ancestors"], "ancestorRef"),
        Kind::DestinationRule => spec["host"].as_str().unwrap_or("").to_string(),
        Kind::VirtualService | Kind::ServiceEntry => list(&spec["hosts"]),
        Kind::Gateway => spec["servers"].as_array().map(|s| s.iter().map(|s| list(&s["hosts"])).collect::<Vec<_>>().join(",")).unwrap_or_default(),
        Kind::WorkloadEntry => spec["address"].as_str().unwrap_or("").to_string(),
        _ => String::new(),
    }
}

async fn delete(client: &Client, kind: Option<String>, name: Option<String>, namespace: Option<String>, files: &[String], ignore: bool) -> Result<()> {
    match (files.is_empty(), kind, name) {
        (false, None, None) => {
            let docs = read_documents(files)?;
            let refs: Vec<Value> = docs
                .iter()
                .map(|d| {
                    // `kind: Gateway` is Istio's or the Gateway API's by its apiVersion.
                    let kind = d["kind"]
                        .as_str()
                        .and_then(|k| Kind::from_kind_and_api_version(k, d["apiVersion"].as_str()))
                        .map_or(d["kind"].clone(), |k| json!(k.plural()));
                    json!({"kind": kind, "name": d["metadata"]["name"], "namespace": d["metadata"]["namespace"].as_str().or(namespace.as_deref())})
                })
                .collect();
            // As kubectl: delete every object that is there (in one
            // write), then report each one that was not.
            let mut result = client.post("/v1/delete?ignoreNotFound=true", &json!({ "resources": refs })).await?;
            let mut missing = Vec::new();
            if let Some(items) = result.get_mut("items").and_then(Value::as_array_mut) {
                items.retain(|i| {
                    let found = i["action"] != "not-found";
                    if !found {
                        missing.push(format!("{} {}/{}", i["kind"].as_str().unwrap_or("").to_ascii_lowercase(), s(&i["namespace"]), s(&i["name"])));
                    }
                    found
                });
            }
            print_write_result(&result);
            if ignore || missing.is_empty() {
                return Ok(());
            }
            for m in &missing {
                eprintln!("Error from server (NotFound): {m} not found");
            }
            bail!("{} of {} objects not found (--ignore-not-found to accept that)", missing.len(), docs.len())
        }
        (true, Some(kind), Some(name)) => {
            let kind = parse_kind(&kind)?;
            let ns = namespace.as_deref().unwrap_or(crate::model::DEFAULT_NAMESPACE);
            let ignore_q = query(&[("ignoreNotFound", ignore.then_some("true"))]);
            print_write_result(&client.delete(&format!("/v1/resources/{}/{ns}/{name}{ignore_q}", kind.plural())).await?);
            Ok(())
        }
        _ => bail!("use either `delete KIND NAME` or `delete -f FILE`"),
    }
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

async fn cluster(client: &Client, command: ClusterCommand) -> Result<()> {
    let status = match command {
        ClusterCommand::Status { output: Some(Output::Json) } => {
            println!("{}", serde_json::to_string_pretty(&client.get("/v1/cluster").await?)?);
            return Ok(());
        }
        ClusterCommand::Status { output: Some(Output::Yaml) } => {
            print!("{}", yaml_serde::to_string(&client.get("/v1/cluster").await?)?);
            return Ok(());
        }
        ClusterCommand::Status { .. } => client.get("/v1/cluster").await?,
        ClusterCommand::AddNode { id, raft_addr, api_addr, xds_addr } => {
            client.post("/v1/cluster/members", &json!({"id": id, "raftAddr": raft_addr, "apiAddr": api_addr, "xdsAddr": xds_addr})).await?
        }
        ClusterCommand::RemoveNode { id } => client.delete(&format!("/v1/cluster/members/{id}")).await?,
    };
    // A replica of wire version 1 reports no versions.
    let cluster_version = status["cluster_version"].as_u64().map_or_else(|| "1 (the answering replica predates versions)".to_string(), |v| v.to_string());
    println!(
        "leader: {}   term: {}   cluster version: {cluster_version}",
        status["leader"].as_u64().map_or("none".to_string(), |l| l.to_string()),
        status["term"]
    );
    for why in status["incompatible"].as_array().into_iter().flatten() {
        println!("incompatible: {}", s(why));
    }
    println!("{:<4} {:<8} {:<10} {:<24} {:<24} {:>8} {:>9} {:>8}", "ID", "ROLE", "STATE", "API", "RAFT", "APPLIED", "REVISION", "VERSIONS");
    for m in status["members"].as_array().into_iter().flatten() {
        let st = &m["status"];
        let state = st["state"].as_str().unwrap_or("unreachable");
        let v = &m["versions"];
        let versions = match (v["min"].as_u64(), v["max"].as_u64()) {
            (Some(min), Some(max)) if min == max => max.to_string(),
            (Some(min), Some(max)) => format!("{min}..{max}"),
            _ => "-".to_string(),
        };
        println!(
            "{:<4} {:<8} {:<10} {:<24} {:<24} {:>8} {:>9} {:>8}",
            m["id"].as_u64().unwrap_or(0),
            m["role"].as_str().unwrap_or(""),
            state,
            m["info"]["api_addr"].as_str().unwrap_or(""),
            m["info"]["raft_addr"].as_str().unwrap_or(""),
            st["applied_index"].as_u64().map_or("-".into(), |v| v.to_string()),
            st["revision"].as_u64().map_or("-".into(), |v| v.to_string()),
            versions,
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::FromArgMatches;

    /// Every command and option says what it is for in `--help`.
    #[test]
    fn every_option_has_a_description() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for a in cmd.get_arguments().filter(|a| !a.is_hide_set() && !["help", "version"].contains(&a.get_id().as_str())) {
                if a.get_help().is_none() && a.get_long_help().is_none() {
                    missing.push(format!("{path} {}", a.get_long().map_or_else(|| a.get_id().to_string(), |l| format!("--{l}"))));
                }
            }
            for sc in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
                let sub = format!("{path} {}", sc.get_name());
                if sc.get_about().is_none() && sc.get_long_about().is_none() {
                    missing.push(format!("{sub} (the command)"));
                }
                walk(sc, &sub, missing);
            }
        }
        let mut cmd = super::command();
        cmd.build();
        let mut missing = Vec::new();
        walk(&cmd, "lodestar", &mut missing);
        assert!(missing.is_empty(), "{} options or commands without a description:\n{}", missing.len(), missing.join("\n"));
    }

    /// The client options are not offered where nothing talks to a
    /// cluster (`lodestar server --server` would read like a listen
    /// address), and are everywhere else.
    #[test]
    fn client_options_only_on_client_commands() {
        let mut cmd = super::command();
        cmd.build();
        let shown = |path: &[&str], id: &str| {
            let mut c = &cmd;
            for p in path {
                c = c.find_subcommand(p).unwrap();
            }
            c.get_arguments().any(|a| a.get_id() == id && !a.is_hide_set())
        };
        for path in [&["server"][..], &["tls", "ca", "create"], &["snapshot", "restore"], &["snapshot", "status"]] {
            assert!(!shown(path, "servers"), "{path:?} shows --server");
        }
        for path in [&["get"][..], &["apply"], &["snapshot", "save"], &["token", "create"], &["bootstrap"]] {
            assert!(shown(path, "servers"), "{path:?} lacks --server");
        }
        // --insecure: the server's plaintext, a client's token over http://.
        for path in [&["server"][..], &["get"], &["apply"], &["bootstrap"]] {
            assert!(shown(path, "insecure"), "{path:?} lacks --insecure");
        }
        for path in [&["tls", "ca", "create"][..], &["snapshot", "restore"], &["snapshot", "status"]] {
            assert!(!shown(path, "insecure"), "{path:?} shows --insecure");
        }
        // They still parse where shown, before or after the command.
        let cli = super::Cli::from_arg_matches(&super::command().get_matches_from(["lodestar", "get", "vs", "--server", "https://x:1"])).unwrap();
        assert_eq!(cli.servers, ["https://x:1"]);
    }
}
