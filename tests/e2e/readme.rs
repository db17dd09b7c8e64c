//! The README, run as printed (issue 33): a newcomer's first ten minutes.
//!
//! The fenced `sh` blocks of the sections named in [`SECTIONS`] run in
//! README order, each section in a fresh `bash` (`set -Eeuo pipefail`), in
//! one scratch checkout with a fresh `HOME`, as a user following the README
//! top to bottom would run them. Processes a block starts with `&` keep
//! running into later sections (a server started in "Run a server" serves
//! "The service registry").
//!
//! What the harness adds, and nothing else:
//! - `PATH`: the checkout's `target/debug` (where `lodestar` is, a link to
//!   the binary under test, as after `cargo build`), `envoy`
//!   (`LODESTAR_ENVOY`) and `python3`, then the system's directories.
//! - A command line ending in `# → TEXT` must print exactly TEXT (its
//!   standard output, trimmed); one ending in `# ✗ TEXT` must fail (exit
//!   non-zero) with TEXT in its standard error: the harness checks both.
//!   Other comments are prose.
//! - [`SUBSTITUTIONS`]: a README line the harness cannot run as printed is
//!   replaced by the command given there, and each must match exactly one
//!   line, so a README change that moves it fails here first. Only "Run a
//!   server"'s `cargo run --release -- server` is replaced: a release build
//!   takes many minutes, so the harness runs the binary under test (the same
//!   source in the debug profile) with the same arguments, in the
//!   background (the user keeps it in its own terminal), and waits for its
//!   `/readyz` before the next command (the user waits for its log).
//! - A block whose info string holds `norun` (```` ```sh norun ````) is not
//!   run: it is for other machines (it names their addresses).
//!
//! Isolation: with namespaces (root, or unprivileged user namespaces), the
//! run gets its own network namespace (the README's fixed ports and
//! addresses clash with nothing), its own PID namespace (every process a
//! block started, `&` or `nohup`, dies with it) and its own `/dev/shm`
//! (Envoy's `--base-id` shared memory). Without them it runs on the host's
//! loopback in its own process group, killed at the end, and needs the
//! README's ports free.
//!
//! A failure names the section, the README line, the command and its exit
//! status, and prints the section's output and the server logs; the
//! scratch directory is then kept (`LODESTAR_README_KEEP=1` keeps it
//! always).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

const BIN: &str = env!("CARGO_BIN_EXE_lodestar");

/// The README sections run, by heading, with the least number of checked
/// answers (`# → TEXT`) each must hold.
const SECTIONS: &[(&str, usize)] = &[
    ("Run a server", 0),
    ("Web console", 3),
    ("Walkthrough: traffic through Envoy", 6),
    ("Check config: `lodestar analyze`", 1),
    ("Mesh config, external authorization (CUSTOM) and the Telemetry API", 1),
    ("Gateway API", 6),
    ("EnvoyFilter", 2),
    ("Connect an Envoy", 0),
    ("A three-replica cluster on one machine", 0),
    ("The service registry", 0),
    ("Tokens and policies (ACLs)", 1),
    ("Transparent capture", 1),
    ("DNS: mesh names, as Istio's agent DNS proxy", 1),
];

/// (section, README line as printed, what the harness runs instead); see
/// the module doc for why.
const SUBSTITUTIONS: &[(&str, &str, &str)] = &[(
    "Run a server",
    "cargo run --release -- server",
    r#"lodestar server >>"$README_HARNESS/server.log" 2>&1 & __ready https://127.0.0.1:8470 lodestar-data/tls/ca.pem"#,
)];

/// Each section's time limit (the whole run takes well under a minute).
const SECTION_TIMEOUT_S: u64 = 120;

/// A fenced block: its first line's number in README.md (1-based, the
/// line after the fence) and its lines.
struct Block {
    line: usize,
    lines: Vec<String>,
}

/// The `sh` blocks under each heading (`#`..`######`, text as written).
/// Fences as CommonMark has them: three or more backticks, and an info
/// string without a backtick (else it is inline code); closed by as many.
fn sh_blocks(readme: &str) -> BTreeMap<String, Vec<Block>> {
    let mut out: BTreeMap<String, Vec<Block>> = BTreeMap::new();
    let mut heading = String::new();
    // (fence length, run it, the block)
    let mut fence: Option<(usize, bool, Block)> = None;
    let ticks = |l: &str| l.trim_start().chars().take_while(|c| *c == '`').count();
    for (i, line) in readme.lines().enumerate() {
        let n = i + 1;
        if let Some((len, _, block)) = &mut fence {
            if ticks(line) >= *len && line.trim_start().trim_start_matches('`').trim().is_empty() {
                let (_, run, block) = fence.take().unwrap();
                if run {
                    out.entry(heading.clone()).or_default().push(block);
                }
            } else {
                block.lines.push(line.to_string());
            }
            continue;
        }
        let len = ticks(line);
        let info = line.trim_start().trim_start_matches('`');
        if len >= 3 && !info.contains('`') {
            let words: Vec<&str> = info.split_whitespace().collect();
            let run = words.first() == Some(&"sh") && !words.contains(&"norun");
            fence = Some((len, run, Block { line: n + 1, lines: Vec::new() }));
        } else if line.starts_with('#') {
            heading = line.trim_start_matches('#').trim().to_string();
        }
    }
    out
}

/// Bash single-quoted.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Helpers every section script starts with. `__fail` reports the script
/// line, mapped back to the README by [`Script::readme_line`].
const PRELUDE: &str = r#"set -Eeuo pipefail
trap '__s=$?; echo "README_FAILED script_line=$LINENO status=$__s command: $BASH_COMMAND" >&2; exit $__s' ERR
__expect() { set -- "$1" "$(printf '%s' "$2" | sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//')" "$3"; if [ "$2" != "$1" ]; then echo "README_MISMATCH readme_line=$3 want: $1" >&2; echo "got: $2" >&2; exit 1; fi; echo "README_CHECKED readme_line=$3: $1"; }
__expect_error() { case "$2" in *"$1"*) echo "README_CHECKED readme_line=$3: fails with $1" ;; *) echo "README_MISMATCH readme_line=$3 want an error holding: $1" >&2; echo "got: $2" >&2; exit 1 ;; esac; }
__succeeded() { echo "README_MISMATCH readme_line=$1 want a failure; it succeeded" >&2; exit 1; }
__ready() { for _ in $(seq 1 300); do if [ -f "$2" ] && curl -fsS --cacert "$2" "$1/readyz" >/dev/null 2>&1; then return 0; fi; sleep 0.1; done; echo "README_FAILED $1 not ready within 30s" >&2; return 1; }
"#;

/// One section as a bash script, with the README line of each script line.
struct Script {
    text: String,
    /// A block's first script line (1-based) → (its README line, its
    /// number in the section).
    lines: BTreeMap<usize, (usize, usize)>,
    checks: usize,
}

impl Script {
    /// The README line and block of a script line.
    fn readme_line(&self, script_line: usize) -> Option<(usize, usize)> {
        self.lines.range(..=script_line).next_back().map(|(s, (r, b))| (r + (script_line - s), *b))
    }
}

/// What a command line says it does.
#[derive(Debug, PartialEq)]
enum Expect<'a> {
    /// `CMD  # → TEXT`: CMD prints exactly TEXT.
    Prints(&'a str, &'a str),
    /// `CMD  # ✗ TEXT`: CMD fails, with TEXT in its standard error.
    Fails(&'a str, &'a str),
}

fn expectation(line: &str) -> Option<Expect<'_>> {
    let (cmd, want, fails) = match line.split_once("# → ") {
        Some((cmd, want)) => (cmd, want, false),
        None => line.split_once("# ✗ ").map(|(cmd, want)| (cmd, want, true))?,
    };
    let cmd = cmd.trim_end();
    if cmd.is_empty() || cmd.trim_start().starts_with('#') {
        return None;
    }
    Some(if fails { Expect::Fails(cmd, want.trim()) } else { Expect::Prints(cmd, want.trim()) })
}

fn script(section: &str, blocks: &[Block], used: &mut BTreeMap<&'static str, usize>) -> Script {
    let mut text = PRELUDE.to_string();
    let mut lines = BTreeMap::new();
    let mut checks = 0;
    let mut at = PRELUDE.lines().count();
    for (b, block) in blocks.iter().enumerate() {
        writeln!(text, "# README.md:{} ({section}, block {})", block.line, b + 1).unwrap();
        at += 1;
        lines.insert(at + 1, (block.line, b + 1));
        for (i, line) in block.lines.iter().enumerate() {
            let substitute = SUBSTITUTIONS.iter().find(|(s, printed, _)| *s == section && line.trim() == *printed);
            let run = if let Some((_, printed, instead)) = substitute {
                *used.entry(printed).or_default() += 1;
                instead.to_string()
            } else if let Some(expect) = expectation(line) {
                checks += 1;
                let n = block.line + i;
                match expect {
                    Expect::Prints(cmd, want) => format!("__out=$({cmd}); __expect {} \"$__out\" {n}", quote(want)),
                    Expect::Fails(cmd, want) => {
                        format!("if __err=$({cmd} 2>&1 >/dev/null); then __succeeded {n}; fi; __expect_error {} \"$__err\" {n}", quote(want))
                    }
                }
            } else {
                line.clone()
            };
            text.push_str(&run);
            text.push('\n');
            at += 1;
        }
    }
    Script { text, lines, checks }
}

/// How the run is isolated (see the module doc).
#[derive(Clone, Copy, PartialEq, Debug)]
enum Isolation {
    Namespaces,
    UserNamespaces,
    ProcessGroup,
}

fn isolation() -> Isolation {
    let works = |args: &[&str]| Command::new("unshare").args(args).arg("true").stderr(Stdio::null()).status().is_ok_and(|s| s.success());
    let has_ip = Command::new("ip").arg("-V").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success());
    if has_ip && works(&["--mount", "--net", "--pid", "--fork"]) {
        Isolation::Namespaces
    } else if has_ip && works(&["--user", "--map-root-user", "--mount", "--net", "--pid", "--fork"]) {
        Isolation::UserNamespaces
    } else {
        Isolation::ProcessGroup
    }
}

/// The real path of `python3` on the test's PATH (a pyenv shim needs its
/// own HOME, which the run replaces).
fn python3() -> PathBuf {
    let out =
        Command::new("python3").args(["-c", "import sys; print(sys.executable)"]).output().expect("python3 on PATH: the walkthrough's upstreams are Python");
    assert!(out.status.success(), "python3 failed: {}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

fn envoy() -> PathBuf {
    let hint = "run the tests with tests/run, or: export LODESTAR_ENVOY=\"$(tests/support/install-envoy.sh)\"";
    let path = PathBuf::from(std::env::var_os("LODESTAR_ENVOY").filter(|p| !p.is_empty()).unwrap_or_else(|| panic!("LODESTAR_ENVOY is not set; {hint}")));
    assert!(path.is_file(), "LODESTAR_ENVOY={} does not exist; {hint}", path.display());
    path
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let name = e.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(&name));
        } else {
            std::fs::copy(e.path(), to.join(&name)).unwrap();
        }
    }
}

/// The last `n` lines of a file, for failure output.
fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[test]
fn readme_runs_as_printed() {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(repo.join("README.md")).unwrap();
    let all = sh_blocks(&readme);

    // The sections, in README order.
    let mut order: Vec<(usize, &str, usize)> = Vec::new();
    for (name, min_checks) in SECTIONS {
        let blocks = all.get(*name).unwrap_or_else(|| {
            panic!(
                "README section {name:?} not found or has no ```sh block: renamed? update SECTIONS in tests/e2e/readme.rs (headings: {:?})",
                all.keys().collect::<Vec<_>>()
            )
        });
        order.push((blocks[0].line, name, *min_checks));
    }
    order.sort();

    let scratch = tempfile::Builder::new().prefix("lodestar-readme").tempdir().unwrap();
    let checkout = scratch.path().join("lodestar");
    let home = scratch.path().join("home");
    let harness = scratch.path().join("harness");
    let bin = harness.join("bin");
    for d in [&checkout, &home, &bin] {
        std::fs::create_dir_all(d).unwrap();
    }
    // What the README's commands read from the checkout, and the binary
    // where `cargo build` puts it.
    copy_dir(&repo.join("cluster"), &checkout.join("cluster"));
    copy_dir(&repo.join("ops"), &checkout.join("ops"));
    std::fs::create_dir_all(checkout.join("target/debug")).unwrap();
    std::os::unix::fs::symlink(BIN, checkout.join("target/debug/lodestar")).unwrap();
    std::os::unix::fs::symlink(envoy(), bin.join("envoy")).unwrap();
    std::os::unix::fs::symlink(python3(), bin.join("python3")).unwrap();

    let mut used = BTreeMap::new();
    let mut scripts = Vec::new();
    for (i, (_, name, min_checks)) in order.iter().enumerate() {
        let s = script(name, &all[*name], &mut used);
        assert!(s.checks >= *min_checks, "README section {name:?}: {} checked answers (`# → TEXT`), expected at least {min_checks}", s.checks);
        std::fs::write(harness.join(format!("{i:02}.sh")), &s.text).unwrap();
        scripts.push((name.to_string(), s));
    }
    for (section, printed, _) in SUBSTITUTIONS {
        assert_eq!(
            used.get(printed).copied().unwrap_or(0),
            1,
            "README section {section:?}: the line {printed:?} the harness substitutes must appear exactly once"
        );
    }

    let isolation = isolation();
    let mut driver = String::from("set -u\n");
    if isolation != Isolation::ProcessGroup {
        driver.push_str("ip link set lo up\nmount -t tmpfs tmpfs /dev/shm\n");
    }
    writeln!(driver, "cd {}", quote(&checkout.display().to_string())).unwrap();
    for (i, (name, _)) in scripts.iter().enumerate() {
        writeln!(
            driver,
            "echo \"README_SECTION {i} start\"; timeout {SECTION_TIMEOUT_S} bash {h}/{i:02}.sh >{h}/{i:02}.log 2>&1 </dev/null; rc=$?; echo \"README_SECTION {i} rc=$rc\"; [ $rc -eq 0 ] || exit 1 # {name}",
            h = quote(&harness.display().to_string())
        )
        .unwrap();
    }
    std::fs::write(harness.join("driver.sh"), &driver).unwrap();

    let path = format!("{}:{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", checkout.join("target/debug").display(), bin.display());
    let mut cmd = match isolation {
        Isolation::Namespaces => {
            let mut c = Command::new("unshare");
            c.args(["--mount", "--net", "--pid", "--fork", "--kill-child", "bash"]);
            c
        }
        Isolation::UserNamespaces => {
            let mut c = Command::new("unshare");
            c.args(["--user", "--map-root-user", "--mount", "--net", "--pid", "--fork", "--kill-child", "bash"]);
            c
        }
        Isolation::ProcessGroup => {
            use std::os::unix::process::CommandExt;
            let mut c = Command::new("bash");
            c.process_group(0);
            c
        }
    };
    cmd.arg(harness.join("driver.sh"))
        .env_clear()
        .env("PATH", path)
        .env("HOME", &home)
        .env("LANG", "C.UTF-8")
        .env("README_HARNESS", &harness)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let started = Instant::now();
    let child = cmd.spawn().expect("starting the README driver");
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    if isolation == Isolation::ProcessGroup {
        let _ = Command::new("kill").args(["-KILL", "--", &format!("-{pid}")]).status();
    }
    let progress = String::from_utf8_lossy(&out.stdout).to_string();
    eprintln!("README run ({isolation:?}) in {:.1?}:\n{progress}", started.elapsed());

    // Which section ended it, and where.
    let failed = scripts.iter().enumerate().find(|(i, _)| progress.lines().any(|l| l.starts_with(&format!("README_SECTION {i} rc=")) && !l.ends_with("rc=0")));
    let ran_all = progress.lines().filter(|l| l.ends_with("rc=0")).count() == scripts.len();
    if failed.is_none() && ran_all {
        for (i, (name, s)) in scripts.iter().enumerate() {
            let log = std::fs::read_to_string(harness.join(format!("{i:02}.log"))).unwrap_or_default();
            let checked = log.lines().filter(|l| l.starts_with("README_CHECKED")).count();
            assert_eq!(checked, s.checks, "README section {name:?}: {checked} of {} answers checked", s.checks);
        }
        if std::env::var_os("LODESTAR_README_KEEP").is_some() {
            eprintln!("scripts and logs kept in {}", scratch.keep().display());
        }
        return;
    }
    let mut report = String::new();
    match failed {
        Some((i, (name, s))) => {
            let log_path = harness.join(format!("{i:02}.log"));
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            writeln!(report, "README section {name:?} failed.").unwrap();
            for l in log.lines().filter(|l| l.starts_with("README_FAILED") || l.starts_with("README_MISMATCH") || l.starts_with("got:")) {
                let at = l
                    .split_once("script_line=")
                    .and_then(|(_, rest)| rest.split_whitespace().next())
                    .and_then(|n| n.parse().ok())
                    .and_then(|n| s.readme_line(n))
                    .map(|(r, b)| format!(" (README.md:{r}, block {b} of the section)"))
                    .unwrap_or_default();
                writeln!(report, "  {l}{at}").unwrap();
            }
            writeln!(report, "--- its output (the last 60 lines):\n{}", tail(&log_path, 60)).unwrap();
        }
        None => writeln!(report, "the README run stopped before every section ran (status {:?})", out.status).unwrap(),
    }
    writeln!(report, "--- server.log (last 30 lines):\n{}", tail(&harness.join("server.log"), 30)).unwrap();
    for n in 1..=3 {
        let log = checkout.join(format!("cluster/.local/node{n}/log"));
        if log.exists() {
            writeln!(report, "--- cluster/.local/node{n}/log (last 15 lines):\n{}", tail(&log, 15)).unwrap();
        }
    }
    let kept = scratch.keep();
    panic!("{report}--- scripts and logs kept in {}", kept.display());
}

#[test]
fn expectations_and_blocks_are_parsed() {
    let readme =
        "# A\n```sh\necho hi   # → hi\n```\n## B\n```sh norun\nrm -rf /\n```\n```` ```sh ```` inline\n```yaml\nx: 1\n```\n````sh\nls  # prose\n```\n````\n";
    let blocks = sh_blocks(readme);
    assert_eq!(blocks.keys().collect::<Vec<_>>(), ["A", "B"]);
    assert_eq!(blocks["A"][0].line, 3);
    assert_eq!(blocks["B"].len(), 1, "the norun block is skipped");
    assert_eq!(blocks["B"][0].lines, ["ls  # prose", "```"], "a longer fence holds a shorter one");
    assert_eq!(expectation("echo hi   # → hi"), Some(Expect::Prints("echo hi", "hi")));
    assert_eq!(expectation("false   # ✗ no"), Some(Expect::Fails("false", "no")));
    assert_eq!(expectation("# a comment # → x"), None);
    assert_eq!(expectation("# a comment # ✗ x"), None);
    let s = script("A", &blocks["A"], &mut BTreeMap::new());
    assert_eq!(s.checks, 1);
    assert!(s.text.contains("__out=$(echo hi); __expect 'hi' \"$__out\" 3"), "{}", s.text);
    let first = PRELUDE.lines().count() + 2;
    assert_eq!(s.readme_line(first), Some((3, 1)));
}

/// `# ✗ TEXT` in bash, as the harness runs it: passes only for a command
/// that fails with TEXT in its standard error.
#[test]
fn failure_expectations_run_in_bash() {
    let run = |line: &str| {
        let blocks = sh_blocks(&format!("# A\n```sh\n{line}\necho after\n```\n"));
        let s = script("A", &blocks["A"], &mut BTreeMap::new());
        assert_eq!(s.checks, 1, "{}", s.text);
        let out = Command::new("bash").arg("-c").arg(&s.text).output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr))
    };
    let (ok, out) = run("sh -c 'echo refused: boom >&2; echo ignored; exit 3'  # ✗ refused: boom");
    assert!(ok && out.contains("README_CHECKED readme_line=3: fails with refused: boom") && out.contains("after"), "{out}");
    let (ok, out) = run("sh -c 'echo other >&2; exit 1'  # ✗ refused: boom");
    assert!(!ok && out.contains("README_MISMATCH readme_line=3 want an error holding: refused: boom") && !out.contains("after"), "{out}");
    let (ok, out) = run("sh -c 'echo refused: boom >&2'  # ✗ refused: boom");
    assert!(!ok && out.contains("README_MISMATCH readme_line=3 want a failure; it succeeded") && !out.contains("after"), "{out}");
}
