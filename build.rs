//! Compiles proto/ with protox (pure Rust), so building Lodestar needs no protoc.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/lodestar/api/v1/api.proto", "proto/lodestar/peer/v1/peer.proto"];
    let fds = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(fds)?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
