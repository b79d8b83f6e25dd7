//! `strata.Array`: a view (a typed, strided window over a host or device
//! buffer) as numpy users hold one. Indexing, `.T`, `transpose`,
//! `reshape` and `.view(dtype)` make new views of the same bytes (no
//! copy); `numpy()` and `__array_interface__` hand numpy the mapped memory
//! of a host buffer in place.
//!
//! Every host access checks first what the Rust driver's own reads and
//! writes check: `View::check_read` (quarantined bytes) before numpy gets
//! the memory, `View::check_write` (the view's grant, then quarantine)
//! before `__setitem__` and `write`. A view that does not grant WRITE
//! hands numpy read-only memory (`(address, True)` in the interface's
//! `data`): the ndarray's base is this object, which exposes no writable
//! buffer, so numpy refuses to make it writable again.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use strata_orchestrator::View;
use strata_wire::{Access, DType};

use crate::core::Core;
use crate::dtype;
use crate::errors::{err, invalid_view, obj, raise};

/// A view of a strata buffer: shape, strides and dtype over bytes that
/// tasks read and write.
///
/// Arrays come from a :class:`Cluster` (``array``, ``zeros``, ``empty``,
/// ``from_npy``, ``device_zeros``) and from other arrays: basic numpy
/// indexing (integers, slices with steps, ``...``, ``None``), ``.T``,
/// ``transpose``, ``reshape`` (where the bytes allow it without a copy)
/// and ``view(dtype)`` all give a new view of the *same bytes*, so strata
/// sees exactly which bytes a task touches. Indexing that numpy answers
/// with a copy (lists, arrays, masks) raises :class:`InvalidIndex`.
///
/// A host array is numpy-compatible in place: ``arr.numpy()`` (or
/// ``numpy.asarray(arr)``) is an ``ndarray`` over the buffer's mapped
/// memory with this view's shape and strides; writing through it is the
/// driver's own access — write inputs before submitting the tasks that read
/// them, and read results after ``wait``/``wait_all``. The view's grant
/// binds it: a :meth:`read_only` array gives a read-only ``ndarray`` and
/// refuses ``arr[...] = v`` and ``write`` with :class:`ReadOnlyView`.
/// While a lost task may still write the bytes, every host access raises
/// :class:`Quarantined`; an ``ndarray`` taken earlier is not checked.
///
/// An array a scope allocated (``Scope.alloc``) names memory the scope
/// holds: once the scope has ended every access raises
/// :class:`ScopeEnded`. An ``ndarray`` taken from it while the scope was
/// open keeps that memory (it is reclaimed once the ``ndarray`` goes too).
#[pyclass(name = "Array", module = "strata", frozen)]
pub(crate) struct PyArray {
    pub(crate) view: View,
    pub(crate) core: Arc<Core>,
    /// For a view of a scope buffer whose memory numpy was handed through
    /// this object (`__array_interface__`), the handle that holds that
    /// memory while this object, the ``ndarray``'s base, lives.
    pin: std::sync::OnceLock<strata_orchestrator::Buffer>,
}

/// A view derived from another: `(byte delta, shape, element strides)`.
type Derived = (u64, Vec<u32>, Vec<u32>);

/// `(length, element stride)` axes at `delta` bytes as a [`Derived`], as
/// `_geometry._finish` makes it: a length-1 axis gets the row-major
/// stride. `None` past 5 axes, for an empty axis, or past 32 bits.
fn finish(axes: &[(u64, u64)], delta: u64) -> Option<Derived> {
    if axes.is_empty() || axes.len() > 5 || axes.iter().any(|&(n, _)| n == 0) {
        return None;
    }
    let (mut shape, mut strides) = (vec![0u32; axes.len()], vec![0u32; axes.len()]);
    let mut inner: u64 = 1;
    for (k, &(n, st)) in axes.iter().enumerate().rev() {
        let st = if n == 1 { inner } else { st };
        shape[k] = u32::try_from(n).ok()?;
        strides[k] = u32::try_from(st).ok()?;
        inner = st.checked_mul(n)?;
    }
    Some((delta, shape, strides))
}

impl PyArray {
    pub(crate) fn new(view: View, core: Arc<Core>) -> Self {
        PyArray {
            view,
            core,
            pin: std::sync::OnceLock::new(),
        }
    }

    /// Whether the view is of a scope buffer that this handle does not
    /// pin: its address must come from a pinned handle.
    fn needs_pin(&self) -> bool {
        self.view.buffer().scope().is_some()
            && self.view.buffer().host_address_transient(false).is_none()
    }

    /// This array through a handle that holds its memory, for an
    /// ``ndarray`` whose base it becomes (a scope buffer's memory stays
    /// while that ``ndarray`` lives; any other array is itself).
    fn pinned<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let me = slf.get();
        if !me.needs_pin() {
            return Ok(slf.clone().into_any());
        }
        let view = me.view.pinned().map_err(err)?;
        Ok(Bound::new(slf.py(), PyArray::new(view, Arc::clone(&me.core)))?.into_any())
    }

    fn itemsize(&self) -> PyResult<usize> {
        dtype::itemsize(self.view.dtype()).ok_or_else(|| {
            invalid_view(format!(
                "{} packs two values per byte: views of it cannot be indexed or handed to numpy",
                self.view.dtype().name()
            ))
        })
    }

    fn byte_strides(&self) -> PyResult<Vec<u64>> {
        let item = self.itemsize()? as u64;
        Ok(self
            .view
            .tensor()
            .strides()
            .iter()
            .map(|&s| u64::from(s) * item)
            .collect())
    }

    /// The view `delta` bytes further on with `shape`, element `strides`
    /// and `dtype`.
    fn derive(&self, delta: u64, shape: &[u32], strides: &[u32], dtype: DType) -> PyResult<Self> {
        let offset = self
            .view
            .tensor()
            .byte_offset()
            .checked_add(delta)
            .ok_or_else(|| invalid_view("offset overflows"))?;
        let view = self
            .view
            .reshape(offset, shape, strides, dtype)
            .map_err(err)?;
        Ok(PyArray::new(view, Arc::clone(&self.core)))
    }

    /// `view[key]` computed here, for the keys a loop over tiles uses —
    /// Python integers, slices with a positive step, `...` and `None`,
    /// alone or in a tuple — when the answer is a view strata can express:
    /// `(byte delta, shape, element strides)` as `strata._geometry.index`
    /// gives them (numpy's rules: `tests/test_views.py` checks the two
    /// agree on random keys). `None` for anything else (other key types,
    /// an index out of range, an empty or reversed axis, too many axes):
    /// the numpy path answers those, with its errors.
    fn basic_index(&self, key: &Bound<'_, PyAny>) -> PyResult<Option<Derived>> {
        use pyo3::types::{PyBool, PyEllipsis, PyInt, PySlice};
        let parts: Vec<Bound<'_, PyAny>> = match key.cast::<PyTuple>() {
            Ok(t) => t.iter().collect(),
            Err(_) => vec![key.clone()],
        };
        if parts.len() > 8 {
            return Ok(None);
        }
        let Some(item) = dtype::itemsize(self.view.dtype()) else {
            return Ok(None);
        };
        let (shape, strides) = (self.view.shape(), self.view.tensor().strides());
        let ellipsis = PyEllipsis::get(key.py());
        let mut axis = 0usize;
        let mut rest_seen = false;
        // Axes the key names (integers and slices), for `...`'s share.
        let mut named = 0usize;
        for p in &parts {
            if p.is_instance_of::<PyBool>() {
                return Ok(None);
            }
            if p.is_instance_of::<PyInt>() || p.is_instance_of::<PySlice>() {
                named += 1;
            } else if p.is(ellipsis) {
                if rest_seen {
                    return Ok(None);
                }
                rest_seen = true;
            } else if !p.is_none() {
                return Ok(None);
            }
        }
        if named > shape.len() {
            return Ok(None);
        }
        let mut offset: u64 = 0;
        let mut out: Vec<(u64, u64)> = Vec::with_capacity(shape.len() + 2);
        let keep = |out: &mut Vec<(u64, u64)>, axis: usize| {
            out.push((u64::from(shape[axis]), u64::from(strides[axis])));
        };
        for p in &parts {
            if p.is_none() {
                out.push((1, 0));
            } else if p.is(ellipsis) {
                for _ in 0..shape.len() - named {
                    keep(&mut out, axis);
                    axis += 1;
                }
            } else if let Ok(sl) = p.cast::<PySlice>() {
                let len = shape[axis] as isize;
                let ix = sl.indices(len)?;
                if ix.step <= 0 || ix.slicelength == 0 {
                    return Ok(None);
                }
                offset += ix.start as u64 * u64::from(strides[axis]);
                out.push((
                    ix.slicelength as u64,
                    u64::from(strides[axis]) * ix.step as u64,
                ));
                axis += 1;
            } else {
                let Ok(i) = p.extract::<i64>() else {
                    return Ok(None);
                };
                let len = i64::from(shape[axis]);
                let i = if i < 0 { i + len } else { i };
                if !(0..len).contains(&i) {
                    return Ok(None);
                }
                offset += i as u64 * u64::from(strides[axis]);
                axis += 1;
            }
        }
        while axis < shape.len() {
            keep(&mut out, axis);
            axis += 1;
        }
        if out.is_empty() {
            out.push((1, 1));
        }
        Ok(finish(&out, offset * item as u64))
    }

    /// `view.reshape(newshape)` computed here (numpy's no-copy reshape in
    /// C order: runs of old axes that are contiguous with each other take
    /// the new axes of the same product), for a shape of Python integers
    /// with at most one -1. `None` for anything else, or where numpy would
    /// copy or refuse: the numpy path answers those, with its errors.
    fn native_reshape(&self, new: &Bound<'_, PyAny>) -> Option<Derived> {
        let want: Vec<i64> = if new.is_instance_of::<pyo3::types::PyInt>() {
            vec![new.extract().ok()?]
        } else if let Ok(t) = new.cast::<PyTuple>() {
            t.iter()
                .map(|n| n.extract::<i64>().ok())
                .collect::<Option<_>>()?
        } else {
            new.extract().ok()?
        };
        let (shape, strides) = (self.view.shape(), self.view.tensor().strides());
        let total: u64 = shape.iter().map(|&n| u64::from(n)).product();
        let known: i64 = want.iter().filter(|&&n| n != -1).product();
        if want.is_empty() || want.len() > 5 || want.iter().any(|&n| n < -1 || n == 0) || known <= 0
        {
            return None;
        }
        let new_dims: Vec<u64> = match want.iter().filter(|&&n| n == -1).count() {
            0 => want.iter().map(|&n| n as u64).collect(),
            1 if total % known as u64 == 0 => want
                .iter()
                .map(|&n| {
                    if n == -1 {
                        total / known as u64
                    } else {
                        n as u64
                    }
                })
                .collect(),
            _ => return None,
        };
        if new_dims.iter().product::<u64>() != total {
            return None;
        }
        // numpy's `_attempt_nocopy_reshape`, C order, in elements.
        let old: Vec<(u64, u64)> = shape
            .iter()
            .zip(strides)
            .filter(|&(&n, _)| n != 1)
            .map(|(&n, &st)| (u64::from(n), u64::from(st)))
            .collect();
        let mut new_strides = vec![1u64; new_dims.len()];
        let (mut oi, mut oj, mut ni, mut nj) = (0, 1, 0, 1);
        while ni < new_dims.len() && oi < old.len() {
            let (mut np, mut op) = (new_dims[ni], old[oi].0);
            while np != op {
                if np < op {
                    np *= *new_dims.get(nj)?;
                    nj += 1;
                } else {
                    op *= old.get(oj)?.0;
                    oj += 1;
                }
            }
            if (oi..oj - 1).any(|k| old[k].1 != old[k + 1].0 * old[k + 1].1) {
                return None;
            }
            new_strides[nj - 1] = old[oj - 1].1;
            for k in (ni + 1..nj).rev() {
                new_strides[k - 1] = new_strides[k] * new_dims[k];
            }
            ni = nj;
            nj += 1;
            oi = oj;
            oj += 1;
        }
        let out: Vec<(u64, u64)> = new_dims.into_iter().zip(new_strides).collect();
        finish(&out, 0)
    }

    /// `view.view(dtype)` of elements of `new` bytes computed here (numpy's
    /// rule: with another size, the last axis must be contiguous, and its
    /// bytes a whole number of new elements). `None` where numpy would
    /// refuse or the result is no strata view: the numpy path answers.
    fn native_retype(&self, new: usize) -> Option<Derived> {
        let item = dtype::itemsize(self.view.dtype())? as u64;
        let new = new as u64;
        let (shape, strides) = (self.view.shape(), self.view.tensor().strides());
        let mut out: Vec<(u64, u64)> = shape
            .iter()
            .zip(strides)
            .map(|(&n, &st)| (u64::from(n), u64::from(st) * item))
            .collect();
        let last = out.last_mut()?;
        if new != item {
            if last.0 != 1 && last.1 != item {
                return None;
            }
            let bytes = last.0 * item;
            if bytes % new != 0 {
                return None;
            }
            *last = (bytes / new, new);
        }
        // Byte strides to elements of the new size (length-1 axes' do
        // not matter: `finish` gives them the row-major one).
        for a in &mut out {
            if a.0 != 1 && a.1 % new != 0 {
                return None;
            }
            a.1 /= new;
        }
        finish(&out, 0)
    }

    /// Applies `strata._geometry.<func>` to this view and derives the
    /// view it describes.
    fn by_numpy(
        &self,
        py: Python<'_>,
        func: &str,
        extra: Bound<'_, PyAny>,
        new_dtype: DType,
    ) -> PyResult<Self> {
        let shape: Vec<u32> = self.view.shape().to_vec();
        let r = py.import("strata._geometry")?.getattr(func)?.call1((
            shape,
            self.byte_strides()?,
            self.itemsize()?,
            extra,
        ))?;
        let (delta, shape, strides): (u64, Vec<u64>, Vec<u64>) = r.extract()?;
        let to32 = |v: Vec<u64>, what: &str| -> PyResult<Vec<u32>> {
            v.into_iter()
                .map(|x| {
                    u32::try_from(x).map_err(|_| {
                        invalid_view(format!(
                            "{what} {x} does not fit a strata view (at most 2^32-1)"
                        ))
                    })
                })
                .collect()
        };
        let shape = to32(shape, "axis length")?;
        let strides = to32(strides, "stride")?;
        self.derive(delta, &shape, &strides, new_dtype)
    }

    /// The address of the view's first byte: kept by whoever takes it
    /// (`transient` `None`: the buffer counts as exposed to the driver),
    /// or used for one read (`Some(false)`) or write (`Some(true)`) that
    /// ends before the call returns.
    fn host_address(&self, transient: Option<bool>) -> PyResult<usize> {
        let buffer = self.pin.get().unwrap_or(self.view.buffer());
        let address = match transient {
            None => buffer.host_address(),
            Some(write) => buffer.host_address_transient(write),
        };
        match address {
            Some((addr, _len)) => Ok(addr as usize + self.view.tensor().byte_offset() as usize),
            None => Err(raise(
                "BufferError",
                format!(
                    "this view is of a device buffer on worker {}: its bytes are in that chip's memory, not here (copy them with to_numpy())",
                    self.view.buffer().device_worker().map_or(0, |w| w.0)
                ),
                &[],
            )),
        }
    }

    /// The numpy array interface of the view (host buffers), after the
    /// quarantine check; read-only memory for a view that does not grant
    /// WRITE.
    fn interface<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        // numpy keeps this object as the ndarray's base: for a scope
        // buffer it holds the memory from now on.
        if self.pin.get().is_none() && self.needs_pin() {
            let _ = self.pin.set(self.view.buffer().pinned().map_err(err)?);
        }
        self.interface_for(py, None)
    }

    /// [`PyArray::interface`] for an access of the kind `transient` says
    /// (see [`PyArray::host_address`]).
    fn interface_for<'py>(
        &self,
        py: Python<'py>,
        transient: Option<bool>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let addr = self.host_address(transient)?;
        self.view.check_read().map_err(err)?;
        let read_only = !self.view.access().allows_write();
        let ts = dtype::typestr(self.view.dtype()).ok_or_else(|| {
            invalid_view(format!("{} has no numpy dtype", self.view.dtype().name()))
        })?;
        let d = PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("shape", PyTuple::new(py, self.view.shape())?)?;
        d.set_item("typestr", ts)?;
        d.set_item("data", (addr, read_only))?;
        d.set_item("strides", PyTuple::new(py, self.byte_strides()?)?)?;
        Ok(d)
    }
}

#[pymethods]
impl PyArray {
    /// The view's shape, as a tuple.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.view.shape())
    }

    /// The view's strides in bytes (numpy's convention).
    #[getter]
    fn strides<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.byte_strides()?)
    }

    /// The view's dtype: a ``numpy.dtype``, or strata's name (``"bf16"``,
    /// ``"fp8e4m3fn"``...) for a type numpy lacks.
    #[getter]
    fn dtype(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        dtype::to_py(py, self.view.dtype())
    }

    /// Number of axes.
    #[getter]
    fn ndim(&self) -> usize {
        self.view.shape().len()
    }

    /// Number of elements.
    #[getter]
    fn size(&self) -> u64 {
        self.view.tensor().element_count()
    }

    /// Bytes per element.
    #[getter(itemsize)]
    fn itemsize_getter(&self) -> PyResult<usize> {
        self.itemsize()
    }

    /// Bytes the view's elements take (numpy's ``size * itemsize``; half a
    /// byte each for a 4-bit dtype, rounded up). Not what it spans in its
    /// buffer when it is strided (that is the buffer's business).
    #[getter]
    fn nbytes(&self) -> PyResult<u64> {
        let d = self.view.dtype();
        d.bytes_for(self.view.tensor().element_count())
            .ok_or_else(|| invalid_view("nbytes overflows"))
    }

    /// Where the view starts in its buffer, in bytes.
    #[getter]
    fn offset(&self) -> u64 {
        self.view.tensor().byte_offset()
    }

    /// The size of the buffer under the view, in bytes.
    #[getter]
    fn buffer_nbytes(&self) -> u64 {
        self.view.buffer().nbytes()
    }

    /// ``None`` for a host buffer; the worker id whose device holds it for
    /// a device buffer.
    #[getter]
    fn device_worker(&self) -> Option<u32> {
        self.view.buffer().device_worker().map(|w| w.0)
    }

    /// What tasks named with this view may do: ``"r"``, ``"w"`` or ``"rw"``.
    #[getter]
    fn access(&self) -> &'static str {
        match self.view.access() {
            Access::Read => "r",
            Access::Write => "w",
            Access::ReadWrite => "rw",
        }
    }

    /// The same view, granting read access only: a task that writes
    /// through it is refused at submit, and so is the driver's own
    /// ``arr[...] = v`` and ``write`` (:class:`ReadOnlyView`); its
    /// ``numpy()`` is a read-only ``ndarray``.
    fn read_only(&self) -> PyResult<Self> {
        let v = self.view.read_only().map_err(err)?;
        Ok(PyArray::new(v, Arc::clone(&self.core)))
    }

    /// Whether ``other`` views the same buffer.
    fn same_buffer(&self, other: &PyArray) -> bool {
        self.view.buffer().identity() == other.view.buffer().identity()
    }

    fn __len__(&self) -> usize {
        self.view.shape().first().map_or(0, |&n| n as usize)
    }

    fn __repr__(&self) -> String {
        let t = self.view.tensor();
        let place = match self.view.buffer().device_worker() {
            Some(w) => format!("device buffer on worker {}", w.0),
            None => "host buffer".to_owned(),
        };
        format!(
            "strata.Array(shape={:?}, dtype={}, strides={:?} elements, offset={} B, {place} of {} B)",
            t.shape(),
            t.dtype().name().to_ascii_lowercase(),
            t.strides(),
            t.byte_offset(),
            self.view.buffer().nbytes()
        )
    }

    /// A view of the same bytes by numpy's basic indexing: integers,
    /// slices (with positive steps), ``...`` and ``None``. Indexing every
    /// axis with an integer gives a one-element view of shape ``(1,)``.
    ///
    /// Raises :class:`InvalidIndex` for indexing numpy answers with a copy
    /// (lists, arrays, boolean masks) and :class:`InvalidView` for a
    /// geometry strata cannot express (negative steps, empty slices).
    fn __getitem__(&self, py: Python<'_>, key: Bound<'_, PyAny>) -> PyResult<Self> {
        match self.basic_index(&key)? {
            Some((delta, shape, strides)) => {
                self.derive(delta, &shape, &strides, self.view.dtype())
            }
            None => self.by_numpy(py, "index", key, self.view.dtype()),
        }
    }

    /// Assigns through numpy (host buffers): ``arr[1:3] = 7`` is
    /// ``arr.numpy()[1:3] = 7``, after the checks of ``write``.
    fn __setitem__(
        slf: &Bound<'_, Self>,
        key: Bound<'_, PyAny>,
        value: Bound<'_, PyAny>,
    ) -> PyResult<()> {
        slf.get().view.check_write().map_err(err)?;
        let a = PyArray::numpy_transient(slf, true)?;
        a.set_item(key, value)
    }

    /// The view with its axes reversed (numpy's ``.T``).
    #[getter(T)]
    fn t(&self) -> PyResult<Self> {
        let n = self.view.shape().len();
        let axes: Vec<usize> = (0..n).rev().collect();
        self.permute(&axes)
    }

    /// The view with its axes permuted: ``transpose()`` reverses them,
    /// ``transpose(1, 0, 2)`` or ``transpose((1, 0, 2))`` names the order.
    #[pyo3(signature = (*axes))]
    fn transpose(&self, axes: Bound<'_, PyTuple>) -> PyResult<Self> {
        let n = self.view.shape().len();
        let axes: Vec<i64> = match axes.len() {
            0 => (0..n as i64).rev().collect(),
            1 if !axes.get_item(0)?.is_instance_of::<pyo3::types::PyInt>() => {
                axes.get_item(0)?.extract()?
            }
            _ => axes.extract()?,
        };
        let mut norm = Vec::with_capacity(n);
        for a in axes {
            let k = if a < 0 { a + n as i64 } else { a };
            if !(0..n as i64).contains(&k) {
                return Err(invalid_view(format!(
                    "axis {a} is out of range for {n} axes"
                )));
            }
            norm.push(k as usize);
        }
        self.permute(&norm)
    }

    /// The same bytes with another shape (one axis may be ``-1``), where
    /// that needs no copy; otherwise :class:`InvalidView`.
    #[pyo3(signature = (*shape))]
    fn reshape(&self, py: Python<'_>, shape: Bound<'_, PyTuple>) -> PyResult<Self> {
        let shape =
            if shape.len() == 1 && !shape.get_item(0)?.is_instance_of::<pyo3::types::PyInt>() {
                shape.get_item(0)?
            } else {
                shape.into_any()
            };
        match self.native_reshape(&shape) {
            Some((delta, shape, strides)) => {
                self.derive(delta, &shape, &strides, self.view.dtype())
            }
            None => self.by_numpy(py, "reshape", shape, self.view.dtype()),
        }
    }

    /// The same bytes seen as ``dtype`` (numpy's ``ndarray.view``): with
    /// another element size, the last axis must be contiguous and its
    /// length changes.
    fn view(&self, py: Python<'_>, dtype: Bound<'_, PyAny>) -> PyResult<Self> {
        let d = dtype::parse(&dtype)?;
        let new = dtype::itemsize(d).ok_or_else(|| {
            invalid_view(format!(
                "{}: two values per byte cannot be viewed",
                d.name()
            ))
        })?;
        match self.native_retype(new) {
            Some((delta, shape, strides)) => self.derive(delta, &shape, &strides, d),
            None => self.by_numpy(py, "view", obj(py, new).into_bound(py), d),
        }
    }

    /// An ``ndarray`` over the buffer's memory with this view's shape,
    /// strides and dtype: no copy (``numpy.shares_memory`` with every other
    /// array of the buffer). Host buffers only; bf16 and fp8 views come as
    /// unsigned integers of their width (their bits). Read-only for a view
    /// that does not grant WRITE; :class:`Quarantined` while a lost task
    /// may still write the bytes.
    pub(crate) fn numpy<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        // numpy calls the interface, which checks too; checking here keeps
        // the error ours whatever numpy does with one raised inside it.
        slf.get().view.check_read().map_err(err)?;
        let base = PyArray::pinned(slf)?;
        slf.py().import("numpy")?.call_method1("asarray", (base,))
    }

    /// A numpy array over the view for one read (`write` false) or write
    /// that ends before the caller returns, the array dropped with it: the
    /// buffer is not exposed to the driver by it (see
    /// [`PyArray::host_address`]).
    fn numpy_transient<'py>(slf: &Bound<'py, Self>, write: bool) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        slf.get().view.check_read().map_err(err)?;
        let owner = PyArray::pinned(slf)?;
        let interface = owner
            .cast::<PyArray>()?
            .get()
            .interface_for(py, Some(write))?;
        let holder = py
            .import("strata._geometry")?
            .getattr("Interface")?
            .call1((interface, owner))?;
        py.import("numpy")?.call_method1("asarray", (holder,))
    }

    /// DLPack: a capsule of this view of a *shared* device array
    /// (``Cluster.device_zeros(..., shared=True)``), mapped into this
    /// process — host memory for a simulated chip (``numpy.from_dlpack``),
    /// device memory of the same GPU for a CUDA one (``cupy.from_dlpack``,
    /// ``torch.from_dlpack``) — read and written in place, no copy. Order
    /// it against tasks as for ``numpy()``: take it after the writers'
    /// ``wait``, and write before submitting readers. The mapping lives as
    /// long as the consumer's tensor. ``copy=True`` is refused (ask
    /// ``to_numpy()``), as is a ``dl_device`` other than this array's.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        slf: &Bound<'py, Self>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<Bound<'py, PyAny>>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        // The bytes are ready once their writers were waited for: no stream
        // to order against.
        let _ = stream;
        let versioned = match max_version {
            Some(v) => v.extract::<(u32, u32)>()?.0 >= 1,
            None => false,
        };
        let py = slf.py();
        let me = slf.get();
        if copy == Some(true) {
            return Err(pyo3::exceptions::PyBufferError::new_err(
                "__dlpack__(copy=True): a shared device array is handed out in place; to_numpy() copies",
            ));
        }
        let view = me.view.clone();
        let core = Arc::clone(&me.core);
        let shared = py
            .detach(|| core.run(|c| c.export_device(view.buffer())))
            .map_err(err)?;
        let mapping = py.detach(|| shared.map()).map_err(|e| {
            pyo3::exceptions::PyBufferError::new_err(format!("mapping the shared array: {e}"))
        })?;
        // No quarantine to check: a lost worker's buffer is exported no
        // more, and a capsule taken before the loss is, like an ndarray
        // taken before it, not checked later.
        let memory = mapping.into_memory();
        let here = crate::dlpack::device(memory.place());
        if let Some(asked) = dl_device
            && asked != here
        {
            return Err(pyo3::exceptions::PyBufferError::new_err(format!(
                "__dlpack__(dl_device={asked:?}): the array is on device {here:?}"
            )));
        }
        let writable = me.view.tensor().buffer().access().allows_write();
        crate::dlpack::capsule(py, memory, me.view.tensor(), versioned, writable)
    }

    /// DLPack: ``(device type, device id)`` of a device array's memory —
    /// ``(1, 0)`` (CPU) on a simulated chip, ``(2, N)`` (CUDA) on GPU
    /// ``N`` — and ``(1, 0)`` for a host array.
    fn __dlpack_device__(&self) -> PyResult<(i32, i32)> {
        let Some(worker) = self.view.buffer().device_worker() else {
            return Ok((1, 0));
        };
        let spec = self
            .core
            .run(|c| Ok(c.workers().get(worker.0 as usize).map(|w| w.device.clone())))
            .map_err(err)?
            .unwrap_or_default();
        let place = match spec.strip_prefix("cuda:") {
            Some(rest) => {
                let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                strata_chip_runtime::shared::Place::Cuda(digits.parse().unwrap_or(0))
            }
            None => strata_chip_runtime::shared::Place::Host,
        };
        Ok(crate::dlpack::device(place))
    }

    /// numpy's array interface: ``numpy.asarray(arr)`` is ``arr.numpy()``.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.interface(py)
    }

    /// A C-ordered *copy* of the view's elements as an ``ndarray``, host or
    /// device buffer alike (a device view's bytes are read from its
    /// worker).
    fn to_numpy<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let me = slf.get();
        if me.view.buffer().device_worker().is_none() {
            return PyArray::numpy_transient(slf, false)?.call_method0("copy");
        }
        let t = *me.view.tensor();
        let (offset, len) = (t.byte_offset(), t.extent_bytes());
        let view = me.view.clone();
        let core = Arc::clone(&me.core);
        let bytes = py
            .detach(|| core.run(|c| c.read_device(view.buffer(), offset, len)))
            .map_err(err)?;
        let ts = dtype::typestr(t.dtype())
            .ok_or_else(|| invalid_view(format!("{} has no numpy dtype", t.dtype().name())))?;
        py.import("strata._geometry")?.getattr("gather")?.call1((
            pyo3::types::PyBytes::new(py, &bytes),
            t.shape().to_vec(),
            t.strides().to_vec(),
            ts,
        ))
    }

    /// Writes ``values`` (anything numpy turns into this view's shape and
    /// dtype) into the view: in place for a host buffer, by a control call
    /// for a device buffer (whose view must then be row-major contiguous).
    /// Order it against tasks yourself: before submitting readers, after
    /// writers are done. Refused for a view that does not grant WRITE
    /// (:class:`ReadOnlyView`) and while the bytes are quarantined.
    fn write(slf: &Bound<'_, Self>, values: Bound<'_, PyAny>) -> PyResult<()> {
        let py = slf.py();
        let me = slf.get();
        me.view.check_write().map_err(err)?;
        if me.view.buffer().device_worker().is_none() {
            let a = PyArray::numpy_transient(slf, true)?;
            return a
                .call_method1("__setitem__", (pyo3::types::PyEllipsis::get(py), values))
                .map(drop);
        }
        let t = *me.view.tensor();
        let row_major = {
            let mut inner = 1u64;
            let mut ok = true;
            for (&n, &s) in t.shape().iter().zip(t.strides()).rev() {
                if n > 1 && u64::from(s) != inner {
                    ok = false;
                }
                inner *= u64::from(n);
            }
            ok
        };
        if !row_major {
            return Err(invalid_view(
                "write to a device view needs a row-major contiguous view (write the whole tile, or a host buffer)",
            ));
        }
        let ts = dtype::typestr(t.dtype())
            .ok_or_else(|| invalid_view(format!("{} has no numpy dtype", t.dtype().name())))?;
        let np = py.import("numpy")?;
        let a = np.call_method1("asarray", (values, ts))?;
        let a = np.call_method1("broadcast_to", (a, PyTuple::new(py, t.shape())?))?;
        let bytes: Vec<u8> = np
            .call_method1("ascontiguousarray", (a,))?
            .call_method0("tobytes")?
            .extract()?;
        let view = me.view.clone();
        let core = Arc::clone(&me.core);
        py.detach(|| core.run(|c| c.write_device(view.buffer(), t.byte_offset(), &bytes)))
            .map_err(err)
    }

    /// Writes the view's elements to a ``.npy`` file (host buffers).
    fn save_npy(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
        let view = self.view.clone();
        py.detach(|| view.save_npy(&path)).map_err(err)
    }
}

impl PyArray {
    fn permute(&self, axes: &[usize]) -> PyResult<Self> {
        let t = self.view.tensor();
        let n = t.shape().len();
        let mut seen = vec![false; n];
        if axes.len() != n
            || axes
                .iter()
                .any(|&a| a >= n || std::mem::replace(&mut seen[a], true))
        {
            return Err(invalid_view(format!(
                "axes {axes:?} are not a permutation of the view's {n} axes"
            )));
        }
        let shape: Vec<u32> = axes.iter().map(|&a| t.shape()[a]).collect();
        let strides: Vec<u32> = axes.iter().map(|&a| t.strides()[a]).collect();
        self.derive(0, &shape, &strides, t.dtype())
    }
}

/// `shape` (an int or a sequence of ints) as a strata shape.
pub(crate) fn shape_of(shape: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    let dims: Vec<i64> = match shape.extract::<i64>() {
        Ok(n) => vec![n],
        Err(_) => shape.extract()?,
    };
    dims.into_iter()
        .map(|d| {
            u32::try_from(d)
                .ok()
                .filter(|&d| d > 0)
                .ok_or_else(|| invalid_view(format!("axis length {d}: each must be 1 to 2^32-1")))
        })
        .collect()
}

/// A host array of `shape` and `dtype` (default float32) over the view
/// `make` gives for them, made with the GIL released.
pub(crate) fn host_array(
    py: Python<'_>,
    core: &Arc<Core>,
    shape: &Bound<'_, PyAny>,
    dtype: Option<Bound<'_, PyAny>>,
    make: impl FnOnce(
        &strata_orchestrator::Cluster,
        &[u32],
        DType,
    ) -> Result<strata_orchestrator::View, strata_orchestrator::Error>
    + Send,
) -> PyResult<PyArray> {
    let shape = shape_of(shape)?;
    let d = crate::dtype::dtype_or_f32(dtype)?;
    let view = py
        .detach(|| core.run(|c| make(c, &shape, d)))
        .map_err(err)?;
    Ok(PyArray::new(view, Arc::clone(core)))
}
