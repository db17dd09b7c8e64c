//! Runs the YAML fixtures: every `valid/*.yaml` must validate and
//! round-trip to the same JSON; every `invalid/*.yaml` must fail with the
//! errors its `# expect: <field path>: <reason substring>` lines name.

use std::fs;
use std::path::{Path, PathBuf};

use lodestar::model::istio::validate;
use serde_json::Value;

fn fixtures(kind: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/istio").join(kind);
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no fixtures in {}", dir.display());
    files
}

/// Reads a manifest and returns its kind and spec.
fn load(path: &Path) -> (String, Value, String) {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let manifest: Value = yaml_serde::from_str(&text).unwrap_or_else(|e| panic!("{}: bad YAML: {e}", path.display()));
    let api_version = manifest["apiVersion"].as_str().unwrap_or_default();
    assert!(
        api_version.starts_with("networking.istio.io/") || api_version.starts_with("security.istio.io/"),
        "{}: unexpected apiVersion {api_version:?}",
        path.display()
    );
    let kind = manifest["kind"].as_str().unwrap_or_else(|| panic!("{}: no kind", path.display())).to_string();
    (kind, manifest["spec"].clone(), text)
}

#[test]
fn valid_fixtures_validate_and_round_trip() {
    let mut failures = Vec::new();
    for path in fixtures("valid") {
        let (kind, spec, _) = load(&path);
        match validate(&kind, &spec) {
            Err(errors) => failures.push(format!("{}: unexpected errors {errors:?}", path.display())),
            Ok(validated) => {
                assert_eq!(validated.kind(), kind);
                match validated.to_json() {
                    Ok(json) if json == spec => {}
                    Ok(json) => failures.push(format!("{}: round trip differs\n  input:  {spec}\n  output: {json}", path.display())),
                    Err(e) => failures.push(format!("{}: cannot serialise: {e}", path.display())),
                }
            }
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn invalid_fixtures_report_the_expected_errors() {
    let mut failures = Vec::new();
    for path in fixtures("invalid") {
        let (kind, spec, text) = load(&path);
        let expectations: Vec<(&str, &str)> =
            text.lines().filter_map(|line| line.strip_prefix("# expect: ")).map(|rest| rest.split_once(": ").unwrap_or((rest, ""))).collect();
        assert!(!expectations.is_empty(), "{}: no `# expect:` line", path.display());
        let errors = match validate(&kind, &spec) {
            Ok(_) => {
                failures.push(format!("{}: validated, but should not have", path.display()));
                continue;
            }
            Err(errors) => errors,
        };
        for (field, reason) in expectations {
            if !errors.iter().any(|e| e.field == field && e.reason.contains(reason)) {
                failures.push(format!("{}: expected `{field}: {reason}`, got {errors:#?}", path.display()));
            }
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// Issue 38's corpus: every EnvoyFilter document of every file validates
/// (as `apply` would run it), with Istio's warning; each other document of
/// those files is not an EnvoyFilter and is left to its own kind's tests.
#[test]
fn corpus_38_envoyfilters_validate() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/istio/corpus-38");
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("envoyfilter-")) && p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 7, "{files:?}");
    let mut failures = Vec::new();
    let mut filters = 0;
    for path in files {
        let text = fs::read_to_string(&path).unwrap();
        for doc in text.split("\n---\n") {
            let manifest: Value = yaml_serde::from_str(doc).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            if manifest["kind"] != "EnvoyFilter" {
                continue;
            }
            filters += 1;
            match validate("EnvoyFilter", &manifest["spec"]) {
                Ok(v) => assert!(v.warnings().iter().any(|w| w.contains("internal implementation details")), "{}: Istio's warning", path.display()),
                Err(errors) => failures.push(format!("{} ({}): {errors:?}", path.display(), manifest["metadata"]["name"])),
            }
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
    assert_eq!(filters, 11);
}
