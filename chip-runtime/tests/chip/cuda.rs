//! The CUDA chip's own cases, beyond the conformance suite: faults
//! provoked on purpose (a kernel that writes to an illegal address, a
//! source that does not compile, more memory than the device has), kernels
//! without a CUDA body, and user source kernels. On a machine without a
//! GPU each test prints one line naming why it skips and passes, unless
//! `STRATA_REQUIRE_CUDA=1`; the typed errors of absence are checked
//! everywhere.

use std::sync::Arc;

use strata_chip_runtime::kernel::cuda::{Entry, Grid, SourceKernel};
use strata_chip_runtime::kernel::{Kernel, Signature};
use strata_chip_runtime::{CudaError, Device, Error, Launch, Registry, device};
use strata_wire::ArgTag;
use strata_wire::check::Rng;

use crate::common::{Layout, device_f32_arg, host_tensor};

/// `cuda:0` with `keys`, or `None` (after one line saying why) where
/// there is none; `STRATA_REQUIRE_CUDA=1` turns that into a failure.
fn gpu(test: &str, keys: &str) -> Option<Arc<dyn Device>> {
    match strata_chip_runtime::open(&format!("cuda:0{keys}")) {
        Ok(d) => Some(d),
        Err(Error::Cuda(e @ (CudaError::NoDriver { .. } | CudaError::NoDevice { .. }))) => {
            if std::env::var("STRATA_REQUIRE_CUDA").is_ok_and(|v| v == "1") {
                panic!("{test}: STRATA_REQUIRE_CUDA=1 and cuda:0 cannot be opened: {e}");
            }
            println!("{test} on cuda:0: skipped, {e} (STRATA_REQUIRE_CUDA=1 makes this a failure)");
            None
        }
        Err(e) => panic!("{test}: cuda:0 failed to open: {e}"),
    }
}

fn launch(
    dev: &dyn Device,
    kernel: Arc<dyn Kernel>,
    args: Vec<strata_chip_runtime::LaunchArg>,
    scalars: Vec<u64>,
) -> Result<strata_chip_runtime::LaunchReport, Error> {
    device::launch(
        dev,
        Launch {
            kernel,
            args,
            scalars,
            gate: None,
            priority: 0,
        },
    )?
    .wait()
}

fn builtin(name: &str) -> Arc<dyn Kernel> {
    let reg = Registry::with_builtins();
    reg.get(reg.find(name, 1).unwrap()).unwrap()
}

/// Writes through a null pointer: the context is lost.
fn faulting() -> Arc<dyn Kernel> {
    Arc::new(
        SourceKernel::new(
            Signature::parse("fault@1(x:W:F32:*;)").unwrap(),
            r#"extern "C" __global__ void fault(strata_tensor x) {
                   *reinterpret_cast<volatile float*>(0x10) = 1.0f;
                   *strata_at<float>(x, 0) = 7.0f;
               }"#,
            Entry::One("fault".into()),
            Grid::Fixed {
                blocks: [1, 1, 1],
                threads: [1, 1, 1],
                shared: 0,
            },
        )
        .unwrap(),
    )
}

/// The faulting kernel's task fails with the lost context, naming the
/// driver's error; its output keeps its bytes; every launch after it,
/// of any kernel, fails with the same cause and writes nothing.
///
/// In a process of its own: the context lost is the GPU's primary one,
/// which every chip of that GPU in the process shares (the other tests
/// here go on using `cuda:0`).
#[test]
fn an_illegal_address_loses_the_context_and_nothing_is_written() {
    in_own_process(
        "cuda::an_illegal_address_loses_the_context_and_nothing_is_written",
        illegal_address,
    );
}

/// Runs `body` in a child process: this test binary, running only the
/// test `name` with `STRATA_OWN_PROCESS=1` (in which the test runs
/// `body` itself). The child's output is printed; its failure fails the
/// test.
fn in_own_process(name: &str, body: fn()) {
    if std::env::var_os("STRATA_OWN_PROCESS").is_some() {
        body();
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env("STRATA_OWN_PROCESS", "1")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    print!("{text}");
    assert!(out.status.success(), "{name} failed in its own process");
    assert!(
        text.contains("1 passed"),
        "{name} did not run in its own process:\n{text}"
    );
}

fn illegal_address() {
    let Some(dev) = gpu("an_illegal_address_loses_the_context", ",mem=256MiB") else {
        return;
    };
    let mut rng = Rng(5);
    let out = host_tensor(&mut rng, &[8, 8], strata_wire::DType::F32, Layout::RowMajor);
    let before = out.bytes();
    let e = launch(
        dev.as_ref(),
        faulting(),
        vec![out.arg(ArgTag::Output)],
        vec![],
    )
    .unwrap_err();
    let Error::Cuda(CudaError::ContextLost { name, .. }) = &e else {
        panic!("not a lost context: {e}");
    };
    assert!(
        name.contains("ILLEGAL_ADDRESS") || name.contains("LAUNCH_FAILED"),
        "{e}"
    );
    assert_eq!(out.bytes(), before, "a failed task wrote its output");
    let next = launch(
        dev.as_ref(),
        builtin("fill"),
        vec![out.arg(ArgTag::Output)],
        vec![2.0f64.to_bits()],
    )
    .unwrap_err();
    assert!(
        matches!(next, Error::Cuda(CudaError::ContextLost { .. })),
        "{next}"
    );
    assert_eq!(out.bytes(), before, "a launch on a lost context wrote");
    assert_eq!(e.failure_kind(), strata_boundary::FailureKind::Device);
}

/// The source kernels of these tests and of `SourceKernel`'s example
/// (compiled by NVRTC in `nvrtc.rs` wherever NVRTC is, GPU or not).
pub(crate) fn sources() -> Vec<Arc<dyn Kernel>> {
    let scale = SourceKernel::new(
        Signature::parse("scale@1(x:RW:F32:*;alpha:f64)").unwrap(),
        r#"extern "C" __global__ void scale(strata_tensor x, unsigned long long alpha) {
               double a = __longlong_as_double((long long)alpha);
               strata_u64 n = strata_numel(x);
               for (strata_u64 i = blockIdx.x * (strata_u64)blockDim.x + threadIdx.x; i < n;
                    i += (strata_u64)gridDim.x * blockDim.x)
                   *strata_at<float>(x, i) *= (float)a;
           }"#,
        Entry::One("scale".into()),
        Grid::Elements(0),
    )
    .unwrap();
    vec![faulting(), broken(), Arc::new(scale)]
}

fn broken() -> Arc<dyn Kernel> {
    Arc::new(
        SourceKernel::new(
            Signature::parse("broken@1(x:W:F32:*;)").unwrap(),
            r#"extern "C" __global__ void broken(strata_tensor x) { this is not C++ }"#,
            Entry::One("broken".into()),
            Grid::Elements(0),
        )
        .unwrap(),
    )
}

/// A source NVRTC refuses fails its launch with the compiler's log, as a
/// kernel failure; the chip serves on.
#[test]
fn a_source_that_does_not_compile_names_the_log() {
    let Some(dev) = gpu("a_source_that_does_not_compile", ",mem=256MiB") else {
        return;
    };
    let broken = broken();
    let mut rng = Rng(6);
    let out = host_tensor(&mut rng, &[4], strata_wire::DType::F32, Layout::RowMajor);
    let e = launch(dev.as_ref(), broken, vec![out.arg(ArgTag::Output)], vec![]).unwrap_err();
    let Error::Cuda(CudaError::Compile { log, .. }) = &e else {
        panic!("not a compile error: {e}");
    };
    assert!(log.contains("error"), "{log}");
    assert_eq!(e.failure_kind(), strata_boundary::FailureKind::Kernel);
    launch(
        dev.as_ref(),
        builtin("fill"),
        vec![out.arg(ArgTag::Output)],
        vec![2.0f64.to_bits()],
    )
    .unwrap();
    assert_eq!(out.bytes()[..16], [2f32.to_le_bytes(); 4].concat());
}

/// Asking for more device memory than there is: the typed cause, with
/// what was asked and what is free.
#[test]
fn more_memory_than_the_device_has_is_out_of_memory() {
    let Some(_) = gpu("more_memory_than_the_device_has", ",mem=64MiB") else {
        return;
    };
    // More than any GPU has, within what a spec may ask.
    match strata_chip_runtime::open("cuda:0,mem=255GiB") {
        Err(Error::Cuda(CudaError::OutOfMemory { asked, .. })) => {
            assert_eq!(asked, 255 << 30);
        }
        other => panic!("not out of memory: {other:?}"),
    }
}

/// A kernel with only a CPU body is not run on a GPU (and its chip does
/// not offer it); one with only a CUDA body is not run on a CPU chip.
#[test]
fn kernels_run_only_where_they_have_a_body() {
    let sim = strata_chip_runtime::open("sim:mem=1MiB").unwrap();
    assert!(!sim.runs(faulting().as_ref()));
    assert!(sim.runs(builtin("add").as_ref()));
    let mut rng = Rng(7);
    let out = host_tensor(&mut rng, &[4], strata_wire::DType::F32, Layout::RowMajor);
    let e = launch(
        sim.as_ref(),
        faulting(),
        vec![out.arg(ArgTag::Output)],
        vec![],
    )
    .unwrap_err();
    assert!(e.to_string().contains("only a CUDA body"), "{e}");
    let Some(dev) = gpu("kernels_run_only_where_they_have_a_body", ",mem=64MiB") else {
        return;
    };
    struct CpuOnly(Signature);
    impl Kernel for CpuOnly {
        fn descriptor(&self) -> &Signature {
            &self.0
        }
        fn run(&self, _: &mut strata_chip_runtime::KernelContext<'_>) -> Result<(), String> {
            Ok(())
        }
    }
    let cpu = Arc::new(CpuOnly(Signature::parse("cpu_only@1(x:W:F32:*;)").unwrap()));
    assert!(!dev.runs(cpu.as_ref()));
    let e = launch(dev.as_ref(), cpu, vec![out.arg(ArgTag::Output)], vec![]).unwrap_err();
    assert!(matches!(e, Error::Cuda(CudaError::NoBody { .. })), "{e}");
}

/// Absence is typed everywhere: a machine without a driver names it;
/// `cuda:all` is never one chip; a bad key is a spec error naming it.
#[test]
fn opening_a_cuda_chip_says_what_is_wrong() {
    let e = strata_chip_runtime::open("cuda:all").unwrap_err();
    assert!(e.to_string().contains("one chip is one GPU"), "{e}");
    let e = strata_chip_runtime::open("cuda:0,lanes=2").unwrap_err();
    assert!(e.to_string().contains("unknown key \"lanes\""), "{e}");
    let e = strata_chip_runtime::open("cuda:zero").unwrap_err();
    assert!(e.to_string().contains("not a device number"), "{e}");
    if let Err(Error::Cuda(CudaError::NoDriver { lib })) =
        strata_chip_runtime::open("cuda:0,mem=64MiB")
    {
        assert_eq!(lib, "libcuda.so.1");
    }
    let e = SourceKernel::new(
        Signature::parse("k@1(x:W:F32:*;)").unwrap(),
        "x",
        Entry::One("not an identifier".into()),
        Grid::Elements(0),
    )
    .unwrap_err();
    assert!(e.contains("not a C identifier"), "{e}");
    let e = SourceKernel::new(
        Signature::parse("k@1(x:W:F32:*;)").unwrap(),
        "x",
        Entry::One("k".into()),
        Grid::Rows(3),
    )
    .unwrap_err();
    assert!(e.contains("tensor argument 3"), "{e}");
}

/// A device number the driver does not have is named, with the count it
/// has.
#[test]
fn a_device_that_is_not_there_is_named() {
    let Some(_) = gpu("a_device_that_is_not_there_is_named", ",mem=64MiB") else {
        return;
    };
    match strata_chip_runtime::open("cuda:4096") {
        Err(Error::Cuda(CudaError::NoDevice { ordinal, count })) => {
            assert_eq!(ordinal, 4096);
            assert!(count >= 1);
        }
        other => panic!("not a missing device: {other:?}"),
    }
}

/// A launch's report on a GPU times what the device did, not how soon the
/// calls that queue its work return: the copies in of 64 MiB from host
/// memory take at least what 1 TB/s (beyond any host link) would, and
/// they are counted as copying in, not as the kernel.
#[test]
fn a_launch_report_times_the_device_work() {
    let Some(dev) = gpu("a_launch_report_times_the_device_work", ",mem=512MiB") else {
        return;
    };
    let n = 16u32 << 20;
    let mut rng = Rng(9);
    let src = host_tensor(&mut rng, &[n], strata_wire::DType::F32, Layout::RowMajor);
    let dst = host_tensor(&mut rng, &[n], strata_wire::DType::F32, Layout::RowMajor);
    let bytes = u64::from(n) * 4;
    for _ in 0..2 {
        let r = launch(
            dev.as_ref(),
            builtin("copy"),
            vec![src.arg(ArgTag::Input), dst.arg(ArgTag::Output)],
            vec![],
        )
        .unwrap();
        assert_eq!(r.staged_in, bytes);
        let floor = std::time::Duration::from_secs_f64(bytes as f64 / 1e12);
        assert!(
            r.copy_in >= floor,
            "copy in of {bytes} bytes timed {:?} (at least {floor:?})",
            r.copy_in
        );
        assert!(r.busy >= r.copy_in + r.kernel, "{r:?}");
    }
    // On device memory alone nothing is copied in, and the kernel is
    // still timed by the device's marks.
    let block = dev
        .alloc(strata_chip_runtime::Region::Persistent, bytes)
        .unwrap();
    let r = launch(
        dev.as_ref(),
        builtin("fill"),
        vec![device_f32_arg(block, ArgTag::Output)],
        vec![1f64.to_bits()],
    )
    .unwrap();
    assert_eq!(
        (r.staged_in, r.copy_in),
        (0, std::time::Duration::ZERO),
        "{r:?}"
    );
    assert!(r.kernel > std::time::Duration::ZERO, "{r:?}");
    dev.free(block.addr).unwrap();
}

/// A kernel writing `7.0` to `x[0]`, launched with `shared` bytes of
/// dynamic shared memory (which it does not touch).
fn with_shared(shared: u32) -> Arc<dyn Kernel> {
    Arc::new(
        SourceKernel::new(
            Signature::parse("big_shared@1(x:W:F32:*;)").unwrap(),
            r#"extern "C" __global__ void big_shared(strata_tensor x) {
                   *strata_at<float>(x, 0) = 7.0f;
               }"#,
            Entry::One("big_shared".into()),
            Grid::Fixed {
                blocks: [1, 1, 1],
                threads: [1, 1, 1],
                shared,
            },
        )
        .unwrap(),
    )
}

/// Beyond 48 KiB of dynamic shared memory a launch needs the function's
/// attribute raised first: the chip asks for it, and a launch asking more
/// than the GPU gives a block fails that task, naming it, not the chip.
#[test]
fn a_launch_with_more_than_48_kib_of_shared_memory_asks_the_driver_first() {
    let Some(dev) = gpu(
        "a_launch_with_more_than_48_kib_of_shared_memory",
        ",mem=64MiB",
    ) else {
        return;
    };
    let mut rng = Rng(8);
    for shared in [4 << 10, 64 << 10, 100 << 10] {
        let out = host_tensor(&mut rng, &[4], strata_wire::DType::F32, Layout::RowMajor);
        launch(
            dev.as_ref(),
            with_shared(shared),
            vec![out.arg(ArgTag::Output)],
            vec![],
        )
        .unwrap_or_else(|e| panic!("{shared} bytes: {e}"));
        assert_eq!(out.bytes()[..4], 7f32.to_le_bytes(), "{shared} bytes");
    }
    let out = host_tensor(&mut rng, &[4], strata_wire::DType::F32, Layout::RowMajor);
    let before = out.bytes();
    let e = launch(
        dev.as_ref(),
        with_shared(1 << 20),
        vec![out.arg(ArgTag::Output)],
        vec![],
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("more than this GPU gives a block"),
        "{e}"
    );
    assert_eq!(out.bytes(), before);
    // The chip serves on.
    launch(
        dev.as_ref(),
        with_shared(64 << 10),
        vec![out.arg(ArgTag::Output)],
        vec![],
    )
    .unwrap();
    assert_eq!(out.bytes()[..4], 7f32.to_le_bytes());
}

/// Two versions of one kernel name, and one per-dtype source launched on
/// two dtypes, each run their own function on one chip, whatever order
/// they come in (the chip finds a launch's function by name, version and
/// dtype).
#[test]
fn versions_and_dtypes_of_one_kernel_each_run_their_own_function() {
    let Some(dev) = gpu("versions_and_dtypes_of_one_kernel", ",mem=64MiB") else {
        return;
    };
    let twin = |version: u32, value: &str| -> Arc<dyn Kernel> {
        Arc::new(
            SourceKernel::new(
                Signature::parse(&format!("twin@{version}(x:W:F32|F64:*;)")).unwrap(),
                format!(
                    r#"extern "C" __global__ void twin_f32(strata_tensor x) {{
                           *strata_at<float>(x, 0) = {value}f;
                       }}
                       extern "C" __global__ void twin_f64(strata_tensor x) {{
                           *strata_at<double>(x, 0) = 10.0 * {value};
                       }}"#
                ),
                Entry::PerDType("twin".into()),
                Grid::Fixed {
                    blocks: [1, 1, 1],
                    threads: [1, 1, 1],
                    shared: 0,
                },
            )
            .unwrap(),
        )
    };
    let (one, two) = (twin(1, "1.0"), twin(2, "2.0"));
    let mut rng = Rng(12);
    for (kernel, dtype, want) in [
        (&one, strata_wire::DType::F32, 1.0),
        (&two, strata_wire::DType::F32, 2.0),
        (&one, strata_wire::DType::F64, 10.0),
        (&two, strata_wire::DType::F64, 20.0),
        (&one, strata_wire::DType::F32, 1.0),
        (&two, strata_wire::DType::F64, 20.0),
    ] {
        let out = host_tensor(&mut rng, &[1], dtype, Layout::RowMajor);
        launch(
            dev.as_ref(),
            Arc::clone(kernel),
            vec![out.arg(ArgTag::Output)],
            vec![],
        )
        .unwrap();
        let got = match dtype {
            strata_wire::DType::F32 => {
                f64::from(f32::from_le_bytes(out.bytes()[..4].try_into().unwrap()))
            }
            _ => f64::from_le_bytes(out.bytes()[..8].try_into().unwrap()),
        };
        let version = kernel.descriptor().version;
        assert_eq!(got, want, "twin@{version} on {dtype}");
    }
}

/// A fixed grid beyond what any CUDA GPU launches is refused when the
/// kernel is made, naming the limit (everywhere: no GPU needed).
#[test]
fn a_fixed_grid_beyond_cuda_s_limits_is_refused_naming_the_limit() {
    let make = |blocks, threads| {
        SourceKernel::new(
            Signature::parse("k@1(x:W:F32:*;)").unwrap(),
            r#"extern "C" __global__ void k(strata_tensor x) {}"#,
            Entry::One("k".into()),
            Grid::Fixed {
                blocks,
                threads,
                shared: 0,
            },
        )
    };
    for (blocks, threads, why) in [
        ([1, 1, 1], [2048, 1, 1], "at most 1024"),
        ([1, 1, 1], [32, 32, 2], "is 2048"),
        (
            [1, 1, 1],
            [1, 1, 65],
            "along z; a CUDA block takes at most 64",
        ),
        (
            [1, 70_000, 1],
            [32, 1, 1],
            "along y; a CUDA grid takes at most 65535",
        ),
        ([1 << 31, 1, 1], [32, 1, 1], "along x"),
    ] {
        let e = make(blocks, threads).unwrap_err();
        assert!(
            e.contains("grid: ") && e.contains(why),
            "{blocks:?} {threads:?}: {e}"
        );
    }
    make([65_535, 65_535, 65_535], [1024, 1, 1]).unwrap();
    make([1, 1, 1], [16, 16, 4]).unwrap();
}
