//! The persisted and peer wire format.
//!
//! Every blob Lodestar writes to disk (log entries, raft metadata, objects,
//! snapshots, watch history) or sends to a peer is `[FORMAT_VERSION] ++
//! bincode(value)`. We chose bincode 1.3: compact, fast, deterministic, and
//! stable (3.0 on crates.io is a `compile_error!` stub; 2.x encodes
//! differently unless configured for 1.x compatibility). bincode is not
//! self-describing, so evolution is explicit: enums only grow at the end, and
//! a change to an existing layout bumps the version byte and adds a decoder
//! for the old one. `tests/fixtures/codec` pins the bytes of version 1.

use serde::de::DeserializeOwned;
use serde::Serialize;

pub const FORMAT_VERSION: u8 = 1;

#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("empty blob")]
    Empty,
    #[error("unsupported format version {0} (this build reads version {FORMAT_VERSION})")]
    Version(u8),
    #[error("bincode: {0}")]
    Bincode(#[from] bincode::Error),
}

pub fn encode<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.push(FORMAT_VERSION);
    // Serializing our own types into a Vec cannot fail (no maps with non-string
    // keys, no unsized sequences).
    bincode::serialize_into(&mut out, value).expect("bincode serialization of a Lodestar type");
    out
}

pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    match bytes.split_first() {
        None => Err(CodecError::Empty),
        Some((&FORMAT_VERSION, rest)) => Ok(bincode::deserialize(rest)?),
        Some((&v, _)) => Err(CodecError::Version(v)),
    }
}

/// `encode(value)` followed by `trailer`'s bincode: a field added after a
/// layout was fixed, which a decoder that predates it skips (bincode
/// ignores trailing bytes) and [`decode_with_trailer`] reads if present.
pub fn encode_with_trailer<T: Serialize + ?Sized, U: Serialize>(value: &T, trailer: &U) -> Vec<u8> {
    let mut out = encode(value);
    bincode::serialize_into(&mut out, trailer).expect("bincode serialization of a Lodestar type");
    out
}

/// The value and its trailer (see [`encode_with_trailer`]); the trailer's
/// default when the blob has none.
pub fn decode_with_trailer<T: Serialize + DeserializeOwned, U: DeserializeOwned + Default>(bytes: &[u8]) -> Result<(T, U), CodecError> {
    let value: T = decode(bytes)?;
    let used = 1 + bincode::serialized_size(&value)? as usize;
    let trailer = match bytes.get(used..) {
        Some(rest) if !rest.is_empty() => bincode::deserialize(rest)?,
        _ => U::default(),
    };
    Ok((value, trailer))
}
