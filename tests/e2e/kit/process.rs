//! The one process guard ([`Proc`]: killed on drop) and the one poll
//! helper ([`eventually`]).
//!
//! Every process a test starts through the kit (replicas, Envoys, agents,
//! [`Proc::spawn`]) registers its log file here; a poll that runs out of
//! time prints the tail of each, so a failure shows what every process
//! said. (nextest runs each test in its own process, so the list is this
//! test's.)

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How many lines of each log a failed poll prints.
const TAIL: usize = 60;

static LOGS: Mutex<Vec<(String, PathBuf)>> = Mutex::new(Vec::new());

/// Remember `path` as the log of the process called `name` (once per path).
pub fn register_log(name: &str, path: &Path) {
    let mut logs = LOGS.lock().unwrap_or_else(|e| e.into_inner());
    if !logs.iter().any(|(_, p)| p == path) {
        logs.push((name.to_string(), path.to_path_buf()));
    }
}

/// The last `n` lines of the file at `path` (empty when there is none).
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Print the tail of every registered log to stderr.
pub fn dump_logs() {
    let logs = LOGS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for (name, path) in logs {
        eprintln!("----- {name} ({}, last {TAIL} lines) -----\n{}", path.display(), tail(&path, TAIL));
    }
}

/// Poll `check` (every 100 ms) until it returns `Some`, for at most
/// `within`; then print every process's log tail and panic naming `what`.
pub async fn eventually<T, Fut>(what: &str, within: Duration, mut check: impl FnMut() -> Fut) -> T
where
    Fut: std::future::Future<Output = Option<T>>,
{
    eventually_or(what, within, || {
        let attempt = check();
        async move { attempt.await.ok_or_else(String::new) }
    })
    .await
}

/// [`eventually`] whose attempts say what they saw (`Err(last)`): the
/// panic shows the last one.
pub async fn eventually_or<T, Fut>(what: &str, within: Duration, mut check: impl FnMut() -> Fut) -> T
where
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + within;
    loop {
        let last = match check().await {
            Ok(v) => return v,
            Err(last) => last,
        };
        if Instant::now() > deadline {
            dump_logs();
            panic!("{what}: not within {within:?}; last: {last}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// [`eventually`] for a condition: until `check` returns true.
pub async fn until<Fut>(what: &str, within: Duration, mut check: impl FnMut() -> Fut)
where
    Fut: std::future::Future<Output = bool>,
{
    eventually(what, within, || {
        let holds = check();
        async move { holds.await.then_some(()) }
    })
    .await
}

/// [`eventually`] for code outside an async runtime.
pub fn eventually_blocking<T>(what: &str, within: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = check() {
            return v;
        }
        if Instant::now() > deadline {
            dump_logs();
            panic!("{what}: not within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A child process, killed (SIGKILL) and reaped when dropped.
pub struct Proc {
    child: Option<Child>,
    name: String,
    log: Option<PathBuf>,
}

impl Proc {
    /// Guard a process already started (its output goes where `child` says).
    pub fn new(name: &str, child: Child) -> Proc {
        Proc { child: Some(child), name: name.to_string(), log: None }
    }

    /// Start `cmd` with its standard error appended to `log` (standard
    /// output discarded), and register the log.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> Proc {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
        let child = cmd.stdout(Stdio::null()).stderr(file).spawn().unwrap_or_else(|e| panic!("starting {name}: {e}"));
        register_log(name, log);
        Proc { child: Some(child), name: name.to_string(), log: Some(log.to_path_buf()) }
    }

    pub fn id(&self) -> u32 {
        self.child.as_ref().expect("the process was not reaped").id()
    }

    /// The log's last `n` lines, headed by the process's name.
    pub fn tail(&self, n: usize) -> String {
        format!("--- {} (tail)\n{}", self.name, self.log.as_ref().map(|p| tail(p, n)).unwrap_or_default())
    }

    /// Send `sig` (kill(2)).
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on a child of this test that has not been reaped.
        assert_eq!(unsafe { libc::kill(self.id() as libc::pid_t, sig) }, 0, "kill {sig} {}", self.name);
    }

    /// Its exit status if it has exited.
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        self.child.as_mut()?.try_wait().unwrap()
    }

    /// Wait (bounded) for it to exit on its own: its status. Panics with
    /// its log after `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_exit() {
                return status;
            }
            assert!(Instant::now() < deadline, "{} did not exit within {timeout:?}\n{}", self.name, self.tail(80));
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on a child of this test that has not been reaped.
            unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline {
                if matches!(c.try_wait(), Ok(Some(_))) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}
