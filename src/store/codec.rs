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
//!
//! The format version byte is not the wire version (`node::version`): the
//! envelope is unchanged at 1, while wire version 2 added enum variants
//! (`ForwardRequest::Version`, `Op::Author`) that only a build of wire
//! version 2 decodes. Fixtures are named by wire version:
//! `NAME.v1.hex` (what the release at wire version 1 writes and reads),
//! `NAME.v2.hex` (shapes added in wire version 2).

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

/// Golden bytes: `value` encodes to `tests/fixtures/codec/NAME.v1.hex`, and
/// those bytes decode to `value`. A failure after a change means the
/// change broke reading what an older build wrote or sent: keep the old
/// format readable (a new version) instead of re-blessing.
/// `LODESTAR_BLESS=1` writes the fixture of a new type only.
#[cfg(test)]
pub fn check_fixture<T: Serialize + DeserializeOwned + std::fmt::Debug>(name: &str, value: &T) {
    check_fixture_at(name, 1, value)
}

/// [`check_fixture`] of a shape added in wire version `wire`
/// (`NAME.vWIRE.hex`).
#[cfg(test)]
pub fn check_fixture_at<T: Serialize + DeserializeOwned + std::fmt::Debug>(name: &str, wire: u32, value: &T) {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/codec").join(format!("{name}.v{wire}.hex"));
    let bytes = encode(value);
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    if !path.exists() && std::env::var("LODESTAR_BLESS").is_ok() {
        std::fs::write(&path, format!("{hex}\n")).unwrap();
    }
    let stored = std::fs::read_to_string(&path).unwrap_or_else(|_| panic!("missing fixture {}", path.display()));
    let stored = stored.trim();
    let raw: Vec<u8> = (0..stored.len()).step_by(2).map(|i| u8::from_str_radix(&stored[i..i + 2], 16).unwrap()).collect();
    let decoded: T = decode(&raw).unwrap_or_else(|e| panic!("{name}: stored bytes no longer decode: {e}"));
    assert_eq!(format!("{decoded:?}"), format!("{value:?}"), "{name}: stored bytes decode to something else");
    assert_eq!(hex, stored, "{name}: encoding changed");
}
