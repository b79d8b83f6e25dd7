//! No foreign byte: a kernel, a client or a device buffer never sees bytes
//! an earlier task or owner left in device memory, and `OUTPUT_EXISTING`
//! and `INOUT` keep the elements a kernel leaves alone, in both modes.
//!
//! Fresh device blocks read as zeros on every chip of the conformance
//! list ([`crate::conformance`]); the tests with kernels of their own (no
//! CUDA body) stay on the simulated chip.

use std::sync::Arc;

use strata_chip_runtime::kernel::{ArgSpec, DTypes, Rank, Signature};
use strata_chip_runtime::{Device, Kernel, KernelContext, Launch, Region, SimDevice, device};
use strata_wire::check::Rng;
use strata_wire::{Access, ArgTag, DType};

use crate::common::{CUDA_KEYS, LAYOUTS, Layout, MODES, host_tensor};

/// What the poison kernel writes everywhere it can.
const POISON: u8 = 0xA5;

fn descriptor(name: &str, access: Access, scalars: usize) -> Signature {
    Signature {
        name: name.into(),
        version: 1,
        args: vec![ArgSpec::new("x", access, DTypes::Any, Rank::Any)],
        scalars: (0..scalars)
            .map(|i| strata_chip_runtime::kernel::ScalarSpec {
                name: format!("s{i}"),
                kind: strata_chip_runtime::kernel::ScalarKind::U64,
            })
            .collect(),
    }
}

/// Writes `POISON` into every byte of its (32-bit) output and into a scratch
/// block of `scalar 0` bytes: leaves device memory dirty for whoever comes
/// next.
struct Poison(Signature);

impl Kernel for Poison {
    fn descriptor(&self) -> &Signature {
        &self.0
    }
    fn run(&self, ctx: &mut KernelContext<'_>) -> Result<(), String> {
        let mut out = ctx.output_raw::<u32>(0)?;
        let g = *out.geometry();
        g.for_each_index(|idx| out.set(idx, u32::from_ne_bytes([POISON; 4])));
        let mut s = ctx.scratch(usize::try_from(ctx.scalar(0)?).unwrap_or(0))?;
        s.as_mut_slice::<u8>().fill(POISON);
        Ok(())
    }
}

/// Writes 1 into element 0 of its (F32) argument and nothing else; reports
/// in its error whether a scratch block of `scalar 0` bytes held anything
/// but zeros.
struct WriteFirst(Signature);

impl Kernel for WriteFirst {
    fn descriptor(&self) -> &Signature {
        &self.0
    }
    fn run(&self, ctx: &mut KernelContext<'_>) -> Result<(), String> {
        let mut out = ctx.output::<f32>(0)?;
        let first = [0usize; 5];
        out.set(&first[..out.geometry().ndims()], 1.0);
        let mut s = ctx.scratch(usize::try_from(ctx.scalar(0)?).unwrap_or(0))?;
        if let Some(i) = s.as_mut_slice::<u8>().iter().position(|&b| b != 0) {
            return Err(format!("scratch byte {i} held an earlier kernel's byte"));
        }
        Ok(())
    }
}

fn launch(
    dev: &SimDevice,
    k: Arc<dyn Kernel>,
    args: Vec<strata_chip_runtime::LaunchArg>,
    scalars: Vec<u64>,
) {
    device::launch(
        dev,
        Launch {
            kernel: k,
            args,
            scalars,
            gate: None,
            priority: 0,
        },
    )
    .unwrap()
    .wait()
    .unwrap();
}

/// A partial writer after a kernel that dirtied the scratch region: an
/// `OUTPUT_EXISTING` or `INOUT` view keeps every element but the written
/// one (staged: the copy-in; unified: in place), and an `OUTPUT` view's
/// untouched elements are its old bytes or zeros, never the poison. The
/// kernel's own scratch reads as zeros.
#[test]
fn partial_writers_see_no_foreign_byte() {
    let poison: Arc<dyn Kernel> = Arc::new(Poison(descriptor("test.poison", Access::Write, 1)));
    let write_first: Arc<dyn Kernel> =
        Arc::new(WriteFirst(descriptor("test.write_first", Access::Write, 1)));
    let write_first_x: Arc<dyn Kernel> = Arc::new(WriteFirst(descriptor(
        "test.write_first.x",
        Access::ReadWrite,
        1,
    )));
    let mut rng = Rng(29);
    for spec in MODES {
        let dev = SimDevice::from_spec(spec).unwrap();
        for layout in LAYOUTS {
            for (tag, kernel) in [
                (ArgTag::OutputExisting, &write_first),
                (ArgTag::InOut, &write_first_x),
                (ArgTag::Output, &write_first),
            ] {
                // Dirty the scratch region: a staged view and a scratch
                // block, both freed when the kernel ends.
                let dirty = host_tensor(&mut rng, &[16, 16], DType::F32, Layout::RowMajor);
                launch(
                    &dev,
                    Arc::clone(&poison),
                    vec![dirty.arg(ArgTag::Output)],
                    vec![4096],
                );
                let y = host_tensor(&mut rng, &[6, 5], DType::F32, layout);
                let before = y.bytes();
                launch(&dev, Arc::clone(kernel), vec![y.arg(tag)], vec![4096]);
                let after = y.bytes();
                let elements = crate::common::indices(y.view.shape());
                for idx in &elements {
                    let got = crate::common::read(&after, &y.view, idx);
                    let old = crate::common::read(&before, &y.view, idx);
                    if idx.iter().all(|&i| i == 0) {
                        assert_eq!(got, 1.0, "{spec} {layout:?} {tag}: the written element");
                    } else if tag == ArgTag::Output {
                        let zero = !spec.contains("unified") && got == 0.0;
                        assert!(
                            got == old || zero,
                            "{spec} {layout:?} {tag}: element {idx:?} is {got}, neither its old {old} nor zero"
                        );
                    } else {
                        assert_eq!(
                            got, old,
                            "{spec} {layout:?} {tag}: element {idx:?} the kernel left alone changed"
                        );
                    }
                }
                // No byte anywhere in the buffer is the poison's.
                let poisoned = after
                    .chunks(4)
                    .filter(|c| c.iter().all(|&b| b == POISON))
                    .count();
                assert_eq!(
                    poisoned, 0,
                    "{spec} {layout:?} {tag}: poison reached the host"
                );
            }
        }
        if spec.contains("staged") {
            assert!(dev.stats().zeroed > 0, "staged OUTPUT scratch is zeroed");
        }
    }
}

/// Device blocks come back zeroed after a free (persistent) and after a
/// reset (run), small ones and ones large enough to be zeroed by handing
/// their pages back; a client copying them out sees zeros.
#[test]
fn new_device_blocks_are_zeroed() {
    let sims = ["sim:mem=64MiB,mode=staged"];
    crate::conformance::each_chip(0, &sims, CUDA_KEYS, &[], |dev, _, _| {
        for nbytes in [64u64, 1000, 4096 * 3 + 17, 1 << 20, (4 << 20) + 100] {
            let len = usize::try_from(nbytes).unwrap();
            // Persistent: write, free, allocate the same size again (the pool
            // hands the same bytes back first).
            let a = dev.alloc(Region::Persistent, nbytes).unwrap();
            dev.copy_to_device(&a, 0, &vec![POISON; len]).unwrap();
            dev.free(a.addr).unwrap();
            let b = dev.alloc(Region::Persistent, nbytes).unwrap();
            assert_eq!(b.addr, a.addr, "the pool reuses the freed block");
            let mut out = vec![1u8; len];
            dev.copy_from_device(&b, 0, &mut out).unwrap();
            assert!(
                out.iter().all(|&x| x == 0),
                "persistent block of {nbytes} not zeroed"
            );
            dev.free(b.addr).unwrap();
            // Run: write, end the run, allocate again at the same offset.
            let r = dev.alloc(Region::Run, nbytes).unwrap();
            dev.copy_to_device(&r, 0, &vec![POISON; len]).unwrap();
            dev.end_run().unwrap();
            let r2 = dev.alloc(Region::Run, nbytes).unwrap();
            assert_eq!(r2.addr, r.addr, "a reset run starts at the same offset");
            let mut out = vec![1u8; len];
            dev.copy_from_device(&r2, 0, &mut out).unwrap();
            assert!(
                out.iter().all(|&x| x == 0),
                "run block of {nbytes} not zeroed"
            );
            dev.end_run().unwrap();
        }
        // A zeroed neighbour: zeroing a block by pages never touches the bytes
        // of the blocks around it.
        let left = dev.alloc(Region::Persistent, 100).unwrap();
        dev.copy_to_device(&left, 0, &[POISON; 100]).unwrap();
        let big = dev.alloc(Region::Persistent, 2 << 20).unwrap();
        let right = dev.alloc(Region::Persistent, 100).unwrap();
        dev.copy_to_device(&right, 0, &[POISON; 100]).unwrap();
        dev.free(big.addr).unwrap();
        let _again = dev.alloc(Region::Persistent, 2 << 20).unwrap();
        for b in [left, right] {
            let mut out = [0u8; 100];
            dev.copy_from_device(&b, 0, &mut out).unwrap();
            assert_eq!(out, [POISON; 100], "a neighbour of a zeroed block changed");
        }
    });
}
