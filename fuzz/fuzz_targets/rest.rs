//! The REST write bodies, as the axum handlers take them after reading:
//! `/v1/apply` (parse, unwrap `expectedRevision`, validate every resource
//! into a transaction) and `/v1/delete`, in YAML and in JSON. The first
//! byte picks the route and the content type. Bad input must be an error
//! (a 400 naming the field), never a panic or a hang.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lodestar::api::rest::{apply_body, delete_body};

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else { return };
    let yaml = which & 1 == 1;
    if which & 2 == 0 {
        let _ = apply_body(yaml, body, Default::default());
    } else {
        let ignore = [None, Some(false), Some(true)][usize::from(which >> 2) % 3];
        let _ = delete_body(yaml, body, ignore);
    }
});
