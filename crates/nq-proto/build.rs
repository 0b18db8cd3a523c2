//! Compiles `proto/nqueens/v1/nqueens.proto` without a system `protoc`: protox
//! parses it in pure Rust, and tonic-prost-build generates the code from the
//! resulting descriptor set. A fresh machine needs nothing but cargo.

use std::path::PathBuf;

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let file = root.join("nqueens/v1/nqueens.proto");
    println!("cargo:rerun-if-changed={}", root.display());

    let fds = protox::compile([&file], [&root])?;
    // Kept for tonic-reflection and for tools that want the schema at run time.
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("nqueens_descriptor.bin"), fds.encode_to_vec())?;

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
