//! The CUDA chip's benchmarks, beside the vendor libraries on the same
//! device: what `scripts/gpu-check.sh` runs and tabulates.
//!
//! `gpu_bench [SECTION...]` with sections `copy` (buffer ↔ device
//! bandwidth through a chip), `hop` (a chain of dependent tiny tasks from
//! this driver), `throughput` (independent tiny tasks), `gemm` (a tiled
//! 16384² F32 GEMM in 2048² and 1024² tiles on device buffers), `dense`
//! (one GEMM and one potrf on whole matrices: cuBLAS and cuSOLVER
//! themselves, through the chip's `gemm` and `potrf` bodies); none: all.
//! `STRATA_DEVICE` picks the chip (default `cuda:0`; `sim` runs the same
//! programs on a simulated chip, small unless `STRATA_BENCH_SMALL=0`;
//! `STRATA_BENCH_SMALL=1` makes them small on any chip, as `scripts/gpu-check.sh --quick` does). Each figure is printed as
//! `RESULT name value unit`, with the median of its runs.
//!
//! Needs the `strata` binary (`cargo build --release`, or `STRATA_BIN`).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use strata_chip_runtime::{
    ArgBacking, Device, HostBuffer, HostMemory, Launch, LaunchArg, Region, Registry, device,
};
use strata_orchestrator::{Cluster, Task};
use strata_wire::{
    Access, AddressSpace, ArgTag, Backing, BufferDescriptor, CanonicalIdentity, DType, Tensor,
};

/// The driver allocates per task from several threads, as the `strata`
/// binary's and the Python package's do: the same allocator here, so the
/// figures are the ones those drivers get (glibc's malloc was a quarter of
/// this driver's instructions per task).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

type Fallible<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> ExitCode {
    let sections: Vec<String> = std::env::args().skip(1).collect();
    let spec = std::env::var("STRATA_DEVICE").unwrap_or_else(|_| "cuda:0".into());
    let small = match std::env::var("STRATA_BENCH_SMALL") {
        Ok(v) => v == "1",
        Err(_) => spec.starts_with("sim"),
    };
    let all = sections.is_empty();
    let want = |s: &str| all || sections.iter().any(|a| a == s);
    let run = || -> Fallible<()> {
        if want("copy") {
            copy(&spec, small)?;
        }
        if want("dense") {
            dense(&spec, small)?;
        }
        if want("hop") || want("throughput") || want("gemm") {
            let cluster = Cluster::builder().local(1).device(&spec).start()?;
            if want("hop") {
                hop(&cluster, if small { 2_000 } else { 20_000 })?;
            }
            if want("throughput") {
                throughput(&cluster, if small { 5_000 } else { 100_000 })?;
            }
            if want("gemm") {
                let n = if small { 512 } else { 16_384 };
                for tile in if small { [256, 128] } else { [2048, 1024] } {
                    gemm(&cluster, n, tile)?;
                }
            }
            cluster.shutdown()?;
        }
        Ok(())
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpu_bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn result(name: &str, value: f64, unit: &str) {
    println!("RESULT {name} {value:.3} {unit}");
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// A host buffer's descriptor for a chip-level view.
fn host_descriptor(nbytes: u64) -> Fallible<BufferDescriptor> {
    let id = CanonicalIdentity::new(*b"gpubench", 1, 1)?;
    let backing = Backing::Memfd {
        st_dev: 1,
        st_ino: 1,
    };
    Ok(BufferDescriptor::new(
        id,
        nbytes,
        AddressSpace::Host,
        Access::ReadWrite,
        backing,
    )?)
}

/// A device block's descriptor for a chip-level view.
fn device_descriptor(block: strata_chip_runtime::DeviceBlock) -> Fallible<BufferDescriptor> {
    let id = CanonicalIdentity::new(*b"gpubench", block.addr, 1)?;
    let addr = std::num::NonZeroU64::new(block.addr).ok_or("a device block at address 0")?;
    Ok(BufferDescriptor::new(
        id,
        block.len,
        AddressSpace::Device,
        Access::ReadWrite,
        Backing::DeviceMalloc { addr },
    )?)
}

/// Runs one launch on `dev` and returns its report.
fn launch(
    dev: &dyn Device,
    kernels: &Registry,
    name: &str,
    args: Vec<LaunchArg>,
    scalars: Vec<u64>,
) -> Fallible<strata_chip_runtime::LaunchReport> {
    let handle = kernels
        .find(name, 1)
        .ok_or_else(|| format!("no kernel {name}"))?;
    let kernel = kernels.get(handle)?;
    Ok(device::launch(
        dev,
        Launch {
            kernel,
            args,
            scalars,
            gate: None,
            priority: 0,
        },
    )?
    .wait()?)
}

fn host_arg(t: Tensor, tag: ArgTag, host: &Arc<HostBuffer>) -> LaunchArg {
    LaunchArg {
        tensor: t,
        tag,
        backing: ArgBacking::Host(Arc::clone(host) as Arc<dyn HostMemory>),
        cache: None,
    }
}

fn device_arg(t: Tensor, tag: ArgTag, block: strata_chip_runtime::DeviceBlock) -> LaunchArg {
    LaunchArg {
        tensor: t,
        tag,
        backing: ArgBacking::Device(block),
        cache: None,
    }
}

/// Host buffer → device and back, through the chip's staging (the
/// buffer page-locked in place on its first use).
fn copy(spec: &str, small: bool) -> Fallible<()> {
    let dev = strata_chip_runtime::open(spec)?;
    let kernels = Registry::with_builtins();
    let sizes: &[u64] = if small {
        &[16 << 20]
    } else {
        &[16 << 20, 64 << 20, 256 << 20]
    };
    for &bytes in sizes {
        let host = Arc::new(HostBuffer::new(bytes as usize)?);
        let block = dev.alloc(Region::Persistent, bytes)?;
        let n = (bytes / 4) as u32;
        let hv = Tensor::new(host_descriptor(bytes)?, 0, &[n], &[1], DType::F32)?;
        let dv = Tensor::new(device_descriptor(block)?, 0, &[n], &[1], DType::F32)?;
        let (mut to, mut from) = (Vec::new(), Vec::new());
        for i in 0..6 {
            // In: the host view is read, copied to the device block.
            let r = launch(
                dev.as_ref(),
                &kernels,
                "copy",
                vec![
                    host_arg(hv, ArgTag::Input, &host),
                    device_arg(dv, ArgTag::Output, block),
                ],
                vec![],
            )?;
            // Out: the device block is copied into the host view.
            let w = launch(
                dev.as_ref(),
                &kernels,
                "copy",
                vec![
                    device_arg(dv, ArgTag::Input, block),
                    host_arg(hv, ArgTag::Output, &host),
                ],
                vec![],
            )?;
            if i > 0 {
                to.push(r.staged_in as f64 / r.copy_in.as_secs_f64().max(1e-9) / 1e9);
                from.push(w.staged_out as f64 / w.copy_out.as_secs_f64().max(1e-9) / 1e9);
            }
        }
        let mib = bytes >> 20;
        result(&format!("copy_to_device_{mib}MiB"), median(to), "GB/s");
        result(&format!("copy_to_host_{mib}MiB"), median(from), "GB/s");
        dev.free(block.addr)?;
    }
    let s = dev.stats();
    result("copy_bounced_bytes", s.bounced as f64, "B");
    Ok(())
}

/// cuBLAS GEMM and cuSOLVER potrf on whole matrices in device memory,
/// through the chip's own `gemm` and `potrf` bodies.
fn dense(spec: &str, small: bool) -> Fallible<()> {
    let dev = strata_chip_runtime::open(spec)?;
    let kernels = Registry::with_builtins();
    let cases: &[(u32, DType, &str)] = if small {
        &[(256, DType::F32, "gemm"), (256, DType::F32, "potrf")]
    } else {
        &[
            (16_384, DType::F32, "gemm"),
            (16_384, DType::F32, "potrf"),
            (16_384, DType::F64, "potrf"),
            (32_768, DType::F32, "potrf"),
        ]
    };
    for &(n, dtype, what) in cases {
        let elem = u64::from(dtype.bits() / 8);
        let bytes = u64::from(n) * u64::from(n) * elem;
        let mat = |b: strata_chip_runtime::DeviceBlock| -> Fallible<Tensor> {
            Ok(Tensor::new(
                device_descriptor(b)?,
                0,
                &[n, n],
                &[n, 1],
                dtype,
            )?)
        };
        let diag = |b: strata_chip_runtime::DeviceBlock| -> Fallible<Tensor> {
            Ok(Tensor::new(
                device_descriptor(b)?,
                0,
                &[n],
                &[n + 1],
                dtype,
            )?)
        };
        let fill = |block, t: Tensor, v: f64| {
            launch(
                dev.as_ref(),
                &kernels,
                "fill",
                vec![device_arg(t, ArgTag::Output, block)],
                vec![v.to_bits()],
            )
        };
        let mut times = Vec::new();
        let flops = if what == "gemm" {
            2.0 * f64::from(n).powi(3)
        } else {
            f64::from(n).powi(3) / 3.0
        };
        for _ in 0..3 {
            if what == "gemm" {
                let (a, b, c) = (
                    dev.alloc(Region::Persistent, bytes)?,
                    dev.alloc(Region::Persistent, bytes)?,
                    dev.alloc(Region::Persistent, bytes)?,
                );
                fill(a, mat(a)?, 0.5)?;
                fill(b, mat(b)?, 0.25)?;
                let t = Instant::now();
                launch(
                    dev.as_ref(),
                    &kernels,
                    "gemm",
                    vec![
                        device_arg(mat(a)?, ArgTag::Input, a),
                        device_arg(mat(b)?, ArgTag::Input, b),
                        device_arg(mat(c)?, ArgTag::InOut, c),
                    ],
                    vec![1f64.to_bits(), 0f64.to_bits()],
                )?;
                times.push(t.elapsed());
                for blk in [a, b, c] {
                    dev.free(blk.addr)?;
                }
            } else {
                // n·I + 1: symmetric, diagonally dominant, positive definite.
                let a = dev.alloc(Region::Persistent, bytes)?;
                fill(a, mat(a)?, 1.0)?;
                fill(a, diag(a)?, f64::from(n) + 1.0)?;
                let t = Instant::now();
                launch(
                    dev.as_ref(),
                    &kernels,
                    "potrf",
                    vec![device_arg(mat(a)?, ArgTag::InOut, a)],
                    vec![],
                )?;
                times.push(t.elapsed());
                dev.free(a.addr)?;
            }
        }
        let secs = median(times.iter().map(Duration::as_secs_f64).collect());
        result(
            &format!("dense_{what}_{n}_{}", dtype.name().to_lowercase()),
            flops / secs / 1e12,
            "TFLOP/s",
        );
    }
    Ok(())
}

/// A chain of dependent tiny tasks: y ← αx + y, each on the last's y.
fn hop(cluster: &Cluster, n: usize) -> Fallible<()> {
    let w = cluster.workers()[0].id;
    let x = cluster.device_buffer(w, 64)?;
    let y = cluster.device_buffer(w, 64)?;
    let (xv, yv) = (x.tensor(&[16], DType::F32)?, y.tensor(&[16], DType::F32)?);
    let mut per = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        for _ in 0..n {
            cluster.submit(Task::new("axpy").input(&xv).inout(&yv).scalar_f64(1.0))?;
        }
        cluster.wait_all()?;
        per.push(t.elapsed().as_secs_f64() * 1e6 / n as f64);
    }
    result("chain_hop", median(per), "us");
    Ok(())
}

/// Independent tiny tasks: a fill of its own 64 bytes each.
fn throughput(cluster: &Cluster, n: usize) -> Fallible<()> {
    let w = cluster.workers()[0].id;
    let buf = cluster.device_buffer(w, 64 * n as u64)?;
    let views: Vec<_> = (0..n)
        .map(|i| buf.tensor_at(64 * i as u64, &[16], DType::F32))
        .collect::<Result<_, _>>()?;
    let mut rates = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        for v in &views {
            cluster.submit(Task::new("fill").output(v).scalar_f64(1.0))?;
        }
        cluster.wait_all()?;
        rates.push(n as f64 / t.elapsed().as_secs_f64());
    }
    result("independent_tasks", median(rates), "tasks/s");
    Ok(())
}

/// `c += a·b` on n×n F32 device buffers in tile×tile tasks.
fn gemm(cluster: &Cluster, n: u32, tile: u32) -> Fallible<()> {
    let w = cluster.workers()[0].id;
    let bytes = u64::from(n) * u64::from(n) * 4;
    let (a, b, c) = (
        cluster.device_buffer(w, bytes)?,
        cluster.device_buffer(w, bytes)?,
        cluster.device_buffer(w, bytes)?,
    );
    cluster.submit(
        Task::new("fill")
            .output(&a.tensor(&[n, n], DType::F32)?)
            .scalar_f64(0.5),
    )?;
    cluster.submit(
        Task::new("fill")
            .output(&b.tensor(&[n, n], DType::F32)?)
            .scalar_f64(0.25),
    )?;
    cluster.wait_all()?;
    let tiles = n / tile;
    let at = |buf: &strata_orchestrator::Buffer, i: u32, j: u32| {
        buf.view(
            (u64::from(i) * u64::from(tile) * u64::from(n) + u64::from(j) * u64::from(tile)) * 4,
            &[tile, tile],
            &[n, 1],
            DType::F32,
        )
    };
    let mut rates = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        for k in 0..tiles {
            for i in 0..tiles {
                for j in 0..tiles {
                    let task = if k == 0 {
                        Task::new("matmul")
                            .input(&at(&a, i, k)?)
                            .input(&at(&b, k, j)?)
                            .output(&at(&c, i, j)?)
                    } else {
                        Task::new("matmul_acc")
                            .input(&at(&a, i, k)?)
                            .input(&at(&b, k, j)?)
                            .inout(&at(&c, i, j)?)
                    };
                    cluster.submit(task)?;
                }
            }
        }
        cluster.wait_all()?;
        rates.push(2.0 * f64::from(n).powi(3) / t.elapsed().as_secs_f64() / 1e12);
    }
    // Every element of c is n · 0.5 · 0.25.
    let got: Vec<f32> = cluster
        .read_device(&c, 0, bytes)?
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let want = n as f32 * 0.125;
    if let Some((i, v)) = got
        .iter()
        .enumerate()
        .find(|(_, v)| (**v - want).abs() > want * 1e-3)
    {
        return Err(format!("tiled gemm: c[{i}] = {v}, want {want}").into());
    }
    result(
        &format!("tiled_gemm_{n}_tile{tile}"),
        median(rates),
        "TFLOP/s",
    );
    Ok(())
}
