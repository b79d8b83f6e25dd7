//! `strata._strata`: the extension module under the `strata` Python
//! package (python/strata). It wraps the Rust driver API
//! (`strata-orchestrator`) and a worker that can run kernels written in
//! Python (`strata-worker` with the `PyKernel`s of `kernel.rs`).
//!
//! Every call that can block (starting a cluster, submitting past the
//! cluster's bound on unfinished tasks, waiting, control calls, shutdown)
//! runs with the GIL released, so other Python threads — and Python
//! kernels of in-process workers — keep running. Long waits are taken in
//! short slices with a check for signals between them, so Ctrl-C raises
//! `KeyboardInterrupt` promptly. No Rust panic reaches the interpreter:
//! pyo3 turns one into `pyo3_runtime.PanicException`, and the driver's
//! errors become the exception classes of `errors.rs`.
//!
//! The crate's `unsafe` is in two places: `kernel::keep_thread_state` (two
//! calls of CPython's stable API that keep a chip lane's Python thread
//! state for the thread's life) and `dlpack` (DLPack's C structures and
//! CPython's capsule calls, for `Array.__dlpack__`). numpy arrays over a host buffer are built by numpy
//! from `__array_interface__` (an address and the view's geometry; the
//! array's base keeps the buffer mapped), and a Python kernel's arguments
//! likewise.

#![deny(unsafe_code)]

use pyo3::prelude::*;

/// The driver and a Python process's worker allocate per task from
/// several threads, as the `strata` binary's do; mimalloc serves the
/// extension's Rust allocations as it serves the binary's (glibc's malloc
/// and the copies around it were a fifth of the driver's threads' time).
/// Python's own objects keep Python's allocator.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod array;
mod cluster;
mod core;
mod dlpack;
mod dtype;
mod errors;
mod kernel;
mod scope;
mod sig;
mod task;

/// The extension module.
#[pymodule]
fn _strata(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // `threading` imported here, on the thread importing strata (the main
    // one, as a rule): imported first inside a kernel on a chip's lane, it
    // would take that lane for the main thread and wait for it at exit
    // (see `kernel::keep_thread_state`).
    m.py().import("threading")?;
    m.add_class::<cluster::PyCluster>()?;
    m.add_class::<array::PyArray>()?;
    m.add_class::<task::PyTask>()?;
    m.add_class::<task::Tagged>()?;
    m.add_class::<task::PyTaskSpec>()?;
    m.add_class::<task::PySummary>()?;
    m.add_class::<scope::PyScope>()?;
    m.add_class::<cluster::PyWorker>()?;
    m.add_class::<kernel::PyKernelSpec>()?;
    m.add_function(wrap_pyfunction!(task::input, m)?)?;
    m.add_function(wrap_pyfunction!(task::output, m)?)?;
    m.add_function(wrap_pyfunction!(task::inout, m)?)?;
    m.add_function(wrap_pyfunction!(task::output_existing, m)?)?;
    m.add_function(wrap_pyfunction!(task::no_dep, m)?)?;
    m.add_function(wrap_pyfunction!(errors::_failure_kinds, m)?)?;
    m.add_function(wrap_pyfunction!(dtype::_dtype_names, m)?)?;
    m.add_function(wrap_pyfunction!(kernel::run_worker, m)?)?;
    m.add_function(wrap_pyfunction!(kernel::builtin_kernels, m)?)?;
    Ok(())
}
