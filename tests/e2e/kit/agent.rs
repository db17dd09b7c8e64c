//! The one workload launcher: a join token for `NAMESPACE/NAME`, `lodestar
//! agent` as a process ([`Agent`]), and, for a sidecar, the Envoy it
//! bootstraps ([`Workload`]). Registration is the agent's own flags
//! (`--workload-group`, `--lease-ttl`, ...), passed with [`AgentBuilder::args`].

use super::process::{eventually, Proc};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long an agent may take to get its first certificate.
pub const FIRST_CERTIFICATE: Duration = Duration::from_secs(30);

/// A join token for the workload `namespace/name`, created through the CLI
/// against `api`: its secret.
pub fn join_token(api: &str, workload: &str) -> String {
    super::token_create(api, &["--workload", workload])["secret"].as_str().unwrap().to_string()
}

/// What [`Agent`] is started with.
pub struct AgentBuilder {
    name: String,
    dir: PathBuf,
    identity: PathBuf,
    log: PathBuf,
    server: Option<String>,
    args: Vec<OsString>,
    env: Vec<(String, OsString)>,
    netns: Option<String>,
    binary: Option<PathBuf>,
}

impl AgentBuilder {
    /// `lodestar agent --xds-servers XDS --name NAME --namespace NAMESPACE`,
    /// keeping its identity in `DIR/identity` and its log in `DIR/agent.log`.
    pub fn new(namespace: &str, name: &str, xds: &str, dir: &Path) -> AgentBuilder {
        let args = ["--xds-servers", xds, "--name", name, "--namespace", namespace].map(OsString::from).to_vec();
        AgentBuilder {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            identity: dir.join("identity"),
            log: dir.join("agent.log"),
            server: None,
            args,
            env: Vec::new(),
            netns: None,
            binary: None,
        }
    }

    /// The replica API the agent registers through (`--server`).
    pub fn server(mut self, api: &str) -> Self {
        self.server = Some(api.to_string());
        self
    }

    /// Keep the identity (key, certificate) in `dir` (`--dir`).
    pub fn identity_dir(mut self, dir: &Path) -> Self {
        self.identity = dir.to_path_buf();
        self
    }

    /// Append the log to `path`.
    pub fn log(mut self, path: &Path) -> Self {
        self.log = path.to_path_buf();
        self
    }

    /// A new join token for this workload from `api`, written to
    /// `DIR/join.token` and passed with `--join-token-file`.
    pub fn join_token(self, api: &str, workload: &str) -> Self {
        std::fs::create_dir_all(&self.dir).unwrap();
        let file = self.dir.join("join.token");
        std::fs::write(&file, join_token(api, workload)).unwrap();
        self.join_token_file(&file)
    }

    /// `--join-token-file FILE`.
    pub fn join_token_file(self, file: &Path) -> Self {
        self.args([OsString::from("--join-token-file"), file.into()])
    }

    pub fn args<S: Into<OsString>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    pub fn env(mut self, key: &str, value: impl Into<OsString>) -> Self {
        self.env.push((key.to_string(), value.into()));
        self
    }

    /// Run it in the network namespace `name` (`ip netns exec`, which
    /// execs: the process is the agent's).
    pub fn netns(mut self, name: &str) -> Self {
        self.netns = Some(name.to_string());
        self
    }

    /// Run this `lodestar` binary instead of this build's (another
    /// release's agent: tests/e2e/upgrade.rs).
    pub fn binary(mut self, path: &Path) -> Self {
        self.binary = Some(path.to_path_buf());
        self
    }

    fn command(&self) -> std::process::Command {
        let bin = self.binary.clone().unwrap_or_else(|| PathBuf::from(super::BIN));
        let mut cmd = match &self.netns {
            Some(ns) => {
                let mut c = std::process::Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&bin);
                c
            }
            None => std::process::Command::new(&bin),
        };
        cmd.env("LODESTAR_CONFIG", &super::test_ca().client_config);
        if let Some(api) = &self.server {
            cmd.args(["--server", api]);
        }
        cmd.arg("agent").arg("--dir").arg(&self.identity).args(&self.args).env("RUST_LOG", "info");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    /// Start it (does not wait).
    pub fn start(self) -> Agent {
        std::fs::create_dir_all(self.log.parent().unwrap()).unwrap();
        let proc = Proc::spawn(&format!("agent {}", self.name), self.command(), &self.log);
        Agent { proc, dir: self.dir, identity: self.identity, log: self.log }
    }

    /// Run it to its end: (success, standard error).
    pub fn run(self) -> (bool, String) {
        let out = self.command().output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// `lodestar agent` as a process, killed when dropped (its Envoy child,
/// with `--run-envoy`, dies with it: PR_SET_PDEATHSIG).
pub struct Agent {
    pub proc: Proc,
    pub dir: PathBuf,
    pub identity: PathBuf,
    log: PathBuf,
}

impl Agent {
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The certificate chain it writes.
    pub fn cert_chain(&self) -> PathBuf {
        self.identity.join("cert-chain.pem")
    }

    /// Until its certificate and every file in `also` (a bootstrap) exist.
    pub async fn wait_for_files(&self, also: &[&Path]) {
        let what = format!("agent {}: certificate and {also:?}", self.dir.display());
        eventually(&what, FIRST_CERTIFICATE, || async { (self.cert_chain().exists() && also.iter().all(|p| p.exists())).then_some(()) }).await
    }
}

/// One sidecar workload: its agent (which writes an Envoy bootstrap with
/// `--bootstrap`) and the Envoy started from that bootstrap.
pub struct Workload {
    pub ip: String,
    pub dir: PathBuf,
    pub agent: Agent,
    pub envoy: Proc,
}

impl Workload {
    /// Start the agent `builder` describes with `--bootstrap DIR/bootstrap.json`,
    /// wait for its certificate and bootstrap, then start Envoy from it
    /// (admin on `ip`:15000: `--admin-port 15000` is the caller's flag) and
    /// wait until Envoy is ready and `ready` holds for it.
    pub async fn start<Fut>(builder: AgentBuilder, ip: &str, ready: impl Fn(String) -> Fut) -> Workload
    where
        Fut: std::future::Future<Output = bool>,
    {
        let bootstrap = builder.dir.join("bootstrap.json");
        let agent = builder.args([OsString::from("--bootstrap"), bootstrap.clone().into()]).start();
        agent.wait_for_files(&[&bootstrap]).await;
        let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&bootstrap).unwrap()).unwrap();
        assert_eq!(doc["node"]["metadata"]["LODESTAR_SDS"], "true", "the agent's bootstrap says the proxy has SDS");
        let dir = agent.dir.clone();
        let log = dir.join("envoy.log");
        let mut cmd = std::process::Command::new(super::envoy::envoy_binary());
        cmd.arg("-c").arg(&bootstrap).args(["--use-dynamic-base-id", "--log-level", "info", "--drain-time-s", "2"]);
        let envoy = Proc::spawn(&format!("envoy {}", dir.display()), cmd, &log);
        let admin = format!("http://{ip}:15000");
        let what = format!("envoy {} ready with its certificate", dir.display());
        eventually(&what, FIRST_CERTIFICATE, || async {
            let up = super::mesh::plain().get(format!("{admin}/ready")).send().await.is_ok_and(|r| r.status().is_success());
            (up && ready(admin.clone()).await).then_some(())
        })
        .await;
        Workload { ip: ip.to_string(), dir, agent, envoy }
    }

    pub fn admin(&self) -> String {
        format!("http://{}:15000", self.ip)
    }

    /// Counters and gauges of its Envoy.
    pub async fn stats(&self) -> std::collections::BTreeMap<String, u64> {
        super::envoy::admin_stats(&self.admin()).await.expect("envoy stats")
    }

    /// The serial of the workload certificate its Envoy serves.
    pub async fn serving_serial(&self) -> Option<String> {
        super::envoy::serving_serial(&self.admin()).await
    }

    /// The agent's whole log and the tail of Envoy's.
    pub fn logs(&self) -> String {
        format!("--- agent {}\n{}\n{}", self.ip, self.agent.log(), self.envoy.tail(60))
    }
}
