//! The tiled-factorization kernels (`potrf`, `trsm`, `syrk`, `gemm`)
//! against definitions computed here in f64, on F32 and F64, on row-major,
//! transposed and stepped views, with sizes on both sides of the
//! recursions' 32×32 base blocks, in staged and unified mode.
//!
//! Tolerances are normwise backward-error bounds: c·n·ε(dtype)·‖·‖ with
//! c = 8 (the recursions reorder sums; they do not change their length).

use strata_chip_runtime::{Device, Registry, SimDevice};
use strata_wire::check::Rng;
use strata_wire::{ArgTag, DType};

use crate::common::{CUDA_KEYS, HostTensor, Layout, MODES, eps, fill_with, host_tensor, read, run};

const SIZES: [u32; 9] = [1, 2, 7, 31, 32, 33, 64, 97, 130];

/// Runs `f` on each chip of the conformance list (seed 7000); `uses`
/// names the kernels it launches.
fn each_mode(uses: &[&str], f: impl FnMut(&dyn Device, &Registry, &mut Rng)) {
    crate::common::each_mode(7000, uses, f);
}

/// The layouts the dense kernels see: tiles of a larger matrix (which
/// `trsm` and `syrk` copy into packed blocks first when they are large)
/// besides the common ones.
const LAYOUTS: [Layout; 5] = [
    Layout::RowMajor,
    Layout::Transposed,
    Layout::Stepped,
    Layout::Tile,
    Layout::TransposedTile,
];

fn tensor(rng: &mut Rng, shape: &[u32], dtype: DType) -> HostTensor {
    let layout = rng.pick(&LAYOUTS);
    host_tensor(rng, shape, dtype, layout)
}

/// The tensor's elements as a row-major f64 matrix.
fn matrix(t: &HostTensor) -> Vec<Vec<f64>> {
    let b = t.bytes();
    let s = t.view.shape();
    (0..s[0] as usize)
        .map(|i| {
            (0..s[1] as usize)
                .map(|j| read(&b, &t.view, &[i, j]))
                .collect()
        })
        .collect()
}

fn norm(m: &[Vec<f64>]) -> f64 {
    m.iter().flatten().map(|v| v * v).sum::<f64>().sqrt()
}

fn assert_near(what: &str, got: &[Vec<f64>], want: &[Vec<f64>], tol: f64) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        for (j, (g, w)) in g.iter().zip(w).enumerate() {
            assert!(
                (g - w).abs() <= tol,
                "{what}: [{i}, {j}] is {g}, want {w} (tolerance {tol})"
            );
        }
    }
}

/// A symmetric positive definite matrix: m·mᵀ/n + I with m random.
fn spd(rng: &mut Rng, n: usize) -> Vec<Vec<f64>> {
    let m: Vec<Vec<f64>> = (0..n)
        .map(|_| {
            (0..n)
                .map(|_| (rng.next_u64() % 2001) as f64 / 1000.0 - 1.0)
                .collect()
        })
        .collect();
    (0..n)
        .map(|i| {
            (0..n)
                .map(|j| {
                    let dot: f64 = (0..n).map(|k| m[i][k] * m[j][k]).sum();
                    dot / n as f64 + if i == j { 1.0 } else { 0.0 }
                })
                .collect()
        })
        .collect()
}

#[test]
fn potrf_factors_and_leaves_the_upper_triangle() {
    each_mode(&["potrf"], |dev, reg, rng| {
        for dtype in [DType::F32, DType::F64] {
            for n in SIZES {
                let a = tensor(rng, &[n, n], dtype);
                let want = spd(rng, n as usize);
                // The strict upper triangle holds markers the kernel must keep.
                fill_with(&a, |ix| {
                    if ix[1] > ix[0] {
                        -7.0
                    } else {
                        want[ix[0]][ix[1]]
                    }
                });
                run(dev, reg, "potrf", vec![a.arg(ArgTag::InOut)], vec![]).unwrap();
                let got = matrix(&a);
                let n = n as usize;
                let l: Vec<Vec<f64>> = (0..n)
                    .map(|i| {
                        (0..n)
                            .map(|j| if j <= i { got[i][j] } else { 0.0 })
                            .collect()
                    })
                    .collect();
                let llt: Vec<Vec<f64>> = (0..n)
                    .map(|i| {
                        (0..n)
                            .map(|j| (0..n).map(|k| l[i][k] * l[j][k]).sum())
                            .collect()
                    })
                    .collect();
                let tol = 8.0 * n as f64 * eps(dtype) * norm(&want);
                assert_near(&format!("potrf {dtype} n={n}: L·Lᵀ"), &llt, &want, tol);
                for (i, row) in got.iter().enumerate() {
                    for (j, v) in row.iter().enumerate().skip(i + 1) {
                        assert_eq!(*v, -7.0, "potrf wrote the upper triangle at [{i}, {j}]");
                    }
                    assert!(row[i] > 0.0, "diagonal of L is positive");
                }
            }
        }
    });
}

#[test]
fn trsm_solves_against_the_transposed_triangle() {
    each_mode(&["trsm"], |dev, reg, rng| {
        for dtype in [DType::F32, DType::F64] {
            for n in SIZES {
                let m = rng.range(1, 80);
                let l = tensor(rng, &[n, n], dtype);
                // Well conditioned: a dominant diagonal; junk above it.
                fill_with(&l, |ix| match ix[1].cmp(&ix[0]) {
                    std::cmp::Ordering::Greater => 1e6,
                    std::cmp::Ordering::Equal => 2.0 + (ix[0] % 3) as f64,
                    std::cmp::Ordering::Less => ((ix[0] * 7 + ix[1] * 3) % 11) as f64 / 11.0 - 0.5,
                });
                let b = tensor(rng, &[m, n], dtype);
                let before = matrix(&b);
                run(
                    dev,
                    reg,
                    "trsm",
                    vec![l.arg(ArgTag::Input), b.arg(ArgTag::InOut)],
                    vec![],
                )
                .unwrap();
                let x = matrix(&b);
                let lm = matrix(&l);
                let (m, n) = (m as usize, n as usize);
                let back = times_lower_t(&x, &lm);
                let tol = 8.0 * n as f64 * eps(dtype) * norm(&before).max(1.0) * 4.0;
                assert_near(&format!("trsm {dtype} {m}×{n}: x·lᵀ"), &back, &before, tol);
            }
        }
    });
}

#[test]
fn syrk_updates_every_element() {
    each_mode(&["syrk"], |dev, reg, rng| {
        for dtype in [DType::F32, DType::F64] {
            for m in SIZES {
                let k = rng.range(1, 70);
                let a = tensor(rng, &[m, k], dtype);
                let c = tensor(rng, &[m, m], dtype);
                let (am, c0) = (matrix(&a), matrix(&c));
                run(
                    dev,
                    reg,
                    "syrk",
                    vec![a.arg(ArgTag::Input), c.arg(ArgTag::InOut)],
                    vec![],
                )
                .unwrap();
                let want = minus_a_at(&c0, &am);
                let tol = 8.0 * k as f64 * eps(dtype) * (norm(&am).powi(2) + norm(&c0));
                assert_near(
                    &format!("syrk {dtype} m={m} k={k}"),
                    &matrix(&c),
                    &want,
                    tol,
                );
            }
        }
    });
}

/// Runs `gemm` on random `m×k` and `k×n` operands of random layouts into a
/// random `m×n` `c` and checks `c ← alpha·a·b + beta·c` against the
/// definition in f64 (with `beta` zero, `c` holds NaN first: it must not
/// be read).
#[allow(clippy::too_many_arguments)]
fn check_gemm(
    dev: &dyn Device,
    reg: &Registry,
    rng: &mut Rng,
    dtype: DType,
    (m, k, n): (u32, u32, u32),
    alpha: f64,
    beta: f64,
) {
    let a = tensor(rng, &[m, k], dtype);
    let b = tensor(rng, &[k, n], dtype);
    let c = tensor(rng, &[m, n], dtype);
    if beta == 0.0 {
        fill_with(&c, |_| f64::NAN);
    }
    let (am, bm, c0) = (matrix(&a), matrix(&b), matrix(&c));
    run(
        dev,
        reg,
        "gemm",
        vec![
            a.arg(ArgTag::Input),
            b.arg(ArgTag::Input),
            c.arg(ArgTag::InOut),
        ],
        vec![f64::to_bits(alpha), f64::to_bits(beta)],
    )
    .unwrap();
    let (m, k, n) = (m as usize, k as usize, n as usize);
    let want: Vec<Vec<f64>> = (0..m)
        .map(|i| {
            (0..n)
                .map(|j| {
                    let ab: f64 = (0..k).map(|p| am[i][p] * bm[p][j]).sum();
                    let c = if beta == 0.0 { 0.0 } else { beta * c0[i][j] };
                    alpha * ab + c
                })
                .collect()
        })
        .collect();
    let scale = norm(&am) * norm(&bm) + if beta == 0.0 { 0.0 } else { 2.0 * norm(&c0) };
    let tol = 8.0 * k as f64 * eps(dtype) * scale;
    assert_near(
        &format!("gemm {dtype} {m}×{k}×{n}"),
        &matrix(&c),
        &want,
        tol,
    );
}

#[test]
fn gemm_scales_and_accumulates() {
    each_mode(&["gemm"], |dev, reg, rng| {
        for dtype in [DType::F32, DType::F64] {
            for (case, &n) in SIZES.iter().enumerate() {
                let (m, k) = (rng.range(1, 70), rng.range(1, 70));
                let (alpha, beta) = match case % 3 {
                    0 => (1.0, 0.0),
                    1 => (-1.0, 1.0),
                    _ => (0.5, -2.0),
                };
                check_gemm(dev, reg, rng, dtype, (m, k, n), alpha, beta);
            }
        }
    });
}

/// Shapes past the blocked GEMM's block sizes (256 deep, 96 rows and
/// 1024 columns at a time) and not multiples of its 6×16 and 6×8
/// register tiles, on every layout: each block edge and partial panel.
#[test]
fn gemm_is_right_across_block_edges() {
    let sims = ["sim:mem=64MiB,mode=unified"];
    crate::conformance::each_chip(7100, &sims, CUDA_KEYS, &["gemm"], |dev, reg, rng| {
        for dtype in [DType::F32, DType::F64] {
            for (case, &shape) in [
                (97, 257, 17),
                (13, 300, 1030),
                (200, 513, 33),
                (6, 8, 16),
                (5, 3, 9),
            ]
            .iter()
            .enumerate()
            {
                let (alpha, beta) = if case % 2 == 0 {
                    (-1.0, 1.0)
                } else {
                    (0.5, 0.0)
                };
                check_gemm(dev, reg, rng, dtype, shape, alpha, beta);
            }
        }
    });
}

#[test]
fn bad_inputs_are_named() {
    let reg = Registry::with_builtins();
    let dev = SimDevice::from_spec(MODES[0]).unwrap();
    let mut rng = Rng(5);
    // Not positive definite: the leading minor of order 2 is -3.
    let a = host_tensor(&mut rng, &[40, 40], DType::F64, LAYOUTS[0]);
    fill_with(&a, |ix| match (ix[0], ix[1]) {
        (i, j) if i == j && i != 1 => 1.0,
        (1, 1) => -2.0,
        (1, 0) | (0, 1) => 1.0,
        _ => 0.0,
    });
    let before = a.bytes();
    let err = run(&dev, &reg, "potrf", vec![a.arg(ArgTag::InOut)], vec![])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("not positive definite") && err.contains("order 2"),
        "{err}"
    );
    assert_eq!(
        a.bytes(),
        before,
        "a failed factorization leaves the tile as it was"
    );
    // A singular triangle.
    let l = host_tensor(&mut rng, &[40, 40], DType::F32, LAYOUTS[1]);
    fill_with(&l, |ix| {
        if ix[0] == ix[1] && ix[0] != 35 {
            1.0
        } else {
            0.0
        }
    });
    let b = host_tensor(&mut rng, &[3, 40], DType::F32, LAYOUTS[0]);
    let err = run(
        &dev,
        &reg,
        "trsm",
        vec![l.arg(ArgTag::Input), b.arg(ArgTag::InOut)],
        vec![],
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("l[35, 35] is zero"), "{err}");
    // Shapes that do not fit are refused before running.
    let c = host_tensor(&mut rng, &[4, 5], DType::F32, LAYOUTS[0]);
    let err = run(&dev, &reg, "potrf", vec![c.arg(ArgTag::InOut)], vec![])
        .unwrap_err()
        .to_string();
    assert!(err.contains("not square"), "{err}");
    let a = host_tensor(&mut rng, &[3, 4], DType::F32, LAYOUTS[0]);
    let c = host_tensor(&mut rng, &[4, 4], DType::F32, LAYOUTS[0]);
    let err = run(
        &dev,
        &reg,
        "syrk",
        vec![a.arg(ArgTag::Input), c.arg(ArgTag::InOut)],
        vec![],
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("needs 4 rows"), "{err}");
    // Mixed precision is refused.
    let a = host_tensor(&mut rng, &[4, 4], DType::F64, LAYOUTS[0]);
    let c = host_tensor(&mut rng, &[4, 4], DType::F32, LAYOUTS[0]);
    assert!(
        run(
            &dev,
            &reg,
            "syrk",
            vec![a.arg(ArgTag::Input), c.arg(ArgTag::InOut)],
            vec![],
        )
        .is_err()
    );
}

/// `syrk` and `trsm` on large tiles of wider matrices (the packed path):
/// right, and no byte between the tile's lines touched.
#[test]
fn tiles_of_wider_matrices_are_packed_and_written_back_in_place() {
    each_mode(&["trsm", "syrk"], |dev, reg, rng| {
        for layout in [Layout::Tile, Layout::TransposedTile] {
            let (m, k) = (130u32, 96u32);
            let a = host_tensor(rng, &[m, k], DType::F64, layout);
            let c = host_tensor(rng, &[m, m], DType::F64, layout);
            let (am, c0, before) = (matrix(&a), matrix(&c), c.bytes());
            run(
                dev,
                reg,
                "syrk",
                vec![a.arg(ArgTag::Input), c.arg(ArgTag::InOut)],
                vec![],
            )
            .unwrap();
            let want = minus_a_at(&c0, &am);
            let tol = 8.0 * k as f64 * eps(DType::F64) * (norm(&am).powi(2) + norm(&c0));
            assert_near(&format!("syrk on {layout:?}"), &matrix(&c), &want, tol);
            untouched_outside(&c, &before);

            let l = host_tensor(rng, &[m, m], DType::F64, layout);
            fill_with(&l, |ix| match ix[1].cmp(&ix[0]) {
                std::cmp::Ordering::Greater => 1e6,
                std::cmp::Ordering::Equal => 2.0,
                std::cmp::Ordering::Less => ((ix[0] * 7 + ix[1] * 3) % 11) as f64 / 11.0 - 0.5,
            });
            let b = host_tensor(rng, &[k, m], DType::F64, layout);
            let (b0, before) = (matrix(&b), b.bytes());
            run(
                dev,
                reg,
                "trsm",
                vec![l.arg(ArgTag::Input), b.arg(ArgTag::InOut)],
                vec![],
            )
            .unwrap();
            let back = times_lower_t(&matrix(&b), &matrix(&l));
            let tol = 32.0 * m as f64 * eps(DType::F64) * norm(&b0).max(1.0);
            assert_near(&format!("trsm on {layout:?}: x·lᵀ"), &back, &b0, tol);
            untouched_outside(&b, &before);
        }
    });
}

/// Every byte of `t`'s buffer outside its elements is as in `before`.
fn untouched_outside(t: &HostTensor, before: &[u8]) {
    let elem = (t.view.dtype().bits() / 8) as usize;
    let mut inside = vec![false; before.len()];
    let s = t.view.shape();
    for i in 0..s[0] as usize {
        for j in 0..s[1] as usize {
            let e = i * t.view.strides()[0] as usize + j * t.view.strides()[1] as usize;
            let at = t.view.byte_offset() as usize + e * elem;
            inside[at..at + elem].iter_mut().for_each(|x| *x = true);
        }
    }
    let now = t.bytes();
    for (at, ((&was, &is), &mine)) in before.iter().zip(&now).zip(&inside).enumerate() {
        assert!(mine || was == is, "byte {at} outside the view changed");
    }
}

/// `x·lᵀ` with only `l`'s lower triangle (what a `trsm` solution must give
/// back).
fn times_lower_t(x: &[Vec<f64>], l: &[Vec<f64>]) -> Vec<Vec<f64>> {
    x.iter()
        .map(|row| {
            (0..l.len())
                .map(|j| (0..=j).map(|p| row[p] * l[j][p]).sum())
                .collect()
        })
        .collect()
}

/// `c − a·aᵀ`, every element (`syrk`'s definition).
fn minus_a_at(c: &[Vec<f64>], a: &[Vec<f64>]) -> Vec<Vec<f64>> {
    c.iter()
        .enumerate()
        .map(|(i, row)| {
            row.iter()
                .enumerate()
                .map(|(j, v)| v - a[i].iter().zip(&a[j]).map(|(x, y)| x * y).sum::<f64>())
                .collect()
        })
        .collect()
}
