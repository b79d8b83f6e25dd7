//! The CUDA sources, built for the host (`cuda_cpu`), against the CPU
//! kernels: every source kernel, every dtype its signature takes, on
//! random views of every rank 1–5 (transposed, permuted, stepped, offset,
//! with gaps), each launched with several launch shapes (one thread per
//! block and the blocks in turn; a single block, so the grid-stride loop
//! does the work; blocks of several real threads, and of 256 for the row
//! kernels, whose `__syncthreads` are a barrier).
//!
//! Every byte of every buffer must come out as the CPU kernel left it —
//! the elements written and the bytes around them — bit for bit, except:
//! softmax and reduce_sum, whose sums run in another order, are within
//! 4·ε(dtype)·|want| + 1e-13·Σ|x|; and F16 results converted from a double
//! (axpy, fill) within one ulp where the half crate does not round
//! through f32 (it does on x86-64 with F16C).

use std::sync::Arc;

use half::{bf16, f16};
use strata_chip_runtime::kernel::cuda::{CudaSource, Grid, THREADS};
use strata_chip_runtime::{ArgBacking, HostBuffer, LaunchArg, Registry, Signature, SimDevice};
use strata_wire::check::Rng;
use strata_wire::{
    Access, AddressSpace, ArgTag, Backing, BufferDescriptor, CanonicalIdentity, ChipTensor, DType,
    Tensor,
};

use crate::common::{MODES, eps, indices, run};
use crate::cuda_cpu::{HostKernels, Shape, host_kernels, sources};

/// A tensor argument: its view and its buffer's bytes before the launch.
struct Arg {
    view: Tensor,
    bytes: Vec<u8>,
}

static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A view of `shape` laid out at random in a buffer of its own: the axes
/// stored in a random order, stepped by 1–3 elements, gaps after axes,
/// an offset before.
fn random_view(rng: &mut Rng, shape: &[u32], dtype: DType) -> Tensor {
    let n = shape.len();
    let mut order: Vec<usize> = (0..n).rev().collect();
    match rng.range(0, 2) {
        0 => {}
        1 => order.reverse(),
        _ => {
            for i in (1..n).rev() {
                order.swap(i, rng.range(0, i as u32) as usize);
            }
        }
    }
    let step = rng.pick(&[1u32, 1, 2, 3]);
    let mut strides = vec![0u32; n];
    let mut acc = 1u32;
    for &k in &order {
        strides[k] = acc * step;
        acc = strides[k] * shape[k] + rng.pick(&[0u32, 0, 1, 3]);
    }
    let offset = u64::from(rng.pick(&[0u32, 0, 1, 5]));
    let elem = u64::from(dtype.bits() / 8);
    let nbytes = (offset + u64::from(acc) + 4) * elem;
    let identity = CanonicalIdentity::new(
        *b"cudahost",
        NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        1,
    )
    .unwrap();
    let buf = BufferDescriptor::new(
        identity,
        nbytes,
        AddressSpace::Host,
        Access::ReadWrite,
        Backing::Memfd {
            st_dev: 1,
            st_ino: 1,
        },
    )
    .unwrap();
    Tensor::new(buf, offset * elem, shape, &strides, dtype).unwrap()
}

/// Values for the data: `Wide` is any finite value (integers: any bits,
/// moves: any bits at all), `Narrow` values of magnitude 1/16 to 16 or 0.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Data {
    Any,
    Wide,
    Narrow,
}

/// A random finite float of `bits` (16, 32 or 64) as its bits: `wide`
/// anywhere in the range, subnormals included; else 1/16 to 16 or 0.
fn float_bits(rng: &mut Rng, fmt: DType, wide: bool) -> u64 {
    let (exp_bits, man_bits) = match fmt {
        DType::F16 => (5, 10),
        DType::BF16 => (8, 7),
        DType::F32 => (8, 23),
        _ => (11, 52),
    };
    let bias = (1u64 << (exp_bits - 1)) - 1;
    let sign = rng.next_u64() & 1;
    let man = rng.next_u64() & ((1u64 << man_bits) - 1);
    let exp = if wide {
        rng.next_u64() % ((1u64 << exp_bits) - 1)
    } else if rng.range(0, 15) == 0 {
        return 0;
    } else {
        bias - 4 + rng.next_u64() % 8
    };
    (sign << (exp_bits + man_bits)) | (exp << man_bits) | man
}

fn random_bytes(rng: &mut Rng, dtype: DType, len: usize, data: Data) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 16);
    let (part, width) = match dtype {
        DType::C64 => (DType::F32, 4),
        DType::C128 => (DType::F64, 8),
        d if matches!(d, DType::F32 | DType::F64 | DType::F16 | DType::BF16) => {
            (d, d.bits() as usize / 8)
        }
        _ => (DType::U8, 1),
    };
    while out.len() < len {
        let v = if data == Data::Any || part == DType::U8 {
            rng.next_u64()
        } else {
            float_bits(rng, part, data == Data::Wide)
        };
        out.extend_from_slice(&v.to_le_bytes()[..width]);
    }
    out.truncate(len);
    out
}

fn arg(rng: &mut Rng, shape: &[u32], dtype: DType, data: Data) -> Arg {
    let view = random_view(rng, shape, dtype);
    let bytes = random_bytes(rng, dtype, view.buffer().nbytes() as usize, data);
    Arg { view, bytes }
}

/// Runs the CPU kernel `desc` on `args`; the buffers after.
fn run_cpu(
    dev: &SimDevice,
    reg: &Registry,
    desc: &Signature,
    args: &[Arg],
    scalars: &[u64],
) -> Vec<Vec<u8>> {
    let hosts: Vec<Arc<HostBuffer>> = args
        .iter()
        .map(|a| {
            let h = Arc::new(HostBuffer::new(a.bytes.len()).unwrap());
            h.write(0, &a.bytes).unwrap();
            h
        })
        .collect();
    let launch_args = args
        .iter()
        .zip(&hosts)
        .zip(&desc.args)
        .map(|((a, h), spec)| LaunchArg {
            tensor: a.view,
            tag: match spec.access {
                Access::Read => ArgTag::Input,
                Access::Write => ArgTag::Output,
                _ => ArgTag::InOut,
            },
            backing: ArgBacking::Host(h.clone()),
            cache: None,
        })
        .collect();
    run(dev, reg, &desc.name, launch_args, scalars.to_vec())
        .unwrap_or_else(|e| panic!("CPU {}: {e}", desc.name));
    hosts.iter().map(|h| h.to_vec()).collect()
}

/// Runs the host build of `symbol` on `args` with launch shape `shape`;
/// the buffers after.
fn run_host(
    k: &HostKernels,
    symbol: &str,
    args: &[Arg],
    scalars: &[u64],
    shape: Shape,
) -> Vec<Vec<u8>> {
    // u128 storage: every element type's alignment.
    let mut bufs: Vec<Vec<u128>> = args
        .iter()
        .map(|a| {
            let mut b = vec![0u128; a.bytes.len().div_ceil(16)];
            as_bytes(&mut b)[..a.bytes.len()].copy_from_slice(&a.bytes);
            b
        })
        .collect();
    let tensors: Vec<ChipTensor> = args
        .iter()
        .zip(bufs.iter_mut())
        .map(|(a, b)| {
            let addr = b.as_mut_ptr() as u64;
            ChipTensor::from_view(&a.view, addr, a.bytes.len() as u64, AddressSpace::Host).unwrap()
        })
        .collect();
    // SAFETY: each tensor lies within its own buffer (from_view checked
    // the extent against the length), which lives past the call and is
    // not otherwise touched during it; tensors and scalars follow the
    // kernel's signature.
    unsafe { k.launch(symbol, &tensors, scalars, shape) };
    bufs.iter_mut()
        .zip(args)
        .map(|(b, a)| as_bytes(b)[..a.bytes.len()].to_vec())
        .collect()
}

fn as_bytes(b: &mut [u128]) -> &mut [u8] {
    // SAFETY: u128 has no padding and any byte is a valid u8; the slice
    // covers exactly the u128s' memory, borrowed mutably.
    unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr().cast::<u8>(), b.len() * 16) }
}

/// The launch shapes a case runs with.
fn shapes(grid: Grid, args: &[Arg]) -> Vec<Shape> {
    let one = |blocks, threads| Shape { blocks, threads };
    match grid {
        Grid::Elements(n) => {
            let numel = args[n].view.element_count();
            let full = numel.div_ceil(u64::from(THREADS)).min(65_535 * 32) as u32;
            vec![one((full, 1), 1), one((1, 1), 1), one((3, 1), 4)]
        }
        Grid::Rows(n) => {
            let v = &args[n].view;
            let rows = v.element_count() / u64::from(*v.shape().last().unwrap());
            let mut s = vec![one((rows as u32, 1), 1), one((2, 2), 7)];
            if rows <= 6 {
                s.push(one((rows as u32, 1), THREADS));
            }
            s
        }
        Grid::Fixed {
            blocks, threads, ..
        } => vec![one((blocks[0], blocks[1]), threads[0])],
    }
}

/// How the host build's buffers must match the CPU kernel's.
#[derive(Clone, Copy)]
enum Expect {
    /// Bit for bit.
    Exact,
    /// Argument `out`'s elements within one unit in the last place (16-bit
    /// floats); every other byte bit for bit.
    OneUlp { out: usize },
    /// Argument `out`'s elements within the reduction tolerance (module
    /// docs) for inputs of total magnitude `scale`; every other byte bit
    /// for bit.
    Close { out: usize, scale: f64 },
}

/// Element `idx` of `t` in `bytes`, as (real, imaginary) and as raw bits.
fn element(bytes: &[u8], t: &Tensor, idx: &[usize]) -> ((f64, f64), u128) {
    let elem = (t.dtype().bits() / 8) as usize;
    let at = t.byte_offset() as usize
        + elem
            * idx
                .iter()
                .zip(t.strides())
                .map(|(&i, &s)| i * s as usize)
                .sum::<usize>();
    let b = &bytes[at..at + elem];
    let mut raw = [0u8; 16];
    raw[..elem].copy_from_slice(b);
    let f4 = |b: &[u8]| f64::from(f32::from_le_bytes(b.try_into().unwrap()));
    let f8 = |b: &[u8]| f64::from_le_bytes(b.try_into().unwrap());
    let v = match t.dtype() {
        DType::F32 => (f4(b), 0.0),
        DType::F64 => (f8(b), 0.0),
        DType::F16 => (f16::from_le_bytes([b[0], b[1]]).to_f64(), 0.0),
        DType::BF16 => (bf16::from_le_bytes([b[0], b[1]]).to_f64(), 0.0),
        DType::C64 => (f4(&b[..4]), f4(&b[4..])),
        DType::C128 => (f8(&b[..8]), f8(&b[8..])),
        _ => (f64::NAN, f64::NAN),
    };
    (v, u128::from_le_bytes(raw))
}

/// The byte positions of `t`'s elements.
fn element_bytes(t: &Tensor) -> Vec<usize> {
    let elem = (t.dtype().bits() / 8) as usize;
    let mut out = Vec::new();
    for idx in indices(t.shape()) {
        let e: usize = idx
            .iter()
            .zip(t.strides())
            .map(|(&i, &s)| i * s as usize)
            .sum();
        let at = t.byte_offset() as usize + e * elem;
        out.extend(at..at + elem);
    }
    out
}

fn check(what: &str, args: &[Arg], want: &[Vec<u8>], got: &[Vec<u8>], expect: Expect) {
    let out = match expect {
        Expect::Exact => None,
        Expect::OneUlp { out } | Expect::Close { out, .. } => Some(out),
    };
    for (i, (w, g)) in want.iter().zip(got).enumerate() {
        if Some(i) != out {
            if let Some(at) = w.iter().zip(g).position(|(a, b)| a != b) {
                panic!(
                    "{what}: argument {i}'s byte {at} is {:#04x}, the CPU kernel's {:#04x}",
                    g[at], w[at]
                );
            }
            continue;
        }
        let t = &args[i].view;
        let mut outside = w.clone();
        let mut got_outside = g.clone();
        for at in element_bytes(t) {
            outside[at] = 0;
            got_outside[at] = 0;
        }
        assert!(
            outside == got_outside,
            "{what}: argument {i} changed outside its elements"
        );
        for idx in indices(t.shape()) {
            let ((wr, wi), wbits) = element(w, t, &idx);
            let ((gr, gi), gbits) = element(g, t, &idx);
            if wbits == gbits {
                continue;
            }
            let ok = match expect {
                Expect::OneUlp { .. } => (wbits as i128 - gbits as i128).abs() <= 1,
                Expect::Close { scale, .. } => {
                    let tol = |v: f64| 4.0 * eps_of(t.dtype()) * v.abs() + 1e-13 * scale;
                    (wr - gr).abs() <= tol(wr) && (wi - gi).abs() <= tol(wi)
                }
                Expect::Exact => false,
            };
            assert!(
                ok,
                "{what}: argument {i} at {idx:?} is ({gr}, {gi}) = {gbits:#x}, the CPU kernel's ({wr}, {wi}) = {wbits:#x}"
            );
        }
    }
}

fn eps_of(dtype: DType) -> f64 {
    match dtype {
        DType::C64 => eps(DType::F32),
        DType::C128 => eps(DType::F64),
        d => eps(d),
    }
}

/// Whether the half crate converts f64 to F16 through f32 here (with
/// F16C), as the prelude does; elsewhere its result may differ by an ulp.
fn half_rounds_through_f32() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The source body of built-in `name`.
fn source(name: &str) -> (Signature, CudaSource) {
    sources()
        .into_iter()
        .find(|(d, _)| d.name == name)
        .unwrap_or_else(|| panic!("{name} has no source body"))
}

/// The dtypes the first argument of `desc` takes.
fn dtypes(desc: &Signature) -> Vec<DType> {
    match &desc.args[0].dtypes {
        strata_chip_runtime::kernel::DTypes::OneOf(list) => list.clone(),
        other => panic!("{}: dtypes {other:?}", desc.name),
    }
}

/// One random shape of each rank in `ranks`, axes 1 to 6 long.
fn by_rank(rng: &mut Rng, ranks: std::ops::RangeInclusive<u32>) -> Vec<Vec<u32>> {
    ranks
        .map(|rank| (0..rank).map(|_| rng.range(1, 6)).collect())
        .collect()
}

/// Runs kernel `name` for each of its dtypes on the shapes `shapes`
/// draws and the cases `make` draws for each (arguments and scalars,
/// given a dtype and a shape), on the CPU and the host build in every
/// launch shape, and checks them as `expect` says; returns (dtypes,
/// launches compared).
fn compare(
    name: &str,
    seed: u64,
    shapes_of: impl Fn(&mut Rng) -> Vec<Vec<u32>>,
    mut make: impl FnMut(&mut Rng, DType, &[u32]) -> (Vec<Arg>, Vec<u64>, Expect),
) -> Option<(usize, usize)> {
    let k = host_kernels()?;
    let (desc, source) = self::source(name);
    let dev = SimDevice::from_spec(MODES[1]).unwrap();
    let reg = Registry::with_builtins();
    let mut rng = Rng(seed);
    let mut launches = 0;
    let list = dtypes(&desc);
    for &dtype in &list {
        let symbol = source.entry.symbol(Some(dtype));
        for shape in shapes_of(&mut rng) {
            let (args, scalars, expect) = make(&mut rng, dtype, &shape);
            let want = run_cpu(&dev, &reg, &desc, &args, &scalars);
            for s in shapes(source.grid, &args) {
                let got = run_host(k, &symbol, &args, &scalars, s);
                let what = format!("{symbol} on {shape:?} with {s:?}");
                check(&what, &args, &want, &got, expect);
                launches += 1;
            }
        }
    }
    println!(
        "{name}: {} dtypes, {launches} launches match the CPU kernel",
        list.len()
    );
    Some((list.len(), launches))
}

/// The value of a `fill` of `dtype`: for integers any value of the
/// dtype's range (sign-extended for signed dtypes), for the others an
/// f64 from a list of roundings worth checking or any finite one.
fn fill_value(rng: &mut Rng, dtype: DType) -> u64 {
    let r = rng.next_u64();
    match dtype {
        DType::I8 => r as i8 as i64 as u64,
        DType::I16 => r as i16 as i64 as u64,
        DType::I32 => r as i32 as i64 as u64,
        DType::U8 => r as u8 as u64,
        DType::U16 => r as u16 as u64,
        DType::U32 => r as u32 as u64,
        DType::I64 | DType::U64 => r,
        _ => {
            let special = [
                0.1,
                1.0 / 3.0,
                -0.0,
                65_519.0,                             // F16: rounds down to its largest
                65_520.0,                             // F16: rounds to infinity
                1e-8,                                 // F16: subnormal
                1e39,                                 // F32: infinity
                1.0 + 2f64.powi(-11),                 // F16: a tie, to even
                1.0 + 2f64.powi(-8) + 2f64.powi(-40), // BF16: above a tie only in the low bits
            ];
            match rng.range(0, 2) {
                0 => rng.pick(&special).to_bits(),
                1 => float_bits(rng, DType::F64, false),
                _ => float_bits(rng, DType::F64, true),
            }
        }
    }
}

/// F16 results converted from a double: exact where the half crate
/// rounds as the prelude does.
fn from_double(dtype: DType, out: usize) -> Expect {
    if dtype == DType::F16 && !half_rounds_through_f32() {
        Expect::OneUlp { out }
    } else {
        Expect::Exact
    }
}

#[test]
fn fill_matches_the_cpu_kernel() {
    compare(
        "fill",
        11,
        |r| by_rank(r, 1..=5),
        |rng, dtype, shape| {
            let out = arg(rng, shape, dtype, Data::Any);
            let value = fill_value(rng, dtype);
            (vec![out], vec![value], from_double(dtype, 0))
        },
    );
}

#[test]
fn copy_matches_the_cpu_kernel() {
    compare(
        "copy",
        12,
        |r| by_rank(r, 1..=5),
        |rng, dtype, shape| {
            let args = vec![
                arg(rng, shape, dtype, Data::Any),
                arg(rng, shape, dtype, Data::Any),
            ];
            (args, vec![], Expect::Exact)
        },
    );
}

fn binary(name: &str, seed: u64) {
    compare(
        name,
        seed,
        |r| by_rank(r, 1..=5),
        |rng, dtype, shape| {
            let args = vec![
                arg(rng, shape, dtype, Data::Wide),
                arg(rng, shape, dtype, Data::Wide),
                arg(rng, shape, dtype, Data::Any),
            ];
            (args, vec![], Expect::Exact)
        },
    );
}

#[test]
fn add_matches_the_cpu_kernel() {
    binary("add", 13);
}

#[test]
fn mul_matches_the_cpu_kernel() {
    binary("mul", 14);
}

#[test]
fn axpy_matches_the_cpu_kernel() {
    compare(
        "axpy",
        15,
        |r| by_rank(r, 1..=5),
        |rng, dtype, shape| {
            let args = vec![
                arg(rng, shape, dtype, Data::Wide),
                arg(rng, shape, dtype, Data::Wide),
            ];
            let alpha = float_bits(rng, DType::F64, false);
            (args, vec![alpha], from_double(dtype, 1))
        },
    );
}

#[test]
fn transpose_matches_the_cpu_kernel() {
    compare(
        "transpose",
        16,
        |r| by_rank(r, 2..=5),
        |rng, dtype, shape| {
            let mut swapped = shape.to_vec();
            let n = swapped.len();
            swapped.swap(n - 2, n - 1);
            let args = vec![
                arg(rng, shape, dtype, Data::Any),
                arg(rng, &swapped, dtype, Data::Any),
            ];
            (args, vec![], Expect::Exact)
        },
    );
}

/// Shapes for the row kernels: one of each rank, and rows that blocks of
/// 256 threads share (shorter and longer than the block).
fn row_shapes(rng: &mut Rng) -> Vec<Vec<u32>> {
    let mut s = by_rank(rng, 1..=5);
    s.extend([
        vec![2, 300],
        vec![3, 37],
        vec![1, 1],
        vec![5],
        vec![2, 1, 3],
    ]);
    s
}

#[test]
fn softmax_matches_the_cpu_kernel() {
    compare("softmax", 17, row_shapes, |rng, dtype, shape| {
        let args = vec![
            arg(rng, shape, dtype, Data::Narrow),
            arg(rng, shape, dtype, Data::Any),
        ];
        (args, vec![], Expect::Close { out: 1, scale: 1.0 })
    });
}

#[test]
fn reduce_sum_matches_the_cpu_kernel() {
    compare("reduce_sum", 18, row_shapes, |rng, dtype, shape| {
        let out_shape = if shape.len() == 1 {
            vec![1]
        } else {
            shape[..shape.len() - 1].to_vec()
        };
        let x = arg(rng, shape, dtype, Data::Narrow);
        let scale: f64 = indices(shape)
            .iter()
            .map(|idx| {
                let ((re, im), _) = element(&x.bytes, &x.view, idx);
                re.abs() + im.abs()
            })
            .sum();
        let args = vec![x, arg(rng, &out_shape, dtype, Data::Any)];
        (args, vec![], Expect::Close { out: 1, scale })
    });
}

/// The host build defines every entry of every source body, and the
/// no-argument `noop` launches.
#[test]
fn the_host_build_defines_every_entry() {
    let Some(k) = host_kernels() else { return };
    let mut entries = 0;
    for (desc, source) in sources() {
        for symbol in source.symbols(&desc) {
            assert!(
                k.defines(&format!("strata_run_{symbol}")),
                "{symbol} is not defined"
            );
            assert!(k.defines(&symbol), "{symbol}'s kernel is not defined");
            entries += 1;
        }
    }
    assert_eq!(entries, 93, "entries of the nine source bodies");
    // SAFETY: noop takes no tensor and no scalar.
    unsafe {
        k.launch(
            "noop",
            &[],
            &[],
            Shape {
                blocks: (1, 1),
                threads: 1,
            },
        )
    };
}

/// The prelude's 16-bit float conversions against the half crate's: every
/// F16 and BF16 to float, and to F16 and BF16 from random floats and
/// doubles of every magnitude, from the edges of the 16-bit ranges.
#[test]
fn the_preludes_conversions_round_as_the_half_crate() {
    let Some(k) = host_kernels() else { return };
    // SAFETY: each type is the C signature in cuda_cpu's CONVERSIONS.
    let (f16_to, bf16_to, f16_from_f, bf16_from_f, f16_from_d, bf16_from_d) = unsafe {
        (
            k.conversion::<unsafe extern "C" fn(u16) -> f32>("strata_test_f16_to_float"),
            k.conversion::<unsafe extern "C" fn(u16) -> f32>("strata_test_bf16_to_float"),
            k.conversion::<unsafe extern "C" fn(f32) -> u16>("strata_test_f16_from_float"),
            k.conversion::<unsafe extern "C" fn(f32) -> u16>("strata_test_bf16_from_float"),
            k.conversion::<unsafe extern "C" fn(f64) -> u16>("strata_test_f16_from_double"),
            k.conversion::<unsafe extern "C" fn(f64) -> u16>("strata_test_bf16_from_double"),
        )
    };
    for b in 0..=u16::MAX {
        // SAFETY: plain value functions.
        let (h, bf) = unsafe { (f16_to(b), bf16_to(b)) };
        assert_eq!(
            h.to_bits(),
            f16::from_bits(b).to_f32().to_bits(),
            "f16 {b:#06x}"
        );
        assert_eq!(
            bf.to_bits(),
            bf16::from_bits(b).to_f32().to_bits(),
            "bf16 {b:#06x}"
        );
    }
    let exact_f16_from_double = half_rounds_through_f32();
    let mut rng = Rng(19);
    for i in 0..200_000u32 {
        // Any bits; or near the 16-bit ranges (exponents -30..20), where
        // subnormals, ties and overflow are.
        let d = if i % 2 == 0 {
            f64::from_bits(rng.next_u64())
        } else {
            let e = i64::from(rng.range(0, 50)) - 30 + 1023;
            f64::from_bits((rng.next_u64() & 0x800F_FFFF_FFFF_FFFF) | ((e as u64) << 52))
        };
        let f = d as f32;
        // SAFETY: plain value functions.
        let got = unsafe { (f16_from_f(f), bf16_from_f(f), f16_from_d(d), bf16_from_d(d)) };
        assert_eq!(
            got.0,
            f16::from_f32(f).to_bits(),
            "f16 from float {f:e} ({:#x})",
            f.to_bits()
        );
        assert_eq!(
            got.1,
            bf16::from_f32(f).to_bits(),
            "bf16 from float {f:e} ({:#x})",
            f.to_bits()
        );
        assert_eq!(
            got.3,
            bf16::from_f64(d).to_bits(),
            "bf16 from double {d:e} ({:#x})",
            d.to_bits()
        );
        let want = f16::from_f64(d).to_bits();
        let close = got.2 == want || (!d.is_nan() && got.2.abs_diff(want) <= 1);
        assert!(
            got.2 == want || (!exact_f16_from_double && close),
            "f16 from double {d:e} ({:#x}): {:#06x}, the half crate's {want:#06x}",
            d.to_bits(),
            got.2
        );
    }
}
