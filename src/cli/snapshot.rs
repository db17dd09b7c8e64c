//! `lodestar snapshot`: backups. `save` downloads one from a running
//! replica (online); `restore` writes a new data directory from one
//! (offline, for a new cluster); `status` checks a file and shows what it
//! holds. The file format and the restore procedure are in
//! `store::backup`.

use super::client::Client;
use super::ServerArgs;
use crate::config::Member;
use crate::store::backup::{self, Backup};
use crate::store::types::{NodeId, NodeInfo};
use anyhow::{anyhow, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use serde_json::json;
use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

#[derive(Subcommand)]
pub enum SnapshotCommand {
    /// Download a backup of the replica's state at one revision (after a
    /// linearizable read: it holds every write acknowledged before) and write
    /// it to FILE atomically.
    Save {
        /// Where to write the backup.
        file: PathBuf,
        /// Back up the replica's local applied state without asking the leader.
        #[arg(long)]
        stale: bool,
    },
    /// Create the data directory of a replica of a NEW cluster from a backup
    /// (offline). Restore every founding member from the same file with its
    /// own --id and the same --initial-member list, then start each with
    /// `lodestar server` and the same flags. No --initial-member: a
    /// single-node cluster of this replica at its --raft-addr/--api-addr/--xds-addr.
    Restore(RestoreArgs),
    /// Check a backup file (format, checksum, contents) and show what it holds.
    Status {
        /// The backup file.
        file: PathBuf,
        /// json (default: a summary for people).
        #[arg(short, long, value_enum)]
        output: Option<StatusFormat>,
    },
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum StatusFormat {
    Json,
}

#[derive(Args)]
pub struct RestoreArgs {
    /// The backup file (from `lodestar snapshot save`).
    file: PathBuf,
    /// The replica's TOML config file (`lodestar server --config`): its id,
    /// data_dir, addresses and initial_members are used; flags override it.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// This replica's node id in the new cluster (default 1).
    #[arg(long)]
    id: Option<u64>,
    /// The new data directory: must not exist, or be empty.
    #[arg(long, required_unless_present = "config")]
    data_dir: Option<PathBuf>,
    /// This replica's API address, for a single-node cluster (default 127.0.0.1:8470).
    #[arg(long)]
    api_addr: Option<String>,
    /// This replica's raft address, for a single-node cluster (default 127.0.0.1:8471).
    #[arg(long)]
    raft_addr: Option<String>,
    /// This replica's xDS address, for a single-node cluster (default 127.0.0.1:8472).
    #[arg(long)]
    xds_addr: Option<String>,
    /// A member of the new cluster, ID=RAFT_ADDR,API_ADDR,XDS_ADDR; repeat for each.
    #[arg(long = "initial-member", value_parser = Member::parse)]
    initial_members: Vec<Member>,
}

pub async fn run(client: &Client, command: SnapshotCommand) -> Result<()> {
    match command {
        SnapshotCommand::Save { file, stale } => save(client, &file, stale).await,
        SnapshotCommand::Restore(args) => restore(args).await,
        SnapshotCommand::Status { file, output } => status(&file, output),
    }
}

async fn save(client: &Client, file: &Path, stale: bool) -> Result<()> {
    let path = if stale { "/v1/snapshot?consistency=stale" } else { "/v1/snapshot" };
    let bytes = client.get_bytes(path).await?;
    // Check what arrived before it replaces anything.
    let b = backup::decode(&bytes).map_err(|e| anyhow!("the server's answer is not a usable backup: {e}"))?;
    write_atomically(file, &bytes)?;
    println!("saved revision {} ({} objects, {} bytes) from node {} to {}", b.revision, b.objects.len(), bytes.len(), b.source.node_id, file.display());
    Ok(())
}

/// Write to a temporary file next to `file`, fsync it, rename it over
/// `file`, and fsync the directory: `file` is either the old content or the
/// whole new one, also after a crash.
fn write_atomically(file: &Path, bytes: &[u8]) -> Result<()> {
    let name = file.file_name().ok_or_else(|| anyhow!("{}: not a file name", file.display()))?;
    let dir = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let tmp = dir.join(format!(".{}.tmp-{}", name.to_string_lossy(), std::process::id()));
    let written = (|| -> std::io::Result<()> {
        // A backup holds every object, token hashes included: its owner's only.
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, file)?;
        // The rename itself is durable once the directory is.
        std::fs::File::open(&dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.with_context(|| format!("writing {}", file.display()))
}

fn read_backup(file: &Path) -> Result<Backup> {
    let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    backup::decode(&bytes).map_err(|e| anyhow!("{}: {e}", file.display()))
}

async fn restore(args: RestoreArgs) -> Result<()> {
    let server = ServerArgs {
        config: args.config,
        id: args.id,
        data_dir: args.data_dir,
        api_addr: args.api_addr,
        raft_addr: args.raft_addr,
        xds_addr: args.xds_addr,
        initial_members: args.initial_members,
        join: false,
        watch_dir: None,
        metrics_addr: None,
        history_revisions: None,
        history_max_age_s: None,
        revert_on_nack: false,
        revert_on_nack_window_s: None,
        log_format: Default::default(),
    };
    let config = server.into_config(false)?;
    config.validate().map_err(|e| anyhow!("invalid configuration: {e}"))?;
    if config.join && config.initial_members.is_empty() {
        // Without members this would make a single-node cluster: surely not
        // what a replica configured to join a cluster wants.
        return Err(anyhow!(
            "the configuration says join = true and lists no initial members: a restored replica founds a new cluster; \
             give every member of the new cluster with --initial-member (the same list on every member)"
        ));
    }
    // Before reading a possibly large file: the cheap refusals first.
    backup::check_new_data_dir(&config.data_dir)?;
    let b = read_backup(&args.file)?;
    let members: BTreeMap<NodeId, NodeInfo> = if config.initial_members.is_empty() {
        BTreeMap::from([(config.id, config.node_info())])
    } else {
        config.initial_members.iter().map(|m| (m.id, m.info())).collect()
    };
    let ids: Vec<String> = members.keys().map(|id| id.to_string()).collect();
    backup::restore(&b, &config.data_dir, config.id, members).await?;
    println!("restored revision {} ({} objects) into {}", b.revision, b.objects.len(), config.data_dir.display());
    println!("node {} of a new cluster with members {}: start every member with `lodestar server` and the same flags", config.id, ids.join(", "));
    Ok(())
}

fn status(file: &Path, output: Option<StatusFormat>) -> Result<()> {
    let b = read_backup(file)?;
    let kinds = b.kind_counts();
    if output == Some(StatusFormat::Json) {
        let doc = json!({
            "file": file.display().to_string(),
            "bytes": b.size,
            "format": backup::FILE_FORMAT,
            "revision": b.revision,
            "objects": b.objects.len(),
            "kinds": kinds,
            "source": {"nodeId": b.source.node_id, "appliedIndex": b.source.applied_index,
                       "createdUnixMs": b.source.created_unix_ms, "lodestarVersion": b.source.lodestar_version},
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!("file:      {} ({} bytes, format {}, checksum ok)", file.display(), b.size, backup::FILE_FORMAT);
    println!("revision:  {}", b.revision);
    println!("objects:   {}", b.objects.len());
    for (kind, n) in kinds {
        println!("  {kind:<18} {n}");
    }
    println!(
        "taken:     {} from node {} (applied index {}), lodestar {}",
        utc(b.source.created_unix_ms),
        b.source.node_id,
        b.source.applied_index,
        b.source.lodestar_version
    );
    Ok(())
}

/// `YYYY-MM-DDTHH:MM:SSZ` of Unix milliseconds (the civil-from-days
/// algorithm of H. Hinnant's date library).
fn utc(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_dates() {
        assert_eq!(super::utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::utc(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(super::utc(1_700_000_000_123), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn atomic_write_replaces_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("b.snapshot");
        super::write_atomically(&f, b"one").unwrap();
        super::write_atomically(&f, b"two").unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), b"two");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&f).unwrap().permissions().mode() & 0o777, 0o600, "a backup is its owner's only");
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1, "no temporary file left behind");
    }
}
