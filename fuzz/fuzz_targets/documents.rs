//! YAML and JSON documents into parse and validate, for every kind: what
//! the REST apply body, `lodestar apply -f` and the watched directory go
//! through. Bad input must be an error, never a panic or a hang.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(docs) = lodestar::model::documents::parse_documents(text, "body") else { return };
    for doc in docs {
        if let Ok(resource) = lodestar::model::parse_resource(doc, "default") {
            let _ = lodestar::model::validate_spec(&resource);
        }
    }
});
