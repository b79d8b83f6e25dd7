//! Compiles `strata/worker/v1/worker.proto` with protox, a pure-Rust
//! protobuf compiler, so building strata needs no system `protoc`.
//!
//! The fields that carry view bytes (megabytes each) are `bytes::Bytes`,
//! not `Vec<u8>`: tonic decodes a message from one contiguous receive
//! buffer, and prost then hands out each such field as a slice of it
//! instead of copying it; on the sending side the driver's packed bytes
//! go into the message without a copy.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "strata/worker/v1/worker.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["."])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .bytes(".strata.worker.v1.InlineBytes.data")
        .bytes(".strata.worker.v1.CopyToDeviceRequest.data")
        .bytes(".strata.worker.v1.CopyFromDeviceReply.data")
        .bytes(".strata.worker.v1.StageChunk.data")
        .bytes(".strata.worker.v1.FetchChunk.data")
        .codec_path("crate::codec::Codec")
        .compile_fds(fds)?;
    Ok(())
}
