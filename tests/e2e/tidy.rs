//! Tidy: the import rules the crate keeps (rust-analyzer's `tidy` style).
//! It reads `src/**/*.rs` as text, so it needs no build of the server:
//!
//! 1. no import circle between top-level modules (`crate::x`, `use
//!    crate::{a, b}`, `super::super::x` reaching another top-level module;
//!    `#[cfg(test)]` items, comments and strings do not count);
//! 2. each module imports only modules of a lower layer (`LAYERS`; the root
//!    layer's modules may import each other, without circles), except the
//!    edges listed in `PENDING` with why;
//! 3. the pure modules name no IO crate (`FORBIDDEN`), and the pure
//!    workspace crates have none in their dependency tree (`cargo tree`);
//! 4. `src/lib.rs`'s Layout names every module.
//!
//! `model`, `state`, `translate`, `tls`, `client` and `agent` are workspace
//! crates of their own (`src/X/Cargo.toml`, `CRATES`; `proto` is one at the
//! top, `proto/Cargo.toml`): inside one, `crate::x` is its own module
//! unless `x` names another crate; the rest are the root crate's modules
//! (ARCHITECTURE.md, "Code map"). The client side (`tls`, `client`,
//! `agent`) has no server crate in its dependency tree (`cargo tree`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Top-level modules by layer, lowest first. A module may import modules
/// of lower layers only; those of the last layer (the root crate) may also
/// import each other.
const LAYERS: &[&[&str]] = &[
    &["metrics", "proto"],
    &["model"],
    &["state", "logging"],
    &["translate"],
    &["analyze"],
    &["store"],
    &["node"],
    &["tls"],
    &["xds"],
    &["client"],
    &["agent"],
    &["adapters", "api", "auth", "ca", "cli", "config", "gateway_status", "ha", "health", "jwks", "peer", "replica", "secrets", "server"],
];

/// The workspace crates under `src/`: directory, crate name, and the names
/// its root gives the crates it uses (`use lodestar_model as model;`).
const CRATES: &[(&str, &str)] = &[
    ("model", "lodestar_model"),
    ("state", "lodestar_state"),
    ("translate", "lodestar_translate"),
    ("tls", "lodestar_tls"),
    ("client", "lodestar_client"),
    ("agent", "lodestar_agent"),
    ("proto", "lodestar_proto"),
];

/// Names that stand for another module: the model crate's error
/// vocabulary, re-exported at the root as `error`, and the mesh index,
/// re-exported as `mesh`.
const ALIASES: &[(&str, &str)] = &[("error", "model"), ("mesh", "translate")];

/// Imports that point up today, each to be removed before the crate split.
const PENDING: &[(&str, &str, &str)] = &[];

/// External crates a module must not name (the pure core knows no IO).
const FORBIDDEN: &[(&[&str], &[&str])] = &[
    (&["model", "state", "translate", "analyze", "metrics"], &["tokio", "tonic", "axum", "sled", "openraft", "hyper", "hyper_util", "reqwest"]),
    (&["store", "node"], &["axum", "tonic", "hyper"]),
    (&["tls", "xds", "client", "agent"], &["sled", "openraft", "axum"]),
];

#[test]
fn imports_point_one_way() {
    let failures = check(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(failures.is_empty(), "tidy:\n{}", failures.join("\n"));
}

/// The check finds what it is there for: a planted circle, an import
/// that points up, an IO crate named by a pure module, a module the
/// layout misses.
#[test]
fn tidy_fails_on_a_planted_circle_and_a_forbidden_import() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let files: &[(&str, &str)] = &[
        ("lib.rs", "//! [`proto`] [`api`] [`store`]\npub mod api;\npub mod store;\npub mod ghost;\n"),
        ("model/mod.rs", "use crate::state::State;\npub mod kinds;\n"),
        ("model/kinds.rs", "use crate::mesh::Mesh; use tokio::sync::watch;\n"),
        ("state/mod.rs", "use crate::model::Kind;\n"),
        ("translate/mod.rs", "use crate::model::Kind;\n"),
        ("store/mod.rs", "use crate::api::serve;\n"),
        ("api/mod.rs", "use crate::store::Store;\n"),
    ];
    for (path, text) in files {
        let path = src.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    let failures = check(&src).join("\n");
    for expected in [
        "`model` (layer 1) imports `state` (layer 2)",
        "`model` (layer 1) imports `translate` (layer 3)",
        "`model` names `tokio`",
        "import circle between top-level modules: api -> store -> api",
        "src/lib.rs declares `ghost` but its Layout does not name it",
    ] {
        assert!(failures.contains(expected), "tidy missed {expected:?} in:\n{failures}");
    }
    assert!(!failures.contains("`state` (layer 2) imports"), "a crate's own alias is no upward import:\n{failures}");
}

/// The pure crates' whole dependency trees (`cargo tree -e normal`), not
/// only what their sources name, hold no IO crate.
#[test]
fn pure_crates_have_no_io_crate_in_their_dependency_tree() {
    assert_trees_lack(&["lodestar-model", "lodestar-state", "lodestar-translate"], IO_CRATES);
}

/// The client side (what `lodestar agent`, the CLI and lodestar-bench
/// link) reaches no server code: neither the server's crates nor the
/// store's, the API's or the pure core's beyond the model.
#[test]
fn client_crates_have_no_server_code_in_their_dependency_tree() {
    assert_trees_lack(&["lodestar-tls", "lodestar-client", "lodestar-agent"], SERVER_CRATES);
}

/// No package of `crates` has any of `banned` in its `cargo tree -e normal`.
fn assert_trees_lack(crates: &[&str], banned: &[&str]) {
    for krate in crates {
        let tree = cargo_tree(krate);
        let found: BTreeSet<&str> = tree.lines().filter_map(|l| l.split(' ').next()).filter(|name| banned.contains(name)).collect();
        assert!(found.is_empty(), "{krate} has {found:?} in its dependency tree (cargo tree -e normal -p {krate} -i NAME says through what)");
        assert!(tree.lines().count() > 10, "cargo tree -p {krate} printed too little to be its tree:\n{tree}");
    }
}

/// What the client side must not link, by package name. (axum is in its
/// tree only as tonic's router, which the agent's local SDS and xDS relay
/// serve Envoy through; the sources may not name it, `FORBIDDEN`.)
const SERVER_CRATES: &[&str] = &["lodestar", "lodestar-state", "lodestar-translate", "sled", "openraft", "prometheus-client"];

/// `cargo tree -e normal` of one package, one crate per line.
fn cargo_tree(krate: &str) -> String {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(&cargo)
        .args(["tree", "--offline", "--locked", "-e", "normal", "--prefix", "none", "-p", krate])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(out.status.success(), "cargo tree -p {krate}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The crates the pure core must not reach, by package name.
const IO_CRATES: &[&str] = &["tokio", "tonic", "axum", "sled", "openraft", "hyper", "hyper-util", "reqwest", "mio"];

/// Every rule above, over the sources under `src`: the failures, none if
/// the tree keeps them.
fn check(src: &Path) -> Vec<String> {
    let files = sources(src);
    let edges = module_edges(src, &files);
    let mut failures = Vec::new();

    for circle in circles(&edges) {
        let mut text = format!("import circle between top-level modules: {}", circle.join(" -> "));
        for pair in circle.windows(2) {
            let at = &edges[&(pair[0].clone(), pair[1].clone())];
            text.push_str(&format!("\n    {} -> {}: {at}", pair[0], pair[1]));
        }
        failures.push(text);
    }

    let layer = |m: &str| LAYERS.iter().position(|l| l.contains(&m));
    let root = LAYERS.len() - 1;
    let modules: BTreeSet<&String> = edges.keys().flat_map(|(a, b)| [a, b]).collect();
    for m in modules {
        if layer(m).is_none() {
            failures.push(format!("module `{m}` is in no layer: add it to LAYERS in tests/e2e/tidy.rs"));
        }
    }
    for ((from, to), at) in &edges {
        let (Some(lf), Some(lt)) = (layer(from), layer(to)) else { continue };
        let upward = lt > lf || (lt == lf && lf != root);
        if upward && !PENDING.iter().any(|(f, t, _)| f == from && t == to) {
            failures.push(format!("`{from}` (layer {lf}) imports `{to}` (layer {lt}), which it may not: {at}"));
        }
    }
    for (from, to, why) in PENDING {
        if !edges.contains_key(&(from.to_string(), to.to_string())) {
            failures.push(format!("PENDING lists {from} -> {to} ({why}), which is gone: remove it from the list"));
        }
    }

    for (file, code) in &files {
        let top = top_module(src, file);
        for (modules, crates) in FORBIDDEN {
            if !modules.contains(&top.as_str()) {
                continue;
            }
            for krate in *crates {
                if let Some(offset) = find_path(code, krate) {
                    failures.push(format!("`{top}` names `{krate}`, which it may not: {}:{}", rel(src, file), line_of(code, offset)));
                }
            }
        }
    }

    failures.extend(layout_gaps(src));
    failures
}

/// Every `.rs` file under `src` but the binaries and the crate roots, with
/// its code: comments, strings and `#[cfg(test)]` items blanked (newlines
/// kept, so offsets still give lines).
fn sources(src: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if path != src.join("bin") {
                    stack.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "rs")
                && !["main.rs", "lib.rs"].iter().any(|r| path == src.join(r))
                && !CRATES.iter().any(|(dir, _)| path == src.join(dir).join("build.rs"))
            {
                let text = std::fs::read_to_string(&path).unwrap();
                out.push((path, without_tests(&code_only(&text))));
            }
        }
    }
    out.sort();
    out
}

fn rel(src: &Path, file: &Path) -> String {
    format!("src/{}", file.strip_prefix(src).unwrap().display())
}

fn top_module(src: &Path, file: &Path) -> String {
    let first = file.strip_prefix(src).unwrap().components().next().unwrap().as_os_str().to_string_lossy().to_string();
    first.trim_end_matches(".rs").to_string()
}

/// The module path of a file: `src/a/b.rs` and `src/a/b/mod.rs` are `a::b`.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let mut parts: Vec<String> = file.strip_prefix(src).unwrap().iter().map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string()).collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

fn line_of(code: &str, offset: usize) -> usize {
    code[..offset].matches('\n').count() + 1
}

/// Top-level module edges, each with the first place that makes it.
fn module_edges(src: &Path, files: &[(PathBuf, String)]) -> BTreeMap<(String, String), String> {
    let mut edges = BTreeMap::new();
    for (file, code) in files {
        let top = top_module(src, file);
        let path = module_path(src, file);
        let own = CRATES.iter().any(|(dir, _)| *dir == top);
        for (offset, mut target) in imports(code, &path, own) {
            // Inside a crate of its own, `crate::x` is its own item unless
            // `x` names another crate (`use lodestar_model as model;`).
            let other = CRATES.iter().any(|(dir, _)| *dir == target) || ALIASES.iter().any(|(alias, _)| *alias == target);
            if own && (!other || src.join(&top).join(format!("{target}.rs")).exists() || src.join(&top).join(&target).is_dir()) {
                target = top.clone();
            }
            if let Some((_, to)) = ALIASES.iter().find(|(alias, _)| *alias == target) {
                target = to.to_string();
            }
            if target != top {
                edges.entry((top.clone(), target)).or_insert_with(|| format!("{}:{}", rel(src, file), line_of(code, offset)));
            }
        }
    }
    edges
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

fn ident_at(b: &[u8], mut i: usize) -> (String, usize) {
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    let start = i;
    while i < b.len() && is_ident(b[i]) {
        i += 1;
    }
    (String::from_utf8_lossy(&b[start..i]).to_string(), i)
}

/// The top-level modules `code` names, with where: `crate::x`, each first
/// segment of `crate::{a, b::c}`, `super::...::x` climbing to the crate
/// root from a file at `path` (not out of a crate of its own: `own`), and
/// the workspace crates by name (`lodestar_model::`).
fn imports(code: &str, path: &[String], own: bool) -> Vec<(usize, String)> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let starts = i == 0 || !(is_ident(b[i - 1]) || b[i - 1] == b'$' || b[i - 1] == b':');
        if starts && b[i..].starts_with(b"crate::") {
            let mut j = i + "crate::".len();
            while j < b.len() && b[j].is_ascii_whitespace() {
                j += 1;
            }
            if j < b.len() && b[j] == b'{' {
                out.extend(group_heads(b, j).into_iter().map(|m| (i, m)));
            } else {
                let (m, _) = ident_at(b, j);
                out.push((i, m));
            }
            i = j;
            continue;
        }
        if starts && b[i..].starts_with(b"super::") {
            let mut j = i;
            let mut depth = 0;
            while b[j..].starts_with(b"super::") {
                depth += 1;
                j += "super::".len();
            }
            if depth >= path.len() && !own {
                let (m, _) = ident_at(b, j);
                out.push((i, m));
            }
            i = j;
            continue;
        }
        if starts {
            if let Some((dir, name)) =
                CRATES.iter().find(|(_, name)| b[i..].starts_with(name.as_bytes()) && !b.get(i + name.len()).is_some_and(|&c| is_ident(c)))
            {
                out.push((i, dir.to_string()));
                i += name.len();
                continue;
            }
        }
        i += 1;
    }
    out.retain(|(_, m)| !m.is_empty() && m != "self");
    out
}

/// The first segment of each item of the `{...}` group opening at `open`.
fn group_heads(b: &[u8], open: usize) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut expect = true;
    let mut i = open;
    while i < b.len() {
        match b[i] {
            b'{' => {
                depth += 1;
                if depth == 1 {
                    expect = true;
                }
            }
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            b',' if depth == 1 => expect = true,
            c if depth == 1 && expect && is_ident(c) => {
                let (m, end) = ident_at(b, i);
                heads.push(m);
                expect = false;
                i = end;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    heads
}

/// Where `krate::` first appears as a path (not inside another path).
fn find_path(code: &str, krate: &str) -> Option<usize> {
    let needle = format!("{krate}::");
    let b = code.as_bytes();
    code.match_indices(&needle).map(|(i, _)| i).find(|&i| i == 0 || !(is_ident(b[i - 1]) || b[i - 1] == b':'))
}

/// `text` with comments (doc comments too), string and char literals
/// blanked to spaces, newlines kept.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = b.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut out[from..to.min(b.len())] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            let end = text[i..].find('\n').map_or(b.len(), |n| i + n);
            blank(&mut out, i, end);
            i = end;
        } else if b[i..].starts_with(b"/*") {
            let (mut depth, mut j) = (1, i + 2);
            while j < b.len() && depth > 0 {
                if b[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if b[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if b[i] == b'r' && (i == 0 || !is_ident(b[i - 1])) && b.get(i + 1).is_some_and(|&c| c == b'"' || c == b'#') {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while j < b.len() && b[j] == b'#' {
                hashes += 1;
                j += 1;
            }
            if j >= b.len() || b[j] != b'"' {
                i += 1;
                continue;
            }
            let close = format!("\"{}", "#".repeat(hashes));
            let end = text[j + 1..].find(&close).map_or(b.len(), |n| j + 1 + n + close.len());
            blank(&mut out, i, end);
            i = end;
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            blank(&mut out, i, j + 1);
            i = j + 1;
        } else if b[i] == b'\'' {
            // A char literal ('x', '\n', '\u{..}'), not a lifetime.
            if b.get(i + 1) == Some(&b'\\') {
                let end = text[i + 2..].find('\'').map_or(b.len(), |n| i + 2 + n + 1);
                blank(&mut out, i, end);
                i = end;
            } else if let Some(c) = text[i + 1..].chars().next() {
                let after = i + 1 + c.len_utf8();
                if b.get(after) == Some(&b'\'') {
                    blank(&mut out, i, after + 1);
                    i = after + 1;
                } else {
                    i += 1;
                }
            } else {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    String::from_utf8(out).unwrap_or_default()
}

/// `code` with every item under `#[cfg(test)]` blanked.
fn without_tests(code: &str) -> String {
    let mut out = code.as_bytes().to_vec();
    let attr = "#[cfg(test)]";
    let mut from = 0;
    while let Some(n) = code[from..].find(attr) {
        let start = from + n;
        let b = code.as_bytes();
        let mut i = start + attr.len();
        // The item ends at its first `;` before any brace, or at the brace
        // closing its first `{`.
        while i < b.len() && b[i] != b';' && b[i] != b'{' {
            i += 1;
        }
        if i < b.len() && b[i] == b'{' {
            let mut depth = 0;
            while i < b.len() {
                match b[i] {
                    b'{' => depth += 1,
                    b'}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
        }
        let end = (i + 1).min(b.len());
        for c in &mut out[start..end] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
        from = end;
    }
    String::from_utf8(out).unwrap_or_default()
}

/// Each strongly connected component of more than one module, as one circle
/// through it (`a -> b -> ... -> a`).
fn circles(edges: &BTreeMap<(String, String), String>) -> Vec<Vec<String>> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges.keys() {
        next.entry(a).or_default().push(b);
        next.entry(b).or_default();
    }
    let reach = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_string()];
        while let Some(m) = todo.pop() {
            for n in &next[m.as_str()] {
                if seen.insert(n.to_string()) {
                    todo.push(n.to_string());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&str, BTreeSet<String>> = next.keys().map(|m| (*m, reach(m))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for m in next.keys() {
        if done.contains(*m) || !reaches[m].contains(*m) {
            continue;
        }
        let component: BTreeSet<&str> = next.keys().copied().filter(|n| reaches[m].contains(*n) && reaches[n].contains(*m)).collect();
        done.extend(component.iter().map(|s| s.to_string()));
        // The shortest way back to `m`, breadth first, inside the component.
        let mut parent: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([*m]);
        'search: while let Some(at) = queue.pop_front() {
            for n in &next[at] {
                if *n == *m {
                    // Back from `at` through the parents to `m`, then
                    // turned around: m -> ... -> at -> m.
                    let mut back = vec![];
                    let mut hop = at;
                    while hop != *m {
                        back.push(hop.to_string());
                        hop = parent[hop];
                    }
                    back.reverse();
                    let mut circle = vec![m.to_string()];
                    circle.extend(back);
                    circle.push(m.to_string());
                    out.push(circle);
                    break 'search;
                }
                if component.contains(n) && !parent.contains_key(n) && *n != *m {
                    parent.insert(n, at);
                    queue.push_back(n);
                }
            }
        }
    }
    out
}

/// Modules `src/lib.rs` declares that its Layout section does not name.
fn layout_gaps(src: &Path) -> Vec<String> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let doc: String = lib.lines().filter(|l| l.starts_with("//!")).collect::<Vec<_>>().join("\n");
    let mut gaps = Vec::new();
    for line in lib.lines() {
        // `pub mod x;`, and the crates and re-exports: `pub use lodestar_model
        // as model;`, `pub use lodestar_model::error;`, `pub use translate::mesh;`.
        let name =
            line.strip_prefix("pub mod ").or_else(|| line.strip_prefix("pub use ").and_then(|r| r.rsplit([' ', ':']).next())).and_then(|r| r.strip_suffix(';'));
        if let Some(name) = name.filter(|n| n.chars().all(|c| c.is_ascii_lowercase() || c == '_')) {
            if !doc.contains(&format!("[`{name}`]")) {
                gaps.push(format!("src/lib.rs declares `{name}` but its Layout does not name it ([`{name}`])"));
            }
        }
    }
    if !doc.contains("[`proto`]") {
        gaps.push("src/lib.rs's Layout does not name [`proto`]".into());
    }
    gaps
}
