//! Compiles the benchmark client's etcd protos (proto/bench) with protox
//! (pure Rust), so building Lodestar needs no protoc. Lodestar's own protos
//! are the `lodestar-proto` crate (proto/build.rs).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    // etcd's KV.Put and Auth.Authenticate, for `lodestar-bench write
    // --target etcd` (included by src/bin/lodestar-bench/write.rs, not by
    // the library): client only.
    let etcd = protox::compile(["proto/bench/etcd_kv.proto", "proto/bench/etcd_auth.proto"], ["proto"])?;
    tonic_prost_build::configure().build_client(true).build_server(false).compile_fds(etcd)?;
    println!("cargo:rerun-if-changed=proto/bench");
    Ok(())
}
