//! Envoy as the agent's child process (`lodestar agent --run-envoy`), the
//! way pilot-agent runs it.
//!
//! - Started once the agent has a certificate and has written the
//!   bootstrap, with `--disable-hot-restart` (no shared memory, so several
//!   workloads' Envoys share a host without base ids), `--drain-time-s`
//!   and `--drain-strategy immediate`.
//! - It dies with the agent (`PR_SET_PDEATHSIG`): an agent killed with
//!   SIGKILL leaves no Envoy behind holding the workload's ports.
//! - When it exits on its own (a crash, `kill -9`) it is started again
//!   after a backoff (0.5 s doubling to 30 s; back to 0.5 s once a run
//!   lasted a minute).
//! - Stopping ([`Supervisor::run`]'s `stop`): `POST
//!   /drain_listeners?graceful` on its admin port (loopback only), the drain
//!   time to let connections finish, then SIGTERM, and SIGKILL if it has
//!   not exited 10 s later.

use anyhow::{anyhow, Result};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::sync::watch;

const BACKOFF_MIN: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A run this long resets the backoff.
const STABLE_RUN: Duration = Duration::from_secs(60);
/// How long Envoy has after SIGTERM before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub struct EnvoyOptions {
    /// The Envoy binary.
    pub binary: PathBuf,
    pub bootstrap: PathBuf,
    /// Its admin address, `HOST:PORT` on loopback (the bootstrap's).
    pub admin: String,
    /// How long connections get to finish after the drain starts.
    pub drain: Duration,
    /// More arguments for Envoy (`--log-level debug`, ...).
    pub extra_args: Vec<String>,
    /// Run it under this uid and gid (`--capture`: the rules leave its own
    /// connections alone by them); None: the agent's.
    pub user: Option<(u32, u32)>,
}

/// Runs Envoy until stopped; `pid` publishes the current child's pid (0
/// while none runs), for logs and tests.
pub struct Supervisor {
    pub opts: EnvoyOptions,
    pub pid: watch::Sender<u32>,
}

impl Supervisor {
    fn command(&self) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.opts.binary);
        cmd.arg("-c").arg(&self.opts.bootstrap);
        cmd.args(["--disable-hot-restart", "--drain-strategy", "immediate"]);
        cmd.args(["--drain-time-s", &self.opts.drain.as_secs().max(1).to_string()]);
        cmd.args(&self.opts.extra_args);
        // Envoy's log goes where the agent's does (the journal under systemd).
        cmd.stdin(Stdio::null()).stdout(Stdio::inherit()).stderr(Stdio::inherit());
        cmd.kill_on_drop(true);
        if let Some((uid, gid)) = self.opts.user {
            // The gid first, then the uid; supplementary groups dropped (std
            // does, when root changes uid without naming groups).
            cmd.uid(uid).gid(gid);
        }
        #[cfg(target_os = "linux")]
        // SAFETY: prctl is async-signal-safe and touches no memory of the
        // parent; it runs in the forked child before exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd
    }

    /// Run (and re-run) Envoy until `stop` turns true, then drain and stop
    /// it. Returns when Envoy has exited.
    pub async fn run(&self, mut stop: watch::Receiver<bool>) -> Result<()> {
        let mut backoff = BACKOFF_MIN;
        loop {
            if *stop.borrow() {
                return Ok(());
            }
            let mut child = self.command().spawn().map_err(|e| anyhow!("starting Envoy ({}): {e}", self.opts.binary.display()))?;
            let pid = child.id().unwrap_or(0);
            let started = Instant::now();
            self.pid.send_replace(pid);
            tracing::info!(pid, bootstrap = %self.opts.bootstrap.display(), "started Envoy");
            let exited = tokio::select! {
                status = child.wait() => Some(status),
                _ = stop.wait_for(|s| *s) => None,
            };
            let Some(status) = exited else {
                self.drain_and_stop(&mut child, pid).await;
                self.pid.send_replace(0);
                return Ok(());
            };
            self.pid.send_replace(0);
            let status = status.map_err(|e| anyhow!("waiting for Envoy: {e}"))?;
            if started.elapsed() >= STABLE_RUN {
                backoff = BACKOFF_MIN;
            }
            tracing::warn!(pid, %status, "Envoy exited; starting it again in {backoff:?}");
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return Ok(()),
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    async fn drain_and_stop(&self, child: &mut tokio::process::Child, pid: u32) {
        // Graceful drain: listeners keep accepting for the drain time while
        // Envoy asks clients to close (HTTP/2 GOAWAY, `connection: close`).
        let url = format!("http://{}/drain_listeners?graceful", self.opts.admin);
        let drained = match reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(2)).build() {
            Ok(http) => http.post(&url).send().await.map(|r| r.status().is_success()).unwrap_or(false),
            Err(_) => false,
        };
        if drained {
            tracing::info!(pid, drain = ?self.opts.drain, "draining Envoy's listeners");
            tokio::select! {
                _ = child.wait() => { tracing::info!(pid, "Envoy exited while draining"); return; }
                _ = tokio::time::sleep(self.opts.drain) => {}
            }
        } else {
            tracing::warn!(pid, "Envoy's admin did not take the drain; stopping it at once");
        }
        if pid != 0 {
            // SAFETY: kill(2) on our own child's pid, which we have not
            // reaped yet (so it cannot have been reused).
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGTERM);
            }
        }
        match tokio::time::timeout(TERM_GRACE, child.wait()).await {
            Ok(status) => tracing::info!(pid, status = %status.map_or_else(|e| e.to_string(), |s| s.to_string()), "Envoy stopped"),
            Err(_) => {
                tracing::warn!(pid, "Envoy did not exit {TERM_GRACE:?} after SIGTERM; killing it");
                let _ = child.kill().await;
            }
        }
    }
}

/// Until Envoy's admin at `admin` answers `/ready` with 200 (its listeners
/// and clusters initialised), polling every 500 ms; false if `stop` came
/// first. The agent registers the workload only then, so no client is sent
/// to an Envoy that cannot serve yet.
pub async fn wait_ready(admin: &str, mut stop: watch::Receiver<bool>) -> bool {
    let Ok(http) = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(2)).build() else { return false };
    let url = format!("http://{admin}/ready");
    loop {
        if http.get(&url).send().await.is_ok_and(|r| r.status().is_success()) {
            return true;
        }
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return false,
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}
