//! Errors name what was wrong, and the device keeps working after them.
//!
//! The tests through `each_chip` (memory running out, copies and frees of
//! dead blocks, run blocks after their run, argument refusals, range
//! checks) run on every chip of the conformance list
//! ([`crate::conformance`]); those with kernels of their own (no CUDA
//! body), lanes or start gates stay on the simulated chip.

use std::sync::Arc;

use strata_chip_runtime::kernel::{ArgSpec, DTypes, Rank, Signature};
use strata_chip_runtime::{
    ArgBacking, Device, Error, HostBuffer, Kernel, KernelContext, LaunchArg, Region, Registry,
    SimDevice,
};
use strata_wire::check::Rng;
use strata_wire::{
    Access, AddressSpace, ArgTag, Backing, BufferDescriptor, CanonicalIdentity, DType, Tensor,
};

use crate::common::{Layout, host_tensor, read, run};
use crate::conformance::each_chip;

fn dev() -> SimDevice {
    SimDevice::from_spec("sim:mem=1MiB,lanes=2").unwrap()
}

#[test]
fn out_of_memory_then_smaller_requests_still_work() {
    each_chip(0, &["sim:mem=1MiB,lanes=2"], "mem=1MiB", &[], |d, _, _| {
        let err = d.alloc(Region::Persistent, 10 << 20).unwrap_err();
        match &err {
            Error::OutOfMemory {
                region: Region::Persistent,
                asked,
                free,
                ..
            } => {
                assert_eq!(*asked, 10 << 20);
                assert_eq!(*free, 512 * 1024);
            }
            other => panic!("{other}"),
        }
        assert!(
            err.to_string()
                .starts_with("out of device memory in the persistent region: asked 10485760 bytes")
        );
        let b = d.alloc(Region::Persistent, 4096).unwrap();
        assert_eq!(b.addr % 64, 0);
        d.copy_to_device(&b, 0, &[7; 4096]).unwrap();
        let mut back = [0u8; 4096];
        d.copy_from_device(&b, 0, &mut back).unwrap();
        assert_eq!(back, [7; 4096]);
        d.free(b.addr).unwrap();
        assert!(
            matches!(d.free(b.addr), Err(Error::UnknownBlock { .. })),
            "double free refused"
        );
        assert!(
            matches!(
                d.copy_to_device(&b, 0, &[1]),
                Err(Error::UnknownBlock { .. })
            ),
            "freed block"
        );
        assert!(matches!(
            d.alloc(Region::Scratch, 64),
            Err(Error::Spec { .. })
        ));
        let s = d.stats();
        assert_eq!(
            (
                s.arena.persistent.failed,
                s.copied_to_device,
                s.copied_to_host
            ),
            (1, 4096, 4096)
        );
    });
}

#[test]
fn a_staged_view_larger_than_scratch_fails_the_task_not_the_device() {
    each_chip(
        1,
        &["sim:mem=1MiB,scratch=64KiB"],
        "mem=1MiB,scratch=64KiB",
        &["fill"],
        |d, reg, rng| {
            let big = host_tensor(rng, &[256, 128], DType::F32, Layout::RowMajor);
            let err = run(d, reg, "fill", vec![big.arg(ArgTag::Output)], vec![0]).unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::OutOfMemory {
                        region: Region::Scratch,
                        asked: 131_072,
                        ..
                    }
                ),
                "{err}"
            );
            let small = host_tensor(rng, &[4, 4], DType::F32, Layout::RowMajor);
            run(
                d,
                reg,
                "fill",
                vec![small.arg(ArgTag::Output)],
                vec![1f64.to_bits()],
            )
            .unwrap();
            assert_eq!(read(&small.bytes(), &small.view, &[3, 3]), 1.0);
        },
    );
}

fn argument_error(err: Error) -> (usize, String, String) {
    match err {
        Error::Argument {
            index,
            name,
            reason,
            ..
        } => (index, name, reason),
        other => panic!("expected an argument error, got {other}"),
    }
}

#[test]
fn bad_arguments_are_refused_before_anything_runs_naming_the_argument() {
    each_chip(
        2,
        &["sim:mem=1MiB,lanes=2"],
        "mem=1MiB",
        &["add", "copy", "fill", "matmul"],
        |d, reg, rng| {
            let a = host_tensor(rng, &[4, 3], DType::F32, Layout::RowMajor);
            let b = host_tensor(rng, &[5, 2], DType::F32, Layout::RowMajor);
            let c = host_tensor(rng, &[4, 2], DType::F32, Layout::RowMajor);
            let h = host_tensor(rng, &[4, 3], DType::F16, Layout::RowMajor);
            let r1 = host_tensor(rng, &[12], DType::F32, Layout::RowMajor);

            let (i, name, why) = argument_error(
                run(
                    d,
                    reg,
                    "matmul",
                    vec![
                        a.arg(ArgTag::Input),
                        b.arg(ArgTag::Input),
                        c.arg(ArgTag::Output),
                    ],
                    vec![],
                )
                .unwrap_err(),
            );
            assert_eq!((i, name.as_str()), (1, "b"));
            assert!(why.contains("does not chain"), "{why}");

            let (i, _, why) =
                argument_error(run(d, reg, "add", vec![a.arg(ArgTag::Input)], vec![]).unwrap_err());
            assert_eq!(i, 1);
            assert!(why.contains("expected 3 tensor arguments, got 1"));

            let (i, name, why) = argument_error(
                run(
                    d,
                    reg,
                    "add",
                    vec![
                        a.arg(ArgTag::Input),
                        h.arg(ArgTag::Input),
                        a.arg(ArgTag::Output),
                    ],
                    vec![],
                )
                .unwrap_err(),
            );
            assert_eq!((i, name.as_str()), (1, "b"));
            assert!(
                why.contains("dtype F16 differs from argument 0's F32"),
                "{why}"
            );

            let (i, _, why) = argument_error(
                run(
                    d,
                    reg,
                    "copy",
                    vec![a.arg(ArgTag::Input), r1.arg(ArgTag::Output)],
                    vec![],
                )
                .unwrap_err(),
            );
            assert_eq!(i, 1);
            assert!(
                why.contains("rank 1 given, the rank of argument 0 expected"),
                "{why}"
            );

            let (i, _, why) = argument_error(
                run(d, reg, "fill", vec![a.arg(ArgTag::Input)], vec![0]).unwrap_err(),
            );
            assert_eq!(i, 0);
            assert!(
                why.contains("tagged INPUT, but the kernel writes it"),
                "{why}"
            );

            let err = run(d, reg, "fill", vec![a.arg(ArgTag::Output)], vec![]).unwrap_err();
            assert!(matches!(err, Error::Scalars { .. }), "{err}");

            // Writing a view that shares bytes with another argument.
            let (i, _, why) = argument_error(
                run(
                    d,
                    reg,
                    "add",
                    vec![
                        a.arg(ArgTag::Input),
                        a.arg(ArgTag::Input),
                        a.arg(ArgTag::Output),
                    ],
                    vec![],
                )
                .unwrap_err(),
            );
            assert_eq!(i, 2);
            assert!(why.contains("shares bytes with argument 0"), "{why}");

            // A READ grant cannot be written.
            let id = CanonicalIdentity::new([3; 8], 77, 1).unwrap();
            let ro = BufferDescriptor::new(
                id,
                64,
                AddressSpace::Host,
                Access::Read,
                Backing::Memfd {
                    st_dev: 1,
                    st_ino: 2,
                },
            )
            .unwrap();
            let view = Tensor::new(ro, 0, &[16], &[1], DType::F32).unwrap();
            let host = Arc::new(HostBuffer::new(64).unwrap());
            let arg = LaunchArg {
                tensor: view,
                tag: ArgTag::Output,
                backing: ArgBacking::Host(host),
                cache: None,
            };
            let (_, _, why) = argument_error(run(d, reg, "fill", vec![arg], vec![0]).unwrap_err());
            assert!(why.contains("grants READ"), "{why}");

            // A host mapping shorter than the view.
            let short = Arc::new(HostBuffer::new(16).unwrap());
            let arg = LaunchArg {
                tensor: c.view,
                tag: ArgTag::Output,
                backing: ArgBacking::Host(short),
                cache: None,
            };
            let (_, _, why) = argument_error(run(d, reg, "fill", vec![arg], vec![0]).unwrap_err());
            assert!(why.contains("host mapping has 16"), "{why}");

            assert_eq!(d.stats().launched, 0, "nothing was queued");
        },
    );
}

/// Panics on purpose.
struct Panicky(Signature);

impl Kernel for Panicky {
    fn descriptor(&self) -> &Signature {
        &self.0
    }
    fn run(&self, ctx: &mut KernelContext<'_>) -> Result<(), String> {
        let v = ctx.input::<f32>(0)?;
        // Index past the end: the view's bounds check panics.
        let _ = v.get(&[usize::MAX]);
        Ok(())
    }
}

#[test]
fn a_panicking_kernel_is_a_task_failure_and_the_device_keeps_working() {
    let d = dev();
    let mut reg = Registry::with_builtins();
    let panicky = Arc::new(Panicky(Signature {
        name: "test.panicky".into(),
        version: 1,
        args: vec![ArgSpec::new(
            "x",
            Access::Read,
            DTypes::Any,
            Rank::Exactly(1),
        )],
        scalars: vec![],
    }));
    reg.register(panicky).unwrap();
    let mut rng = Rng(3);
    let x = host_tensor(&mut rng, &[8], DType::F32, Layout::RowMajor);
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let err = run(&d, &reg, "test.panicky", vec![x.arg(ArgTag::Input)], vec![]);
    std::panic::set_hook(prev);
    match err.unwrap_err() {
        Error::KernelPanicked { kernel, message } => {
            assert_eq!(kernel, "test.panicky@1");
            assert!(message.contains("past axis 0"), "{message}");
        }
        other => panic!("{other}"),
    }
    let out = host_tensor(&mut rng, &[8], DType::F32, Layout::RowMajor);
    run(
        &d,
        &reg,
        "copy",
        vec![x.arg(ArgTag::Input), out.arg(ArgTag::Output)],
        vec![],
    )
    .unwrap();
    assert_eq!(out.bytes()[..32], x.bytes()[..32]);
    let s = d.stats();
    assert_eq!((s.launched, s.panicked, s.succeeded), (2, 1, 1));
    assert_eq!(s.arena.scratch.in_use, 0);
}

#[test]
fn device_backed_arguments_run_in_place() {
    each_chip(
        4,
        &["sim:mem=1MiB,lanes=2"],
        "mem=1MiB",
        &["add"],
        |d, reg, rng| {
            let block = d.alloc(Region::Persistent, 64).unwrap();
            let values: Vec<u8> = (0..16).flat_map(|i| (i as f32).to_le_bytes()).collect();
            d.copy_to_device(&block, 0, &values).unwrap();
            let id = CanonicalIdentity::new([9; 8], 1, 1).unwrap();
            let addr = std::num::NonZeroU64::new(block.addr).unwrap();
            let desc = BufferDescriptor::new(
                id,
                64,
                AddressSpace::Device,
                Access::ReadWrite,
                Backing::DeviceMalloc { addr },
            )
            .unwrap();
            let x = Tensor::new(desc, 0, &[4, 4], &[4, 1], DType::F32).unwrap();
            let xt = Tensor::new(desc, 0, &[4, 4], &[1, 4], DType::F32).unwrap();
            let out = host_tensor(rng, &[4, 4], DType::F32, Layout::RowMajor);
            let dev_arg = |t: Tensor| LaunchArg {
                tensor: t,
                tag: ArgTag::Input,
                backing: ArgBacking::Device(block),
                cache: None,
            };
            let report = run(
                d,
                reg,
                "add",
                vec![dev_arg(x), dev_arg(xt), out.arg(ArgTag::Output)],
                vec![],
            )
            .unwrap();
            assert_eq!(report.staged_in, 0, "device arguments are not staged");
            let ob = out.bytes();
            for i in 0..4 {
                for j in 0..4 {
                    assert_eq!(
                        read(&ob, &out.view, &[i, j]),
                        (4 * i + j + 4 * j + i) as f64
                    );
                }
            }
            // A run block, then end_run releases it.
            let r = d.alloc(Region::Run, 1000).unwrap();
            d.copy_to_device(&r, 0, &[1; 1000]).unwrap();
            d.end_run().unwrap();
            assert!(
                matches!(
                    d.copy_to_device(&r, 0, &[1; 10]),
                    Err(Error::RunEnded {
                        run: 0,
                        current: 1,
                        ..
                    })
                ),
                "run memory is gone after end_run"
            );
            assert_eq!(d.stats().arena.run.in_use, 0);
        },
    );
}

/// A run block outlives nothing past its run: after `end_run` the cursor
/// is back at 0, and the old block is refused in copies and launches even
/// though a block of the new run now covers the same bytes.
#[test]
fn run_blocks_are_refused_after_their_run_ends() {
    each_chip(
        0,
        &["sim:mem=1MiB,lanes=2"],
        "mem=1MiB",
        &["fill"],
        |d, reg, _| {
            let old = d.alloc(Region::Run, 64).unwrap();
            assert_eq!(old.epoch, 0);
            d.copy_to_device(&old, 0, &[3; 64]).unwrap();
            assert_eq!(d.stats().arena.run.in_use, 64);
            d.end_run().unwrap();
            let s = d.stats().arena.run;
            assert_eq!((s.in_use, s.frees), (0, 1), "cursor back to 0, one reset");
            let new = d.alloc(Region::Run, 64).unwrap();
            assert_eq!(
                (new.addr, new.epoch),
                (old.addr, 1),
                "the new run reuses the same bytes"
            );
            d.copy_to_device(&new, 0, &[9; 64]).unwrap();
            let err = d.copy_from_device(&old, 0, &mut [0u8; 64]).unwrap_err();
            assert_eq!(
                err,
                Error::RunEnded {
                    addr: old.addr,
                    run: 0,
                    current: 1
                }
            );
            assert!(
                err.to_string()
                    .contains("belonged to run 0, which has ended"),
                "{err}"
            );
            // A launch naming the old block is refused before anything runs.
            let id = CanonicalIdentity::new([9; 8], 2, 1).unwrap();
            let desc = BufferDescriptor::new(
                id,
                64,
                AddressSpace::Device,
                Access::ReadWrite,
                Backing::DeviceMalloc {
                    addr: std::num::NonZeroU64::new(old.addr).unwrap(),
                },
            )
            .unwrap();
            let view = Tensor::new(desc, 0, &[16], &[1], DType::F32).unwrap();
            let arg = |block| LaunchArg {
                tensor: view,
                tag: ArgTag::Output,
                backing: ArgBacking::Device(block),
                cache: None,
            };
            let err = run(d, reg, "fill", vec![arg(old)], vec![1.0f64.to_bits()]).unwrap_err();
            assert!(
                err.to_string().contains("which has ended"),
                "launch on an ended run block: {err}"
            );
            let mut back = [0u8; 64];
            d.copy_from_device(&new, 0, &mut back).unwrap();
            assert_eq!(back, [9; 64], "the refused launch wrote nothing");
            run(d, reg, "fill", vec![arg(new)], vec![1.0f64.to_bits()]).unwrap();
            d.copy_from_device(&new, 0, &mut back).unwrap();
            assert_eq!(back[..4], 1.0f32.to_le_bytes(), "the live block works");
        },
    );
}

#[test]
fn registry_handles() {
    let reg = Registry::with_builtins();
    let names = [
        "fill",
        "noop",
        "copy",
        "add",
        "mul",
        "axpy",
        "matmul",
        "matmul_acc",
        "reduce_sum",
        "softmax",
        "transpose",
        "potrf",
        "trsm",
        "syrk",
        "gemm",
    ];
    assert_eq!(reg.len(), names.len());
    let mut handles = std::collections::HashSet::new();
    for name in names {
        let h = reg
            .find(name, 1)
            .unwrap_or_else(|| panic!("{name} registered"));
        let k = reg.get(h).unwrap();
        assert_eq!(
            k.descriptor().handle(),
            h,
            "handle is the digest of the descriptor"
        );
        assert!(handles.insert(h));
    }
    let add = reg.get(reg.find("add", 1).unwrap()).unwrap();
    assert_eq!(
        add.descriptor().canonical(),
        "add@1(a:R:F32|F64|F16|BF16|I8|I16|I32|I64|U8|U16|U32|U64|C64|C128:*,b:R:=0:=0,out:W:=0:=0;)"
    );
    // The examples of docs/wire-format.md §8.2.
    for (name, canonical) in [
        (
            "matmul_acc",
            "matmul_acc@1(a:R:F32|F64|F16|BF16|C64|C128:2,b:R:=0:2,c:RW:=0:2;)",
        ),
        (
            "axpy",
            "axpy@1(x:R:F32|F64|F16|BF16|C64|C128:*,y:RW:=0:=0;alpha:f64)",
        ),
    ] {
        let k = reg.get(reg.find(name, 1).unwrap()).unwrap();
        assert_eq!(k.descriptor().canonical(), canonical);
    }
    // Same name and version, different signature: refused.
    let mut reg2 = reg.clone();
    let clash = Arc::new(Panicky(Signature {
        name: "add".into(),
        version: 1,
        args: vec![ArgSpec::new("x", Access::Read, DTypes::Any, Rank::Any)],
        scalars: vec![],
    }));
    assert!(matches!(
        reg2.register(clash),
        Err(Error::ConflictingKernel(_))
    ));
    assert!(matches!(
        reg.get(strata_chip_runtime::KernelHandle([0; 16])),
        Err(Error::UnknownKernel(_))
    ));
}

/// Runs until the test lets it go: a kernel that holds its lane.
struct Gatekeeper {
    desc: Signature,
    release: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
    started: std::sync::mpsc::SyncSender<()>,
}

impl Kernel for Gatekeeper {
    fn descriptor(&self) -> &Signature {
        &self.desc
    }
    fn run(&self, _: &mut KernelContext<'_>) -> Result<(), String> {
        let _ = self.started.send(());
        let rx = self.release.lock().map_err(|e| e.to_string())?;
        rx.recv().map_err(|e| e.to_string())
    }
}

/// A launch queued behind a running one, on the only lane, does not start
/// once its gate is closed: it fails with the gate's reason and its output
/// keeps its bytes. The running launch and a launch without the gate are
/// not affected.
#[test]
fn a_closed_gate_keeps_a_queued_launch_from_starting() {
    let d = SimDevice::from_spec("sim:mem=1MiB,lanes=1").unwrap();
    let reg = Registry::with_builtins();
    let (release_tx, release_rx) = std::sync::mpsc::channel();
    let (started_tx, started_rx) = std::sync::mpsc::sync_channel(1);
    let holder: Arc<dyn Kernel> = Arc::new(Gatekeeper {
        desc: Signature {
            name: "test.hold".into(),
            version: 1,
            args: vec![],
            scalars: vec![],
        },
        release: std::sync::Mutex::new(release_rx),
        started: started_tx,
    });
    let fill = reg.get(reg.find("fill", 1).unwrap()).unwrap();
    let gate = strata_chip_runtime::StartGate::new();
    let mut rng = Rng(5);
    let gated = host_tensor(&mut rng, &[16], DType::F32, Layout::RowMajor);
    let free = host_tensor(&mut rng, &[16], DType::F32, Layout::RowMajor);
    let before = gated.bytes();
    let launch = |kernel: &Arc<dyn Kernel>, args: Vec<LaunchArg>, scalars, gate| {
        strata_chip_runtime::device::launch(
            &d,
            strata_chip_runtime::Launch {
                kernel: Arc::clone(kernel),
                args,
                scalars,
                gate,
                priority: 0,
            },
        )
        .unwrap()
    };
    let held = launch(&holder, vec![], vec![], Some(gate.clone()));
    started_rx.recv().unwrap();
    let queued = launch(
        &fill,
        vec![gated.arg(ArgTag::Output)],
        vec![3.0f64.to_bits()],
        Some(gate.clone()),
    );
    let ungated = launch(
        &fill,
        vec![free.arg(ArgTag::Output)],
        vec![4.0f64.to_bits()],
        None,
    );
    assert!(!gate.is_closed());
    gate.close("session 7 ended before the task started");
    gate.close("a second reason is ignored");
    assert!(gate.is_closed());
    release_tx.send(()).unwrap();
    assert!(held.wait().is_ok(), "the running launch finishes");
    let err = queued.wait().unwrap_err();
    assert_eq!(
        err,
        Error::NotStarted {
            reason: "session 7 ended before the task started".into()
        }
    );
    assert_eq!(
        err.to_string(),
        "not started: session 7 ended before the task started"
    );
    assert_eq!(gated.bytes(), before, "the gated fill wrote nothing");
    ungated.wait().unwrap();
    assert_eq!(read(&free.bytes(), &free.view, &[15]), 4.0);
    let s = d.stats();
    assert_eq!((s.launched, s.succeeded, s.failed), (3, 2, 1));
}

/// An integer `fill` value the dtype cannot hold is refused at launch on
/// every chip, naming it and the range, and nothing is written; the edges
/// of the range are kept.
#[test]
fn a_fill_value_out_of_the_dtypes_range_is_refused() {
    each_chip(
        3,
        &["sim:mem=1MiB"],
        "mem=1MiB",
        &["fill"],
        |d, reg, rng| {
            for (dtype, bad, good, why) in [
                (
                    DType::U8,
                    300u64,
                    255u64,
                    "value 300 does not fit out's dtype U8 (0..=255)",
                ),
                (
                    DType::U8,
                    (-1i64) as u64,
                    0,
                    "value 18446744073709551615 does not fit",
                ),
                (
                    DType::I16,
                    (-32_769i64) as u64,
                    (-32_768i64) as u64,
                    "value -32769 does not fit out's dtype I16 (-32768..=32767)",
                ),
                (DType::I16, 40_000, 32_767, "value 40000 does not fit"),
            ] {
                let x = host_tensor(rng, &[8], dtype, Layout::RowMajor);
                let before = x.bytes();
                let err = run(d, reg, "fill", vec![x.arg(ArgTag::Output)], vec![bad]).unwrap_err();
                assert!(matches!(err, Error::Argument { index: 0, .. }), "{err}");
                assert!(err.to_string().contains(why), "{err}");
                assert_eq!(x.bytes(), before, "{dtype}: a refused fill wrote");
                run(d, reg, "fill", vec![x.arg(ArgTag::Output)], vec![good]).unwrap();
                let want = read(&x.bytes(), &x.view, &[3]);
                let expect = if dtype == DType::U8 {
                    good as f64
                } else {
                    good as i64 as f64
                };
                assert_eq!(want, expect, "{dtype}");
            }
        },
    );
}
