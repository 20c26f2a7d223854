//! Compiles `proto/` (Talos's API subset, written from the documented wire facts) with a
//! pure-Rust protobuf compiler, so no system `protoc` is needed, and generates the tonic client
//! and server code. The descriptor set is kept for the conformance check against Talos.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let files = [
        "common/common.proto",
        "machine/machine.proto",
        "machine/lifecycle.proto",
        "machine/image.proto",
        "storage/storage.proto",
        "v1alpha1/resource.proto",
        "v1alpha1/state.proto",
        "v1alpha1/meta.proto",
        "resource/config/config.proto",
        "resource/definitions/enums/enums.proto",
        "resource/definitions/block/block.proto",
        "resource/definitions/cluster/cluster.proto",
        "resource/definitions/etcd/etcd.proto",
        "resource/definitions/extensions/extensions.proto",
        "resource/definitions/hardware/hardware.proto",
        "resource/definitions/k8s/k8s.proto",
        "resource/definitions/network/network.proto",
        "resource/definitions/runtime/runtime.proto",
    ];
    println!("cargo:rerun-if-changed={}", root.display());
    let fds = protox::compile(files.iter().map(|f| root.join(f)), [&root])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("ichor_talos_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
