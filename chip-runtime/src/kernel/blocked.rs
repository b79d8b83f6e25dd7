//! A blocked GEMM for x86-64 with AVX2 and FMA: operands packed into
//! panels (with 8×8 or 4×4 register transposes where a line runs along
//! the depth), then a register-tiled micro-kernel (6×16 for F32, 6×8 for
//! F64) over each pair of panels, which updates its block of `c` in place.
//! The micro-panels of `a` are the outer loop, so that each micro-kernel
//! call moves along the same six rows of `c`, and the block of `c` the
//! next call updates is prefetched while this one computes.
//!
//! Why our own: the tiled factorizations run GEMM on 256² tiles of a
//! large matrix, whose rows lie a power of two apart and come from
//! memory. The `gemm` crate, which we used before and still use where
//! this one does not run (other targets, CPUs without AVX2 and FMA), was
//! 1.19–1.24× OpenBLAS's time there; packing with prefetches of the next
//! lines, as BLAS libraries do, is what closes most of that. Measured on
//! 256² F32 tiles of an 8192² matrix, alternating runs: this GEMM 436–477
//! µs a call, the crate 494–538, OpenBLAS 411–426. On a tile that stays in
//! cache the crate is 3–5 % faster (381–400 against 395–415 µs).
//!
//! The `unsafe` here: the micro-kernels and transposes (raw vector loads
//! and stores of packed panels, whose lengths the driver sizes) and the
//! strided reads and writes of the operands, bounded by their shapes as
//! in [`super::dense`].

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::sync::OnceLock;

use super::dense::Real;

/// Rows of `a` per micro-panel (both dtypes).
const MR: usize = 6;
/// Depth of one packed block: `a`'s columns and `b`'s rows per pass.
const KC: usize = 256;
/// Rows of `a` packed at once: MR-panels that stay in L2 beside `b`'s.
const MC: usize = 96;
/// Columns of `b` packed at once.
const NC: usize = 1024;

/// A float with a micro-kernel here.
pub(crate) trait Blocked: Real {
    /// Columns of `b` per micro-panel.
    const NR: usize;

    /// Lines a register transpose takes at once.
    const GROUP: usize;

    /// `Σ_p a[i·k + p] · b[p·NR + j]` for `p < k`, into `d`: `a` is MR
    /// rows of `k` (its elements are broadcast, so they need not be
    /// transposed), `b` is `k` rows of NR (loaded as vectors).
    ///
    /// # Safety
    /// AVX2 and FMA are present; `a` holds `k·MR` elements, `b` `k·NR`;
    /// `d.acc` holds `MR·NR`, or `d.c` addresses a writable MR×NR block
    /// of unit column step.
    unsafe fn micro(k: usize, a: *const Self, b: *const Self, d: &Dest<Self>);

    /// `src` (at most GROUP lines), `kc` elements of each, into
    /// `dst[p·width + r]` (`r` the line), fetching the lines of `ahead`
    /// into cache meanwhile.
    ///
    /// Stores whole vectors: each row `p` also gets zeros at `lines..GROUP`
    /// (masked stores are slow on some CPUs), which may run past the row
    /// into the next one's first elements. Callers transpose a panel's
    /// groups last to first, so that later stores overwrite those, and
    /// leave GROUP elements of room after the panel's last row.
    ///
    /// # Safety
    /// AVX2; the lines are readable; `dst` has room for
    /// `(kc - 1)·width + GROUP` elements.
    unsafe fn transpose(src: Run<Self>, kc: usize, dst: *mut Self, width: usize, ahead: Run<Self>);

    /// The packing buffers of this thread, for this dtype.
    fn with_buffers<R>(f: impl FnOnce(&mut Vec<Self>, &mut Vec<Self>) -> R) -> R;
}

thread_local! {
    static F32_PACKS: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
    static F64_PACKS: RefCell<(Vec<f64>, Vec<f64>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

impl Blocked for f32 {
    const NR: usize = 16;

    const GROUP: usize = 8;

    unsafe fn micro(k: usize, a: *const f32, b: *const f32, d: &Dest<f32>) {
        // SAFETY: the caller's contract.
        unsafe { micro_f32(k, a, b, d) }
    }

    unsafe fn transpose(src: Run<f32>, kc: usize, dst: *mut f32, width: usize, ahead: Run<f32>) {
        // SAFETY: the caller's contract.
        unsafe { transpose_f32(src, kc, dst, width, ahead) }
    }

    fn with_buffers<R>(f: impl FnOnce(&mut Vec<f32>, &mut Vec<f32>) -> R) -> R {
        F32_PACKS.with(|p| {
            let (a, b) = &mut *p.borrow_mut();
            f(a, b)
        })
    }
}

impl Blocked for f64 {
    const NR: usize = 8;

    const GROUP: usize = 4;

    unsafe fn micro(k: usize, a: *const f64, b: *const f64, d: &Dest<f64>) {
        // SAFETY: the caller's contract.
        unsafe { micro_f64(k, a, b, d) }
    }

    unsafe fn transpose(src: Run<f64>, kc: usize, dst: *mut f64, width: usize, ahead: Run<f64>) {
        // SAFETY: the caller's contract.
        unsafe { transpose_f64(src, kc, dst, width, ahead) }
    }

    fn with_buffers<R>(f: impl FnOnce(&mut Vec<f64>, &mut Vec<f64>) -> R) -> R {
        F64_PACKS.with(|p| {
            let (a, b) = &mut *p.borrow_mut();
            f(a, b)
        })
    }
}

/// Whether this CPU runs the micro-kernels (checked once).
pub(crate) fn available() -> bool {
    static YES: OnceLock<bool> = OnceLock::new();
    *YES.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    })
}

/// Where a micro-kernel's result goes: straight into `c` (a whole MR×NR
/// block of unit column step: `c ← alpha·acc + beta·c`), or into `acc`
/// for the caller to apply.
pub(crate) struct Dest<T> {
    /// The block's first element, or null for `acc`.
    pub c: *mut T,
    /// Elements from one row of the block to the next.
    pub rs: isize,
    pub alpha: T,
    pub beta: T,
    /// MR·NR elements, row-major.
    pub acc: *mut T,
}

/// Twelve accumulators: six rows of two vectors.
macro_rules! micro_body {
    ($k:ident, $a:ident, $b:ident, $d:ident, $t:ty, $zero:ident, $set1:ident, $load:ident,
     $bcast:ident, $fma:ident, $mul:ident, $store:ident, $lanes:expr) => {{
        let mut c = [[$zero(); 2]; MR];
        for p in 0..$k {
            // SAFETY: p < k, so both panels hold these elements.
            let (b0, b1) = unsafe {
                (
                    $load($b.add(p * 2 * $lanes)),
                    $load($b.add(p * 2 * $lanes + $lanes)),
                )
            };
            for (i, row) in c.iter_mut().enumerate() {
                // SAFETY: as above.
                let ai = unsafe { $bcast(&*$a.add(i * $k + p)) };
                row[0] = $fma(ai, b0, row[0]);
                row[1] = $fma(ai, b1, row[1]);
            }
        }
        let d: &Dest<$t> = $d;
        if d.c.is_null() {
            for (i, row) in c.iter().enumerate() {
                // SAFETY: acc holds MR rows of 2·lanes.
                unsafe {
                    $store(d.acc.add(i * 2 * $lanes), row[0]);
                    $store(d.acc.add(i * 2 * $lanes + $lanes), row[1]);
                }
            }
            return;
        }
        let alpha = $set1(d.alpha);
        let beta = $set1(d.beta);
        for (i, row) in c.iter().enumerate() {
            // SAFETY: the block's rows hold 2·lanes adjacent elements
            // each (the Dest contract).
            unsafe {
                let e = d.c.offset(i as isize * d.rs);
                for (h, v) in row.iter().enumerate() {
                    let e = e.add(h * $lanes);
                    let r = if d.beta == 0.0 {
                        $mul(alpha, *v)
                    } else {
                        $fma(alpha, *v, $mul(beta, $load(e)))
                    };
                    $store(e, r);
                }
            }
        }
    }};
}

#[target_feature(enable = "avx2,fma")]
unsafe fn micro_f32(k: usize, a: *const f32, b: *const f32, d: &Dest<f32>) {
    micro_body!(
        k,
        a,
        b,
        d,
        f32,
        _mm256_setzero_ps,
        _mm256_set1_ps,
        _mm256_loadu_ps,
        _mm256_broadcast_ss,
        _mm256_fmadd_ps,
        _mm256_mul_ps,
        _mm256_storeu_ps,
        8
    )
}

#[target_feature(enable = "avx2,fma")]
unsafe fn micro_f64(k: usize, a: *const f64, b: *const f64, d: &Dest<f64>) {
    micro_body!(
        k,
        a,
        b,
        d,
        f64,
        _mm256_setzero_pd,
        _mm256_set1_pd,
        _mm256_loadu_pd,
        _mm256_broadcast_sd,
        _mm256_fmadd_pd,
        _mm256_mul_pd,
        _mm256_storeu_pd,
        4
    )
}

/// The first element of each of `src`'s lines, `N` of them: lines past its
/// count read `zeros` (KC zero elements) instead.
fn line_starts<T, const N: usize>(
    src: Run<T>,
    kc: usize,
    zeros: &'static [T; KC],
) -> [*const T; N] {
    debug_assert!(kc <= KC && src.count <= N);
    std::array::from_fn(|l| {
        if l < src.count {
            src.at.wrapping_offset(l as isize * src.ld)
        } else {
            zeros.as_ptr()
        }
    })
}

/// Fetches element `p` of each of `lines`'s lines into cache.
#[inline]
fn prefetch<T>(lines: Run<T>, p: usize) {
    for l in 0..lines.count {
        // A prefetch never faults, wherever it points.
        let at = lines
            .at
            .wrapping_offset(l as isize * lines.ld)
            .wrapping_add(p);
        // SAFETY: as above.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(at.cast()) };
    }
}

/// [`Blocked::transpose`] for F32: 8×8 blocks transposed in registers.
///
/// # Safety
/// As [`Blocked::transpose`].
#[target_feature(enable = "avx2,fma")]
unsafe fn transpose_f32(src: Run<f32>, kc: usize, dst: *mut f32, width: usize, ahead: Run<f32>) {
    static ZEROS: [f32; KC] = [0.0; KC];
    let from: [*const f32; 8] = line_starts(src, kc, &ZEROS);
    let mut p = 0;
    while p + 8 <= kc {
        if p % 16 == 0 {
            prefetch(ahead, p);
        }
        // SAFETY: each line's elements p..p + 8 are readable (a missing
        // line reads zeros, KC of them).
        let r: [_; 8] = std::array::from_fn(|l| unsafe { _mm256_loadu_ps(from[l].add(p)) });
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
        let t6 = _mm256_unpacklo_ps(r[6], r[7]);
        let t7 = _mm256_unpackhi_ps(r[6], r[7]);
        let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        let o = [
            _mm256_permute2f128_ps::<0x20>(u0, u4),
            _mm256_permute2f128_ps::<0x20>(u1, u5),
            _mm256_permute2f128_ps::<0x20>(u2, u6),
            _mm256_permute2f128_ps::<0x20>(u3, u7),
            _mm256_permute2f128_ps::<0x31>(u0, u4),
            _mm256_permute2f128_ps::<0x31>(u1, u5),
            _mm256_permute2f128_ps::<0x31>(u2, u6),
            _mm256_permute2f128_ps::<0x31>(u3, u7),
        ];
        for (q, v) in o.iter().enumerate() {
            // SAFETY: dst has room for GROUP elements from row p + q.
            unsafe { _mm256_storeu_ps(dst.add((p + q) * width), *v) };
        }
        p += 8;
    }
    for p in p..kc {
        for (l, line) in from.iter().enumerate().take(src.count) {
            // SAFETY: as above, one element at a time.
            unsafe { *dst.add(p * width + l) = *line.add(p) };
        }
    }
}

/// [`Blocked::transpose`] for F64: 4×4 blocks.
///
/// # Safety
/// As [`Blocked::transpose`].
#[target_feature(enable = "avx2,fma")]
unsafe fn transpose_f64(src: Run<f64>, kc: usize, dst: *mut f64, width: usize, ahead: Run<f64>) {
    static ZEROS: [f64; KC] = [0.0; KC];
    let from: [*const f64; 4] = line_starts(src, kc, &ZEROS);
    let mut p = 0;
    while p + 4 <= kc {
        if p % 8 == 0 {
            prefetch(ahead, p);
        }
        // SAFETY: each line's elements p..p + 4 are readable (a missing
        // line reads zeros, KC of them).
        let r: [_; 4] = std::array::from_fn(|l| unsafe { _mm256_loadu_pd(from[l].add(p)) });
        let t0 = _mm256_unpacklo_pd(r[0], r[1]);
        let t1 = _mm256_unpackhi_pd(r[0], r[1]);
        let t2 = _mm256_unpacklo_pd(r[2], r[3]);
        let t3 = _mm256_unpackhi_pd(r[2], r[3]);
        let o = [
            _mm256_permute2f128_pd::<0x20>(t0, t2),
            _mm256_permute2f128_pd::<0x20>(t1, t3),
            _mm256_permute2f128_pd::<0x31>(t0, t2),
            _mm256_permute2f128_pd::<0x31>(t1, t3),
        ];
        for (q, v) in o.iter().enumerate() {
            // SAFETY: dst has room for GROUP elements from row p + q.
            unsafe { _mm256_storeu_pd(dst.add((p + q) * width), *v) };
        }
        p += 4;
    }
    for p in p..kc {
        for (l, line) in from.iter().enumerate().take(src.count) {
            // SAFETY: as above, one element at a time.
            unsafe { *dst.add(p * width + l) = *line.add(p) };
        }
    }
}

/// Lines of adjacent elements: `count` of them, line `r` at `at + r·ld`.
#[derive(Clone, Copy)]
pub(crate) struct Run<T> {
    at: *const T,
    ld: isize,
    count: usize,
}

/// An operand seen as lines of elements along the depth: `ls` elements
/// from one line to the next, `ds` along a line.
#[derive(Clone, Copy)]
struct Lines<T> {
    ptr: *const T,
    ls: isize,
    ds: isize,
}

/// A strided operand: pointer and element strides.
#[derive(Clone, Copy)]
pub(crate) struct Strided<T> {
    pub ptr: *const T,
    pub rs: isize,
    pub cs: isize,
}

/// A strided, writable result.
pub(crate) struct StridedMut<T> {
    pub ptr: *mut T,
    pub rs: isize,
    pub cs: isize,
}

/// `c ← alpha·a·b + beta·c` for `a` m×k, `b` k×n, `c` m×n (`c` not read
/// when `beta` is zero).
///
/// # Safety
/// [`available`] is true; each operand's pointer and strides address
/// readable (for `c`: writable, distinct, unaliased) elements for every
/// index inside its shape.
pub(crate) unsafe fn gemm<T: Blocked>(
    (m, n, k): (usize, usize, usize),
    a: Strided<T>,
    b: Strided<T>,
    c: &StridedMut<T>,
    alpha: T,
    beta: T,
) {
    let nr = T::NR;
    if k == 0 {
        for i in 0..m {
            for j in 0..n {
                // SAFETY: (i, j) is inside c.
                unsafe {
                    let e = c.ptr.offset(i as isize * c.rs + j as isize * c.cs);
                    *e = if beta == T::ZERO { T::ZERO } else { beta * *e };
                }
            }
        }
        return;
    }
    T::with_buffers(|apack, bpack| {
        let kc_max = k.min(KC);
        let nc_max = n.min(NC).div_ceil(nr) * nr;
        let mc_max = m.min(MC).div_ceil(MR) * MR;
        // GROUP elements of room after the last panel (see `transpose`),
        // and the panels start on a cache line.
        let apack = aligned(apack, mc_max * kc_max + T::GROUP);
        let bpack = aligned(bpack, nc_max * kc_max + T::GROUP);
        let mut acc = [T::ZERO; MR * 16];
        for jc in (0..n).step_by(NC) {
            let nc = (n - jc).min(NC);
            for pc in (0..k).step_by(KC) {
                let kc = (k - pc).min(KC);
                // The first depth block applies beta; later ones add.
                let beta = if pc == 0 { beta } else { T::ONE };
                // b's lines are its columns, a's its rows.
                let lines = Lines {
                    ptr: b.ptr,
                    ls: b.cs,
                    ds: b.rs,
                };
                // SAFETY: the block lies inside b; bpack holds the panels
                // and GROUP elements more.
                unsafe { pack(lines, jc, nc, pc, kc, nr, bpack) };
                for ic in (0..m).step_by(MC) {
                    let mc = (m - ic).min(MC);
                    let lines = Lines {
                        ptr: a.ptr,
                        ls: a.rs,
                        ds: a.cs,
                    };
                    // SAFETY: as for b.
                    unsafe { pack_rows(lines, ic, mc, pc, kc, apack) };
                    for ir in (0..mc).step_by(MR) {
                        let mb = (mc - ir).min(MR);
                        for jr in (0..nc).step_by(nr) {
                            let nb = (nc - jr).min(nr);
                            let bp = bpack[jr * kc..].as_ptr();
                            let (i0, j0) = (ic + ir, jc + jr);
                            // The next block of c this loop updates, fetched
                            // while this one computes.
                            let (ni, nj) = if jr + nr < nc {
                                (i0, j0 + nr)
                            } else {
                                (i0 + MR, jc)
                            };
                            if ni < ic + mc {
                                for r in 0..MR.min(m - ni.min(m)) {
                                    let p = c.ptr.wrapping_offset(
                                        (ni + r) as isize * c.rs + nj as isize * c.cs,
                                    );
                                    // SAFETY: a prefetch never faults.
                                    unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) };
                                }
                            }
                            let ap = apack[ir * kc..].as_ptr();
                            if mb == MR && nb == nr && c.cs == 1 {
                                let d = Dest {
                                    c: c.ptr.wrapping_offset(i0 as isize * c.rs + j0 as isize),
                                    rs: c.rs,
                                    alpha,
                                    beta,
                                    acc: acc.as_mut_ptr(),
                                };
                                // SAFETY: the panels hold kc·MR and kc·NR
                                // elements from these offsets; the block
                                // of c is whole and inside c.
                                unsafe { T::micro(kc, ap, bp, &d) };
                                continue;
                            }
                            let d = Dest {
                                c: std::ptr::null_mut(),
                                rs: 0,
                                alpha,
                                beta,
                                acc: acc.as_mut_ptr(),
                            };
                            // SAFETY: as above; acc holds MR·NR.
                            unsafe { T::micro(kc, ap, bp, &d) };
                            for r in 0..mb {
                                let row = &acc[r * nr..r * nr + nb];
                                let base = c.ptr.wrapping_offset((i0 + r) as isize * c.rs);
                                for (j, &v) in row.iter().enumerate() {
                                    // SAFETY: (i0 + r, j0 + j) is inside c.
                                    unsafe {
                                        let e = base.offset((j0 + j) as isize * c.cs);
                                        *e = if beta == T::ZERO {
                                            alpha * v
                                        } else {
                                            alpha * v + beta * *e
                                        };
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    });
}

/// `len` elements of `buf` from its first on a cache line (grown when
/// short).
fn aligned<T: Real>(buf: &mut Vec<T>, len: usize) -> &mut [T] {
    let line = 64 / std::mem::size_of::<T>();
    if buf.len() < len + line {
        buf.resize(len + line, T::ZERO);
    }
    let skip = buf.as_ptr().align_offset(64).min(line);
    &mut buf[skip..skip + len]
}

/// Packs `count` lines from `first` of `m`, each `kc` deep from `p0`, into
/// panels of MR lines: panel `q` holds line `q·MR + i`'s `kc` elements at
/// `i·kc`, zero past the last line. These are `a`'s panels: the
/// micro-kernel broadcasts their elements, so a row along the depth is
/// copied as it is; the next panel's lines are fetched meanwhile.
///
/// # Safety
/// The block lies inside `m`'s shape; `out` holds the panels.
unsafe fn pack_rows<T: Blocked>(
    m: Lines<T>,
    first: usize,
    count: usize,
    p0: usize,
    kc: usize,
    out: &mut [T],
) {
    let line = |l: usize| {
        m.ptr
            .wrapping_offset((first + l) as isize * m.ls + p0 as isize * m.ds)
    };
    let per_cache_line = 64 / std::mem::size_of::<T>();
    for (q, panel) in out
        .chunks_exact_mut(MR * kc)
        .take(count.div_ceil(MR))
        .enumerate()
    {
        for (i, dst) in panel.chunks_exact_mut(kc).enumerate() {
            let l = q * MR + i;
            if l >= count {
                dst.fill(T::ZERO);
                continue;
            }
            if l + MR < count && m.ds == 1 {
                let next = line(l + MR);
                for p in (0..kc).step_by(per_cache_line) {
                    // SAFETY: a prefetch never faults, wherever it points.
                    unsafe {
                        _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(p).cast());
                    }
                }
            }
            let src = line(l);
            if m.ds == 1 {
                // SAFETY: line l's kc elements from p0 are adjacent and
                // inside m.
                dst.copy_from_slice(unsafe { std::slice::from_raw_parts(src, kc) });
            } else {
                for (p, v) in dst.iter_mut().enumerate() {
                    // SAFETY: (first + l, p0 + p) is inside m.
                    *v = unsafe { *src.offset(p as isize * m.ds) };
                }
            }
        }
    }
}

/// Packs `count` lines from `first` of `m`, each `kc` deep from `p0`, into
/// panels of `width` lines: panel `q` holds, for each `p < kc`, the
/// `width` elements `m(first + q·width + l, p0 + p)`, zero past the last
/// line. These are `b`'s panels (`width` NR), whose lines are its
/// columns; see [`Lines`].
///
/// # Safety
/// The block lies inside `m`'s shape; `out` holds the panels and GROUP
/// elements more.
unsafe fn pack<T: Blocked>(
    m: Lines<T>,
    first: usize,
    count: usize,
    p0: usize,
    kc: usize,
    width: usize,
    out: &mut [T],
) {
    let panels = count.div_ceil(width);
    assert!(
        out.len() >= panels * width * kc + T::GROUP,
        "pack buffer too short"
    );
    // One pointer for the whole buffer: a transpose's last stores run
    // into the next panel.
    let base = out.as_mut_ptr();
    let line = |l: usize| {
        m.ptr
            .wrapping_offset((first + l) as isize * m.ls + p0 as isize * m.ds)
    };
    for q in 0..panels {
        let panel = base.wrapping_add(q * width * kc);
        let lines = (count - q * width).min(width);
        if m.ds == 1 {
            // Lines contiguous along the depth: transposed in registers,
            // the next panel's lines fetched meanwhile.
            let ahead = count.saturating_sub((q + 1) * width).min(width);
            for g in (0..lines).step_by(T::GROUP).rev() {
                let last = g + T::GROUP >= lines;
                // SAFETY: these lines' kc elements from p0 are inside m;
                // the buffer has room for (kc - 1)·width + GROUP elements
                // from the group's first (the panels' slack).
                unsafe {
                    T::transpose(
                        Run {
                            at: line(q * width + g),
                            ld: m.ls,
                            count: (lines - g).min(T::GROUP),
                        },
                        kc,
                        panel.add(g),
                        width,
                        Run {
                            at: line((q + 1) * width),
                            ld: m.ls,
                            count: if last { ahead } else { 0 },
                        },
                    );
                }
            }
        } else if m.ls == 1 && lines == width {
            // Lines adjacent: each depth step's `width` elements copied.
            for p in 0..kc {
                // SAFETY: lines q·width.. + width at depth p0 + p are
                // adjacent and inside m; the panel holds kc·width.
                unsafe {
                    let src = line(q * width).offset(p as isize * m.ds);
                    std::ptr::copy_nonoverlapping(src, panel.add(p * width), width);
                }
            }
        } else {
            for l in 0..lines {
                let src = line(q * width + l);
                for p in 0..kc {
                    // SAFETY: (first + q·width + l, p0 + p) is inside m;
                    // the panel holds kc·width elements.
                    unsafe { *panel.add(p * width + l) = *src.offset(p as isize * m.ds) };
                }
            }
        }
        for p in 0..kc {
            for l in lines..width {
                // SAFETY: inside the panel.
                unsafe { *panel.add(p * width + l) = T::ZERO };
            }
        }
    }
}
