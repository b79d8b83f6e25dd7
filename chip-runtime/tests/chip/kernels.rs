//! Every built-in kernel against a naive reference, on row-major, transposed
//! and stepped views, in staged and unified mode, within a tolerance per
//! dtype:
//! - exact for moves (copy, transpose, fill) and integer arithmetic;
//! - elementwise float ops: the reference rounded to the dtype, ± 1 ulp;
//! - matmul: 4·k·ε(f32)·Σ|a||b| for the f32 accumulation plus ε(dtype)·|c|
//!   for the final rounding;
//! - reduce_sum, softmax: ε(dtype)·(Σ|x| or 1) plus 1e-12.

use strata_chip_runtime::{Device, Registry};
use strata_wire::check::Rng;
use strata_wire::{ArgTag, DType};

use crate::common::{
    CUDA_KEYS, LAYOUTS, MODES, any_layout, eps, host_tensor, indices, read, run, shape,
};

fn check_close(what: &str, got: f64, want: f64, tol: f64) {
    assert!(
        (got - want).abs() <= tol,
        "{what}: got {got}, want {want} (tolerance {tol})"
    );
}

/// Runs `f` for each mode (seeds from 1000).
fn each_mode(uses: &[&str], f: impl FnMut(&dyn Device, &Registry, &mut Rng)) {
    crate::common::each_mode(1000, uses, f);
}

#[test]
fn fill() {
    each_mode(&["fill"], |dev, reg, rng| {
        for dtype in [
            DType::F32,
            DType::F64,
            DType::F16,
            DType::BF16,
            DType::I32,
            DType::I64,
            DType::U8,
        ] {
            for layout in LAYOUTS {
                let rank = rng.range(1, 4);
                let s = shape(rng, rank);
                let out = host_tensor(rng, &s, dtype, layout);
                let (scalar, want) = if dtype.bits() >= 16
                    && matches!(dtype, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
                {
                    (1.5f64.to_bits(), 1.5)
                } else if dtype == DType::U8 {
                    (200, 200.0)
                } else {
                    ((-7i64) as u64, -7.0)
                };
                run(
                    dev,
                    reg,
                    "fill",
                    vec![out.arg(ArgTag::Output)],
                    vec![scalar],
                )
                .unwrap();
                let bytes = out.bytes();
                for idx in indices(out.view.shape()) {
                    assert_eq!(
                        read(&bytes, &out.view, &idx),
                        want,
                        "{dtype} {layout:?} {idx:?}"
                    );
                }
            }
        }
    });
}

#[test]
fn copy_and_transpose_move_elements_exactly() {
    each_mode(&["copy", "transpose"], |dev, reg, rng| {
        for dtype in [DType::F32, DType::F64, DType::BF16, DType::I64, DType::U8] {
            for _ in 0..6 {
                let rank = rng.range(2, 4);
                let s = shape(rng, rank);
                let src = any_layout(rng, &s, dtype);
                let dst = any_layout(rng, &s, dtype);
                run(
                    dev,
                    reg,
                    "copy",
                    vec![src.arg(ArgTag::Input), dst.arg(ArgTag::Output)],
                    vec![],
                )
                .unwrap();
                let (sb, db) = (src.bytes(), dst.bytes());
                for idx in indices(&s) {
                    assert_eq!(read(&db, &dst.view, &idx), read(&sb, &src.view, &idx));
                }
                let mut ts = s.clone();
                ts.swap(rank as usize - 2, rank as usize - 1);
                let out = any_layout(rng, &ts, dtype);
                run(
                    dev,
                    reg,
                    "transpose",
                    vec![src.arg(ArgTag::Input), out.arg(ArgTag::Output)],
                    vec![],
                )
                .unwrap();
                let ob = out.bytes();
                for idx in indices(&s) {
                    let mut t = idx.clone();
                    t.swap(rank as usize - 2, rank as usize - 1);
                    assert_eq!(read(&ob, &out.view, &t), read(&sb, &src.view, &idx));
                }
            }
        }
    });
}

#[test]
fn add_mul_axpy() {
    each_mode(&["add", "axpy", "mul"], |dev, reg, rng| {
        for dtype in [
            DType::F32,
            DType::F64,
            DType::F16,
            DType::BF16,
            DType::I32,
            DType::U8,
        ] {
            for _ in 0..6 {
                let rank = rng.range(1, 4);
                let s = shape(rng, rank);
                let a = any_layout(rng, &s, dtype);
                let b = any_layout(rng, &s, dtype);
                for (name, op) in [
                    ("add", (|x: f64, y: f64| x + y) as fn(f64, f64) -> f64),
                    ("mul", |x, y| x * y),
                ] {
                    let out = any_layout(rng, &s, dtype);
                    let args = vec![
                        a.arg(ArgTag::Input),
                        b.arg(ArgTag::Input),
                        out.arg(ArgTag::Output),
                    ];
                    run(dev, reg, name, args, vec![]).unwrap();
                    let (ab, bb, ob) = (a.bytes(), b.bytes(), out.bytes());
                    for idx in indices(&s) {
                        let mut want = op(read(&ab, &a.view, &idx), read(&bb, &b.view, &idx));
                        if dtype == DType::U8 {
                            want = want.rem_euclid(256.0);
                        }
                        let got = read(&ob, &out.view, &idx);
                        check_close(
                            &format!("{name} {dtype}"),
                            got,
                            want,
                            eps(dtype) * want.abs(),
                        );
                    }
                }
                if matches!(dtype, DType::F32 | DType::F64 | DType::F16 | DType::BF16) {
                    let y = any_layout(rng, &s, dtype);
                    let before = y.bytes();
                    let alpha = -0.75f64;
                    run(
                        dev,
                        reg,
                        "axpy",
                        vec![a.arg(ArgTag::Input), y.arg(ArgTag::InOut)],
                        vec![alpha.to_bits()],
                    )
                    .unwrap();
                    let (ab, yb) = (a.bytes(), y.bytes());
                    for idx in indices(&s) {
                        let want = alpha * read(&ab, &a.view, &idx) + read(&before, &y.view, &idx);
                        check_close(
                            "axpy",
                            read(&yb, &y.view, &idx),
                            want,
                            eps(dtype) * want.abs() + 1e-12,
                        );
                    }
                }
            }
        }
    });
}

fn matmul_case(dev: &dyn Device, reg: &Registry, rng: &mut Rng, dtype: DType, accumulate: bool) {
    let (m, k, n) = (rng.range(1, 9), rng.range(1, 9), rng.range(1, 9));
    let a = any_layout(rng, &[m, k], dtype);
    let b = any_layout(rng, &[k, n], dtype);
    let c = any_layout(rng, &[m, n], dtype);
    let c_before = c.bytes();
    let (name, tag) = if accumulate {
        ("matmul_acc", ArgTag::InOut)
    } else {
        ("matmul", ArgTag::Output)
    };
    run(
        dev,
        reg,
        name,
        vec![a.arg(ArgTag::Input), b.arg(ArgTag::Input), c.arg(tag)],
        vec![],
    )
    .unwrap();
    let (ab, bb, cb) = (a.bytes(), b.bytes(), c.bytes());
    for i in 0..m as usize {
        for j in 0..n as usize {
            let mut want = if accumulate {
                read(&c_before, &c.view, &[i, j])
            } else {
                0.0
            };
            let mut magnitude = want.abs();
            for p in 0..k as usize {
                let prod = read(&ab, &a.view, &[i, p]) * read(&bb, &b.view, &[p, j]);
                want += prod;
                magnitude += prod.abs();
            }
            let tol = 4.0 * f64::from(k + 1) * eps(DType::F32) * magnitude
                + eps(dtype) * want.abs()
                + 1e-12;
            check_close(
                &format!("{name} {dtype} [{m}x{k}x{n}] ({i},{j})"),
                read(&cb, &c.view, &[i, j]),
                want,
                tol,
            );
        }
    }
}

#[test]
fn matmul_and_matmul_acc() {
    each_mode(&["matmul", "matmul_acc"], |dev, reg, rng| {
        for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            for _ in 0..12 {
                matmul_case(dev, reg, rng, dtype, false);
                matmul_case(dev, reg, rng, dtype, true);
            }
        }
    });
}

#[test]
fn larger_matmul_against_reference() {
    crate::conformance::each_chip(5, &MODES, CUDA_KEYS, &["matmul"], |dev, reg, rng| {
        let (m, k, n) = (67u32, 129u32, 45u32);
        for layout in LAYOUTS {
            let a = host_tensor(rng, &[m, k], DType::F32, layout);
            let b = any_layout(rng, &[k, n], DType::F32);
            let c = any_layout(rng, &[m, n], DType::F32);
            run(
                dev,
                reg,
                "matmul",
                vec![
                    a.arg(ArgTag::Input),
                    b.arg(ArgTag::Input),
                    c.arg(ArgTag::Output),
                ],
                vec![],
            )
            .unwrap();
            let (ab, bb, cb) = (a.bytes(), b.bytes(), c.bytes());
            for i in (0..m as usize).step_by(7) {
                for j in 0..n as usize {
                    let (mut want, mut mag) = (0.0, 0.0);
                    for p in 0..k as usize {
                        let prod = read(&ab, &a.view, &[i, p]) * read(&bb, &b.view, &[p, j]);
                        want += prod;
                        mag += prod.abs();
                    }
                    let tol = 4.0 * f64::from(k) * eps(DType::F32) * mag + 1e-12;
                    check_close("matmul 67x129x45", read(&cb, &c.view, &[i, j]), want, tol);
                }
            }
        }
    });
}

fn reduce_shape(x: &[u32]) -> Vec<u32> {
    if x.len() == 1 {
        vec![1]
    } else {
        x[..x.len() - 1].to_vec()
    }
}

#[test]
fn reduce_sum_and_softmax() {
    each_mode(&["reduce_sum", "softmax"], |dev, reg, rng| {
        for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            for _ in 0..8 {
                let rank = rng.range(1, 4);
                let s = shape(rng, rank);
                let x = any_layout(rng, &s, dtype);
                let out_shape = reduce_shape(&s);
                let out = any_layout(rng, &out_shape, dtype);
                run(
                    dev,
                    reg,
                    "reduce_sum",
                    vec![x.arg(ArgTag::Input), out.arg(ArgTag::Output)],
                    vec![],
                )
                .unwrap();
                let (xb, ob) = (x.bytes(), out.bytes());
                let lane = *s.last().unwrap() as usize;
                for o in indices(&out_shape) {
                    let (mut want, mut mag) = (0.0, 0.0);
                    for j in 0..lane {
                        let idx: Vec<usize> = if rank == 1 {
                            vec![j]
                        } else {
                            [o.clone(), vec![j]].concat()
                        };
                        let v = read(&xb, &x.view, &idx);
                        want += v;
                        mag += v.abs();
                    }
                    check_close(
                        "reduce_sum",
                        read(&ob, &out.view, &o),
                        want,
                        eps(dtype) * mag + 1e-12,
                    );
                }

                let sm = any_layout(rng, &s, dtype);
                run(
                    dev,
                    reg,
                    "softmax",
                    vec![x.arg(ArgTag::Input), sm.arg(ArgTag::Output)],
                    vec![],
                )
                .unwrap();
                let sb = sm.bytes();
                let mut outer = s.clone();
                *outer.last_mut().unwrap() = 1;
                for o in indices(&outer) {
                    let at = |j: usize| {
                        let mut idx = o.clone();
                        *idx.last_mut().unwrap() = j;
                        idx
                    };
                    let vals: Vec<f64> = (0..lane).map(|j| read(&xb, &x.view, &at(j))).collect();
                    let max = vals.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let denom: f64 = vals.iter().map(|v| (v - max).exp()).sum();
                    for (j, v) in vals.iter().enumerate() {
                        let want = (v - max).exp() / denom;
                        check_close(
                            "softmax",
                            read(&sb, &sm.view, &at(j)),
                            want,
                            eps(dtype) * want + 1e-12,
                        );
                    }
                }
            }
        }
    });
}
