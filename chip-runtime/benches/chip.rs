#![allow(missing_docs)] // criterion_group! generates undocumented items

//! Benchmarks of the chip runtime: F32 512×512×512 matmul on one lane
//! (throughput in FLOP/s: 2·m·k·n per iteration), in unified mode (the
//! kernel alone) and staged mode (with the copies), and persistent-region
//! allocation and free in ns per operation; what isolation costs: a
//! staged `fill` of a 1 MiB view tagged OUTPUT (its scratch zeroed),
//! OUTPUT_EXISTING (copied in) and a strided OUTPUT, and device
//! allocations (zeroed) of 4 KiB to 16 MiB; and the tiled-Cholesky
//! kernels (`potrf`, `trsm`, `syrk`, `gemm`) on 256² and 512² tiles in F32
//! and F64, in unified mode (the kernel alone; throughput in FLOP/s by the
//! usual counts: n³/3, n³, n³ and 2n³), and the F32 256² ones again in
//! place, on tiles of an 8192² matrix that come from memory.
//!
//! `cargo bench -p strata-chip-runtime --bench chip`

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use strata_chip_runtime::arena::{Arena, Region};
use strata_chip_runtime::{
    ArgBacking, Device, HostBuffer, Launch, LaunchArg, Registry, SimDevice, device,
};
use strata_wire::{
    Access, AddressSpace, ArgTag, Backing, BufferDescriptor, CanonicalIdentity, DType, Tensor,
};

const N: u32 = 512;

fn bench_matmul(c: &mut Criterion) {
    let reg = Registry::with_builtins();
    let kernel = reg.get(reg.find("matmul", 1).unwrap()).unwrap();
    let bytes = (N * N * 4) as usize;
    let mut group = c.benchmark_group("matmul_f32_512");
    group.throughput(Throughput::Elements(2 * u64::from(N).pow(3)));
    for mode in ["unified", "staged"] {
        let dev = SimDevice::from_spec(&format!("sim:mem=64MiB,mode={mode},lanes=1")).unwrap();
        let mats: Vec<(Arc<HostBuffer>, Tensor)> = (0..3)
            .map(|i| {
                let (host, t) = host_view(*b"benchmat", i + 1, bytes, &[N, N], &[N, 1], DType::F32);
                let vals: Vec<u8> = (0..N * N)
                    .flat_map(|j| ((j % 13) as f32 * 0.25 - i as f32).to_le_bytes())
                    .collect();
                host.write(0, &vals).unwrap();
                (host, t)
            })
            .collect();
        let arg = |i: usize, tag| LaunchArg {
            tensor: mats[i].1,
            tag,
            backing: ArgBacking::Host(mats[i].0.clone()),
            cache: None,
        };
        let launch = Launch {
            kernel: kernel.clone(),
            args: vec![
                arg(0, ArgTag::Input),
                arg(1, ArgTag::Input),
                arg(2, ArgTag::Output),
            ],
            scalars: vec![],
            gate: None,
            priority: 0,
        };
        bench_launch(&mut group, mode, &dev, &launch);
    }
    group.finish();
}

/// The four tile kernels, each repeated in place on its own tiles. The
/// tiles are chosen so that repeating stays finite: `potrf` factors a
/// diagonally dominant matrix, whose factor (mirrored) is again one;
/// `trsm` solves against a unit-diagonal triangle with tiny entries below.
fn bench_tile_kernels(c: &mut Criterion) {
    let reg = Registry::with_builtins();
    let dev = SimDevice::from_spec("sim:mem=64MiB,mode=unified,lanes=1").unwrap();
    for dtype in [DType::F32, DType::F64] {
        for n in [256u32, 512] {
            let n3 = u64::from(n).pow(3);
            let elem = (dtype.bits() / 8) as usize;
            let mut group = c.benchmark_group(format!("tile_{}_{n}", dtype.name().to_lowercase()));
            let tile = |i: u64, f: &dyn Fn(u32, u32) -> f64| {
                let bytes = n as usize * n as usize * elem;
                let (host, t) = host_view(*b"benchtil", i, bytes, &[n, n], &[n, 1], dtype);
                let vals: Vec<u8> = (0..n * n)
                    .flat_map(|k| {
                        let v = f(k / n, k % n);
                        if dtype == DType::F32 {
                            (v as f32).to_le_bytes().to_vec()
                        } else {
                            v.to_le_bytes().to_vec()
                        }
                    })
                    .collect();
                host.write(0, &vals).unwrap();
                LaunchArg {
                    tensor: t,
                    tag: ArgTag::InOut,
                    backing: ArgBacking::Host(host),
                    cache: None,
                }
            };
            let small = |i: u32, j: u32| ((i * 7 + j * 3) % 11) as f64 / (11.0 * f64::from(n));
            let dominant = move |i: u32, j: u32| {
                if i == j {
                    f64::from(n)
                } else {
                    small(i, j) * 1e-3
                }
            };
            let unit = move |i: u32, j: u32| if i == j { 1.0 } else { small(i, j) * 1e-3 };
            let input = |mut a: LaunchArg| {
                a.tag = ArgTag::Input;
                a
            };
            let cases: [(&str, u64, Vec<LaunchArg>, Vec<u64>); 4] = [
                ("potrf", n3 / 3, vec![tile(1, &dominant)], vec![]),
                (
                    "trsm",
                    n3,
                    vec![input(tile(2, &unit)), tile(3, &small)],
                    vec![],
                ),
                (
                    "syrk",
                    n3,
                    vec![input(tile(4, &small)), tile(5, &small)],
                    vec![],
                ),
                (
                    "gemm",
                    2 * n3,
                    vec![
                        input(tile(6, &small)),
                        input(tile(7, &small)),
                        tile(8, &small),
                    ],
                    vec![(-1f64).to_bits(), 1f64.to_bits()],
                ),
            ];
            for (name, flops, args, scalars) in cases {
                let launch = Launch {
                    kernel: reg.get(reg.find(name, 1).unwrap()).unwrap(),
                    args,
                    scalars,
                    gate: None,
                    priority: 0,
                };
                group.throughput(Throughput::Elements(flops));
                bench_launch(&mut group, name, &dev, &launch);
            }
            group.finish();
        }
    }
}

/// The tile kernels in place: on 256² tiles of one 8192² F32 matrix
/// (row stride 8192), a different tile triple each iteration, so the tiles
/// come from memory, as in a tiled Cholesky, and not from a cache the
/// previous iteration warmed (`scripts/openblas_in_situ.py` times
/// OpenBLAS the same way). The values are left to drift: only time counts.
fn bench_tile_in_situ(c: &mut Criterion) {
    const N: u32 = 8192;
    const B: u32 = 256;
    let reg = Registry::with_builtins();
    let dev = SimDevice::from_spec("sim:mem=64MiB,mode=unified,lanes=1").unwrap();
    let bytes = N as usize * N as usize * 4;
    let (host, whole) = host_view(*b"benchisi", 1, bytes, &[N, N], &[N, 1], DType::F32);
    // Small values, a dominant diagonal: nothing overflows for a while.
    let vals: Vec<u8> = (0..u64::from(N) * u64::from(N))
        .flat_map(|k| {
            let (i, j) = (k / u64::from(N), k % u64::from(N));
            let v = if i == j {
                4.0f32
            } else {
                ((k % 7) as f32) * 1e-4
            };
            v.to_le_bytes()
        })
        .collect();
    host.write(0, &vals).unwrap();
    let tile = |i: u32, j: u32, transposed: bool, tag: ArgTag| {
        let offset = (u64::from(i) * u64::from(N) + u64::from(j)) * u64::from(B) * 4;
        let strides = if transposed { [1, N] } else { [N, 1] };
        LaunchArg {
            tensor: Tensor::new(*whole.buffer(), offset, &[B, B], &strides, DType::F32).unwrap(),
            tag,
            backing: ArgBacking::Host(host.clone()),
            cache: None,
        }
    };
    // Tile triples (i > j > k), spread over the matrix by a fixed LCG.
    let tiles = N / B;
    let mut x = 12345u64;
    let triples: Vec<(u32, u32, u32)> = (0..256)
        .map(|_| {
            let mut pick = || {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((x >> 33) % u64::from(tiles)) as u32
            };
            let mut t = [pick(), pick(), pick()];
            t.sort_unstable();
            (
                t[2].max(t[1] + 1).min(tiles - 1),
                t[1].max(t[0] + 1).min(tiles - 2),
                t[0],
            )
        })
        .collect();
    let n3 = u64::from(B).pow(3);
    let mut group = c.benchmark_group("tile_in_situ_f32_256");
    for (name, flops) in [("gemm", 2 * n3), ("syrk", n3), ("trsm", n3)] {
        let kernel = reg.get(reg.find(name, 1).unwrap()).unwrap();
        let launches: Vec<Launch> = triples
            .iter()
            .map(|&(i, j, k)| {
                let (args, scalars) = match name {
                    // The Cholesky's update: c(i,j) -= a(i,k)·a(j,k)ᵀ.
                    "gemm" => (
                        vec![
                            tile(i, k, false, ArgTag::Input),
                            tile(j, k, true, ArgTag::Input),
                            tile(i, j, false, ArgTag::InOut),
                        ],
                        vec![(-1f64).to_bits(), 1f64.to_bits()],
                    ),
                    "syrk" => (
                        vec![
                            tile(i, k, false, ArgTag::Input),
                            tile(i, i, false, ArgTag::InOut),
                        ],
                        vec![],
                    ),
                    _ => (
                        vec![
                            tile(k, k, false, ArgTag::Input),
                            tile(i, k, false, ArgTag::InOut),
                        ],
                        vec![],
                    ),
                };
                Launch {
                    kernel: kernel.clone(),
                    args,
                    scalars,
                    gate: None,
                    priority: 0,
                }
            })
            .collect();
        group.throughput(Throughput::Elements(flops));
        let mut next = 0usize;
        group.bench_function(name, |b| {
            b.iter(|| {
                let l = launches[next % launches.len()].clone();
                next += 1;
                device::launch(&dev, l).unwrap().wait().unwrap()
            })
        });
    }
    group.finish();
}

/// Times `launch` on `dev`, from launch to completion.
fn bench_launch(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    dev: &SimDevice,
    launch: &Launch,
) {
    group.bench_function(name, |b| {
        b.iter(|| device::launch(dev, launch.clone()).unwrap().wait().unwrap())
    });
}

fn bench_arena(c: &mut Criterion) {
    let mut group = c.benchmark_group("persistent_region");
    let arena = Arena::new(1 << 30, 64, 64).unwrap();
    group.bench_function("alloc_free_pair", |b| {
        b.iter(|| {
            let blk = arena.alloc(Region::Persistent, black_box(4096)).unwrap();
            arena.free(Region::Persistent, blk.offset).unwrap()
        })
    });
    // With 10,000 blocks of mixed sizes live, allocate one and free the
    // oldest: the steady state of a long run.
    let mut live: std::collections::VecDeque<u64> = (0..10_000u64)
        .map(|i| {
            arena
                .alloc(Region::Persistent, 64 + (i * 7919) % 65_536)
                .unwrap()
                .offset
        })
        .collect();
    let mut i = 0u64;
    group.bench_function("alloc_free_10k_live", |b| {
        b.iter(|| {
            i += 1;
            let blk = arena
                .alloc(Region::Persistent, 64 + (i * 104_729) % 65_536)
                .unwrap();
            live.push_back(blk.offset);
            let old = live.pop_front().unwrap();
            arena.free(Region::Persistent, old).unwrap()
        })
    });
    group.finish();
}

/// A fresh host buffer of `nbytes` and a view of `dtype` over it from
/// byte 0.
fn host_view(
    owner: [u8; 8],
    i: u64,
    nbytes: usize,
    shape: &[u32],
    strides: &[u32],
    dtype: DType,
) -> (Arc<HostBuffer>, Tensor) {
    let host = HostBuffer::new(nbytes).unwrap();
    let id = CanonicalIdentity::new(owner, i, 1).unwrap();
    let buf = BufferDescriptor::new(
        id,
        nbytes as u64,
        AddressSpace::Host,
        Access::ReadWrite,
        Backing::Memfd {
            st_dev: 1,
            st_ino: i,
        },
    )
    .unwrap();
    let t = Tensor::new(buf, 0, shape, strides, dtype).unwrap();
    (Arc::new(host), t)
}

fn bench_isolation(c: &mut Criterion) {
    let reg = Registry::with_builtins();
    let fill = reg.get(reg.find("fill", 1).unwrap()).unwrap();
    let dev = SimDevice::from_spec("sim:mem=256MiB,mode=staged,lanes=1").unwrap();
    let mut group = c.benchmark_group("staged_fill_1MiB");
    let n = 256 * 1024u32;
    let contiguous = host_view(*b"benchiso", 1, 1 << 20, &[n], &[1], DType::F32);
    let strided = host_view(*b"benchiso", 2, 2 << 20, &[n], &[2], DType::F32);
    for (name, (host, t), tag) in [
        ("output", &contiguous, ArgTag::Output),
        ("output_existing", &contiguous, ArgTag::OutputExisting),
        ("strided_output", &strided, ArgTag::Output),
    ] {
        let launch = Launch {
            kernel: fill.clone(),
            args: vec![LaunchArg {
                tensor: *t,
                tag,
                backing: ArgBacking::Host(host.clone()),
                cache: None,
            }],
            scalars: vec![1f32.to_bits().into()],
            gate: None,
            priority: 0,
        };
        bench_launch(&mut group, name, &dev, &launch);
    }
    group.finish();
    let mut group = c.benchmark_group("device_alloc_free");
    for (name, nbytes) in [("4KiB", 4096u64), ("1MiB", 1 << 20), ("16MiB", 16 << 20)] {
        group.bench_function(name, |b| {
            b.iter(|| {
                let blk = dev.alloc(Region::Persistent, black_box(nbytes)).unwrap();
                dev.free(blk.addr).unwrap()
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    targets = bench_matmul, bench_arena, bench_isolation, bench_tile_kernels, bench_tile_in_situ
}
criterion_main!(benches);
