//! The complex dtypes (C64, C128) through every built-in kernel that takes
//! them, against a reference computed here in two f64s per element, on
//! row-major, transposed and stepped views in both modes: moves exact,
//! arithmetic within a few rounding errors of the part's precision
//! (products: 4·(k+1)·ε·Σ|a||b|).

use num_complex::Complex;
use strata_chip_runtime::{Device, Registry};
use strata_wire::check::Rng;
use strata_wire::{ArgTag, DType};

use crate::common::{
    HostTensor, LAYOUTS, any_layout, host_tensor, indices, read_complex, run, shape,
};

type C = Complex<f64>;

const COMPLEX: [DType; 2] = [DType::C64, DType::C128];

fn eps(dtype: DType) -> f64 {
    match dtype {
        DType::C64 => f64::from(f32::EPSILON),
        _ => f64::EPSILON,
    }
}

fn get(t: &HostTensor, bytes: &[u8], idx: &[usize]) -> C {
    let (re, im) = read_complex(bytes, &t.view, idx);
    C::new(re, im)
}

fn close(what: &str, got: C, want: C, tol: f64) {
    assert!(
        (got - want).l1_norm() <= tol,
        "{what}: got {got}, want {want} (tolerance {tol})"
    );
}

/// Runs `f` for each mode (seeds from 7000).
fn each_mode(uses: &[&str], f: impl FnMut(&dyn Device, &Registry, &mut Rng)) {
    crate::common::each_mode(7000, uses, f);
}

#[test]
fn fill_writes_a_real_value_and_a_zero_imaginary_part() {
    each_mode(&["fill"], |dev, reg, rng| {
        for dtype in COMPLEX {
            for layout in LAYOUTS {
                let rank = rng.range(1, 4);
                let s = shape(rng, rank);
                let out = host_tensor(rng, &s, dtype, layout);
                run(
                    dev,
                    reg,
                    "fill",
                    vec![out.arg(ArgTag::Output)],
                    vec![(-2.5f64).to_bits()],
                )
                .unwrap();
                let b = out.bytes();
                for idx in indices(&s) {
                    assert_eq!(get(&out, &b, &idx), C::new(-2.5, 0.0), "{dtype} {idx:?}");
                }
            }
        }
    });
}

#[test]
fn copy_and_transpose_move_complex_elements_whole() {
    each_mode(&["copy", "transpose"], |dev, reg, rng| {
        for dtype in COMPLEX {
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
                    assert_eq!(get(&dst, &db, &idx), get(&src, &sb, &idx));
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
                    assert_eq!(get(&out, &ob, &t), get(&src, &sb, &idx));
                }
            }
        }
    });
}

#[test]
fn add_mul_and_axpy_with_a_real_alpha() {
    each_mode(&["add", "axpy", "mul"], |dev, reg, rng| {
        for dtype in COMPLEX {
            for _ in 0..6 {
                let rank = rng.range(1, 4);
                let s = shape(rng, rank);
                let a = any_layout(rng, &s, dtype);
                let b = any_layout(rng, &s, dtype);
                for (name, op) in [
                    ("add", (|x, y| x + y) as fn(C, C) -> C),
                    ("mul", |x, y| x * y),
                ] {
                    let out = any_layout(rng, &s, dtype);
                    run(
                        dev,
                        reg,
                        name,
                        vec![
                            a.arg(ArgTag::Input),
                            b.arg(ArgTag::Input),
                            out.arg(ArgTag::Output),
                        ],
                        vec![],
                    )
                    .unwrap();
                    let (ab, bb, ob) = (a.bytes(), b.bytes(), out.bytes());
                    for idx in indices(&s) {
                        let (x, y) = (get(&a, &ab, &idx), get(&b, &bb, &idx));
                        let want = op(x, y);
                        let tol = 4.0
                            * eps(dtype)
                            * (x.l1_norm() * y.l1_norm() + x.l1_norm() + y.l1_norm());
                        close(
                            &format!("{name} {dtype} {idx:?}"),
                            get(&out, &ob, &idx),
                            want,
                            tol,
                        );
                    }
                }
                let y_before = b.bytes();
                run(
                    dev,
                    reg,
                    "axpy",
                    vec![a.arg(ArgTag::Input), b.arg(ArgTag::InOut)],
                    vec![0.75f64.to_bits()],
                )
                .unwrap();
                let (ab, yb) = (a.bytes(), b.bytes());
                for idx in indices(&s) {
                    let (x, y0) = (get(&a, &ab, &idx), get(&b, &y_before, &idx));
                    let want = x * 0.75 + y0;
                    let tol = 4.0 * eps(dtype) * (x.l1_norm() + y0.l1_norm());
                    close(
                        &format!("axpy {dtype} {idx:?}"),
                        get(&b, &yb, &idx),
                        want,
                        tol,
                    );
                }
            }
        }
    });
}

#[test]
fn matmul_and_matmul_acc_match_the_complex_definition() {
    each_mode(&["matmul", "matmul_acc"], |dev, reg, rng| {
        for dtype in COMPLEX {
            for accumulate in [false, true] {
                for _ in 0..8 {
                    let (m, k, n) = (rng.range(1, 9), rng.range(1, 9), rng.range(1, 9));
                    let a = any_layout(rng, &[m, k], dtype);
                    let b = any_layout(rng, &[k, n], dtype);
                    let c = any_layout(rng, &[m, n], dtype);
                    let before = c.bytes();
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
                                get(&c, &before, &[i, j])
                            } else {
                                C::new(0.0, 0.0)
                            };
                            let mut magnitude = want.l1_norm();
                            for p in 0..k as usize {
                                let prod = get(&a, &ab, &[i, p]) * get(&b, &bb, &[p, j]);
                                want += prod;
                                magnitude += prod.l1_norm();
                            }
                            let tol = 4.0 * f64::from(k + 1) * eps(dtype) * magnitude + 1e-12;
                            close(
                                &format!("{name} {dtype} [{m}x{k}x{n}] ({i},{j})"),
                                get(&c, &cb, &[i, j]),
                                want,
                                tol,
                            );
                        }
                    }
                }
            }
        }
    });
}

#[test]
fn reduce_sum_sums_both_parts_and_softmax_refuses_complex() {
    each_mode(&["reduce_sum", "softmax"], |dev, reg, rng| {
        for dtype in COMPLEX {
            for _ in 0..6 {
                let rank = rng.range(1, 4);
                let s = shape(rng, rank);
                let x = any_layout(rng, &s, dtype);
                let out_shape: Vec<u32> = if rank == 1 {
                    vec![1]
                } else {
                    s[..s.len() - 1].to_vec()
                };
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
                for o in indices(&out_shape) {
                    let mut want = C::new(0.0, 0.0);
                    let mut magnitude = 0.0;
                    for j in 0..s[s.len() - 1] as usize {
                        let mut idx = if rank == 1 { vec![] } else { o.clone() };
                        idx.push(j);
                        let v = get(&x, &xb, &idx);
                        want += v;
                        magnitude += v.l1_norm();
                    }
                    close(
                        &format!("reduce_sum {dtype} {o:?}"),
                        get(&out, &ob, &o),
                        want,
                        2.0 * eps(dtype) * magnitude + 1e-12,
                    );
                }
            }
            let x = any_layout(rng, &[3, 4], dtype);
            let out = any_layout(rng, &[3, 4], dtype);
            let err = run(
                dev,
                reg,
                "softmax",
                vec![x.arg(ArgTag::Input), out.arg(ArgTag::Output)],
                vec![],
            )
            .unwrap_err()
            .to_string();
            assert!(err.contains(dtype.name()), "{err}");
        }
    });
}
