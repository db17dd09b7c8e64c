//! Reading resources from YAML or JSON text: multi-document YAML streams,
//! a single JSON object, a JSON array, or a Kubernetes `kind: List`.

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

    #[test]
    fn malformed_names_source() {
        let e = parse_documents("kind: A\n---\nspec: [unclosed\n", "f.yaml").unwrap_err();
        assert_eq!(e.field, "f.yaml[1]");
        assert!(e.reason.contains("malformed YAML"), "{}", e.reason);
    }
}
