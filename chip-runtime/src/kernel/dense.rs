//! Dense linear algebra on strided matrices: GEMM (this crate's blocked
//! kernels where the CPU runs them, `super::blocked`, else the `gemm`
//! crate), and the Cholesky building blocks (POTRF, TRSM, SYRK) written to
//! hand almost every flop to GEMM.
//!
//! Most `unsafe` of kernel arithmetic lives here: [`MatRef`] and
//! [`MatMut`] are a pointer, a shape and element strides, split into
//! disjoint blocks by safe methods, and [`gemm`] passes them on.
//!
//! Why recursion (potrf, trsm): splitting each problem in halves until
//! blocks are small leaves O(n²·b) flops (b the base size) in loops and
//! the rest in GEMM calls of every size, which is what makes a blocked
//! factorization run near GEMM's speed without tuning a block size per
//! machine. `syrk` goes by block rows instead: a few large GEMMs.

use std::marker::PhantomData;

use super::element::{ComplexElement, Element};
use super::view::{View, ViewMut};

/// Below this many rows (or columns) a recursion ends in scalar loops.
const BASE: usize = 32;

/// A float the dense kernels compute on (F32, F64).
pub(crate) trait Real:
    Element
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + std::ops::Neg<Output = Self>
    + PartialOrd
{
    const ZERO: Self;
    const ONE: Self;
    fn sqrt(self) -> Self;

    /// `c ← alpha·a·b + beta·c` by this crate's blocked GEMM, when this
    /// CPU has one for the dtype; false (nothing done) when not.
    ///
    /// # Safety
    /// As [`gemm`]'s arguments: chained shapes, in-bounds strides, `c`
    /// distinct and unaliased.
    unsafe fn blocked(
        a: MatRef<'_, Self>,
        b: MatRef<'_, Self>,
        c: &mut MatMut<'_, Self>,
        alpha: Self,
        beta: Self,
    ) -> bool;
}

/// Whether GEMM runs on this crate's blocked kernels here (which pack
/// their operands themselves: see [`Packed`]).
pub(crate) fn blocked_gemm_here() -> bool {
    #[cfg(target_arch = "x86_64")]
    return super::blocked::available();
    #[cfg(not(target_arch = "x86_64"))]
    return false;
}

/// The blocked GEMM for `T`, where this CPU runs it.
///
/// # Safety
/// As [`Real::blocked`].
#[cfg(target_arch = "x86_64")]
unsafe fn blocked_gemm<T: super::blocked::Blocked>(
    a: MatRef<'_, T>,
    b: MatRef<'_, T>,
    c: &mut MatMut<'_, T>,
    alpha: T,
    beta: T,
) -> bool {
    use super::blocked::{Strided, StridedMut, available, gemm};
    if !available() {
        return false;
    }
    let (sa, sb) = (
        Strided {
            ptr: a.ptr,
            rs: a.rs,
            cs: a.cs,
        },
        Strided {
            ptr: b.ptr,
            rs: b.rs,
            cs: b.cs,
        },
    );
    let sc = StridedMut {
        ptr: c.ptr,
        rs: c.rs,
        cs: c.cs,
    };
    // SAFETY: the caller's contract; available() checked.
    unsafe { gemm((c.rows, c.cols, a.cols), sa, sb, &sc, alpha, beta) };
    true
}

/// `Real` for a float type: the constants, `sqrt`, and the blocked GEMM
/// where this target has one.
macro_rules! real {
    ($t:ty) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }

            unsafe fn blocked(
                a: MatRef<'_, Self>,
                b: MatRef<'_, Self>,
                c: &mut MatMut<'_, Self>,
                alpha: Self,
                beta: Self,
            ) -> bool {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the caller's contract.
                return unsafe { blocked_gemm(a, b, c, alpha, beta) };
                #[cfg(not(target_arch = "x86_64"))]
                return false;
            }
        }
    };
}

real!(f32);
real!(f64);

/// A read-only strided matrix.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MatRef<'a, T> {
    ptr: *const T,
    rows: usize,
    cols: usize,
    rs: isize,
    cs: isize,
    _life: PhantomData<&'a T>,
}

/// A writable strided matrix whose elements are distinct memory.
#[derive(Debug)]
pub(crate) struct MatMut<'a, T> {
    ptr: *mut T,
    rows: usize,
    cols: usize,
    rs: isize,
    cs: isize,
    _life: PhantomData<&'a mut T>,
}

/// A copy of a matrix whose rows (or columns) lie far apart in memory —
/// a tile of a larger matrix — with the same axis contiguous and a cache
/// line between its lines. `trsm` and `syrk` run on it instead: a tile's
/// lines in a matrix whose row step is a large power of two fall in a few
/// cache sets, and their many small GEMMs and scalar loops
/// then miss on most lines; one pass of whole-line copies costs less
/// (measured on 256² tiles of an 8192² F32 matrix: syrk 13 % and trsm 3 %
/// faster). Only where GEMM is the `gemm` crate's: the blocked GEMM packs
/// its operands itself, with prefetches, and a copy first made `trsm` and
/// `syrk` slower there (in place: 369 against 364 µs and 392 against 366).
#[derive(Debug)]
pub(crate) struct Packed<T> {
    data: Vec<T>,
    rows: usize,
    cols: usize,
    /// Elements from one line to the next: a line and a cache line more,
    /// so that lines of a power-of-two length do not share cache sets.
    ld: usize,
    /// Whether columns, not rows, are contiguous.
    column_major: bool,
}

/// Bytes left between a packed copy's lines.
const PACK_PAD: usize = 64;

/// Below this many elements a matrix is used where it lies: its lines fit
/// in cache whatever their addresses.
const PACK_MIN: usize = 64 * 64;

impl<T: Real> Packed<T> {
    /// A packed copy of `m` when it is large and its lines are spread
    /// (a unit step along one axis, a step along the other beyond its
    /// length); `None` when it is better used in place.
    pub(crate) fn of(m: MatRef<'_, T>) -> Option<Self> {
        if m.rows * m.cols < PACK_MIN {
            return None;
        }
        let (lines, len, column_major) = if m.cs == 1 && m.rs > m.cols as isize {
            (m.rows, m.cols, false)
        } else if m.rs == 1 && m.cs > m.rows as isize {
            (m.cols, m.rows, true)
        } else {
            return None;
        };
        let step = if column_major { m.cs } else { m.rs };
        let ld = len + PACK_PAD / std::mem::size_of::<T>();
        let mut data = vec![T::ZERO; lines * ld];
        for (l, line) in data.chunks_exact_mut(ld).enumerate() {
            // SAFETY: line l's `len` elements are adjacent (unit step
            // along the line) and inside the shape, so readable for the
            // matrix's lifetime (the MatRef contract).
            line[..len].copy_from_slice(unsafe {
                std::slice::from_raw_parts(m.ptr.offset(l as isize * step), len)
            });
        }
        Some(Packed {
            data,
            rows: m.rows,
            cols: m.cols,
            ld,
            column_major,
        })
    }

    fn strides(&self) -> (isize, isize) {
        if self.column_major {
            (1, self.ld as isize)
        } else {
            (self.ld as isize, 1)
        }
    }

    pub(crate) fn as_ref(&self) -> MatRef<'_, T> {
        let (rs, cs) = self.strides();
        MatRef {
            ptr: self.data.as_ptr(),
            rows: self.rows,
            cols: self.cols,
            rs,
            cs,
            _life: PhantomData,
        }
    }

    pub(crate) fn as_mut(&mut self) -> MatMut<'_, T> {
        let (rs, cs) = self.strides();
        MatMut {
            ptr: self.data.as_mut_ptr(),
            rows: self.rows,
            cols: self.cols,
            rs,
            cs,
            _life: PhantomData,
        }
    }

    /// Copies the elements back into `m`, the matrix it was packed from.
    ///
    /// # Panics
    /// When `m` is not shaped and laid out as the matrix packed.
    pub(crate) fn unpack(&self, m: &mut MatMut<'_, T>) {
        let (lines, len, step) = if self.column_major {
            (m.cols, m.rows, m.cs)
        } else {
            (m.rows, m.cols, m.rs)
        };
        assert!(
            m.rows == self.rows
                && m.cols == self.cols
                && (if self.column_major { m.rs } else { m.cs }) == 1,
            "unpacked into another matrix"
        );
        for (l, line) in self.data.chunks_exact(self.ld).take(lines).enumerate() {
            let line = &line[..len];
            // SAFETY: line l's `len` elements are adjacent, inside the
            // shape, writable and borrowed exclusively through `m` (the
            // MatMut contract); `line` is this copy's, never `m`'s.
            unsafe {
                std::slice::from_raw_parts_mut(m.ptr.offset(l as isize * step), len)
                    .copy_from_slice(line);
            }
        }
    }
}

/// Why a matrix cannot be handed to the dense kernels.
fn check_aligned<T>(ptr: *const T, what: &str) -> Result<(), String> {
    if ptr.align_offset(std::mem::align_of::<T>()) == 0 {
        Ok(())
    } else {
        Err(format!(
            "{what} does not start on a multiple of its element size"
        ))
    }
}

impl<'a, T: Real> MatRef<'a, T> {
    /// The rank-2 view `v` as a matrix.
    pub(crate) fn of(v: &View<'a, T>, what: &str) -> Result<Self, String> {
        let (ptr, g) = v.raw();
        check_aligned(ptr, what)?;
        Ok(MatRef {
            ptr,
            rows: g.shape()[0],
            cols: g.shape()[1],
            rs: g.strides()[0],
            cs: g.strides()[1],
            _life: PhantomData,
        })
    }

    #[inline]
    fn get(&self, i: usize, j: usize) -> T {
        assert!(i < self.rows && j < self.cols, "index outside the matrix");
        // SAFETY: (i, j) is inside the shape, and every element of the
        // shape is readable for 'a (the view's contract, kept by `of` and
        // `block`, which only narrow the shape).
        unsafe { *self.ptr.offset(i as isize * self.rs + j as isize * self.cs) }
    }

    /// The `rows × cols` block starting at `(r, c)`.
    fn block(&self, r: usize, c: usize, rows: usize, cols: usize) -> MatRef<'a, T> {
        assert!(
            r + rows <= self.rows && c + cols <= self.cols,
            "block outside"
        );
        MatRef {
            // Stays inside the matrix (asserted); wrapping_offset keeps an
            // empty block at the edge from being UB to form.
            ptr: self
                .ptr
                .wrapping_offset(r as isize * self.rs + c as isize * self.cs),
            rows,
            cols,
            ..*self
        }
    }

    /// Row `i` as a slice, when rows are contiguous (unit column step).
    fn row(&self, i: usize) -> Option<&'a [T]> {
        assert!(i < self.rows, "row outside the matrix");
        (self.cs == 1).then(|| {
            // SAFETY: row i's `cols` elements are adjacent (unit step),
            // inside the shape and readable for 'a (the MatRef contract).
            unsafe { std::slice::from_raw_parts(self.ptr.offset(i as isize * self.rs), self.cols) }
        })
    }

    /// The elements in row-major order into `out` (`rows·cols` long).
    fn copy_to(&self, out: &mut [T]) {
        assert_eq!(out.len(), self.rows * self.cols, "copy of another size");
        if self.cols == 0 {
            return;
        }
        for (i, line) in out.chunks_exact_mut(self.cols).enumerate() {
            match self.row(i) {
                Some(row) => line.copy_from_slice(row),
                None => {
                    for (j, v) in line.iter_mut().enumerate() {
                        *v = self.get(i, j);
                    }
                }
            }
        }
    }

    /// The transpose (no copy).
    fn t(&self) -> MatRef<'a, T> {
        MatRef {
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
            ..*self
        }
    }
}

impl<'a, T: Real> MatMut<'a, T> {
    /// The rank-2 view `v` as a matrix.
    pub(crate) fn of(v: &'a mut ViewMut<'_, T>, what: &str) -> Result<Self, String> {
        let (ptr, g) = v.raw();
        check_aligned(ptr, what)?;
        Ok(MatMut {
            ptr,
            rows: g.shape()[0],
            cols: g.shape()[1],
            rs: g.strides()[0],
            cs: g.strides()[1],
            _life: PhantomData,
        })
    }

    /// A matrix over a row-major slice.
    fn from_slice(s: &'a mut [T], rows: usize, cols: usize) -> Self {
        assert!(s.len() >= rows * cols, "slice too short");
        MatMut {
            ptr: s.as_mut_ptr(),
            rows,
            cols,
            rs: cols as isize,
            cs: 1,
            _life: PhantomData,
        }
    }

    pub(crate) fn rb(&self) -> MatRef<'_, T> {
        MatRef {
            ptr: self.ptr,
            rows: self.rows,
            cols: self.cols,
            rs: self.rs,
            cs: self.cs,
            _life: PhantomData,
        }
    }

    /// A reborrow, for passing a block on without giving it up.
    fn rb_mut(&mut self) -> MatMut<'_, T> {
        MatMut {
            ptr: self.ptr,
            rows: self.rows,
            cols: self.cols,
            rs: self.rs,
            cs: self.cs,
            _life: PhantomData,
        }
    }

    #[inline]
    fn get(&self, i: usize, j: usize) -> T {
        self.rb().get(i, j)
    }

    #[inline]
    fn set(&mut self, i: usize, j: usize, v: T) {
        assert!(i < self.rows && j < self.cols, "index outside the matrix");
        // SAFETY: inside the shape, which is writable for 'a and borrowed
        // exclusively (the view's contract, kept by the splits, which hand
        // out disjoint index ranges).
        unsafe { *self.ptr.offset(i as isize * self.rs + j as isize * self.cs) = v }
    }

    /// Row `i` as a slice, when rows are contiguous (unit column step).
    fn row_mut(&mut self, i: usize) -> Option<&mut [T]> {
        assert!(i < self.rows, "row outside the matrix");
        (self.cs == 1).then(|| {
            // SAFETY: row i's `cols` elements are adjacent, inside the
            // shape, writable and borrowed exclusively through self for
            // the slice's life (the MatMut contract).
            unsafe {
                std::slice::from_raw_parts_mut(self.ptr.offset(i as isize * self.rs), self.cols)
            }
        })
    }

    /// Rows `..k` and rows `k..`: disjoint elements.
    fn split_rows(self, k: usize) -> (MatMut<'a, T>, MatMut<'a, T>) {
        assert!(k <= self.rows, "split outside");
        let top = MatMut { rows: k, ..self };
        let bottom = MatMut {
            ptr: self.ptr.wrapping_offset(k as isize * self.rs),
            rows: self.rows - k,
            ..self
        };
        (top, bottom)
    }

    /// Columns `..k` and columns `k..`: disjoint elements.
    fn split_cols(self, k: usize) -> (MatMut<'a, T>, MatMut<'a, T>) {
        assert!(k <= self.cols, "split outside");
        let left = MatMut { cols: k, ..self };
        let right = MatMut {
            ptr: self.ptr.wrapping_offset(k as isize * self.cs),
            cols: self.cols - k,
            ..self
        };
        (left, right)
    }

    /// The four quadrants split at row `r` and column `c`:
    /// (top-left, top-right, bottom-left, bottom-right).
    fn quadrants(self, r: usize, c: usize) -> [MatMut<'a, T>; 4] {
        let (top, bottom) = self.split_rows(r);
        let (tl, tr) = top.split_cols(c);
        let (bl, br) = bottom.split_cols(c);
        [tl, tr, bl, br]
    }
}

/// `c ← alpha·a·b + beta·c` (`c` not read when `beta` is zero).
///
/// # Panics
/// When the shapes do not chain (callers check them first).
pub(crate) fn gemm<T: Real>(
    a: MatRef<'_, T>,
    b: MatRef<'_, T>,
    c: &mut MatMut<'_, T>,
    alpha: T,
    beta: T,
) {
    assert!(
        a.rows == c.rows && b.cols == c.cols && a.cols == b.rows,
        "shapes do not chain"
    );
    if c.rows == 0 || c.cols == 0 {
        return;
    }
    // SAFETY: the contract below.
    if unsafe { T::blocked(a, b, c, alpha, beta) } {
        return;
    }
    portable_gemm(a, b, c, alpha, beta);
}

/// [`gemm`] by the `gemm` crate (shapes chained and non-empty).
fn portable_gemm<T: Real>(
    a: MatRef<'_, T>,
    b: MatRef<'_, T>,
    c: &mut MatMut<'_, T>,
    alpha: T,
    beta: T,
) {
    // SAFETY: each matrix's pointer and strides address exactly its own
    // elements for indices inside its shape (the MatRef/MatMut contract);
    // the shapes chain (asserted); `c`'s elements are distinct and do not
    // alias `a` or `b` (launch validation refuses written arguments that
    // share bytes with others, and the recursions below pass disjoint
    // blocks); pointers are aligned to T (checked where built). The crate
    // computes dst ← (its alpha)·dst + (its beta)·lhs·rhs.
    unsafe {
        gemm::gemm(
            c.rows,
            c.cols,
            a.cols,
            c.ptr,
            c.cs,
            c.rs,
            beta != T::ZERO,
            a.ptr,
            a.cs,
            a.rs,
            b.ptr,
            b.cs,
            b.rs,
            beta,
            alpha,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// `c ← a·b + c` (`accumulate`) or `c ← a·b` on complex rank-2 views, by
/// the `gemm` crate (shapes checked by the caller; `c` not read unless
/// `accumulate`).
///
/// # Errors
/// A view that does not start on its element's alignment.
pub(crate) fn complex_gemm<T: ComplexElement>(
    a: &View<'_, T>,
    b: &View<'_, T>,
    c: &mut ViewMut<'_, T>,
    accumulate: bool,
) -> Result<(), String> {
    let (pa, ga) = a.raw();
    let (pb, gb) = b.raw();
    let (ga, gb) = (*ga, *gb);
    let (pc, gc) = c.raw();
    let gc = *gc;
    check_aligned(pa, "a")?;
    check_aligned(pb, "b")?;
    check_aligned(pc.cast_const(), "c")?;
    let (m, k, n) = (ga.shape()[0], ga.shape()[1], gb.shape()[1]);
    assert!(
        gb.shape()[0] == k && gc.shape() == [m, n],
        "shapes do not chain"
    );
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        if !accumulate {
            gc.for_each_index(|idx| c.set(idx, T::ZERO));
        }
        return Ok(());
    }
    let keep = if accumulate { T::ONE } else { T::ZERO };
    // SAFETY: each view's pointer and strides address exactly its own
    // elements for indices inside its shape (the View contract); the
    // shapes chain (asserted); `c`'s elements are distinct and do not
    // alias `a` or `b` (launch validation refuses written arguments that
    // share bytes with others); the pointers are aligned (checked); T is
    // `Complex<f32>` or `Complex<f64>`, the crate's c32 and c64. The
    // crate computes dst ← (its alpha)·dst + (its beta)·lhs·rhs.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            pc,
            gc.strides()[1],
            gc.strides()[0],
            accumulate,
            pa,
            ga.strides()[1],
            ga.strides()[0],
            pb,
            gb.strides()[1],
            gb.strides()[0],
            keep,
            T::ONE,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
    Ok(())
}

/// Lower Cholesky factor in place: `a ← L` with `L·Lᵀ = a`, reading and
/// writing only the lower triangle. `Err(j)`: the leading minor of order
/// `j + 1` is not positive (the matrix is not positive definite); the
/// first `j` columns then hold their factor.
pub(crate) fn potrf<T: Real>(mut a: MatMut<'_, T>) -> Result<(), (usize, T)> {
    let n = a.rows;
    debug_assert_eq!(n, a.cols);
    if n <= BASE {
        for j in 0..n {
            let mut d = a.get(j, j);
            for k in 0..j {
                let l = a.get(j, k);
                d = d - l * l;
            }
            // Also refuses NaN.
            if d.partial_cmp(&T::ZERO) != Some(std::cmp::Ordering::Greater) {
                return Err((j, d));
            }
            let l = d.sqrt();
            a.set(j, j, l);
            for i in j + 1..n {
                let mut v = a.get(i, j);
                for k in 0..j {
                    v = v - a.get(i, k) * a.get(j, k);
                }
                a.set(i, j, v / l);
            }
        }
        return Ok(());
    }
    let n1 = n / 2;
    let [mut a11, _upper, mut a21, mut a22] = a.quadrants(n1, n1);
    potrf(a11.rb_mut())?;
    trsm(a11.rb(), a21.rb_mut())?;
    syrk_lower(a21.rb(), a22.rb_mut(), -T::ONE);
    potrf(a22).map_err(|(j, d)| (j + n1, d))
}

/// `b ← b·l⁻ᵀ` with `l` lower triangular (only its lower triangle is
/// read). `Err(j)`: `l[j, j]` is zero.
pub(crate) fn trsm<T: Real>(l: MatRef<'_, T>, mut b: MatMut<'_, T>) -> Result<(), (usize, T)> {
    let n = l.rows;
    debug_assert_eq!((n, n), (l.cols, b.cols));
    if n <= BASE {
        // Invert the small triangle (n³/3 flops), then one GEMM applies
        // it to every row of b: substitution row by row would leave m·n²
        // flops in scalar code. Row i of X = L⁻¹ is
        // (eᵢ − Σ_{k<i} L[i,k]·X[k,·]) / L[i,i]: row operations, which
        // vectorize.
        let mut inv = [T::ZERO; BASE * BASE];
        for i in 0..n {
            let d = l.get(i, i);
            if d == T::ZERO {
                return Err((i, d));
            }
            let (done, rest) = inv.split_at_mut(i * n);
            let row = &mut rest[..=i];
            row[i] = T::ONE;
            for k in 0..i {
                let lik = l.get(i, k);
                for (r, &x) in row[..=k].iter_mut().zip(&done[k * n..=k * n + k]) {
                    *r = *r - lik * x;
                }
            }
            let inv_d = T::ONE / d;
            for r in row.iter_mut() {
                *r = *r * inv_d;
            }
        }
        let li = MatMut::from_slice(&mut inv, n, n);
        let mut copy = vec![T::ZERO; b.rows * n];
        b.rb().copy_to(&mut copy);
        let w = MatMut::from_slice(&mut copy, b.rows, n);
        gemm(w.rb(), li.rb().t(), &mut b, T::ONE, T::ZERO);
        return Ok(());
    }
    let n1 = n / 2;
    let (mut b1, mut b2) = b.split_cols(n1);
    trsm(l.block(0, 0, n1, n1), b1.rb_mut())?;
    let l21 = l.block(n1, 0, n - n1, n1);
    gemm(b1.rb(), l21.t(), &mut b2, -T::ONE, T::ONE);
    trsm(l.block(n1, n1, n - n1, n - n1), b2).map_err(|(j, d)| (j + n1, d))
}

/// `c ← c + alpha·a·aᵀ` on the lower triangle of `c` only.
fn syrk_lower<T: Real>(a: MatRef<'_, T>, mut c: MatMut<'_, T>, alpha: T) {
    let m = c.rows;
    if m <= BASE {
        // One small product into a temporary, then its lower triangle.
        let mut tmp = [T::ZERO; BASE * BASE];
        let mut t = MatMut::from_slice(&mut tmp, m, m);
        gemm(a, a.t(), &mut t, T::ONE, T::ZERO);
        for i in 0..m {
            for j in 0..=i {
                let v = c.get(i, j) + alpha * t.get(i, j);
                c.set(i, j, v);
            }
        }
        return;
    }
    let m1 = m / 2;
    let [c11, _upper, mut c21, c22] = c.quadrants(m1, m1);
    let (a1, a2) = (a.block(0, 0, m1, a.cols), a.block(m1, 0, m - m1, a.cols));
    syrk_lower(a1, c11, alpha);
    gemm(a2, a1.t(), &mut c21, alpha, T::ONE);
    syrk_lower(a2, c22, alpha);
}

/// Columns of `c` per block column of [`syrk`].
const SYRK_COLS: usize = 64;

/// `c ← c − a·aᵀ` on all of `c`, by block columns: each block column's
/// product from the diagonal down is computed once into a temporary (one
/// GEMM), then subtracted from that block column and, mirrored, from the
/// block row right of the diagonal. About 0.63·m²·k multiply-adds for 256
/// rows (against m²·k/2 for one triangle and m²·k for a plain GEMM on all
/// of c), in a few large GEMMs. Block columns rather than rows: the
/// GEMM's right operand (`a`'s rows read across, which its packing
/// transposes) is then each block column's own rows, so every row of `a`
/// is transposed once; the left operand, packed as it lies, is the one
/// that repeats.
pub(crate) fn syrk<T: Real>(a: MatRef<'_, T>, mut c: MatMut<'_, T>) {
    let m = c.rows;
    let mut tmp = vec![T::ZERO; SYRK_COLS.min(m) * m];
    for j0 in (0..m).step_by(SYRK_COLS) {
        let cols = (m - j0).min(SYRK_COLS);
        let rows = m - j0;
        let mut t = MatMut::from_slice(&mut tmp, rows, cols);
        gemm(
            a.block(j0, 0, rows, a.cols),
            a.block(j0, 0, cols, a.cols).t(),
            &mut t,
            T::ONE,
            T::ZERO,
        );
        let t = t.rb();
        let (_, below) = c.rb_mut().split_rows(j0);
        let (band, _) = below.split_cols(j0 + cols);
        let (_, block_col) = band.split_cols(j0);
        sub_assign(block_col, t);
        if rows > cols {
            let (_, below) = c.rb_mut().split_rows(j0);
            let (block_row, _) = below.split_rows(cols);
            let (_, right) = block_row.split_cols(j0 + cols);
            sub_assign(right, t.block(cols, 0, rows - cols, cols).t());
        }
    }
}

/// [`sub_assign`] where `c`'s rows and `t`'s columns are contiguous (`t`
/// a transposed view): through 8×8 tiles, so that both are read and
/// written a line at a time rather than `t` one element per line.
fn sub_assign_transposed<T: Real>(mut c: MatMut<'_, T>, t: MatRef<'_, T>) {
    const TILE: usize = 8;
    let columns = t.t();
    // tile[i][j] = t(i0 + i, j0 + j)
    let mut tile = [[T::ZERO; TILE]; TILE];
    for i0 in (0..c.rows).step_by(TILE) {
        let ih = (c.rows - i0).min(TILE);
        for j0 in (0..c.cols).step_by(TILE) {
            let jw = (c.cols - j0).min(TILE);
            for j in 0..jw {
                if let Some(col) = columns.row(j0 + j) {
                    for (line, &x) in tile.iter_mut().zip(&col[i0..i0 + ih]) {
                        line[j] = x;
                    }
                }
            }
            for (i, line) in tile.iter().enumerate().take(ih) {
                if let Some(row) = c.row_mut(i0 + i) {
                    for (v, &d) in row[j0..j0 + jw].iter_mut().zip(line) {
                        *v = *v - d;
                    }
                }
            }
        }
    }
}

/// `c ← c − t` elementwise (same shapes).
fn sub_assign<T: Real>(mut c: MatMut<'_, T>, t: MatRef<'_, T>) {
    debug_assert_eq!((c.rows, c.cols), (t.rows, t.cols));
    if c.cs == 1 && t.cs != 1 && t.rs == 1 {
        return sub_assign_transposed(c, t);
    }
    for i in 0..c.rows {
        match (c.row_mut(i), t.row(i)) {
            (Some(row), Some(trow)) => {
                for (v, &d) in row.iter_mut().zip(trow) {
                    *v = *v - d;
                }
            }
            (Some(row), None) => {
                for (j, v) in row.iter_mut().enumerate() {
                    *v = *v - t.get(i, j);
                }
            }
            (None, _) => {
                for j in 0..c.cols {
                    let v = c.get(i, j) - t.get(i, j);
                    c.set(i, j, v);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both GEMMs (this crate's blocked one, where it runs, and the
    /// portable one) against the definition, on operands whose rows lie
    /// further apart than their width, with beta zero (c not read) and
    /// not. (The device tests cover every layout through whichever GEMM
    /// the CPU gets.)
    #[test]
    fn both_gemms_match_the_definition() {
        let mut x = 1u64;
        let mut next = move || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 40) % 2001) as f64 / 1000.0 - 1.0
        };
        for &(m, k, n) in &[(1, 1, 1), (7, 33, 18), (97, 260, 40), (13, 5, 1030)] {
            // Each operand stored with a row step of its width plus 3.
            let store = |rows: usize, cols: usize, next: &mut dyn FnMut() -> f64| {
                let ld = cols + 3;
                let v: Vec<f64> = (0..rows * ld).map(|_| next()).collect();
                (v, ld)
            };
            let (av, lda) = store(m, k, &mut next);
            let (bv, ldb) = store(k, n, &mut next);
            let (cv, ldc) = store(m, n, &mut next);
            for beta in [0.0, -2.0] {
                let want: Vec<f64> = (0..m * n)
                    .map(|ij| {
                        let (i, j) = (ij / n, ij % n);
                        let ab: f64 = (0..k).map(|p| av[i * lda + p] * bv[p * ldb + j]).sum();
                        0.5 * ab
                            + if beta == 0.0 {
                                0.0
                            } else {
                                beta * cv[i * ldc + j]
                            }
                    })
                    .collect();
                for blocked in [true, false] {
                    let mut c = cv.clone();
                    if beta == 0.0 {
                        c.iter_mut().for_each(|v| *v = f64::NAN);
                    }
                    let a = MatRef {
                        ptr: av.as_ptr(),
                        rows: m,
                        cols: k,
                        rs: lda as isize,
                        cs: 1,
                        _life: PhantomData,
                    };
                    let b = MatRef {
                        ptr: bv.as_ptr(),
                        rows: k,
                        cols: n,
                        rs: ldb as isize,
                        cs: 1,
                        _life: PhantomData,
                    };
                    let mut cm = MatMut {
                        ptr: c.as_mut_ptr(),
                        rows: m,
                        cols: n,
                        rs: ldc as isize,
                        cs: 1,
                        _life: PhantomData,
                    };
                    if blocked {
                        // SAFETY: the matrices address their own vectors.
                        if !unsafe { f64::blocked(a, b, &mut cm, 0.5, beta) } {
                            continue;
                        }
                    } else {
                        portable_gemm(a, b, &mut cm, 0.5, beta);
                    }
                    for (ij, w) in want.iter().enumerate() {
                        let got = c[(ij / n) * ldc + ij % n];
                        assert!(
                            (got - w).abs() <= 1e-12 * (k as f64 + 1.0) * 4.0,
                            "{m}×{k}×{n} beta {beta} blocked {blocked}: [{ij}] {got} want {w}"
                        );
                    }
                }
            }
        }
    }
}
