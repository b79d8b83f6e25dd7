//! The CUDA sources, built for the host (the parent module), against the CPU
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

use half::{bf16, f16};
use strata_wire::DType;
use strata_wire::check::Rng;

use super::compare::{Expect, by_rank, compare, element, from_double, half_rounds_through_f32};
use super::data::{Data, arg, fill_value, float_bits};
use super::{Shape, host_kernels, sources};
use crate::common::indices;

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
