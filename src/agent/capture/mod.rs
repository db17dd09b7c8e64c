//! Transparent traffic capture (`lodestar agent --capture`), as Istio's
//! `istio-iptables` installs it: the rules ([`rules`], pure) are applied in
//! the current network namespace with one `iptables-restore --noflush`
//! (all or nothing) before Envoy starts, and removed when the agent exits
//! ([`Installed`]'s drop). Leftovers of a previous run that could not
//! remove them (SIGKILL, a crash) are removed before the install: only our
//! chains (`LODESTAR_*`) and the jumps into them.
//!
//! Refused, with what is missing: without CAP_NET_ADMIN, without the
//! iptables tools of the backend, or with another tool's capture rules in
//! the nat table (Istio's, Kuma's, Consul's chains, or a REDIRECT/DNAT in
//! PREROUTING or OUTPUT).
//!
//! Between the install and Envoy's listeners the captured connections are
//! refused (nothing listens on 15001/15006 yet): capture fails closed, as
//! a pod's does between `istio-init` and the sidecar.

pub mod rules;

use anyhow::{anyhow, bail, Context, Result};
use rules::CaptureOptions;
use std::io::Write;
use std::process::{Command, Stdio};

/// Which iptables tools write the rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// `iptables --version` decides: nf_tables or legacy.
    Auto,
    /// `iptables-nft*` (the nf_tables backend).
    Nft,
    /// `iptables-legacy*` (the x_tables backend).
    Legacy,
}

impl Backend {
    /// The backend `iptables` (the system's default) uses.
    pub fn detect() -> Result<Backend> {
        let out = Command::new("iptables").arg("--version").output().map_err(|e| anyhow!("--capture needs iptables (running `iptables --version`: {e})"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        if text.contains("nf_tables") {
            Ok(Backend::Nft)
        } else if text.contains("legacy") {
            Ok(Backend::Legacy)
        } else {
            bail!("`iptables --version` names no backend ({}); give --iptables-backend nft or legacy", text.trim())
        }
    }

    /// The resolved backend (`Auto` detected).
    pub fn resolve(self) -> Result<Backend> {
        match self {
            Backend::Auto => Backend::detect(),
            b => Ok(b),
        }
    }

    fn tool(self, what: &str) -> String {
        match self {
            Backend::Legacy => format!("iptables-legacy{what}"),
            _ => format!("iptables-nft{what}"),
        }
    }
}

/// Whether this process has CAP_NET_ADMIN (bit 12 of CapEff).
pub fn has_net_admin() -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else { return false };
    status.lines().find_map(|l| l.strip_prefix("CapEff:")).and_then(|h| u64::from_str_radix(h.trim(), 16).ok()).is_some_and(|caps| caps & (1 << 12) != 0)
}

fn run(cmd: &mut Command, what: &str) -> Result<String> {
    let out = cmd.output().map_err(|e| anyhow!("{what}: {e}"))?;
    if !out.status.success() {
        bail!("{what}: {} {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The nat table as `iptables-save` prints it.
pub fn save(backend: Backend) -> Result<String> {
    let tool = backend.tool("-save");
    run(Command::new(&tool).args(["-t", "nat"]), &format!("{tool} -t nat (is iptables installed?)"))
}

/// Remove our chains and the jumps into them, if any; returns how many
/// commands that took (0: there was nothing of ours).
pub fn remove(backend: Backend) -> Result<usize> {
    let cmds = rules::remove(&save(backend)?);
    let tool = backend.tool("");
    for c in &cmds {
        run(Command::new(&tool).args(c), &format!("{tool} {}", c.join(" ")))?;
    }
    let left = rules::our_chains(&save(backend)?);
    if !left.is_empty() {
        bail!("after removing the capture rules, chains remain: {}", left.join(", "));
    }
    Ok(cmds.len())
}

/// Installed capture rules, removed when dropped.
#[derive(Debug)]
pub struct Installed {
    backend: Backend,
}

impl Installed {
    /// Install `opts`' rules (see the module doc for what is refused).
    pub fn install(opts: &CaptureOptions, backend: Backend) -> Result<Installed> {
        if !has_net_admin() {
            bail!("--capture needs CAP_NET_ADMIN (run the agent as root, or grant it: setcap cap_net_admin+ep, systemd AmbientCapabilities=CAP_NET_ADMIN)");
        }
        let backend = backend.resolve()?;
        let before = save(backend)?;
        if !rules::our_chains(&before).is_empty() {
            let n = remove(backend).context("removing the capture rules a previous agent left")?;
            tracing::warn!(commands = n, "removed the capture rules a previous agent left (it did not exit cleanly)");
        }
        let foreign = rules::foreign_rules(&save(backend)?);
        if !foreign.is_empty() {
            bail!("--capture: another tool's rules are in the nat table and would take the traffic first; remove them: {}", foreign.join("; "));
        }
        let tool = backend.tool("-restore");
        let text = opts.install();
        let mut child = Command::new(&tool)
            .arg("--noflush")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| anyhow!("--capture needs {tool}: {e}"))?;
        child.stdin.take().ok_or_else(|| anyhow!("{tool}: no stdin"))?.write_all(text.as_bytes()).with_context(|| format!("writing to {tool}"))?;
        let out = child.wait_with_output().with_context(|| format!("waiting for {tool}"))?;
        if !out.status.success() {
            // iptables-restore commits the table as one transaction: on an
            // error nothing was applied.
            bail!("{tool} --noflush refused the capture rules (nothing was applied): {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        tracing::info!(?backend, outbound = opts.outbound_port, inbound = opts.inbound_port, proxy_uid = opts.proxy_uid, "installed the capture rules");
        Ok(Installed { backend })
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        match remove(self.backend) {
            Ok(n) => tracing::info!(commands = n, "removed the capture rules"),
            Err(e) => tracing::error!(error = %format!("{e:#}"), "removing the capture rules; the next `agent --capture` removes them"),
        }
    }
}
