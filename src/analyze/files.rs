//! Resources from files, for `lodestar analyze FILE...` (no server): each
//! document checked as `apply` checks it (structure, then the kind's
//! validation: what fails is IST0106), the valid ones put into a [`State`]
//! as one `apply` of them all would store them (one revision, so the same
//! objects analyze the same offline and live), with where each came from
//! (`file:line` of the field a message is about).
//!
//! Documents of kinds Lodestar does not store (a Kubernetes Deployment, a
//! `v1` Service) are skipped with a note, as istioctl skips kinds it has
//! no schema for; ACL objects (policies, roles, tokens) too: nothing
//! analyzes them.

use super::{schema::schema_error, Message, IST0106};
use crate::model::documents::{parse_documents, resource_lines, ResourceLines};
use crate::model::{self, Kind, ResourceKey, StoredObject};
use crate::store::state::State;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;

/// One input: its name (a path, or `stdin`) and its text.
pub struct Source {
    pub name: String,
    pub text: String,
}

/// Where an object came from.
#[derive(Debug, Clone)]
pub struct Origin {
    pub file: String,
    /// Lines of a YAML file's resource; none for JSON (istioctl prints no
    /// line for JSON files either).
    pub lines: Option<ResourceLines>,
}

/// What [`load`] read.
#[derive(Default)]
pub struct Loaded {
    /// The valid objects, as one write of them would store them.
    pub state: State,
    /// IST0106 for the documents validation refuses.
    pub messages: Vec<Message>,
    pub origins: BTreeMap<ResourceKey, Origin>,
    /// Documents skipped, and why (for stderr).
    pub notes: Vec<String>,
    /// Inputs that are not YAML or JSON at all (istioctl's exit 65).
    pub errors: Vec<String>,
}

impl Loaded {
    /// istioctl's `reference`: `file:line` of the message's field (or of
    /// its resource), `file` alone for JSON; none for objects not read
    /// from a file.
    pub fn reference(&self, m: &Message) -> Option<String> {
        let key = m.resource.as_ref()?.key()?;
        let origin = self.origins.get(&key)?;
        Some(match &origin.lines {
            Some(lines) => format!("{}:{}", origin.file, m.field.as_deref().map_or(lines.line, |f| lines.line_of(f))),
            None => origin.file.clone(),
        })
    }
}

/// Read every source; `namespace` for the documents that name none.
pub fn load(sources: &[Source], namespace: &str) -> Loaded {
    let mut out = Loaded::default();
    let mut objects = Vec::new();
    for source in sources {
        match parse_documents(&source.text, &source.name) {
            Ok(docs) => {
                let json = matches!(source.text.trim_start().chars().next(), Some('{') | Some('['));
                let lines = if json { Vec::new() } else { resource_lines(&source.text) };
                read(&mut out, &mut objects, &source.name, docs, &lines, namespace);
            }
            Err(e) => out.errors.push(e.to_string()),
        }
    }
    out.finish(objects)
}

/// Documents already parsed (an API request's), named `name`.
pub fn from_values(name: &str, docs: Vec<Value>, namespace: &str) -> Loaded {
    let mut out = Loaded::default();
    let mut objects = Vec::new();
    read(&mut out, &mut objects, name, docs, &[], namespace);
    out.finish(objects)
}

fn read(out: &mut Loaded, objects: &mut Vec<model::NewResource>, source: &str, docs: Vec<Value>, lines: &[ResourceLines], namespace: &str) {
    let mut cursor = 0;
    for (i, doc) in docs.into_iter().enumerate() {
        let kind_field = doc.get("kind").and_then(Value::as_str).unwrap_or("").to_string();
        let name_field = doc.pointer("/metadata/name").and_then(Value::as_str).map(str::to_string);
        // The resource's lines: the next ones read with its kind and name.
        let found = lines[cursor.min(lines.len())..].iter().position(|l| l.kind.as_deref() == Some(kind_field.as_str()) && l.name == name_field);
        let found = found.map(|at| {
            cursor += at + 1;
            lines[cursor - 1].clone()
        });
        let origin = Origin { file: source.to_string(), lines: found };
        let what = format!("{source}[{i}] ({kind_field} {})", name_field.as_deref().unwrap_or("?"));
        let Some(kind) = Kind::from_kind_field(&kind_field).filter(|k| ours(*k, &doc)) else {
            out.notes.push(format!("{what}: skipped: not a kind Lodestar stores"));
            continue;
        };
        if kind.is_acl() {
            out.notes.push(format!("{what}: skipped: ACL objects are not analyzed"));
            continue;
        }
        let resource = match model::parse_resource(doc, namespace) {
            Ok(r) => r,
            Err(errors) => {
                match name_field {
                    Some(name) => {
                        let key = ResourceKey::new(kind, namespace, name);
                        out.messages.extend(errors.iter().map(|e| schema_error(&key, &e.to_string())));
                        out.origins.insert(key, origin);
                    }
                    None => out.messages.extend(errors.iter().map(|e| Message {
                        code: IST0106.code.into(),
                        level: IST0106.level,
                        resource: None,
                        message: format!("Schema validation error: {what}: {e}"),
                        field: None,
                        related: Vec::new(),
                    })),
                }
                continue;
            }
        };
        let key = resource.key.clone();
        out.origins.insert(key.clone(), origin);
        match model::validate_spec(&resource) {
            Err(errors) => out.messages.extend(errors.iter().map(|e| schema_error(&key, &e.to_string()))),
            Ok(_) => objects.push(resource),
        }
    }
}

impl Loaded {
    /// The objects into the state, as one write of them all stores them:
    /// a later document replaces an earlier one of the same object.
    fn finish(mut self, objects: Vec<model::NewResource>) -> Loaded {
        let mut seen = BTreeMap::new();
        for r in objects {
            seen.insert(r.key.clone(), r.body);
        }
        self.state.revision = 1;
        for (key, body) in seen {
            self.state.objects.insert(Arc::new(StoredObject::new(key, 1, 1, 1, body)));
        }
        self
    }
}

/// The document is of Lodestar's kind by that name: its apiVersion's
/// group is the kind's (a Kubernetes `v1` Service is not the registry's).
fn ours(kind: Kind, doc: &Value) -> bool {
    let api = doc.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let group = api.rsplit_once('/').map_or("", |(g, _)| g);
    group == kind.group()
}
