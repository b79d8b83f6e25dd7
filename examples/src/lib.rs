//! Examples of using strata. Run one with
//! `cargo run -p strata-examples --example <name>`.
//!
//! - `task_args`: builds the TaskArgs blob of one step of a tiled matmul with
//!   the `strata-wire` API and writes it to a file that `strata inspect` can
//!   read. `examples/wire/matmul_tile.args` is its committed output.
//!
//! ```
//! let args = strata_examples::matmul_tile_args().unwrap();
//! assert_eq!(args.tensors().len(), 3);
//! assert_eq!(args.scalars(), &[1, 2, 3]);
//! ```

#![forbid(unsafe_code)]

use strata_wire::{
    Access, AddressSpace, Backing, BufferDescriptor, DType, Error, IdentityMint, TaskArgs, Tensor,
};

/// Side of the square F32 matrices A, B and C.
pub const N: u32 = 256;
/// Side of a square tile.
pub const TILE: u32 = 64;

/// The arguments of the matmul step `C[1,2] += A[1,3] · B[3,2]` on 64×64
/// tiles of three 256×256 F32 matrices held in memfd buffers: three tile
/// views (row stride 256 elements) and the scalars `(i, j, k)`.
///
/// # Errors
/// Only if the wire format rejects a view, which would be a bug here.
pub fn matmul_tile_args() -> Result<TaskArgs, Error> {
    let mint = IdentityMint::new(*b"example1");
    let nbytes = u64::from(N) * u64::from(N) * 4;
    let matrix = |ino: u64| -> Result<BufferDescriptor, Error> {
        BufferDescriptor::new(
            mint.mint()?,
            nbytes,
            AddressSpace::Host,
            Access::ReadWrite,
            Backing::Memfd {
                st_dev: 0x18,
                st_ino: ino,
            },
        )
    };
    let (a, b, c) = (matrix(1001)?, matrix(1002)?, matrix(1003)?);
    let tile = |buf: BufferDescriptor, row: u32, col: u32| {
        let offset = (u64::from(row * TILE) * u64::from(N) + u64::from(col * TILE)) * 4;
        Tensor::new(buf, offset, &[TILE, TILE], &[N, 1], DType::F32)
    };
    let (i, j, k) = (1, 2, 3);
    TaskArgs::new(
        vec![tile(a, i, k)?, tile(b, k, j)?, tile(c, i, j)?],
        vec![i.into(), j.into(), k.into()],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed example file is exactly what the example writes, so the
    /// README's `strata inspect` command shows current bytes.
    #[test]
    fn committed_blob_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/wire/matmul_tile.args");
        let committed = std::fs::read(path).unwrap();
        assert_eq!(
            committed,
            matmul_tile_args().unwrap().encode(),
            "regenerate with: cargo run -p strata-examples --example task_args"
        );
    }
}
