//! Builds the TaskArgs blob of one tiled-matmul step and writes it to a file.
//!
//! `cargo run -p strata-examples --example task_args [-- OUT]`
//! (default OUT: `examples/wire/matmul_tile.args`), then
//! `cargo run -- inspect OUT` to see it decoded.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/wire/matmul_tile.args"
            ))
        });
    let args = strata_examples::matmul_tile_args()?;
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&out, args.encode())?;
    println!(
        "wrote {} ({} bytes, {} tensors, {} scalars)",
        out.display(),
        args.encoded_len(),
        args.tensors().len(),
        args.scalars().len()
    );
    Ok(())
}
