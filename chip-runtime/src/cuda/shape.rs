//! Launch shapes and matrix layouts, worked out on the host (no CUDA
//! call here, so all of it is tested on any machine).

use strata_wire::ChipTensor;

use crate::kernel::cuda::{Grid, THREADS};

/// Most blocks an [`Grid::Elements`] launch starts (its kernel strides
/// over the rest).
pub(crate) const MAX_ELEMENT_BLOCKS: u64 = 65_535 * 32;

/// Blocks, threads per block and dynamic shared bytes of a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Dims {
    pub(crate) blocks: [u32; 3],
    pub(crate) threads: [u32; 3],
    pub(crate) shared: u32,
}

/// The launch `grid` asks for on these arguments; `Ok(None)` when there
/// is nothing to do (no element, no row).
///
/// # Errors
/// An argument index the kernel does not have, or more rows than a grid
/// holds.
pub(crate) fn dims(grid: Grid, args: &[ChipTensor]) -> Result<Option<Dims>, String> {
    let arg = |n: usize| {
        args.get(n)
            .ok_or_else(|| format!("its grid names argument {n}, and it has {}", args.len()))
    };
    let numel = |t: &ChipTensor| t.shape().iter().map(|&d| u64::from(d)).product::<u64>();
    match grid {
        Grid::Elements(n) => {
            let count = numel(arg(n)?);
            if count == 0 {
                return Ok(None);
            }
            let blocks = count.div_ceil(u64::from(THREADS)).min(MAX_ELEMENT_BLOCKS);
            Ok(Some(Dims {
                blocks: [blocks as u32, 1, 1],
                threads: [THREADS, 1, 1],
                shared: 0,
            }))
        }
        Grid::Rows(n) => {
            let t = arg(n)?;
            let shape = t.shape();
            let rows: u64 = shape
                .split_last()
                .map_or(1, |(_, rest)| rest.iter().map(|&d| u64::from(d)).product());
            if rows == 0 {
                return Ok(None);
            }
            let rows = u32::try_from(rows)
                .ok()
                .filter(|r| *r <= i32::MAX as u32)
                .ok_or_else(|| format!("{rows} rows are more than one grid holds"))?;
            Ok(Some(Dims {
                blocks: [rows, 1, 1],
                threads: [THREADS, 1, 1],
                shared: 0,
            }))
        }
        Grid::Fixed {
            blocks,
            threads,
            shared,
        } => {
            if blocks.contains(&0) || threads.contains(&0) {
                return Ok(None);
            }
            grid.check()?;
            Ok(Some(Dims {
                blocks,
                threads,
                shared,
            }))
        }
    }
}

/// How a 2-D view (`rows × cols`, row-major indices) lies in memory, as
/// a column-major library sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ColMajor {
    /// The memory holds the view transposed (`cols × rows`, column-major):
    /// the view's rows are contiguous. Otherwise it holds the view itself
    /// column-major: its columns are contiguous.
    pub(crate) transposed: bool,
    /// The leading dimension, in elements.
    pub(crate) ld: u32,
}

impl ColMajor {
    /// The layout of a 2-D `t`, if one of its axes has unit stride (or
    /// one element) and the other a stride a library takes.
    pub(crate) fn of(t: &ChipTensor) -> Option<ColMajor> {
        let (&[r, c], &[s0, s1]) = (t.shape(), t.strides()) else {
            return None;
        };
        // An axis of one element may have any stride: it is never stepped.
        if c <= 1 || s1 == 1 {
            let ld = if r <= 1 { c.max(1) } else { s0 };
            (ld >= c.max(1)).then_some(ColMajor {
                transposed: true,
                ld,
            })
        } else if r <= 1 || s0 == 1 {
            let ld = if c <= 1 { r.max(1) } else { s1 };
            (ld >= r.max(1)).then_some(ColMajor {
                transposed: false,
                ld,
            })
        } else {
            None
        }
    }
}

/// One GEMM call of a column-major library computing the row-major
/// `c = α·a·b + β·c` (`a` m×k, `b` k×n): operands in call order with
/// their transposition flags and sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GemmCall {
    /// `(m, n, k)` of the call.
    pub(crate) mnk: (u32, u32, u32),
    /// The first operand is argument 0 (`a`) or 1 (`b`).
    pub(crate) first: usize,
    /// Transpose the first operand.
    pub(crate) first_t: bool,
    /// Its leading dimension.
    pub(crate) first_ld: u32,
    /// Transpose the second operand (the other of `a`, `b`).
    pub(crate) second_t: bool,
    /// Its leading dimension.
    pub(crate) second_ld: u32,
    /// `c`'s leading dimension.
    pub(crate) c_ld: u32,
}

/// The call for `c = a·b` on these layouts, or why there is none.
pub(crate) fn gemm_call(
    a: &ChipTensor,
    b: &ChipTensor,
    c: &ChipTensor,
) -> Result<GemmCall, String> {
    let layout = |t: &ChipTensor, name: &str| {
        ColMajor::of(t).ok_or_else(|| {
            format!(
                "{name} (shape {:?}, strides {:?}) has no axis of unit stride: the CUDA body takes matrices whose rows or columns are contiguous",
                t.shape(),
                t.strides()
            )
        })
    };
    let (la, lb, lc) = (layout(a, "a")?, layout(b, "b")?, layout(c, "c")?);
    let (m, k, n) = (a.shape()[0], a.shape()[1], b.shape()[1]);
    Ok(gemm_on(m, n, k, la, lb, lc))
}

/// [`gemm_call`] on layouts already known: `a` m×k, `b` k×n, `c` m×n.
pub(crate) fn gemm_on(
    m: u32,
    n: u32,
    k: u32,
    la: ColMajor,
    lb: ColMajor,
    lc: ColMajor,
) -> GemmCall {
    if lc.transposed {
        // cᵀ = bᵀ·aᵀ, column-major n×m: bᵀ is b's memory as it lies when
        // b is stored transposed, else b's memory transposed.
        GemmCall {
            mnk: (n, m, k),
            first: 1,
            first_t: !lb.transposed,
            first_ld: lb.ld,
            second_t: !la.transposed,
            second_ld: la.ld,
            c_ld: lc.ld,
        }
    } else {
        // c = a·b, column-major m×n.
        GemmCall {
            mnk: (m, n, k),
            first: 0,
            first_t: la.transposed,
            first_ld: la.ld,
            second_t: lb.transposed,
            second_ld: lb.ld,
            c_ld: lc.ld,
        }
    }
}

impl ColMajor {
    /// The layout of the transposed view of the same memory.
    pub(crate) fn t(self) -> ColMajor {
        ColMajor {
            transposed: !self.transposed,
            ld: self.ld,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_wire::{AddressSpace, DType, Tensor};

    fn chip(shape: &[u32], strides: &[u32]) -> ChipTensor {
        let buf = strata_wire::check::test_buffer(1 << 20);
        let t = Tensor::new(buf, 0, shape, strides, DType::F64).unwrap();
        ChipTensor::from_view(&t, 0x1000, 1 << 20, AddressSpace::Device).unwrap()
    }

    /// Column-major GEMM on the memory of row-major views, executed by a
    /// naive loop that reads memory exactly as BLAS would, against the
    /// row-major product: every combination of stored-transposed or not.
    #[test]
    fn gemm_calls_compute_the_row_major_product() {
        let (m, k, n) = (3u32, 4u32, 5u32);
        let shapes = |r: u32, c: u32| [(vec![r, c], vec![c, 1]), (vec![r, c], vec![1, r])];
        let val = |i: usize| (i as f64) * 0.5 - 3.0;
        for (sa, ta) in shapes(m, k) {
            for (sb, tb) in shapes(k, n) {
                for (sc, tc) in shapes(m, n) {
                    let (a, b, c) = (chip(&sa, &ta), chip(&sb, &tb), chip(&sc, &tc));
                    let mem_a: Vec<f64> = (0..(m * k) as usize).map(val).collect();
                    let mem_b: Vec<f64> = (0..(k * n) as usize).map(|i| val(i + 7)).collect();
                    let at = |t: &ChipTensor, mem: &[f64], i: u32, j: u32| {
                        mem[(i * t.strides()[0] + j * t.strides()[1]) as usize]
                    };
                    let call = gemm_call(&a, &b, &c).unwrap();
                    let (first, second) = if call.first == 0 {
                        (&mem_a, &mem_b)
                    } else {
                        (&mem_b, &mem_a)
                    };
                    // op(X)[i][l] of a column-major matrix with leading ld.
                    let op = |mem: &[f64], t: bool, ld: u32, i: u32, l: u32| {
                        if t {
                            mem[(l + i * ld) as usize]
                        } else {
                            mem[(i + l * ld) as usize]
                        }
                    };
                    let (cm, cn, ck) = call.mnk;
                    let mut mem_c = vec![0f64; (m * n) as usize];
                    for i in 0..cm {
                        for j in 0..cn {
                            let mut s = 0.0;
                            for l in 0..ck {
                                s += op(first, call.first_t, call.first_ld, i, l)
                                    * op(second, call.second_t, call.second_ld, l, j);
                            }
                            mem_c[(i + j * call.c_ld) as usize] = s;
                        }
                    }
                    for i in 0..m {
                        for j in 0..n {
                            let want: f64 = (0..k)
                                .map(|l| at(&a, &mem_a, i, l) * at(&b, &mem_b, l, j))
                                .sum();
                            assert_eq!(at(&c, &mem_c, i, j), want, "{ta:?} {tb:?} {tc:?}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn layouts_and_grids() {
        assert_eq!(
            ColMajor::of(&chip(&[4, 3], &[10, 1])),
            Some(ColMajor {
                transposed: true,
                ld: 10
            })
        );
        assert_eq!(
            ColMajor::of(&chip(&[4, 3], &[1, 8])),
            Some(ColMajor {
                transposed: false,
                ld: 8
            })
        );
        assert_eq!(ColMajor::of(&chip(&[4, 3], &[6, 2])), None);
        let e = dims(Grid::Elements(0), &[chip(&[1000, 3], &[3, 1])])
            .unwrap()
            .unwrap();
        assert_eq!(e.blocks[0], 12);
        let r = dims(Grid::Rows(0), &[chip(&[7, 2, 5], &[10, 5, 1])])
            .unwrap()
            .unwrap();
        assert_eq!(r.blocks[0], 14);
        assert!(dims(Grid::Rows(2), &[chip(&[1], &[1])]).is_err());
    }
}
