//! Kubernetes label selectors: `app=reviews,version!=v1,tier,!canary,env in (a,b)`.

use crate::error::FieldError;
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Req {
    Eq(String, String),
    NotEq(String, String),
    Exists(String),
    NotExists(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector(Vec<Req>);

impl Selector {
    pub fn parse(s: &str) -> Result<Selector, FieldError> {
        let err = |reason: String| FieldError::new("labelSelector", reason);
        let mut reqs = Vec::new();
        for term in split_terms(s) {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            let req = if let Some((k, rest)) = split_set_op(term, " notin ") {
                Req::NotIn(k, parse_set(rest).map_err(err)?)
            } else if let Some((k, rest)) = split_set_op(term, " in ") {
                Req::In(k, parse_set(rest).map_err(err)?)
            } else if let Some((k, v)) = term.split_once("!=") {
                Req::NotEq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if let Some(k) = term.strip_prefix('!') {
                Req::NotExists(k.trim().into())
            } else {
                Req::Exists(term.into())
            };
            let key = match &req {
                Req::Eq(k, _) | Req::NotEq(k, _) | Req::Exists(k) | Req::NotExists(k) | Req::In(k, _) | Req::NotIn(k, _) => k,
            };
            if key.is_empty() || key.contains(|c: char| c.is_whitespace() || "=!(),".contains(c)) {
                return Err(err(format!("invalid term {term:?}")));
            }
            reqs.push(req);
        }
        Ok(Selector(reqs))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn matches(&self, labels: &BTreeMap<&str, &str>) -> bool {
        self.0.iter().all(|r| match r {
            Req::Eq(k, v) => labels.get(k.as_str()) == Some(&v.as_str()),
            Req::NotEq(k, v) => labels.get(k.as_str()) != Some(&v.as_str()),
            Req::Exists(k) => labels.contains_key(k.as_str()),
            Req::NotExists(k) => !labels.contains_key(k.as_str()),
            Req::In(k, vs) => labels.get(k.as_str()).is_some_and(|l| vs.iter().any(|v| v == l)),
            Req::NotIn(k, vs) => labels.get(k.as_str()).is_none_or(|l| vs.iter().all(|v| v != l)),
        })
    }
}

/// Split on commas that are not inside a `( ... )` set.
fn split_terms(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn split_set_op<'a>(term: &'a str, op: &str) -> Option<(String, &'a str)> {
    term.split_once(op).map(|(k, rest)| (k.trim().to_string(), rest.trim()))
}

fn parse_set(s: &str) -> Result<Vec<String>, String> {
    let inner = s.strip_prefix('(').and_then(|r| r.strip_suffix(')')).ok_or_else(|| format!("expected a parenthesised set, got {s:?}"))?;
    Ok(inner.split(',').map(|v| v.trim().to_string()).filter(|v| !v.is_empty()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matching() {
        let labels: BTreeMap<&str, &str> = [("app", "reviews"), ("version", "v2")].into();
        for (sel, want) in [
            ("", true),
            ("app=reviews", true),
            ("app==reviews", true),
            ("app=ratings", false),
            ("version!=v1", true),
            ("app,version", true),
            ("!canary", true),
            ("!app", false),
            ("version in (v1, v2)", true),
            ("version notin (v1,v2)", false),
            ("app=reviews,version in (v3)", false),
        ] {
            assert_eq!(Selector::parse(sel).unwrap().matches(&labels), want, "{sel}");
        }
        assert!(Selector::parse("a in b").is_err());
    }
}
