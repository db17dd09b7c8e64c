//! Compiles Envoy's API protos (vendor/envoy-types/proto) into a descriptor
//! set with protox (pure Rust, no protoc), for `envoy_api`.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    envoy_descriptors()?;
    println!("cargo:rerun-if-changed=../../vendor/envoy-types/proto");
    Ok(())
}

/// The Envoy API protos Lodestar emits, compiled into a descriptor set
/// (`$OUT_DIR/envoy_descriptors.bin`) so that resources can be rendered as
/// proto-JSON (golden tests, config dumps). The `.proto` files come from the
/// envoy-types crate (see `envoy_types_proto_dir`).
fn envoy_descriptors() -> Result<(), Box<dyn std::error::Error>> {
    const FILES: &[&str] = &[
        "envoy/config/cluster/v3/cluster.proto",
        "envoy/config/endpoint/v3/endpoint.proto",
        "envoy/config/listener/v3/listener.proto",
        "envoy/config/route/v3/route.proto",
        "envoy/extensions/filters/network/http_connection_manager/v3/http_connection_manager.proto",
        "envoy/extensions/filters/network/tcp_proxy/v3/tcp_proxy.proto",
        "envoy/extensions/filters/http/router/v3/router.proto",
        "envoy/extensions/filters/http/fault/v3/fault.proto",
        "envoy/extensions/filters/http/cors/v3/cors.proto",
        "envoy/extensions/filters/http/jwt_authn/v3/config.proto",
        "envoy/extensions/upstreams/http/v3/http_protocol_options.proto",
        "envoy/extensions/transport_sockets/tls/v3/tls.proto",
        "envoy/extensions/filters/listener/tls_inspector/v3/tls_inspector.proto",
        "envoy/extensions/filters/listener/original_dst/v3/original_dst.proto",
        "envoy/extensions/retry/host/previous_hosts/v3/previous_hosts.proto",
        "envoy/extensions/filters/http/rbac/v3/rbac.proto",
        "envoy/extensions/filters/network/rbac/v3/rbac.proto",
        "envoy/extensions/path/match/uri_template/v3/uri_template_match.proto",
        // CUSTOM authorization and the Telemetry API (`translate::extauthz`,
        // `translate::telemetry`).
        "envoy/extensions/filters/http/ext_authz/v3/ext_authz.proto",
        "envoy/extensions/filters/network/ext_authz/v3/ext_authz.proto",
        "envoy/extensions/access_loggers/file/v3/file.proto",
        "envoy/extensions/access_loggers/filters/cel/v3/cel.proto",
        "envoy/config/trace/v3/zipkin.proto",
    ];
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../vendor/envoy-types/proto");
    let includes: Vec<std::path::PathBuf> = ["data-plane-api", "xds", "googleapis", "protoc-gen-validate", "cel-spec", "opentelemetry-proto", "client_model"]
        .iter()
        .map(|d| root.join(d))
        .collect();
    // One compiler per file: protox resolves relative names more loosely
    // than protoc, and separate compilations keep each file's view strict.
    let mut seen = std::collections::BTreeSet::new();
    let mut set = prost_types::FileDescriptorSet::default();
    for f in FILES {
        let mut compiler = protox::Compiler::new(&includes)?;
        compiler.include_imports(true);
        compiler.open_file(f)?;
        for file in compiler.file_descriptor_set().file {
            if seen.insert(file.name.clone()) {
                set.file.push(file);
            }
        }
    }
    // EnvoyFilter patch values may name any Envoy extension or config type
    // (`typed_config` `@type`): every `.proto` under envoy/config,
    // envoy/extensions and envoy/type, each with its own compiler as above
    // (one compiler for all resolves some relative names wrongly).
    let api = root.join("data-plane-api");
    let mut all = Vec::new();
    for dir in ["envoy/config", "envoy/extensions", "envoy/type"] {
        proto_files(&api, &api.join(dir), &mut all)?;
    }
    all.sort();
    for f in &all {
        if seen.contains(&Some(f.clone())) {
            continue;
        }
        let mut compiler = protox::Compiler::new(&includes)?;
        compiler.include_imports(true);
        // A few files protox cannot resolve as protoc does (a relative
        // name whose first part is also a package): left out, said here.
        if let Err(e) = compiler.open_file(f) {
            println!("cargo:warning=envoy descriptors: {f} left out: {e}");
            continue;
        }
        for file in compiler.file_descriptor_set().file {
            if seen.insert(file.name.clone()) {
                set.file.push(file);
            }
        }
    }
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out_dir.join("envoy_descriptors.bin"), prost::Message::encode_to_vec(&set))?;
    Ok(())
}

/// Every `.proto` under `dir`, as a path relative to `root`.
fn proto_files(root: &std::path::Path, dir: &std::path::Path, out: &mut Vec<String>) -> Result<(), Box<dyn std::error::Error>> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            proto_files(root, &path, out)?;
        } else if path.extension().is_some_and(|e| e == "proto") {
            out.push(path.strip_prefix(root)?.to_string_lossy().into_owned());
        }
    }
    Ok(())
}
