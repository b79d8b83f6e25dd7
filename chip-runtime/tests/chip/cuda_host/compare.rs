//! Running a kernel on the CPU and in the host build, and comparing the
//! buffers they leave.

use std::sync::Arc;

use half::{bf16, f16};
use strata_chip_runtime::kernel::cuda::{CudaSource, Grid, THREADS};
use strata_chip_runtime::{ArgBacking, HostBuffer, LaunchArg, Registry, Signature, SimDevice};
use strata_wire::check::Rng;
use strata_wire::{Access, AddressSpace, ArgTag, ChipTensor, DType, Tensor};

use super::data::Arg;
use super::{HostKernels, Shape, host_kernels, sources};
use crate::common::{MODES, eps, indices, run};

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
pub(crate) enum Expect {
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
pub(crate) fn element(bytes: &[u8], t: &Tensor, idx: &[usize]) -> ((f64, f64), u128) {
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
pub(crate) fn half_rounds_through_f32() -> bool {
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
pub(crate) fn by_rank(rng: &mut Rng, ranks: std::ops::RangeInclusive<u32>) -> Vec<Vec<u32>> {
    ranks
        .map(|rank| (0..rank).map(|_| rng.range(1, 6)).collect())
        .collect()
}

/// Runs kernel `name` for each of its dtypes on the shapes `shapes`
/// draws and the cases `make` draws for each (arguments and scalars,
/// given a dtype and a shape), on the CPU and the host build in every
/// launch shape, and checks them as `expect` says; returns (dtypes,
/// launches compared).
pub(crate) fn compare(
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

/// F16 results converted from a double: exact where the half crate
/// rounds as the prelude does.
pub(crate) fn from_double(dtype: DType, out: usize) -> Expect {
    if dtype == DType::F16 && !half_rounds_through_f32() {
        Expect::OneUlp { out }
    } else {
        Expect::Exact
    }
}
