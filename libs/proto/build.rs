//! Compiles `../../proto` with the pure-Rust protox compiler (no system protoc needed) and
//! writes the file descriptor sets used by server reflection: the socialgraph files, and the
//! google.rpc Status and error details the services put in their statuses (see
//! `error_details.rs`).
use prost::Message;

#[path = "error_details.rs"]
mod error_details;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let files = [
        "socialgraph/events/v1/events.proto",
        "socialgraph/relation/v1/relation.proto",
        "socialgraph/projection/v1/projection.proto",
        "socialgraph/counter/v1/counter.proto",
        "socialgraph/feed/v1/feed.proto",
        "socialgraph/message/v1/message.proto",
    ];
    let mut compiler = protox::Compiler::new([&root])?;
    compiler.include_source_info(true).include_imports(true).open_files(files)?;
    let fds = compiler.file_descriptor_set();
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    // Encoded by the compiler itself: prost's types would drop the extension options (the
    // google.api.http routes the gateway and its OpenAPI document read).
    std::fs::write(out.join("socialgraph_descriptor.bin"), compiler.encode_file_descriptor_set())?;
    // RetryInfo's delay is a google.protobuf.Duration and Status's details are
    // google.protobuf.Any: their files travel in the same set.
    let mut details = protox::compile(["google/protobuf/duration.proto", "google/protobuf/any.proto"], [&root])?;
    details.file.push(error_details::file());
    details.file.push(error_details::status_file());
    std::fs::write(out.join("error_details_descriptor.bin"), details.encode_to_vec())?;
    tonic_prost_build::configure().type_attribute(".", "#[allow(clippy::all, missing_docs)]").compile_fds(fds)?;
    println!("cargo:rerun-if-changed={}", root.display());
    println!("cargo:rerun-if-changed=error_details.rs");
    Ok(())
}
