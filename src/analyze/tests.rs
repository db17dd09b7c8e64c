//! The analyzers, data-driven: `tests/fixtures/analyze/cases/<CODE>/`
//! holds `positive.yaml` (which must give the code; each `# expect: LINE`
//! comment is one istioctl log line it must print, and it prints no other
//! line of that code) and `negative.yaml` (the same setup, fixed: no
//! message of that code). Every message any fixture gives must read as
//! its code's template, and the catalogue must be Istio's, byte for byte
//! (`tests/fixtures/analyze/messages.yaml`).

use super::files::{load, Source};
use super::*;
use crate::translate::mesh::MeshConfig;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/analyze")
}

fn options() -> Options {
    // 2026-01-01T00:00:00Z: the fixtures' certificates are valid then
    // (or, for IST0161, expired).
    Options { mesh: Arc::new(MeshConfig::default()), now: Some(1_767_225_600) }
}

/// The log lines of analysing one fixture file, as `lodestar analyze FILE`
/// prints them (the file named by its file name).
fn analyze_file(path: &Path) -> (Vec<Message>, Vec<String>) {
    let name = path.file_name().unwrap().to_string_lossy().to_string();
    let text = std::fs::read_to_string(path).unwrap();
    let loaded = load(&[Source { name, text }], "default");
    assert!(loaded.errors.is_empty() && loaded.notes.is_empty(), "{}: {:?} {:?}", path.display(), loaded.errors, loaded.notes);
    let mut messages = loaded.messages.clone();
    messages.extend(analyze(&loaded.state, &options()));
    sort(&mut messages);
    let lines = messages.iter().map(|m| m.log_line(loaded.reference(m).as_deref())).collect();
    (messages, lines)
}

/// A template as a pattern: each Go verb is "some text".
fn template_matches(template: &str, text: &str) -> bool {
    let mut pattern = String::from("^");
    let mut rest = template;
    while let Some(i) = rest.find('%') {
        pattern.push_str(&regex::escape(&rest[..i]));
        pattern.push_str("(?s:.*)");
        rest = &rest[i + 2..];
    }
    pattern.push_str(&regex::escape(rest));
    pattern.push('$');
    regex::Regex::new(&pattern).unwrap().is_match(text)
}

#[test]
fn every_code_has_a_positive_and_a_negative_case() {
    let cases = fixtures().join("cases");
    let mut failures = Vec::new();
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(&cases).unwrap() {
        let dir = entry.unwrap().path();
        let code = dir.file_name().unwrap().to_string_lossy().to_string();
        let c = super::code(&code).unwrap_or_else(|| panic!("{code}: no such code in the catalogue"));
        seen.push(code.clone());
        let positive = dir.join("positive.yaml");
        let expected: Vec<String> =
            std::fs::read_to_string(&positive).unwrap().lines().filter_map(|l| l.strip_prefix("# expect: ")).map(str::to_string).collect();
        assert!(!expected.is_empty(), "{code}: positive.yaml has no `# expect:` line");
        let (messages, lines) = analyze_file(&positive);
        for m in &messages {
            let cm = super::code(&m.code).unwrap();
            if !template_matches(cm.template, &m.message) || m.level != cm.level {
                failures.push(format!("{code}/positive: {} does not read as {:?}: {}", m.code, cm.template, m.message));
            }
        }
        let got: Vec<&String> = lines.iter().filter(|l| l.contains(&format!("[{code}]"))).collect();
        for e in &expected {
            if !got.contains(&e) {
                failures.push(format!("{code}/positive: expected\n    {e}\n  got\n    {}", got.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n    ")));
            }
        }
        if got.len() != expected.len() {
            failures.push(format!("{code}/positive: {} lines of {code}, {} expected:\n    {}", got.len(), expected.len(), lines.join("\n    ")));
        }
        let (messages, lines) = analyze_file(&dir.join("negative.yaml"));
        if messages.iter().any(|m| m.code == c.code) {
            failures.push(format!("{code}/negative: gives {code}:\n    {}", lines.join("\n    ")));
        }
        // A fixture validation refuses would prove nothing.
        let (positive, _) = analyze_file(&positive);
        if code != "IST0106" && positive.iter().chain(&messages).any(|m| m.code == "IST0106") {
            failures.push(format!("{code}: a fixture does not validate:\n    {}", lines.join("\n    ")));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Every code the catalogue has is tested.
    for c in CATALOGUE {
        assert!(seen.iter().any(|s| s == c.code), "{}: no case in tests/fixtures/analyze/cases", c.code);
    }
}

/// The IST codes are Istio 1.30.3's, byte for byte; every code Istio's
/// analysis can emit on configuration alone (or with a registry) is
/// reported, unless Lodestar has no kind for it.
#[test]
fn the_catalogue_is_istios() {
    let text = std::fs::read_to_string(fixtures().join("messages.yaml")).unwrap();
    let doc: Value = yaml_serde::from_str(&text).unwrap();
    // Telemetry's (IST0157, 0159, 0160) are not reproduced.
    let no_kind = ["IST0157", "IST0159", "IST0160"];
    for m in doc["messages"].as_array().unwrap() {
        let code = m["code"].as_str().unwrap();
        let applies = m["applies"].as_str().unwrap_or_default();
        match super::code(code) {
            Some(c) => {
                assert_eq!(c.name, m["name"].as_str().unwrap(), "{code}");
                assert_eq!(c.level.as_str(), m["level"].as_str().unwrap(), "{code}");
                assert_eq!(c.template, m["template"].as_str().unwrap(), "{code}");
            }
            None if matches!(applies, "yes" | "registry") => assert!(no_kind.contains(&code), "{code} applies ({applies}) but is not reported"),
            None => {}
        }
    }
    for c in CATALOGUE.iter().filter(|c| c.code.starts_with("LST")) {
        assert!(doc["messages"].as_array().unwrap().iter().all(|m| m["code"] != c.code), "{}", c.code);
    }
}

#[test]
fn go_formatting() {
    assert_eq!(quote("a\"b\\c\n"), r#""a\"b\\c\n""#);
    assert_eq!(quote("é"), "\"é\"");
    assert_eq!(slice([80, 443]), "[80 443]");
    assert_eq!(slice(Vec::<String>::new()), "[]");
}

#[test]
fn suppressions() {
    let m = Message::new(IST0101, &ResourceKey::new(Kind::VirtualService, "default", "reviews"), None, "x".into());
    let yes = [
        "IST0101=VirtualService default/reviews",
        "IST0101=VirtualService default/*",
        "IST0101=*",
        "IST0101=*reviews",
        "IST0101=vs/reviews",
        "IST0101=virtualservice/default/reviews",
        "IST0101=VirtualService/*",
    ];
    for s in yes {
        assert!(Suppression::parse(s).unwrap().matches(&m), "{s}");
    }
    // Istio's own help text's form no longer matches in Istio either.
    let no = ["IST0101=VirtualService reviews.default", "IST0102=*", "IST0101=virtualservice default/reviews", "IST0101=vs/other", "IST0101=dr/reviews"];
    for s in no {
        assert!(!Suppression::parse(s).unwrap().matches(&m), "{s}");
    }
    assert!(Suppression::parse("IST0101").is_err());
    assert!(Suppression::parse("IST0101=a=b").is_err());
    assert!(glob("a*b*c", "aXXbYYc") && !glob("a*b*c", "aXXcYYb") && glob("*", "") && !glob("a*", "b"));
}

/// A write's findings are the full analysis' findings about what it
/// writes, plus those it makes appear elsewhere, and nothing it does not
/// cause.
#[test]
fn on_write_reports_what_the_write_causes() {
    let text = |s: &str| Source { name: "f.yaml".into(), text: s.into() };
    let base = load(
        &[text(
            "apiVersion: registry.lodestar.io/v1\nkind: Service\nmetadata: {name: reviews, namespace: default}\nspec: {ports: [{name: http, number: 9080}]}\n---\n\
             apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: reviews, namespace: default}\nspec: {host: reviews, subsets: [{name: v1, labels: {version: v1}}]}\n---\n\
             apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: reviews, namespace: default}\nspec: {hosts: [reviews], http: [{route: [{destination: {host: reviews, subset: v1}}]}]}\n---\n\
             apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: other, namespace: default}\nspec: {hosts: [other], http: [{route: [{destination: {host: nowhere}}]}]}\n",
        )],
        "default",
    );
    let opts = options();
    let before = &base.state;
    // Deleting the DestinationRule: the VirtualService's subset is gone.
    let dr = ResourceKey::new(Kind::DestinationRule, "default", "reviews");
    let found = on_write(before, &[(dr.clone(), None)], &opts);
    let lines: Vec<String> = found.iter().map(|m| m.log_line(None)).collect();
    assert_eq!(
        lines,
        ["Error [IST0101] (VirtualService default/reviews) Referenced host+subset in destinationrule not found: \"reviews+v1\""],
        "the finding the delete causes, not the one it does not (other's host)"
    );
    // Writing a VirtualService: its own findings, as the full analysis has them.
    let vs = base.state.get(&ResourceKey::new(Kind::VirtualService, "default", "other")).unwrap().clone();
    let found = on_write(before, &[(vs.key.clone(), Some(vs))], &opts);
    let full: Vec<Message> = analyze(before, &opts).into_iter().filter(|m| m.resource.as_ref().is_some_and(|r| r.name == "other")).collect();
    assert_eq!(found, full);
    assert!(!found.is_empty());
}

/// An EnvoyFilter write is analysed against every other EnvoyFilter:
/// IST0155 needs the earlier filter that pins a proxy version.
#[test]
fn an_envoyfilter_write_sees_the_other_filters() {
    let positive = std::fs::read_to_string(fixtures().join("cases/IST0155/positive.yaml")).unwrap();
    let loaded = load(&[Source { name: "f.yaml".into(), text: positive }], "default");
    let b = ResourceKey::new(Kind::EnvoyFilter, "default", "b-lua");
    let obj = loaded.state.get(&b).unwrap().clone();
    let mut before = loaded.state.clone();
    before.objects.remove(&b);
    let found = on_write(&before, &[(b.clone(), Some(obj))], &options());
    let codes: Vec<&str> = found.iter().map(|m| m.code.as_str()).collect();
    assert_eq!(codes, ["IST0155"], "{found:?}");
}
