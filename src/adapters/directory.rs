//! The watched-directory adapter: a directory of YAML/JSON resource files
//! (recursively; `*.yaml`, `*.yml`, `*.json`), e.g. a GitOps checkout. It is
//! scanned every `watch_dir_poll_ms` (polling, so it works on any
//! filesystem, network mounts included); when the set of files or any
//! file's size or mtime changes, and stays the same for one more short
//! look (so a checkout caught mid-write is not applied), every file is read
//! and the whole set is reconciled in one atomic write. A file that does
//! not parse or validate stops that round: nothing is applied until the
//! directory is fixed, and the error (file, field) is logged.
//!
//! The walk is bounded ([`Limits`]) and runs on a blocking thread, off the
//! async workers: symbolic links are never followed (to a directory or a
//! file: a link to `.` would make the walk exponential, a link elsewhere
//! would read files outside the checkout), directories deeper than
//! `max_depth`, more than `max_files` files, or files larger than
//! `max_file_bytes` (or `max_total_bytes` in all) stop the round with an
//! error naming the limit, and nothing is applied.

use super::Source;
use crate::model::documents::parse_documents;
use serde_json::Value;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// How much a scan reads at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Directory levels below the watched directory.
    pub max_depth: usize,
    /// Resource files in all.
    pub max_files: usize,
    /// Bytes of one file (the API's request limit by default).
    pub max_file_bytes: u64,
    /// Bytes of every file together.
    pub max_total_bytes: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { max_depth: 16, max_files: 10_000, max_file_bytes: 4 * 1024 * 1024, max_total_bytes: 64 * 1024 * 1024 }
    }
}

/// One resource file as a scan saw it: path, size, modification time.
pub type FileStamp = (PathBuf, u64, SystemTime);

/// What a walk found: the resource files, sorted, and the symbolic links
/// it did not follow.
#[derive(Debug, Default, PartialEq)]
pub struct Walk {
    pub files: Vec<FileStamp>,
    pub skipped_links: Vec<PathBuf>,
}

fn is_resource_file(p: &Path) -> bool {
    p.extension().and_then(|x| x.to_str()).is_some_and(|x| matches!(x, "yaml" | "yml" | "json"))
}

/// The resource files under `dir` (itself followed if it is a link: it
/// was named), never following a link below it, within `limits`.
pub fn resource_files(dir: &Path, limits: &Limits) -> Result<Walk, String> {
    let err = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
    if !std::fs::metadata(dir).map_err(|e| err(dir, e))?.is_dir() {
        return Err(format!("{}: not a directory", dir.display()));
    }
    let mut walk = Walk::default();
    let mut total = 0u64;
    let mut pending = vec![(dir.to_path_buf(), 0usize)];
    while let Some((d, depth)) = pending.pop() {
        for entry in std::fs::read_dir(&d).map_err(|e| err(&d, e))? {
            let entry = entry.map_err(|e| err(&d, e))?;
            let path = entry.path();
            // The entry's own type: a link is a link, whatever it points to.
            let kind = entry.file_type().map_err(|e| err(&path, e))?;
            if kind.is_symlink() {
                walk.skipped_links.push(path);
            } else if kind.is_dir() {
                if depth + 1 > limits.max_depth {
                    return Err(format!(
                        "{}: more than {} directory levels below the watched directory (the limit); nothing applied",
                        path.display(),
                        limits.max_depth
                    ));
                }
                pending.push((path, depth + 1));
            } else if kind.is_file() && is_resource_file(&path) {
                let meta = entry.metadata().map_err(|e| err(&path, e))?;
                if meta.len() > limits.max_file_bytes {
                    return Err(format!("{}: {} bytes, over the limit of {} per file; nothing applied", path.display(), meta.len(), limits.max_file_bytes));
                }
                total += meta.len();
                if walk.files.len() == limits.max_files || total > limits.max_total_bytes {
                    return Err(format!(
                        "{}: more than {} resource files or {} bytes in all (the limits); nothing applied",
                        dir.display(),
                        limits.max_files,
                        limits.max_total_bytes
                    ));
                }
                walk.files.push((path, meta.len(), meta.modified().unwrap_or(SystemTime::UNIX_EPOCH)));
            }
        }
    }
    walk.files.sort();
    walk.skipped_links.sort();
    Ok(walk)
}

/// Every document of `files`, in order; a file is read up to the limit
/// even if it grew since the walk.
pub fn read_all(files: &[FileStamp], limits: &Limits) -> Result<Vec<Value>, String> {
    let mut docs = Vec::new();
    for (p, _, _) in files {
        let mut text = String::new();
        let file = std::fs::File::open(p).map_err(|e| format!("{}: {e}", p.display()))?;
        file.take(limits.max_file_bytes + 1).read_to_string(&mut text).map_err(|e| format!("{}: {e}", p.display()))?;
        if text.len() as u64 > limits.max_file_bytes {
            return Err(format!("{}: over the limit of {} bytes per file; nothing applied", p.display(), limits.max_file_bytes));
        }
        docs.extend(parse_documents(&text, &p.display().to_string()).map_err(|e| e.to_string())?);
    }
    Ok(docs)
}

pub struct Directory {
    dir: PathBuf,
    poll: Duration,
    limits: Limits,
    /// The files last returned (None: never scanned, or the last scan failed).
    last: Option<Vec<FileStamp>>,
    /// The last scan's error, reported once until it changes.
    last_error: Option<String>,
    scanned: bool,
}

impl Directory {
    pub fn new(dir: PathBuf, poll: Duration) -> Directory {
        Directory::with_limits(dir, poll, Limits::default())
    }

    pub fn with_limits(dir: PathBuf, poll: Duration, limits: Limits) -> Directory {
        Directory { dir, poll, limits, last: None, last_error: None, scanned: false }
    }

    /// A walk on a blocking thread.
    async fn walk(&self) -> Result<Walk, String> {
        let (dir, limits) = (self.dir.clone(), self.limits);
        tokio::task::spawn_blocking(move || resource_files(&dir, &limits)).await.map_err(|e| format!("the directory scan failed: {e}"))?
    }
}

#[tonic::async_trait]
impl Source for Directory {
    fn name(&self) -> &str {
        "directory"
    }

    async fn next(&mut self) -> Result<Vec<Value>, String> {
        loop {
            if self.scanned {
                tokio::time::sleep(self.poll).await;
            }
            self.scanned = true;
            let walk = match self.walk().await {
                Ok(w) => w,
                // Said once; looked at again every poll.
                Err(e) if self.last_error.as_ref() == Some(&e) => continue,
                Err(e) => {
                    (self.last, self.last_error) = (None, Some(e.clone()));
                    return Err(e);
                }
            };
            if self.last.as_ref() == Some(&walk.files) {
                continue;
            }
            // Settle: the same again a moment later, or look again later.
            tokio::time::sleep(Duration::from_millis(100)).await;
            if self.walk().await.map(|w| w.files).as_ref() != Ok(&walk.files) {
                continue;
            }
            if !walk.skipped_links.is_empty() {
                let links: Vec<String> = walk.skipped_links.iter().take(10).map(|p| p.display().to_string()).collect();
                tracing::warn!(count = walk.skipped_links.len(), links = ?links, "adapter: symbolic links in the watched directory are not followed");
            }
            let (files, limits) = (walk.files.clone(), self.limits);
            let docs = tokio::task::spawn_blocking(move || read_all(&files, &limits)).await.map_err(|e| format!("reading the directory failed: {e}"))?;
            // Remember it even when broken: retry once it changes again.
            (self.last, self.last_error) = (Some(walk.files), None);
            return docs;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits { max_depth: 3, max_files: 5, max_file_bytes: 1000, max_total_bytes: 2500 }
    }

    #[test]
    fn links_are_not_followed_and_limits_hold() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        std::fs::create_dir_all(d.join("a/b")).unwrap();
        std::fs::write(d.join("a/b/x.yaml"), "kind: A\n").unwrap();
        std::fs::write(d.join("top.json"), r#"{"kind": "B"}"#).unwrap();
        std::fs::write(d.join("notes.txt"), "not a resource").unwrap();
        // Two links to the directory itself (the walk would double at every
        // level), one to a file outside, one dangling, one to itself.
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.yaml"), "kind: Outside\n").unwrap();
        std::os::unix::fs::symlink(".", d.join("loop1")).unwrap();
        std::os::unix::fs::symlink(d, d.join("a/loop2")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret.yaml"), d.join("link.yaml")).unwrap();
        std::os::unix::fs::symlink(d.join("gone"), d.join("dangling.yaml")).unwrap();
        std::os::unix::fs::symlink("self.yaml", d.join("self.yaml")).unwrap();
        let w = resource_files(d, &limits()).unwrap();
        let names: Vec<_> = w.files.iter().map(|f| f.0.strip_prefix(d).unwrap().display().to_string()).collect();
        assert_eq!(names, ["a/b/x.yaml", "top.json"]);
        assert_eq!(w.skipped_links.len(), 5);
        let docs = read_all(&w.files, &limits()).unwrap();
        assert_eq!(docs.iter().map(|d| d["kind"].as_str().unwrap()).collect::<Vec<_>>(), ["A", "B"]);

        // Depth, count, size.
        std::fs::create_dir_all(d.join("a/b/c/d")).unwrap();
        assert!(resource_files(d, &limits()).unwrap_err().contains("more than 3 directory levels"));
        std::fs::remove_dir_all(d.join("a/b/c")).unwrap();
        for i in 0..4 {
            std::fs::write(d.join(format!("f{i}.yaml")), "kind: A\n").unwrap();
        }
        assert!(resource_files(d, &limits()).unwrap_err().contains("more than 5 resource files"));
        for i in 0..4 {
            std::fs::remove_file(d.join(format!("f{i}.yaml"))).unwrap();
        }
        std::fs::write(d.join("big.yaml"), "x".repeat(1001)).unwrap();
        assert!(resource_files(d, &limits()).unwrap_err().contains("over the limit of 1000 per file"));
        // A file that grew after the walk is still read only up to the limit.
        std::fs::write(d.join("big.yaml"), "kind: A\n").unwrap();
        let w = resource_files(d, &limits()).unwrap();
        std::fs::write(d.join("big.yaml"), "x".repeat(1001)).unwrap();
        assert!(read_all(&w.files, &limits()).unwrap_err().contains("over the limit"));
    }
}
