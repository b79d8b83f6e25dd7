//! Typed, strided element access for kernels, so that kernels never do
//! pointer arithmetic themselves.
//!
//! A [`View`] (read) or [`ViewMut`] (write) is built by the
//! [`KernelContext`](super::KernelContext) from a materialized argument whose
//! extent was checked against its backing; element `[i0, .., in]` lives at
//! `base + Σ i_k·stride_k` elements. Every access checks the index against
//! the shape, so no access can leave the checked extent, and all accesses
//! are raw reads and writes: no Rust reference to argument memory exists,
//! because other kernels, workers or processes may touch neighbouring
//! bytes of the same buffer.

use std::marker::PhantomData;

use super::element::Pod;

/// The geometry shared by views: shape and element strides, outermost first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    ndims: usize,
    shape: [usize; 5],
    strides: [isize; 5],
}

impl Geometry {
    pub(crate) fn new(shape: &[u32], strides: &[u32]) -> Geometry {
        let mut g = Geometry {
            ndims: shape.len().min(5),
            shape: [1; 5],
            strides: [0; 5],
        };
        for (k, (&n, &s)) in shape.iter().zip(strides).take(5).enumerate() {
            g.shape[k] = n as usize;
            g.strides[k] = s as isize;
        }
        g
    }

    /// Rank.
    pub fn ndims(&self) -> usize {
        self.ndims
    }
    /// Extent of each axis.
    pub fn shape(&self) -> &[usize] {
        &self.shape[..self.ndims]
    }
    /// Element stride of each axis.
    pub fn strides(&self) -> &[isize] {
        &self.strides[..self.ndims]
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape().iter().product()
    }
    /// Whether the view has no elements (never true for a valid tensor).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element offset of `idx`.
    ///
    /// # Panics
    /// When `idx` has the wrong rank or an index is past its axis: the
    /// check is what keeps every access inside the materialized extent.
    #[inline]
    pub fn offset(&self, idx: &[usize]) -> isize {
        assert_eq!(
            idx.len(),
            self.ndims,
            "index rank {} for a rank-{} view",
            idx.len(),
            self.ndims
        );
        let mut off = 0isize;
        for (k, ((&i, &n), &s)) in idx.iter().zip(&self.shape).zip(&self.strides).enumerate() {
            assert!(i < n, "index {i} past axis {k} of extent {n}");
            off += i as isize * s;
        }
        off
    }

    /// Makes the last axis extent 1, so that iterating visits each lane
    /// along the last axis once.
    pub fn collapse_last(&mut self) {
        if self.ndims > 0 {
            self.shape[self.ndims - 1] = 1;
        }
    }

    /// The multi-index of the `linear`-th element in row-major order.
    ///
    /// # Panics
    /// When `linear >= len()`.
    pub fn unravel(&self, mut linear: usize) -> [usize; 5] {
        assert!(linear < self.len(), "element {linear} of {}", self.len());
        let mut idx = [0usize; 5];
        for k in (0..self.ndims).rev() {
            idx[k] = linear % self.shape[k];
            linear /= self.shape[k];
        }
        idx
    }

    /// Calls `f` with every multi-index in row-major order.
    pub fn for_each_index(&self, mut f: impl FnMut(&[usize])) {
        let mut idx = [0usize; 5];
        let n = self.ndims;
        loop {
            f(&idx[..n]);
            let mut axis = n;
            loop {
                if axis == 0 {
                    return;
                }
                axis -= 1;
                idx[axis] += 1;
                if idx[axis] < self.shape[axis] {
                    break;
                }
                idx[axis] = 0;
            }
        }
    }
}

/// Read access to a kernel argument.
#[derive(Debug, Clone, Copy)]
pub struct View<'a, T: Pod> {
    base: *const T,
    geometry: Geometry,
    _life: PhantomData<&'a T>,
}

/// Write (and read) access to a kernel argument.
#[derive(Debug)]
pub struct ViewMut<'a, T: Pod> {
    base: *mut T,
    geometry: Geometry,
    _life: PhantomData<&'a mut T>,
}

impl<'a, T: Pod> View<'a, T> {
    /// # Safety
    /// `base` points to element 0 of a view with `geometry` whose every
    /// element lies in memory that stays readable for `'a` (alignment is not
    /// required: accesses are unaligned reads and writes).
    pub(crate) unsafe fn new(base: *const T, geometry: Geometry) -> Self {
        View {
            base,
            geometry,
            _life: PhantomData,
        }
    }

    /// Shape, strides and rank.
    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }
    /// Extent of each axis.
    pub fn shape(&self) -> &[usize] {
        self.geometry.shape()
    }

    /// The element at `idx`.
    ///
    /// # Panics
    /// On an index outside the shape.
    #[inline]
    pub fn get(&self, idx: &[usize]) -> T {
        let off = self.geometry.offset(idx);
        // SAFETY: `offset` checked idx against the shape, so the element is
        // inside the view, which `new`'s contract makes readable and aligned.
        unsafe { self.base.offset(off).read_unaligned() }
    }

    /// The `linear`-th element in row-major order.
    ///
    /// # Panics
    /// When `linear` is not below the element count.
    pub fn at(&self, linear: usize) -> T {
        let idx = self.geometry.unravel(linear);
        self.get(&idx[..self.geometry.ndims()])
    }

    /// Pointer to element 0 and element strides, for the GEMM wrapper.
    pub(crate) fn raw(&self) -> (*const T, &Geometry) {
        (self.base, &self.geometry)
    }
}

impl<'a, T: Pod> ViewMut<'a, T> {
    /// # Safety
    /// As [`View::new`], and the memory stays writable for `'a`.
    pub(crate) unsafe fn new(base: *mut T, geometry: Geometry) -> Self {
        ViewMut {
            base,
            geometry,
            _life: PhantomData,
        }
    }

    /// Shape, strides and rank.
    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }
    /// Extent of each axis.
    pub fn shape(&self) -> &[usize] {
        self.geometry.shape()
    }

    /// The element at `idx`.
    ///
    /// # Panics
    /// On an index outside the shape.
    #[inline]
    pub fn get(&self, idx: &[usize]) -> T {
        self.as_view().get(idx)
    }

    /// A read view of the same elements, borrowed from this one.
    pub fn as_view(&self) -> View<'_, T> {
        // SAFETY: the memory is readable and valid for this view's
        // lifetime (ViewMut::new's contract), which outlives the borrow.
        unsafe { View::new(self.base, self.geometry) }
    }

    /// Stores `value` at `idx`.
    ///
    /// # Panics
    /// On an index outside the shape.
    #[inline]
    pub fn set(&mut self, idx: &[usize], value: T) {
        let off = self.geometry.offset(idx);
        // SAFETY: idx checked as in `get`; the memory is writable by `new`'s
        // contract.
        unsafe { self.base.offset(off).write_unaligned(value) }
    }

    /// Pointer to element 0 and element strides, for the GEMM wrapper.
    pub(crate) fn raw(&mut self) -> (*mut T, &Geometry) {
        (self.base, &self.geometry)
    }
}

/// A kernel's private scratch memory in the device's scratch region,
/// released when dropped. It is exclusively the kernel's, so it can be
/// borrowed as an ordinary slice.
pub struct Scratch<'a> {
    ptr: *mut u8,
    len: usize,
    release: Option<Box<dyn FnOnce() + 'a>>,
}

impl std::fmt::Debug for Scratch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Scratch({} bytes)", self.len)
    }
}

impl<'a> Scratch<'a> {
    /// # Safety
    /// `ptr` is 64-byte aligned and valid for `len` bytes that nothing else
    /// accesses until `release` runs.
    pub(crate) unsafe fn new(ptr: *mut u8, len: usize, release: Box<dyn FnOnce() + 'a>) -> Self {
        Scratch {
            ptr,
            len,
            release: Some(release),
        }
    }

    /// The memory as a slice of `T`, `len / size_of::<T>()` elements.
    pub fn as_mut_slice<T: Pod>(&mut self) -> &mut [T] {
        let n = self.len / std::mem::size_of::<T>().max(1);
        // SAFETY: the block is exclusively ours (constructor contract), 64-byte
        // aligned (enough for every Pod type) and n·size_of::<T>() ≤ len; Pod
        // types accept whatever bytes the memory holds.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.cast::<T>(), n) }
    }
}

impl Drop for Scratch<'_> {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            release();
        }
    }
}
