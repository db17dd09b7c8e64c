//! `lodestar analyze`: istioctl analyze without Kubernetes.
//!
//! - `lodestar analyze FILE|DIR|- ...`: offline, on the files alone (no
//!   server, no credentials).
//! - `lodestar analyze` (or `--live`): the live store (`GET /v1/analyze`).
//! - `lodestar analyze FILE ... --live`: the files laid over the live store
//!   (`POST /v1/analyze`; files override live objects; nothing is written).
//!
//! Output and exit codes as istioctl 1.30's (tests/fixtures/analyze/README.md):
//! `-o log` (default), `json`, `yaml`; exit 79 when a message at
//! `--failure-threshold` or worse remains (log output only, as istioctl),
//! 65 when an input does not parse, 64 for a bad `-o` or threshold value, 1
//! for anything else (a bad `--suppress`, a server that cannot be reached).

use super::client::Client;
use crate::analyze::files::{self, Loaded, Source};
use crate::analyze::{self, Level, Message, Suppression};
use anyhow::{anyhow, Context, Result};
use clap::Args;
use serde_json::{json, Value};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

/// istioctl's exit codes.
const EXIT_USAGE: i32 = 64;
const EXIT_PARSE: i32 = 65;
const EXIT_FOUND: i32 = 79;

#[derive(Args)]
pub struct AnalyzeArgs {
    /// Files or directories (recursively: *.yaml, *.yml, *.json) to analyze,
    /// or - for stdin. None: the live store.
    files: Vec<String>,
    /// More files (as apply takes them).
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    filenames: Vec<String>,
    /// Analyze the live store (the default without files); with files, the
    /// files laid over it (they replace the live objects they name).
    #[arg(long)]
    live: bool,
    /// log (istioctl's lines), json or yaml.
    #[arg(short, long, default_value = "log", value_name = "FORMAT")]
    output: String,
    /// Exit 79 when a message at this level or worse is found: Info,
    /// Warning or Error (with -o log only, as istioctl).
    #[arg(long, default_value = "Error", value_name = "LEVEL")]
    failure_threshold: String,
    /// Print only messages at this level or worse: Info, Warning or Error.
    #[arg(long, default_value = "Info", value_name = "LEVEL")]
    output_threshold: String,
    /// Leave out a code for matching resources: "CODE=Kind namespace/name"
    /// (istioctl's form; * is a wildcard), or CODE=KIND/NAME or
    /// CODE=KIND/NAMESPACE/NAME; repeat for more.
    #[arg(short = 'S', long = "suppress", value_name = "CODE=RESOURCE")]
    suppress: Vec<String>,
    /// Only messages about this namespace's resources (default: default);
    /// files' resources without a namespace are in it.
    #[arg(short, long)]
    namespace: Option<String>,
    /// Messages about every namespace's resources.
    #[arg(short = 'A', long)]
    all_namespaces: bool,
    /// Do not fail (exit 65) on inputs that do not parse.
    #[arg(long)]
    ignore_unknown: bool,
    /// Colour the levels on a terminal (--color=false: never).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    color: bool,
    /// Live: the replica's own applied state instead of a linearizable read.
    #[arg(long)]
    stale: bool,
}

impl AnalyzeArgs {
    fn all_files(&self) -> Vec<String> {
        self.files.iter().chain(&self.filenames).cloned().collect()
    }

    /// Whether a server is needed.
    pub fn live(&self) -> bool {
        self.live || self.all_files().is_empty()
    }
}

/// What was analyzed, for the closing line.
fn subject(args: &AnalyzeArgs, files: &[String]) -> String {
    if !files.is_empty() && !args.live {
        return files.join(", ");
    }
    match (&args.namespace, args.all_namespaces) {
        (_, true) => "all namespaces".into(),
        (ns, false) => format!("namespace: {}", ns.as_deref().unwrap_or(crate::model::DEFAULT_NAMESPACE)),
    }
}

/// Run it; exits the process with istioctl's codes (`client` is `None`
/// offline).
pub async fn run(client: Option<&Client>, args: AnalyzeArgs) -> Result<()> {
    let format = args.output.to_ascii_lowercase();
    if !matches!(format.as_str(), "log" | "json" | "yaml") {
        usage(&format!("invalid output format {:?}: expected log, json or yaml", args.output));
    }
    let Some(failure) = Level::parse(&args.failure_threshold) else {
        usage(&format!("--failure-threshold: invalid level option {:?}", args.failure_threshold))
    };
    let Some(shown) = Level::parse(&args.output_threshold) else { usage(&format!("--output-threshold: invalid level option {:?}", args.output_threshold)) };
    let suppressions: Vec<Suppression> = args
        .suppress
        .iter()
        .map(|s| Suppression::parse(s).map_err(|_| anyhow!("{s} is not a valid suppression value. See lodestar analyze --help")))
        .collect::<Result<_>>()?;
    for s in suppressions.iter().filter(|s| analyze::code(&s.code).is_none()) {
        eprintln!("Warning: Supplied message code '{}' is an unknown message code and will not have any effect.", s.code);
    }
    let namespace = args.namespace.clone().unwrap_or_else(|| crate::model::DEFAULT_NAMESPACE.to_string());
    let files = args.all_files();
    let sources = if files.is_empty() { Vec::new() } else { read_sources(&files)? };
    let loaded = if files.is_empty() { Loaded::default() } else { files::load(&sources, &namespace) };
    for e in &loaded.errors {
        eprintln!("Error: {e}");
    }
    for n in &loaded.notes {
        eprintln!("Skipping {n}");
    }
    let mut messages = match client {
        Some(client) if args.live() => live(client, &args, &sources).await?,
        _ => {
            let mut m = loaded.messages.clone();
            m.extend(analyze::analyze(&loaded.state, &analyze::Options { now: Some(unix_now()), ..analyze::Options::new(Default::default()) }));
            analyze::sort(&mut m);
            m
        }
    };
    messages.retain(|m| args.all_namespaces || m.resource.as_ref().is_none_or(|r| r.namespace == namespace));
    messages.retain(|m| !suppressions.iter().any(|s| s.matches(m)));
    let printed: Vec<&Message> = messages.iter().filter(|m| m.level.reaches(shown)).collect();
    let mut out = std::io::stdout().lock();
    let subject = subject(&args, &files);
    match format.as_str() {
        "json" | "yaml" => {
            let items: Vec<Value> = printed.iter().map(|m| m.istio_json(loaded.reference(m).as_deref())).collect();
            if format == "json" {
                writeln!(out, "{}", tab_json(&Value::Array(items)))?;
            } else if items.is_empty() {
                writeln!(out, "[]")?;
            } else {
                write!(out, "{}", yaml_serde::to_string(&items)?)?;
            }
            // istioctl's exit code is 0 whatever json or yaml output holds.
            return Ok(());
        }
        _ => {
            let colour = args.color && std::io::stdout().is_terminal() && std::env::var("TERM").map_or(true, |t| t != "dumb");
            let mut seen = std::collections::BTreeSet::new();
            for m in &printed {
                let line = m.log_line(loaded.reference(m).as_deref());
                if seen.insert(line.clone()) {
                    writeln!(out, "{}", if colour { coloured(m.level, &line) } else { line })?;
                }
            }
        }
    }
    out.flush()?;
    if printed.is_empty() {
        eprintln!("\u{2714} No validation issues found when analyzing {subject}.");
    }
    if !loaded.errors.is_empty() && !args.ignore_unknown {
        std::process::exit(EXIT_PARSE);
    }
    if messages.iter().any(|m| m.level.reaches(failure)) {
        eprintln!("Error: Analyzers found issues when analyzing {subject}.");
        eprintln!("See https://istio.io/v1.30/docs/reference/config/analysis for more information about causes and resolutions.");
        std::process::exit(EXIT_FOUND);
    }
    Ok(())
}

fn usage(why: &str) -> ! {
    eprintln!("Error: {why}");
    std::process::exit(EXIT_USAGE);
}

fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

/// The live store's findings (with the files laid over it, if any).
async fn live(client: &Client, args: &AnalyzeArgs, sources: &[Source]) -> Result<Vec<Message>> {
    let ns = if args.all_namespaces { None } else { Some(args.namespace.as_deref().unwrap_or(crate::model::DEFAULT_NAMESPACE)) };
    let query = super::query(&[("namespace", ns), ("consistency", args.stale.then_some("stale"))]);
    let answer = if sources.is_empty() {
        client.get(&format!("/v1/analyze{query}")).await?
    } else {
        // The files' documents (a file that does not parse is reported
        // above and not sent).
        let docs: Vec<Value> = sources.iter().flat_map(|s| crate::model::documents::parse_documents(&s.text, &s.name).unwrap_or_default()).collect();
        client.post(&format!("/v1/analyze{query}"), &json!({ "resources": docs })).await?
    };
    for n in answer["notes"].as_array().into_iter().flatten().filter_map(Value::as_str) {
        eprintln!("Skipping {n}");
    }
    serde_json::from_value(answer["messages"].clone()).context("the server's answer")
}

/// Every file's text (directories walked as `apply -f` walks them).
fn read_sources(files: &[String]) -> Result<Vec<Source>> {
    let mut paths: Vec<PathBuf> = Vec::new();
    for f in files {
        if f == "-" {
            paths.push(PathBuf::from("-"));
        } else {
            super::collect(Path::new(f), &mut paths)?;
        }
    }
    paths
        .into_iter()
        .map(|p| {
            if p.as_os_str() == "-" {
                Ok(Source { name: "stdin".into(), text: std::io::read_to_string(std::io::stdin())? })
            } else {
                let text = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
                Ok(Source { name: p.display().to_string(), text })
            }
        })
        .collect()
}

/// JSON as istioctl prints it: tab-indented.
fn tab_json(v: &Value) -> String {
    let mut buf = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, serde_json::ser::PrettyFormatter::with_indent(b"\t"));
    serde::Serialize::serialize(v, &mut ser).expect("a JSON value serializes");
    String::from_utf8(buf).expect("serde_json writes UTF-8")
}

/// istioctl's colours: Error bold red, Warning yellow.
fn coloured(level: Level, line: &str) -> String {
    let (word, rest) = line.split_at(level.as_str().len());
    match level {
        Level::Error => format!("\x1b[1;31m{word}\x1b[0m{rest}"),
        Level::Warning => format!("\x1b[33m{word}\x1b[0m{rest}"),
        Level::Info => line.to_string(),
    }
}
