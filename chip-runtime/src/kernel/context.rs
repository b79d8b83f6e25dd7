//! The context a kernel runs in: its materialized arguments as typed views,
//! its scalars, and scratch memory.

use strata_wire::{Access, ChipTensor};

use super::element::{Pod, Typed};
use super::view::{Geometry, Scratch, View, ViewMut};

/// One argument after materialization: its ChipTensor, what the kernel may
/// do with it, and the host pointer of its element 0 (device memory is
/// simulated in host memory; a real device would keep a device pointer).
#[derive(Debug)]
pub struct Materialized {
    chip: ChipTensor,
    access: Access,
    base: *mut u8,
}

impl Materialized {
    /// # Safety
    /// `base` points to element 0 of `chip`'s view, and every element of the
    /// view stays readable (and writable if `access` allows) while the
    /// argument is in use.
    pub(crate) unsafe fn new(chip: ChipTensor, access: Access, base: *mut u8) -> Self {
        Materialized { chip, access, base }
    }

    /// The materialized tensor.
    pub fn chip(&self) -> &ChipTensor {
        &self.chip
    }
}

/// Supplies scratch memory to a running kernel.
pub(crate) type ScratchSource<'a> = &'a (dyn Fn(usize) -> Result<Scratch<'a>, String> + Sync);

/// What a running kernel sees.
pub struct KernelContext<'a> {
    args: &'a [Materialized],
    scalars: &'a [u64],
    scratch: ScratchSource<'a>,
}

impl std::fmt::Debug for KernelContext<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelContext")
            .field("args", &self.args)
            .field("scalars", &self.scalars)
            .finish()
    }
}

impl<'a> KernelContext<'a> {
    pub(crate) fn new(
        args: &'a [Materialized],
        scalars: &'a [u64],
        scratch: ScratchSource<'a>,
    ) -> Self {
        KernelContext {
            args,
            scalars,
            scratch,
        }
    }

    /// Number of tensor arguments.
    pub fn arg_count(&self) -> usize {
        self.args.len()
    }

    /// Argument `i` as materialized.
    ///
    /// # Errors
    /// When there is no argument `i`.
    pub fn arg(&self, i: usize) -> Result<&ChipTensor, String> {
        self.args
            .get(i)
            .map(|m| &m.chip)
            .ok_or_else(|| format!("no argument {i} (have {})", self.args.len()))
    }

    /// Argument `i` for reading as `T`.
    ///
    /// # Errors
    /// When there is no argument `i`, its dtype is not `T`'s, or the kernel
    /// declared it write-only (its bytes were not staged in).
    pub fn input<T: Typed>(&self, i: usize) -> Result<View<'_, T>, String> {
        let m = self.typed(i, T::DTYPE.name(), self.arg(i)?.dtype() == T::DTYPE)?;
        if !m.access.allows_read() {
            return Err(format!("argument {i} is write-only for this kernel"));
        }
        // SAFETY: Materialized::new's contract: base is element 0 of a view
        // that stays readable; the dtype matches T.
        Ok(unsafe { View::new(m.base.cast::<T>(), geometry(&m.chip)) })
    }

    /// Argument `i` for writing as `T`.
    ///
    /// # Errors
    /// When there is no argument `i`, its dtype is not `T`'s, or the kernel
    /// declared it read-only.
    pub fn output<T: Typed>(&self, i: usize) -> Result<ViewMut<'_, T>, String> {
        let m = self.typed(i, T::DTYPE.name(), self.arg(i)?.dtype() == T::DTYPE)?;
        if !m.access.allows_write() {
            return Err(format!("argument {i} is read-only for this kernel"));
        }
        // SAFETY: as `input`, and the view is writable because its access
        // allows writing.
        Ok(unsafe { ViewMut::new(m.base.cast::<T>(), geometry(&m.chip)) })
    }

    /// Argument `i` for reading as raw elements of `T`'s width, whatever its
    /// dtype (for kernels that move elements without computing on them).
    ///
    /// # Errors
    /// As [`KernelContext::input`], with a width check instead of a dtype
    /// check.
    pub fn input_raw<T: Pod>(&self, i: usize) -> Result<View<'_, T>, String> {
        let bits = self.arg(i)?.dtype().bits() as usize;
        let m = self.typed(i, "raw", bits == 8 * std::mem::size_of::<T>())?;
        if !m.access.allows_read() {
            return Err(format!("argument {i} is write-only for this kernel"));
        }
        // SAFETY: as `input`; T has the element width and accepts any bits.
        Ok(unsafe { View::new(m.base.cast::<T>(), geometry(&m.chip)) })
    }

    /// Argument `i` for writing as raw elements of `T`'s width.
    ///
    /// # Errors
    /// As [`KernelContext::output`], with a width check.
    pub fn output_raw<T: Pod>(&self, i: usize) -> Result<ViewMut<'_, T>, String> {
        let bits = self.arg(i)?.dtype().bits() as usize;
        let m = self.typed(i, "raw", bits == 8 * std::mem::size_of::<T>())?;
        if !m.access.allows_write() {
            return Err(format!("argument {i} is read-only for this kernel"));
        }
        // SAFETY: as `output`.
        Ok(unsafe { ViewMut::new(m.base.cast::<T>(), geometry(&m.chip)) })
    }

    /// The address of element 0 of argument `i` and whether the kernel may
    /// write it (its signature's access): for kernels that hand the memory
    /// to foreign code, such as the Python binding's kernels, which see
    /// their arguments as numpy arrays. Elements lie at element 0 plus
    /// `Σ index·stride` elements ([`KernelContext::arg`]'s shape and
    /// strides), and stay valid only while [`Kernel::run`](super::Kernel::run)
    /// runs. Prefer [`KernelContext::input`] and
    /// [`KernelContext::output`], which check every access.
    ///
    /// # Errors
    /// When there is no argument `i`.
    pub fn arg_address(&self, i: usize) -> Result<(*mut u8, bool), String> {
        let m = self.args.get(i).ok_or_else(|| format!("no argument {i}"))?;
        Ok((m.base, m.access.allows_write()))
    }

    /// Scalar `i`, as sent.
    ///
    /// # Errors
    /// When there is no scalar `i`.
    pub fn scalar(&self, i: usize) -> Result<u64, String> {
        self.scalars
            .get(i)
            .copied()
            .ok_or_else(|| format!("no scalar {i} (have {})", self.scalars.len()))
    }

    /// Scalar `i` as an f64 (by its bits).
    ///
    /// # Errors
    /// When there is no scalar `i`.
    pub fn scalar_f64(&self, i: usize) -> Result<f64, String> {
        self.scalar(i).map(f64::from_bits)
    }

    /// `nbytes` of scratch device memory, released when the returned value
    /// is dropped (and in any case when the kernel ends).
    ///
    /// # Errors
    /// When the scratch region cannot hold it.
    pub fn scratch(&self, nbytes: usize) -> Result<Scratch<'a>, String> {
        (self.scratch)(nbytes)
    }

    fn typed(&self, i: usize, want: &str, ok: bool) -> Result<&Materialized, String> {
        let m = self.args.get(i).ok_or_else(|| format!("no argument {i}"))?;
        if !ok {
            return Err(format!("argument {i} is {}, not {want}", m.chip.dtype()));
        }
        Ok(m)
    }
}

fn geometry(chip: &ChipTensor) -> Geometry {
    Geometry::new(chip.shape(), chip.strides())
}
