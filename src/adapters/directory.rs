//! The watched-directory adapter: a directory of YAML/JSON resource files
//! (recursively; `*.yaml`, `*.yml`, `*.json`), e.g. a GitOps checkout. It is
//! scanned every `watch_dir_poll_ms` (polling, so it works on any
//! filesystem, network mounts included); when the set of files or any
//! file's size or mtime changes, and stays the same for one more short
//! look (so a checkout caught mid-write is not applied), every file is read
//! and the whole set is reconciled in one atomic write. A file that does
//! not parse or validate stops that round: nothing is applied until the
//! directory is fixed, and the error (file, field) is logged.

use super::Source;
use crate::model::documents::parse_documents;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

pub struct Directory {
    dir: PathBuf,
    poll: Duration,
    /// The fingerprint last returned (None: never scanned).
    last: Option<Vec<(PathBuf, u64, SystemTime)>>,
}

impl Directory {
    pub fn new(dir: PathBuf, poll: Duration) -> Directory {
        Directory { dir, poll, last: None }
    }
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            files(&p, out)?;
        } else if p.extension().and_then(|x| x.to_str()).is_some_and(|x| matches!(x, "yaml" | "yml" | "json")) {
            out.push(p);
        }
    }
    Ok(())
}

fn fingerprint(dir: &Path) -> Result<Vec<(PathBuf, u64, SystemTime)>, String> {
    let mut paths = Vec::new();
    files(dir, &mut paths).map_err(|e| format!("{}: {e}", dir.display()))?;
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            let m = std::fs::metadata(&p).map_err(|e| format!("{}: {e}", p.display()))?;
            Ok((p, m.len(), m.modified().unwrap_or(SystemTime::UNIX_EPOCH)))
        })
        .collect()
}

fn read_all(print: &[(PathBuf, u64, SystemTime)]) -> Result<Vec<Value>, String> {
    let mut docs = Vec::new();
    for (p, _, _) in print {
        let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
        docs.extend(parse_documents(&text, &p.display().to_string()).map_err(|e| e.to_string())?);
    }
    Ok(docs)
}

#[tonic::async_trait]
impl Source for Directory {
    fn name(&self) -> &str {
        "directory"
    }

    async fn next(&mut self) -> Result<Vec<Value>, String> {
        loop {
            if self.last.is_some() {
                tokio::time::sleep(self.poll).await;
            }
            let print = fingerprint(&self.dir)?;
            if self.last.as_ref() == Some(&print) {
                continue;
            }
            // Settle: the same again a moment later, or look again later.
            tokio::time::sleep(Duration::from_millis(100)).await;
            if fingerprint(&self.dir)? != print {
                continue;
            }
            let docs = read_all(&print);
            // Remember it even when broken: retry once it changes again.
            self.last = Some(print);
            return docs;
        }
    }
}
