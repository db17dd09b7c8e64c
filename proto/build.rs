//! Compiles the .proto files beside this crate with protox (pure Rust), so
//! building Lodestar needs no protoc.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["lodestar/api/v1/api.proto", "lodestar/peer/v1/peer.proto", "istio/v1/auth/istioca.proto"];
    let fds = protox::compile(files, ["."])?;
    grpc_methods(&fds)?;
    // google.protobuf.Struct (the CSR request's metadata) is envoy-types'
    // copy of the well-known types, which the crate uses already.
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .extern_path(".google.protobuf.Struct", "::envoy_types::pb::google::protobuf::Struct")
        .compile_fds(fds)?;
    println!("cargo:rerun-if-changed=lodestar");
    println!("cargo:rerun-if-changed=istio");
    Ok(())
}

/// The full path of every method of every service in `fds`
/// (`/lodestar.api.v1.Lodestar/Apply`), as `$OUT_DIR/grpc_methods.rs`: the
/// API's request metrics label a gRPC call by its method only when it is
/// one of these (a client-chosen path is no label value).
fn grpc_methods(fds: &prost_types::FileDescriptorSet) -> Result<(), Box<dyn std::error::Error>> {
    let mut paths = Vec::new();
    for file in &fds.file {
        for service in &file.service {
            for method in &service.method {
                paths.push(format!("/{}.{}/{}", file.package(), service.name(), method.name()));
            }
        }
    }
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("grpc_methods.rs"),
        format!("/// `/package.Service/Method` of every gRPC method in proto/ (build.rs).\npub const GRPC_METHODS: &[&str] = &{paths:?};\n"),
    )?;
    Ok(())
}
