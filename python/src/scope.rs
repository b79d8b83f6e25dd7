//! `strata.Scope`: a scope as a context manager, with the memory it
//! allocates and the scopes opened in it.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyTuple;
use strata_orchestrator::Scope;

use crate::array::PyArray;
use crate::core::Core;
use crate::errors::err;

/// A scope: memory it allocates (``alloc``) and arrays added to it
/// (``add``) are reclaimed — their memory freed or recycled, on the
/// workers too — once the scope has ended and no unfinished task uses
/// them. A context manager: leaving the block ends it. Arrays it
/// allocated raise :class:`ScopeEnded` on every use after that (an
/// ``ndarray`` taken from one earlier keeps its memory while it lives).
///
/// Scopes nest: ``s.scope()`` opens one inside ``s``, which ends first
/// when ``s`` ends and reclaims only its own allocations.
#[pyclass(name = "Scope", module = "strata", frozen)]
pub(crate) struct PyScope {
    scope: Scope,
    core: Arc<Core>,
}

impl PyScope {
    pub(crate) fn new(scope: Scope, core: Arc<Core>) -> Self {
        PyScope { scope, core }
    }
}

#[pymethods]
impl PyScope {
    /// A zero-filled host array of ``shape`` (an int or a tuple) and
    /// ``dtype`` (a numpy dtype, or strata's name; default float32) whose
    /// memory this scope holds, from the cluster's pool.
    ///
    /// Raises:
    ///     ScopeEnded: the scope has ended.
    ///     InvalidView: an axis that is not 1 to 2^32-1.
    ///     BufferError: no axes or more than five, or a size past 64 bits.
    #[pyo3(signature = (shape, dtype=None))]
    fn alloc(
        &self,
        py: Python<'_>,
        shape: Bound<'_, PyAny>,
        dtype: Option<Bound<'_, PyAny>>,
    ) -> PyResult<PyArray> {
        let scope = self.scope;
        crate::array::host_array(py, &self.core, &shape, dtype, |c, shape, d| {
            c.alloc_in(scope, shape, d)
        })
    }

    /// Opens a scope inside this one (a context manager too).
    ///
    /// Raises:
    ///     SubmitError: this scope has ended.
    fn scope(&self, py: Python<'_>) -> PyResult<PyScope> {
        let core = Arc::clone(&self.core);
        let parent = self.scope;
        let scope = py
            .detach(|| core.run(|c| c.open_scope_in(parent)))
            .map_err(err)?;
        Ok(PyScope::new(scope, Arc::clone(&self.core)))
    }

    /// Registers ``array``'s buffer in the scope; returns the array.
    fn add<'py>(
        &self,
        py: Python<'py>,
        array: Bound<'py, PyArray>,
    ) -> PyResult<Bound<'py, PyArray>> {
        let core = Arc::clone(&self.core);
        let buffer = array.get().view.buffer().clone();
        let scope = self.scope;
        py.detach(|| core.run(|c| c.scope_buffer(scope, &buffer)))
            .map_err(err)?;
        Ok(array)
    }

    /// Whether the scope has ended (by ``end``, its block, or the scope it
    /// was opened in).
    #[getter]
    fn ended(&self) -> PyResult<bool> {
        let scope = self.scope;
        self.core.run(|c| Ok(!c.scope_is_open(scope))).map_err(err)
    }

    /// Ends the scope (and the scopes opened in it, first).
    ///
    /// Raises:
    ///     SubmitError: it has already ended.
    fn end(&self, py: Python<'_>) -> PyResult<()> {
        let core = Arc::clone(&self.core);
        let scope = self.scope;
        py.detach(|| core.run(|c| c.end_scope(scope))).map_err(err)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Ends the scope unless it already has (by ``end`` or its outer one).
    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: Bound<'_, PyTuple>) -> PyResult<bool> {
        if !self.ended()? {
            self.end(py)?;
        }
        Ok(false)
    }

    fn __repr__(&self) -> String {
        let state = if self.ended().unwrap_or(true) {
            "ended"
        } else {
            "open"
        };
        format!("strata.Scope({}, {state})", self.scope.number())
    }
}
