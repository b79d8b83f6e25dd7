//! Staging moves exactly the view bytes, in the direction the kernel needs:
//! on every chip of the conformance list ([`crate::conformance`]), but for
//! the kernel of its own that fails after writing (simulated chip only).

use std::sync::Arc;

use strata_chip_runtime::kernel::{ArgSpec, DTypes, Rank, Signature};
use strata_chip_runtime::{Device, Kernel, KernelContext, Launch, Mode, SimDevice, device};
use strata_wire::check::{Rng, byte_set};
use strata_wire::{Access, ArgTag, DType};

use crate::common::{CUDA_KEYS, Layout, MODES, host_tensor, run};
use crate::conformance::each_chip;

/// After a kernel, the bytes of the host buffers outside the written views
/// are exactly what they were, in both modes; inputs are untouched.
#[test]
fn only_written_view_bytes_change() {
    each_chip(11, &MODES, CUDA_KEYS, &["add"], |dev, reg, rng| {
        let spec = dev.info().spec;
        for layout in [Layout::Stepped, Layout::Transposed, Layout::RowMajor] {
            let a = host_tensor(rng, &[5, 6], DType::F32, Layout::Stepped);
            let b = host_tensor(rng, &[5, 6], DType::F32, Layout::Transposed);
            let out = host_tensor(rng, &[5, 6], DType::F32, layout);
            let (a0, b0, out0) = (a.bytes(), b.bytes(), out.bytes());
            run(
                dev,
                reg,
                "add",
                vec![
                    a.arg(ArgTag::Input),
                    b.arg(ArgTag::Input),
                    out.arg(ArgTag::Output),
                ],
                vec![],
            )
            .unwrap();
            assert_eq!(a.bytes(), a0, "input a changed");
            assert_eq!(b.bytes(), b0, "input b changed");
            let written = byte_set(&out.view).unwrap();
            let after = out.bytes();
            let mut changed_inside = 0;
            for (i, (&x, &y)) in out0.iter().zip(&after).enumerate() {
                if written.binary_search(&(i as u64)).is_ok() {
                    changed_inside += usize::from(x != y);
                } else {
                    assert_eq!(
                        x, y,
                        "{spec} {layout:?}: byte {i} outside the written view changed"
                    );
                }
            }
            assert!(changed_inside > 0, "the kernel wrote something");
        }
    });
}

/// Staged mode moves the read views in and the written views out, byte for
/// byte; unified mode moves nothing.
#[test]
fn staged_byte_counts() {
    each_chip(12, &MODES, CUDA_KEYS, &["axpy", "fill"], |dev, reg, rng| {
        // Every chip but a unified simulated one stages.
        let staged = dev.info().mode != Mode::Unified;
        let x = host_tensor(rng, &[8, 16], DType::F32, Layout::Stepped);
        let y = host_tensor(rng, &[8, 16], DType::F32, Layout::Transposed);
        let report = run(
            dev,
            reg,
            "axpy",
            vec![x.arg(ArgTag::Input), y.arg(ArgTag::InOut)],
            vec![2f64.to_bits()],
        )
        .unwrap();
        let stats = dev.stats();
        if staged {
            assert_eq!(report.staged_in, 2 * 8 * 16 * 4, "x and y in");
            assert_eq!(report.staged_out, 8 * 16 * 4, "y out");
            assert_eq!((stats.staged_to_device, stats.staged_to_host), (1024, 512));
        } else {
            assert_eq!((report.staged_in, report.staged_out), (0, 0));
            assert_eq!((stats.staged_to_device, stats.staged_to_host), (0, 0));
        }
        let out = host_tensor(rng, &[8, 16], DType::F32, Layout::RowMajor);
        let report = run(dev, reg, "fill", vec![out.arg(ArgTag::Output)], vec![0]).unwrap();
        assert_eq!(
            report.staged_in, 0,
            "a write-only argument is not staged in"
        );
        assert_eq!(report.staged_out, if staged { 512 } else { 0 });
    });
}

/// Writes its output, then fails.
struct WriteThenFail(Signature);

impl Kernel for WriteThenFail {
    fn descriptor(&self) -> &Signature {
        &self.0
    }
    fn run(&self, ctx: &mut KernelContext<'_>) -> Result<(), String> {
        let mut out = ctx.output::<f32>(0)?;
        let g = *out.geometry();
        g.for_each_index(|idx| out.set(idx, 99.0));
        Err("gave up after writing".into())
    }
}

/// In staged mode a failed kernel's writes never reach host memory.
#[test]
fn failed_kernel_leaves_host_bytes_alone_in_staged_mode() {
    let dev = SimDevice::from_spec("sim:mem=8MiB,mode=staged").unwrap();
    let kernel = Arc::new(WriteThenFail(Signature {
        name: "test.write_then_fail".into(),
        version: 1,
        args: vec![ArgSpec::new(
            "out",
            Access::Write,
            DTypes::OneOf(vec![DType::F32]),
            Rank::Any,
        )],
        scalars: vec![],
    }));
    let mut rng = Rng(13);
    let out = host_tensor(&mut rng, &[4, 4], DType::F32, Layout::Stepped);
    let before = out.bytes();
    let err = device::launch(
        &dev,
        Launch {
            kernel,
            args: vec![out.arg(ArgTag::Output)],
            scalars: vec![],
            gate: None,
            priority: 0,
        },
    )
    .unwrap()
    .wait()
    .unwrap_err();
    assert!(err.to_string().contains("gave up after writing"), "{err}");
    assert_eq!(out.bytes(), before);
    assert_eq!(dev.stats().failed, 1);
    assert_eq!(dev.stats().arena.scratch.in_use, 0);
}
