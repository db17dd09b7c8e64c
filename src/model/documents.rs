//! Reading resources from YAML or JSON text: multi-document YAML streams,
//! a single JSON object, a JSON array, or a Kubernetes `kind: List`.
//!
//! YAML anchors (`&name`) and aliases (`*name`) are refused, with the
//! document and line of the first one, before any value is built. An alias
//! is expanded where it is used, so a few kilobytes of nested aliases make
//! hundreds of megabytes of values (yaml_serde's limit counts alias jumps,
//! not the size they expand to), and no later check sees the input before
//! that. Kubernetes manifests do not use them; Istio's docs neither.

use crate::error::FieldError;
use serde::Deserialize;
use serde_json::Value;

/// Parse every document in `text`. `source` names the input in errors
/// (a file name, or `body`). Empty documents are skipped.
pub fn parse_documents(text: &str, source: &str) -> Result<Vec<Value>, FieldError> {
    let trimmed = text.trim_start();
    let mut docs = Vec::new();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        // JSON (also valid YAML, but serde_json gives better errors for it).
        let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Value>();
        for (i, doc) in stream.by_ref().enumerate() {
            let doc = doc.map_err(|e| FieldError::new(format!("{source}[{i}]"), format!("malformed JSON: {e}")))?;
            push_doc(doc, &mut docs);
        }
    } else {
        if let Some(found) = yaml_events::first_anchor(text) {
            return Err(FieldError::new(format!("{source}[{}]", found.document), found.to_string()));
        }
        for (i, de) in yaml_serde::Deserializer::from_str(text).enumerate() {
            let doc = Value::deserialize(de).map_err(|e| FieldError::new(format!("{source}[{i}]"), format!("malformed YAML: {e}")))?;
            push_doc(doc, &mut docs);
        }
    }
    Ok(docs)
}

fn push_doc(doc: Value, out: &mut Vec<Value>) {
    match doc {
        Value::Null => {}
        Value::Array(items) => out.extend(items.into_iter().filter(|v| !v.is_null())),
        Value::Object(ref m) if m.get("kind").and_then(Value::as_str) == Some("List") && m.get("items").is_some_and(Value::is_array) => {
            if let Some(Value::Array(items)) = doc.get("items").cloned() {
                out.extend(items);
            }
        }
        other => out.push(other),
    }
}

/// A scan of a YAML stream's events (libyaml's parser, the one yaml_serde
/// runs): no value is built and nothing is expanded, and events are
/// dropped as they are read, so it runs in constant memory. A quoted or
/// block scalar holding `*` or `&` is a scalar event like any other: only
/// the parser knows what is an alias, so no lexical check is attempted.
mod yaml_events {
    use libyaml_rs as sys;
    use std::mem::MaybeUninit;

    /// The first anchor or alias of a stream.
    #[derive(Debug, PartialEq, Eq)]
    pub struct Found {
        /// The document's index in the stream (as yaml_serde counts them).
        pub document: usize,
        /// 1-based.
        pub line: u64,
        pub alias: bool,
        pub name: String,
    }

    impl std::fmt::Display for Found {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            let (what, sigil) = if self.alias { ("alias", '*') } else { ("anchor", '&') };
            let name: String = self.name.chars().take(64).collect();
            write!(
                f,
                "line {}: YAML {what} {sigil}{name}: anchors and aliases are not accepted (an alias expands where it is used); write the value out",
                self.line
            )
        }
    }

    /// A parser, boxed: libyaml keeps a pointer to it in itself (its read
    /// handler's data), so it must not move once initialised.
    struct Parser(Box<MaybeUninit<sys::yaml_parser_t>>);

    impl Drop for Parser {
        fn drop(&mut self) {
            // SAFETY: initialised in `first_anchor` before the Parser exists.
            unsafe { sys::yaml_parser_delete(self.0.as_mut_ptr()) }
        }
    }

    /// What a scan sees of one event.
    pub struct Event<'a> {
        pub kind: EventKind,
        /// 1-based.
        pub line: u64,
        /// A node's anchor, or an alias's name.
        pub anchor: Option<String>,
        /// A scalar's text.
        pub value: Option<&'a str>,
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum EventKind {
        DocumentStart,
        MappingStart,
        MappingEnd,
        SequenceStart,
        SequenceEnd,
        Scalar,
        Alias,
        Other,
    }

    /// Feed `text`'s events to `f` until it returns false or the stream
    /// ends. A stream that does not parse stops the scan where it fails;
    /// yaml_serde, reading the same events, fails at the same place, with
    /// a better message.
    pub fn scan(text: &str, mut f: impl FnMut(&Event) -> bool) {
        let mut boxed = Box::new(MaybeUninit::<sys::yaml_parser_t>::uninit());
        // SAFETY: `yaml_parser_initialize` fills the whole struct (it
        // zeroes it first) and allocates its buffers; the input is `text`,
        // which outlives the parser (dropped at the end of this function).
        let parser = unsafe {
            let p = boxed.as_mut_ptr();
            if sys::yaml_parser_initialize(p).fail {
                return;
            }
            sys::yaml_parser_set_encoding(p, sys::YAML_UTF8_ENCODING);
            sys::yaml_parser_set_input_string(p, text.as_ptr(), text.len() as u64);
            Parser(boxed)
        };
        let p = parser.0.as_ptr() as *mut sys::yaml_parser_t;
        loop {
            let mut event = MaybeUninit::<sys::yaml_event_t>::uninit();
            // SAFETY: the parser is initialised; a successful parse fills
            // the event, which is read here (its strings copied out or
            // borrowed only for the call to `f`) and then deleted
            // (freeing its strings) before the next one.
            unsafe {
                if sys::yaml_parser_parse(p, event.as_mut_ptr()).fail {
                    return;
                }
                let e = &*event.as_ptr();
                let name = |ptr: *mut u8| (!ptr.is_null()).then(|| std::ffi::CStr::from_ptr(ptr as *const std::ffi::c_char).to_string_lossy().into_owned());
                let (kind, anchor, value) = match e.type_ {
                    sys::YAML_DOCUMENT_START_EVENT => (EventKind::DocumentStart, None, None),
                    sys::YAML_ALIAS_EVENT => (EventKind::Alias, name(e.data.alias.anchor), None),
                    sys::YAML_SCALAR_EVENT => {
                        let s = e.data.scalar;
                        let bytes = if s.value.is_null() { &[][..] } else { std::slice::from_raw_parts(s.value, s.length as usize) };
                        (EventKind::Scalar, name(s.anchor), std::str::from_utf8(bytes).ok())
                    }
                    sys::YAML_SEQUENCE_START_EVENT => (EventKind::SequenceStart, name(e.data.sequence_start.anchor), None),
                    sys::YAML_SEQUENCE_END_EVENT => (EventKind::SequenceEnd, None, None),
                    sys::YAML_MAPPING_START_EVENT => (EventKind::MappingStart, name(e.data.mapping_start.anchor), None),
                    sys::YAML_MAPPING_END_EVENT => (EventKind::MappingEnd, None, None),
                    _ => (EventKind::Other, None, None),
                };
                let end = e.type_ == sys::YAML_STREAM_END_EVENT;
                let more = f(&Event { kind, line: e.start_mark.line + 1, anchor, value });
                sys::yaml_event_delete(event.as_mut_ptr());
                if end || !more {
                    return;
                }
            }
        }
    }

    /// The first anchor or alias in `text`, if any.
    pub fn first_anchor(text: &str) -> Option<Found> {
        let mut document: Option<usize> = None;
        let mut found = None;
        scan(text, |e| {
            if e.kind == EventKind::DocumentStart {
                document = Some(document.map_or(0, |d| d + 1));
            }
            found =
                e.anchor.as_ref().map(|name| Found { document: document.unwrap_or(0), line: e.line, alias: e.kind == EventKind::Alias, name: name.clone() });
            found.is_none()
        });
        found
    }
}

/// Where the resources of a YAML stream are: each resource's first line
/// and the line of each of its fields, by path from the resource
/// (`spec.http[0].route[0].destination.host`). A resource is a document's
/// root mapping, or a mapping in a root sequence, or in the root's
/// `items` (a `kind: List`). Text that does not parse gives what was read
/// before the error; JSON text has no lines worth giving (none).
pub fn resource_lines(text: &str) -> Vec<ResourceLines> {
    use yaml_events::EventKind as K;
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        return Vec::new();
    }
    /// A container being read: its path, and for a mapping the key just
    /// read (its value comes next), for a sequence the next index.
    enum Frame {
        Map { path: String, key: Option<String>, root: Option<usize> },
        Seq { path: String, next: usize },
    }
    let mut out: Vec<ResourceLines> = Vec::new();
    let mut stack: Vec<Frame> = Vec::new();
    let join = |path: &str, key: &str| if path.is_empty() { key.to_string() } else { format!("{path}.{key}") };
    yaml_events::scan(text, |e| {
        match e.kind {
            K::MappingEnd | K::SequenceEnd => {
                stack.pop();
                return true;
            }
            K::MappingStart | K::SequenceStart | K::Scalar | K::Alias => {}
            _ => return true,
        }
        let depth = stack.len();
        let root = stack.iter().rev().find_map(|f| match f {
            Frame::Map { root: Some(r), .. } => Some(*r),
            _ => None,
        });
        let mut record = |path: &str, line: u64| {
            if let Some(r) = root.and_then(|r| out.get_mut(r)) {
                if let Some(rel) = path.strip_prefix(r.base.as_str()) {
                    r.fields.insert(rel.trim_start_matches('.').to_string(), line);
                }
            }
        };
        // A mapping's key: its line is the field's.
        if let Some(Frame::Map { path, key: key @ None, .. }) = stack.last_mut() {
            let k = e.value.unwrap_or_default().to_string();
            record(&join(path, &k), e.line);
            *key = Some(k);
            return true;
        }
        let path = match stack.last_mut() {
            None => String::new(),
            Some(Frame::Map { path, key, .. }) => join(path, &key.take().unwrap_or_default()),
            Some(Frame::Seq { path, next }) => {
                let p = format!("{path}[{next}]");
                *next += 1;
                record(&p, e.line);
                p
            }
        };
        if let (Some(r), Some(v)) = (root.and_then(|r| out.get_mut(r)), e.value) {
            match path.strip_prefix(r.base.as_str()).map(|p| p.trim_start_matches('.')) {
                Some("kind") => r.kind = Some(v.to_string()),
                Some("metadata.name") => r.name = Some(v.to_string()),
                _ => {}
            }
        }
        match e.kind {
            K::MappingStart => {
                // The root, an element of a root list, or of the root's `items`.
                let resource = depth == 0 || (depth == 1 && path.starts_with('[')) || (depth == 2 && path.starts_with("items["));
                let root = resource.then(|| {
                    out.push(ResourceLines { kind: None, name: None, line: e.line, base: path.clone(), fields: Default::default() });
                    out.len() - 1
                });
                stack.push(Frame::Map { path, key: None, root });
            }
            K::SequenceStart => stack.push(Frame::Seq { path, next: 0 }),
            _ => {}
        }
        true
    });
    out
}

/// One resource of a YAML stream (see [`resource_lines`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceLines {
    /// Its `kind` and `metadata.name`, as written.
    pub kind: Option<String>,
    pub name: Option<String>,
    /// Its first line (1-based).
    pub line: u64,
    /// Its path in the document (`""`, `[2]`, `items[0]`).
    base: String,
    /// Field path → line.
    pub fields: std::collections::BTreeMap<String, u64>,
}

impl ResourceLines {
    /// The line of `field`, else of the nearest enclosing field that has
    /// one, else the resource's.
    pub fn line_of(&self, field: &str) -> u64 {
        let mut f = field;
        loop {
            if let Some(l) = self.fields.get(f) {
                return *l;
            }
            match f.rfind(['.', '[']) {
                Some(i) => f = &f[..i],
                None => return self.line,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_document_yaml() {
        let text = "---\nkind: A\n---\n\n---\nkind: B\nspec: {x: 1}\n";
        let docs = parse_documents(text, "f.yaml").unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[1]["spec"]["x"], 1);
    }

    #[test]
    fn json_forms() {
        assert_eq!(parse_documents(r#"{"kind":"A"}"#, "b").unwrap().len(), 1);
        assert_eq!(parse_documents(r#"[{"kind":"A"},{"kind":"B"}]"#, "b").unwrap().len(), 2);
        assert_eq!(parse_documents(r#"{"kind":"List","items":[{"kind":"A"}]}"#, "b").unwrap().len(), 1);
    }

    /// The "billion laughs" of YAML: each level aliases the one before ten
    /// times, so 9 levels in 1 KB expand to 10^9 strings.
    fn alias_bomb() -> String {
        let mut s = String::from("kind: A\nspec:\n  a0: &a0 [\"lol\"]\n");
        for i in 1..10 {
            let refs = vec![format!("*a{}", i - 1); 10].join(", ");
            s.push_str(&format!("  a{i}: &a{i} [{refs}]\n"));
        }
        s
    }

    #[test]
    fn anchors_and_aliases_are_refused_before_expansion() {
        let bomb = format!("kind: First\n---\n{}", alias_bomb());
        let started = std::time::Instant::now();
        let e = parse_documents(&bomb, "body").unwrap_err();
        assert!(started.elapsed() < std::time::Duration::from_secs(1), "refused before expanding: {:?}", started.elapsed());
        assert_eq!(e.field, "body[1]");
        assert!(e.reason.starts_with("line 5: YAML anchor &a0:") && e.reason.contains("not accepted"), "{}", e.reason);
        // An alias alone (its anchor in an earlier document is not in scope,
        // so libyaml would not resolve it; the alias is named all the same).
        let e = parse_documents("kind: A\nspec: {x: *nope}\n", "f.yaml").unwrap_err();
        assert_eq!((e.field.as_str(), e.reason.split(':').next()), ("f.yaml[0]", Some("line 2")));
        assert!(e.reason.contains("alias *nope"), "{}", e.reason);
        // A merge key is an alias too.
        let e = parse_documents("base: &b {x: 1}\nspec:\n  <<: *b\n", "f").unwrap_err();
        assert!(e.reason.contains("anchor &b"), "{}", e.reason);
        // Tags and anchors before a collection or scalar.
        assert!(parse_documents("spec: !!map &m {x: 1}\n", "f").is_err());
        assert!(parse_documents("spec: &s text\n", "f").is_err());
    }

    #[test]
    fn stars_and_ampersands_in_values_are_no_aliases() {
        // Istio's wildcard hosts, regexes, header values, block scalars and
        // comments: only the parser can tell these from aliases.
        let text = r#"kind: VirtualService
spec:
  hosts: ["*", '*.example.com', "*&x"]
  gateways: [mesh]  # *not-an-alias &nor-an-anchor
  http:
  - match: [{uri: {regex: "/a*b&c"}}, {headers: {x: {exact: a*b}}}]
    note: |
      *inside a block
      &and-this
    other: >
      - *folded
    plain: a &b *c
"#;
        let docs = parse_documents(text, "f").unwrap();
        assert_eq!(docs[0]["spec"]["hosts"][2], "*&x");
        assert_eq!(docs[0]["spec"]["http"][0]["note"], "*inside a block\n&and-this\n");
        assert_eq!(docs[0]["spec"]["http"][0]["plain"], "a &b *c");
        // A stream that does not parse is yaml_serde's to report.
        let e = parse_documents("kind: A\nspec: [unclosed\n", "f").unwrap_err();
        assert!(e.reason.contains("malformed YAML"), "{}", e.reason);
        // The scan alone: nothing in a stream without anchors.
        assert_eq!(yaml_events::first_anchor("a: 1\n---\nb: [2]\n"), None);
        assert_eq!(yaml_events::first_anchor(""), None);
    }

    #[test]
    fn malformed_names_source() {
        let e = parse_documents("kind: A\n---\nspec: [unclosed\n", "f.yaml").unwrap_err();
        assert_eq!(e.field, "f.yaml[1]");
        assert!(e.reason.contains("malformed YAML"), "{}", e.reason);
    }
}
