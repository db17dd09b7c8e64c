//! The fields that differ between two JSON documents: what a preview, a
//! diff between revisions or a proxy's config change shows.

use serde::Serialize;
use serde_json::Value;

/// One field that differs: a value added (no `before`), removed (no
/// `after`) or replaced. Paths as validation errors name fields
/// (`spec.http[1].route[0].weight`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FieldChange {
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub before: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after: Option<Value>,
    /// A Secret's value: the field changes, its values are not shown.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub redacted: bool,
}

/// The fields that differ between two JSON documents. Objects are
/// compared key by key; lists of the same length element by element, and
/// as a whole otherwise (a route added or removed replaces the list).
pub fn diff(before: &Value, after: &Value, redact: bool) -> Vec<FieldChange> {
    let mut out = Vec::new();
    walk(String::new(), Some(before), Some(after), redact, &mut out);
    out
}

fn walk(path: String, before: Option<&Value>, after: Option<&Value>, redact: bool, out: &mut Vec<FieldChange>) {
    match (before, after) {
        (Some(a), Some(b)) if a == b => {}
        (Some(Value::Object(a)), Some(Value::Object(b))) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                walk(p, a.get(k), b.get(k), redact, out);
            }
        }
        (Some(Value::Array(a)), Some(Value::Array(b))) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                walk(format!("{path}[{i}]"), Some(x), Some(y), redact, out);
            }
        }
        (a, b) => {
            let hide = redact && !path.starts_with("metadata.") && path != "metadata" && path != "apiVersion" && path != "kind";
            out.push(FieldChange { path, before: if hide { None } else { a.cloned() }, after: if hide { None } else { b.cloned() }, redacted: hide });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn diffs_name_the_fields_that_change() {
        let a = json!({"spec": {"hosts": ["r"], "http": [{"route": [{"weight": 80}, {"weight": 20}]}]}, "metadata": {"labels": {"a": "1"}}});
        let b = json!({"spec": {"hosts": ["r"], "http": [{"route": [{"weight": 70}, {"weight": 30}]}]}, "metadata": {"labels": {"b": "2"}}});
        let d = diff(&a, &b, false);
        let paths: Vec<(&str, Option<Value>, Option<Value>)> = d.iter().map(|f| (f.path.as_str(), f.before.clone(), f.after.clone())).collect();
        assert_eq!(
            paths,
            vec![
                ("metadata.labels.a", Some(json!("1")), None),
                ("metadata.labels.b", None, Some(json!("2"))),
                ("spec.http[0].route[0].weight", Some(json!(80)), Some(json!(70))),
                ("spec.http[0].route[1].weight", Some(json!(20)), Some(json!(30))),
            ]
        );
        // A list that grows is replaced whole.
        let d = diff(&json!({"l": [1]}), &json!({"l": [1, 2]}), false);
        assert_eq!((d.len(), d[0].path.as_str()), (1, "l"));
        assert!(diff(&a, &a, false).is_empty());
    }

    #[test]
    fn secret_values_never_appear() {
        let a = json!({"metadata": {"name": "s"}, "data": {"key": "c2VjcmV0MQ=="}});
        let b = json!({"metadata": {"name": "s", "labels": {"x": "y"}}, "data": {"key": "c2VjcmV0Mg==", "new": "bmV3"}});
        let d = diff(&a, &b, true);
        let text = serde_json::to_string(&d).unwrap();
        assert!(!text.contains("c2Vj") && !text.contains("bmV3"), "{text}");
        assert_eq!(d.iter().filter(|f| f.redacted).count(), 2, "{text}");
        assert!(d.iter().any(|f| f.path == "metadata.labels" && f.after == Some(json!({"x": "y"}))), "{text}");
    }
}
