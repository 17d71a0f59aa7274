//! Generates the Kubernetes CRI v1 client (`runtime.v1`) the end-to-end tests drive
//! containerd with, from `proto/cri-api-v1.proto`, with the `protoc` shipped by the
//! `protoc-bin-vendored` crate (no system protobuf compiler needed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // Build scripts run single-threaded; prost-build reads PROTOC.
    std::env::set_var("PROTOC", protoc);
    println!("cargo:rerun-if-changed=proto/cri-api-v1.proto");
    tonic_prost_build::configure()
        .build_server(false)
        .build_transport(false)
        .compile_protos(&["proto/cri-api-v1.proto"], &["proto"])?;
    Ok(())
}
