//! Compiles `proto/` with protox (a pure-Rust protobuf compiler, so no
//! `protoc` is needed to build) into prost types and a descriptor set that
//! the crate embeds for dynamic JSON rendering of any event.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let proto_root = manifest_dir.join("../../proto");
    let files: Vec<PathBuf> = std::fs::read_dir(proto_root.join("zopu/v1"))?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "proto"))
        .collect();
    println!("cargo:rerun-if-changed={}", proto_root.display());
    let descriptors = protox::compile(&files, [&proto_root])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptor_bytes = prost::Message::encode_to_vec(&descriptors);
    std::fs::write(out_dir.join("zopu_descriptor.bin"), &descriptor_bytes)?;
    prost_build::Config::new().compile_fds(descriptors)?;
    Ok(())
}
