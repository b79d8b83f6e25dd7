//! Compiles `strata/worker/v1/worker.proto` with protox, a pure-Rust
//! protobuf compiler, so building strata needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "strata/worker/v1/worker.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["."])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
