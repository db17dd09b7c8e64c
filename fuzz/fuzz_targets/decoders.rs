//! Every bincode decoder of bytes from disk or a peer: the first byte
//! picks the type, the rest is the blob (`store::codec`: version byte +
//! bincode). Log entries, peer messages (forwarded requests and replies,
//! raft's AppendEntries, Vote and InstallSnapshot), votes, the dedup table
//! and backup files. Garbage must be an error: no panic, no allocation
//! beyond the input's size.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lodestar::store::codec::decode;
use lodestar::store::types::{Entry, NodeId, TypeConfig};

fuzz_target!(|data: &[u8]| {
    let Some((&which, blob)) = data.split_first() else { return };
    match which % 9 {
        0 => drop(decode::<Entry>(blob)),
        1 => drop(decode::<lodestar::node::ForwardRequest>(blob)),
        2 => drop(decode::<Result<lodestar::node::ForwardReply, lodestar::error::Error>>(blob)),
        3 => drop(decode::<openraft::raft::AppendEntriesRequest<TypeConfig>>(blob)),
        4 => drop(decode::<openraft::raft::VoteRequest<NodeId>>(blob)),
        5 => drop(decode::<openraft::raft::InstallSnapshotRequest<TypeConfig>>(blob)),
        6 => drop(decode::<openraft::Vote<NodeId>>(blob)),
        7 => drop(decode::<lodestar::store::dedup::Dedup>(blob)),
        _ => drop(lodestar::store::backup::decode(blob)),
    }
});
