//! Generates the kubelet plugin-registration service (`pluginregistration`) and the DRA
//! service (`k8s.io.kubelet.pkg.apis.dra.v1`) from `proto/`, servers and clients (the tests
//! play the kubelet), with the `protoc` of the `protoc-bin-vendored` crate.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // Build scripts run single-threaded; prost-build reads PROTOC.
    std::env::set_var("PROTOC", protoc);
    println!("cargo:rerun-if-changed=proto");
    tonic_prost_build::configure()
        .build_transport(false)
        .compile_protos(
            &["proto/pluginregistration.proto", "proto/dra.proto"],
            &["proto"],
        )?;
    Ok(())
}
