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

    /// The first anchor or alias in `text`, if any. A stream that does not
    /// parse stops the scan where it fails; yaml_serde, reading the same
    /// events, fails at the same place, with a better message.
    pub fn first_anchor(text: &str) -> Option<Found> {
        let mut boxed = Box::new(MaybeUninit::<sys::yaml_parser_t>::uninit());
        // SAFETY: `yaml_parser_initialize` fills the whole struct (it
        // zeroes it first) and allocates its buffers; the input is `text`,
        // which outlives the parser (dropped at the end of this function).
        let parser = unsafe {
            let p = boxed.as_mut_ptr();
            if sys::yaml_parser_initialize(p).fail {
                return None;
            }
            sys::yaml_parser_set_encoding(p, sys::YAML_UTF8_ENCODING);
            sys::yaml_parser_set_input_string(p, text.as_ptr(), text.len() as u64);
            Parser(boxed)
        };
        let p = parser.0.as_ptr() as *mut sys::yaml_parser_t;
        let mut document: Option<usize> = None;
        loop {
            let mut event = MaybeUninit::<sys::yaml_event_t>::uninit();
            // SAFETY: the parser is initialised; a successful parse fills
            // the event, which is read here and then deleted (freeing its
            // strings) before the next one.
            unsafe {
                if sys::yaml_parser_parse(p, event.as_mut_ptr()).fail {
                    return None;
                }
                let e = &*event.as_ptr();
                let (anchor, alias) = match e.type_ {
                    sys::YAML_DOCUMENT_START_EVENT => {
                        document = Some(document.map_or(0, |d| d + 1));
                        (std::ptr::null_mut(), false)
                    }
                    sys::YAML_ALIAS_EVENT => (e.data.alias.anchor, true),
                    sys::YAML_SCALAR_EVENT => (e.data.scalar.anchor, false),
                    sys::YAML_SEQUENCE_START_EVENT => (e.data.sequence_start.anchor, false),
                    sys::YAML_MAPPING_START_EVENT => (e.data.mapping_start.anchor, false),
                    _ => (std::ptr::null_mut(), false),
                };
                let end = e.type_ == sys::YAML_STREAM_END_EVENT;
                let found = (!anchor.is_null()).then(|| Found {
                    document: document.unwrap_or(0),
                    line: e.start_mark.line + 1,
                    alias,
                    name: std::ffi::CStr::from_ptr(anchor as *const std::ffi::c_char).to_string_lossy().into_owned(),
                });
                sys::yaml_event_delete(event.as_mut_ptr());
                if found.is_some() || end {
                    return found;
                }
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
