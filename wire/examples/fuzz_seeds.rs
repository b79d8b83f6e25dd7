//! Writes the seed corpus of the fuzz targets under `wire/fuzz/corpus/`:
//! valid records of every backing kind and dtype, blobs of several sizes,
//! and overlap seeds for every view class.
//!
//! `cargo run -p strata-wire --example fuzz_seeds`

use std::num::NonZeroU64;
use std::path::Path;

use strata_wire::check::ViewClass;
use strata_wire::{
    Access, AddressSpace, Backing, BufferDescriptor, CanonicalIdentity, DType, ShmName, TaskArgs,
    Tensor,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let addr = NonZeroU64::new(0x7f00_0000_1000).ok_or("zero")?;
    let backings = [
        (
            Backing::ForkShm { addr },
            AddressSpace::Host,
            Access::ReadWrite,
        ),
        (
            Backing::PosixShm {
                name: ShmName::new("strata-seed")?,
            },
            AddressSpace::Host,
            Access::Read,
        ),
        (
            Backing::VmmWindow { addr },
            AddressSpace::Device,
            Access::ReadWrite,
        ),
        (Backing::RemoteSidecar, AddressSpace::Device, Access::Write),
        (
            Backing::DeviceMalloc { addr },
            AddressSpace::Device,
            Access::ReadWrite,
        ),
        (Backing::ForkCow { addr }, AddressSpace::Host, Access::Read),
        (
            Backing::Memfd {
                st_dev: 0x16,
                st_ino: 0x4242,
            },
            AddressSpace::Host,
            Access::ReadWrite,
        ),
    ];
    let mut tensors = Vec::new();
    for (i, (backing, space, access)) in backings.into_iter().enumerate() {
        let id = CanonicalIdentity::new(*b"fuzzseed", i as u64 + 1, 1)?;
        let buf = BufferDescriptor::new(id, 1 << 16, space, access, backing)?;
        let dtype = DType::ALL[i * 2 % DType::ALL.len()];
        tensors.push(Tensor::row_major(buf, 0, &[16, 16], dtype)?);
        tensors.push(Tensor::new(
            buf,
            256,
            &[2, 3, 4, 5, 6],
            &[1000, 300, 70, 12, 2],
            DType::ALL[(i * 2 + 1) % 15],
        )?);
    }
    let dir = root.join("tensor");
    std::fs::create_dir_all(&dir)?;
    for (i, t) in tensors.iter().enumerate() {
        std::fs::write(dir.join(format!("seed-{i:02}")), t.encode())?;
    }
    let dir = root.join("task_args");
    std::fs::create_dir_all(&dir)?;
    let blobs = [
        TaskArgs::new(vec![], vec![])?,
        TaskArgs::new(vec![], vec![1, 2, 3])?,
        TaskArgs::new(tensors[..3].to_vec(), vec![u64::MAX, 0])?,
        TaskArgs::new(tensors.clone(), (0..16).collect())?,
    ];
    for (i, b) in blobs.iter().enumerate() {
        std::fs::write(dir.join(format!("seed-{i:02}")), b.encode())?;
    }
    let dir = root.join("overlap");
    std::fs::create_dir_all(&dir)?;
    for (c, _) in ViewClass::ALL.iter().enumerate() {
        for s in 0..3u64 {
            let mut seed = (s * 0x9e37_79b9 + c as u64).to_le_bytes().to_vec();
            seed.push(c as u8);
            std::fs::write(dir.join(format!("seed-{c}-{s}")), seed)?;
        }
    }
    Ok(())
}
