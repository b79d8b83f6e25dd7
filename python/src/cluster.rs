//! `strata.Cluster`: workers (spawned, in-process or connected) and the
//! orchestrator driving them, with the blocking calls made GIL-free.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, RwLock};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use strata_orchestrator::{Cluster, WorkerId, WorkerInfo};
use strata_wire::DType;

use crate::array::{PyArray, shape_of};
use crate::core::Core;
use crate::dtype::dtype_or_f32;
use crate::errors::{err, invalid_view, raise};
use crate::kernel::{PyKernelSpec, registry_with};
use crate::scope::PyScope;
use crate::task::{PySummary, PyTask, PyTaskSpec, build};

/// A set of workers — one per chip — and the orchestrator driving them.
///
/// ``Cluster(local=4)`` spawns four worker processes on this host (each
/// ``python -m strata.worker``, serving the built-in kernels and any
/// ``kernels=`` you give); ``in_process=2`` runs worker nodes inside this
/// process; ``workers=["unix:/tmp/chip0.sock", "tcp:host:7420"]`` connects
/// to running ones (``token=`` for TCP workers that require one). They
/// mix; ids are given in that order.
///
/// Use it as a context manager: leaving the ``with`` block stops the
/// cluster at once (it does not wait for unfinished tasks: call
/// ``wait_all()`` first) and stops every worker it spawned.
///
/// Buffers: ``array(ndarray)``, ``zeros``, ``empty``, ``from_npy``,
/// ``device_zeros``. Tasks: ``submit("matmul", a, b, c)``; a bare view
/// takes its tag from the kernel's signature (read → input, write →
/// output, read-write → inout), ``strata.input(v)`` and friends tag
/// explicitly, Python numbers are the kernel's scalars. Dependencies are
/// inferred from the bytes each task reads and writes.
///
/// Every call that can block releases the GIL; ``wait``/``wait_all``
/// check for Ctrl-C every 50 ms.
///
/// Args:
///     local: worker processes to spawn on this host.
///     in_process: worker nodes to run inside this process.
///     workers: addresses of running workers (``unix:PATH``,
///         ``tcp:HOST:PORT``).
///     token: bearer token for the ``workers`` that require one.
///     device: the chip of spawned and in-process workers, e.g.
///         ``"sim"``, ``"sim:mem=2GiB,mode=unified,lanes=2"``, ``"cuda:0"``
///         or ``"cuda:1,mem=8GiB"``. ``"cuda:all"`` starts one worker per
///         GPU, worker ``i`` on ``cuda:i``: as many spawned workers when
///         neither ``local``, ``in_process`` nor ``workers`` is given (or
///         ``local`` is the GPU count), as many in-process ones when ``in_process`` is
///         the GPU count; another number raises ``ClusterError`` naming
///         both. A ``cuda`` device without a CUDA driver or that GPU
///         raises ``ClusterError`` at once, naming what is missing.
///     kernels: Python kernels (from ``@strata.kernel``) the spawned and
///         in-process workers offer beside the built-in ones.
///     retry: reruns of a task whose worker is lost, when that is safe.
///     respawn: restarts of a spawned worker that is lost.
///     worker_binary: spawn workers with this ``strata`` binary instead
///         of ``python -m strata.worker`` (no Python kernels then).
///     ring: shared-memory task rings for local workers (default on).
///     trace: record where and when tasks ran, for ``trace(path)``.
///     window: the most tasks in flight on one worker.
///     max_unfinished: past this many unfinished tasks, ``submit`` waits
///         until a sixteenth of them have finished.
///     device_cache: staged chips keep the copies they make of host bytes
///         between tasks and read them again while nothing has changed
///         them (default on). Off: every task copies its views in and out.
///     write_back: when bytes a task writes on a local staged chip reach
///         host memory: ``"through"`` (when the task ends, the default) or
///         ``"deferred"`` (when another task, a wait or an eviction needs
///         them; a worker lost first loses them). Either way, once a wait
///         returns, ``numpy()`` sees them.
///     scheduler: where tasks without ``on=`` go: ``"dmdas"`` (the default:
///         the worker where each is expected to finish first, by
///         performance models learned from the run, with the graph's
///         critical path first in each queue), ``"dmda"`` (the same in
///         ready order) or ``"least-loaded"``.
///     perf_models: a JSON file keeping the performance models across
///         runs (loaded at the start, written at ``shutdown``; delete it to
///         start over).
///
/// Raises:
///     ClusterError: a worker could not be started or reached (the
///         message names it and ends with a spawned worker's log).
///     AuthenticationError: a worker refused the token.
#[pyclass(name = "Cluster", module = "strata", frozen)]
pub(crate) struct PyCluster {
    core: Arc<Core>,
}

impl Drop for PyCluster {
    fn drop(&mut self) {
        // Stopping waits for the actors and the workers: without the GIL,
        // so that in-process workers running Python kernels can finish.
        let core = Arc::clone(&self.core);
        Python::attach(|py| py.detach(|| core.close()));
    }
}

/// The command that spawns a Python worker: `python -m strata.worker
/// --sys-path … [--kernels module:name,…]`.
fn python_worker(py: Python<'_>, kernels: &[Py<PyKernelSpec>]) -> PyResult<(String, Vec<String>)> {
    let sys = py.import("sys")?;
    let exe: String = sys.getattr("executable")?.extract()?;
    let path: Vec<String> = sys.getattr("path")?.extract()?;
    let mut args = vec![
        "-m".to_owned(),
        "strata.worker".to_owned(),
        "--sys-path".to_owned(),
        std::env::join_paths(path.iter().filter(|p| !p.is_empty()))
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default(),
    ];
    let mut names = Vec::new();
    for k in kernels {
        let k = k.get();
        let (module, qualname) = k.origin(py)?;
        if module == "__main__" {
            return Err(raise(
                "ClusterError",
                format!(
                    "kernel {}: its function is defined in __main__, which worker processes cannot import; define it in a module (or use in_process= workers)",
                    k.name()
                ),
                &[],
            ));
        }
        names.push(format!("{module}:{qualname}"));
    }
    if !names.is_empty() {
        args.push("--kernels".to_owned());
        args.push(names.join(","));
    }
    Ok((exe, args))
}

fn worker_id(w: u32) -> WorkerId {
    WorkerId(w)
}

fn nbytes(shape: &[u32], d: DType) -> PyResult<u64> {
    let n = shape
        .iter()
        .try_fold(1u64, |a, &s| a.checked_mul(u64::from(s)));
    n.and_then(|n| d.bytes_for(n))
        .ok_or_else(|| invalid_view(format!("shape {shape:?} of {} overflows", d.name())))
}

#[pymethods]
impl PyCluster {
    /// Starts the workers and connects to each (see the class's help).
    #[new]
    #[pyo3(
        text_signature = "(local=0, *, in_process=0, workers=(), token=None, device='sim', kernels=(), retry=0, respawn=0, worker_binary=None, ring=True, trace=False, window=None, max_unfinished=None, device_cache=True, write_back='through', scheduler='dmdas', perf_models=None)"
    )]
    #[pyo3(signature = (local=0, *, in_process=0, workers=Vec::new(), token=None, device="sim".to_owned(), kernels=Vec::new(), retry=0, respawn=0, worker_binary=None, ring=true, trace=false, window=None, max_unfinished=None, device_cache=true, write_back="through", scheduler="dmdas", perf_models=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        local: usize,
        in_process: usize,
        workers: Vec<String>,
        token: Option<String>,
        device: String,
        kernels: Vec<Py<PyKernelSpec>>,
        retry: u32,
        respawn: u32,
        worker_binary: Option<std::path::PathBuf>,
        ring: bool,
        trace: bool,
        window: Option<usize>,
        max_unfinished: Option<usize>,
        device_cache: bool,
        write_back: &str,
        scheduler: &str,
        perf_models: Option<std::path::PathBuf>,
    ) -> PyResult<Self> {
        let scheduler = strata_orchestrator::SchedulerPolicy::from_name(scheduler)
            .map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("scheduler: {e}")))?;
        let write_back = match write_back {
            "through" => strata_orchestrator::WriteBack::Through,
            "deferred" => strata_orchestrator::WriteBack::Deferred,
            other => {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "write_back: {other:?} is not \"through\" or \"deferred\""
                )));
            }
        };
        let mut b = Cluster::builder()
            .local(local)
            .in_process(in_process)
            .device(device.clone())
            .retry(retry)
            .respawn(respawn)
            .ring(ring)
            .trace(trace)
            .device_cache(device_cache)
            .write_back(write_back)
            .scheduler(scheduler);
        if let Some(path) = perf_models {
            b = b.perf_models(path);
        }
        if let Some(w) = window {
            b = b.window(w);
        }
        if let Some(m) = max_unfinished {
            b = b.max_unfinished(m);
        }
        for w in &workers {
            b = b.connect(w, token.as_deref()).map_err(err)?;
        }
        if in_process > 0 && !kernels.is_empty() {
            b = b.kernels(registry_with(py, &kernels)?);
        }
        // `cuda:all` spawns one worker per GPU when no number is asked
        // for: those are Python workers too.
        let spawns = local > 0
            || (in_process == 0
                && workers.is_empty()
                && matches!(
                    device.parse::<strata_chip_runtime::ChipSpec>(),
                    Ok(strata_chip_runtime::ChipSpec::Cuda(c))
                        if c.ordinal == strata_chip_runtime::CudaOrdinal::All
                ));
        if spawns {
            b = match worker_binary {
                Some(bin) if kernels.is_empty() => b.worker_binary(bin),
                Some(_) => {
                    return Err(raise(
                        "ClusterError",
                        "worker_binary= workers cannot run Python kernels; leave it out to spawn python -m strata.worker",
                        &[],
                    ));
                }
                None => {
                    let (exe, args) = python_worker(py, &kernels)?;
                    b.worker_command(exe, args)
                }
            };
        }
        let cluster = py.detach(|| b.start()).map_err(err)?;
        Ok(PyCluster {
            core: Arc::new(Core {
                cluster: RwLock::new(Some(cluster)),
                sigs: Mutex::new(HashMap::new()),
                closing: AtomicBool::new(false),
            }),
        })
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: Bound<'_, PyTuple>) -> bool {
        let core = Arc::clone(&self.core);
        py.detach(|| core.close());
        false
    }

    /// Stops the cluster now: no waiting for unfinished tasks; every
    /// worker it spawned is stopped and reaped. Later calls raise
    /// :class:`ClusterClosed`.
    fn close(&self, py: Python<'_>) {
        let core = Arc::clone(&self.core);
        py.detach(|| core.close());
    }

    /// Waits for every task, then closes the cluster; returns the run's
    /// :class:`Summary`.
    fn shutdown(&self, py: Python<'_>) -> PyResult<PySummary> {
        let r = self.wait_all(py, None);
        self.close(py);
        r
    }

    /// Whether the cluster is closed.
    #[getter]
    fn closed(&self) -> bool {
        self.core.run(|_| Ok(())).is_err()
    }

    /// The workers, by id: :class:`Worker` records (endpoint, chip,
    /// device, memory, lanes, transport, pid, callables).
    #[getter]
    fn workers(&self) -> PyResult<Vec<PyWorker>> {
        self.core
            .run(|c| Ok(c.workers().iter().map(|w| PyWorker(w.clone())).collect()))
            .map_err(err)
    }

    /// The canonical signature of a callable, as the workers report it
    /// (``name@version(arg:ACCESS:dtypes:rank,...;scalar:kind,...)``).
    fn signature(&self, callable: &str) -> PyResult<String> {
        self.core
            .run(|c| c.callable_signature(callable))
            .map(|s| s.canonical())
            .map_err(err)
    }

    /// A host array holding a copy of ``ndarray`` (anything numpy takes),
    /// copied once, straight into a new shared buffer.
    fn array(&self, py: Python<'_>, ndarray: Bound<'_, PyAny>) -> PyResult<Py<PyArray>> {
        let np = py.import("numpy")?;
        let a = np.call_method1("asarray", (ndarray,))?;
        let shape: Vec<i64> = a.getattr("shape")?.extract()?;
        let shape = if shape.is_empty() { vec![1] } else { shape };
        let shape = PyTuple::new(py, &shape)?;
        let out = self.zeros(py, shape.clone().into_any(), Some(a.getattr("dtype")?))?;
        // Filled by the buffer's own writes, a few MiB at a time, not
        // through a numpy view of it: a buffer no task has named is then
        // not exposed to the driver, so the copies chips make of it stay
        // good from one run to the next (until the driver takes a view).
        const CHUNK: usize = 4 << 20;
        let bytes = np
            .call_method1("ascontiguousarray", (a.call_method1("reshape", (shape,))?,))?
            .call_method1("view", (np.getattr("uint8")?,))?
            .call_method1("reshape", (-1,))?;
        let len: usize = bytes.len()?;
        let buffer = out.view.buffer().clone();
        let mut at = 0usize;
        while at < len {
            let end = len.min(at + CHUNK);
            let part = bytes
                .get_item(pyo3::types::PySlice::new(py, at as isize, end as isize, 1))?
                .call_method0("tobytes")?;
            let part = part.cast::<pyo3::types::PyBytes>()?;
            buffer
                .write_bytes(at as u64, part.as_bytes())
                .map_err(err)?;
            at = end;
        }
        Py::new(py, out)
    }

    /// A zero-filled host array of ``shape`` and ``dtype`` (a numpy dtype,
    /// or strata's name such as ``"bf16"``).
    #[pyo3(signature = (shape, dtype=None))]
    fn zeros(
        &self,
        py: Python<'_>,
        shape: Bound<'_, PyAny>,
        dtype: Option<Bound<'_, PyAny>>,
    ) -> PyResult<PyArray> {
        // The size is checked first, so that an overflow names the shape.
        let n = nbytes(&shape_of(&shape)?, dtype_or_f32(dtype.clone())?)?;
        crate::array::host_array(py, &self.core, &shape, dtype, |c, shape, d| {
            c.buffer(n)?.tensor(shape, d)
        })
    }

    /// A zero-filled host array of ``shape`` (an int or a tuple) and
    /// ``dtype`` (a numpy dtype, or strata's name) from the cluster's pool
    /// of recycled memory: when the array and every task using it are
    /// gone, and the workers have let go of it, its memory goes back to
    /// the pool, zeroed, for the next ``alloc``. For temporaries reclaimed
    /// when a block ends, allocate in a scope: ``with cluster.scope() as
    /// s: t = s.alloc((64, 64), np.float32)``.
    ///
    /// Raises:
    ///     InvalidView: an axis that is not 1 to 2^32-1.
    ///     BufferError: no axes or more than five, or a size past 64 bits.
    #[pyo3(signature = (shape, dtype=None))]
    fn alloc(
        &self,
        py: Python<'_>,
        shape: Bound<'_, PyAny>,
        dtype: Option<Bound<'_, PyAny>>,
    ) -> PyResult<PyArray> {
        crate::array::host_array(py, &self.core, &shape, dtype, |c, shape, d| {
            c.alloc(shape, d)
        })
    }

    /// The pool of recycled memory (``alloc``, ``Scope.alloc``) as a dict:
    /// ``out`` buffers handed out and not back yet (``out_bytes``),
    /// ``idle`` memfds kept for reuse (``idle_bytes``: address space only,
    /// their pages are freed), and the memfds ``created``, ``reused`` and
    /// ``discarded`` since the cluster started.
    fn pool_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.core.run(|c| Ok(c.pool_stats())).map_err(err)?;
        let d = PyDict::new(py);
        for (name, v) in [
            ("out", s.out),
            ("out_bytes", s.out_bytes),
            ("idle", s.idle),
            ("idle_bytes", s.idle_bytes),
            ("created", s.created),
            ("reused", s.reused),
            ("discarded", s.discarded),
        ] {
            d.set_item(name, v)?;
        }
        Ok(d)
    }

    /// A host array over the POSIX shared-memory object ``name`` (as
    /// ``shm_open("/name")`` and Python's
    /// ``multiprocessing.shared_memory.SharedMemory(name)`` name it), for
    /// sharing memory with programs that use such objects: opened when it
    /// exists (it must hold at least the array's bytes, which are its
    /// first ones), created zero-filled when it does not (and then
    /// unlinked when the array is released). Local workers copy the bytes
    /// each task uses in and out instead of mapping the object, so its
    /// owner shrinking it fails the tasks that use it and nothing else.
    #[pyo3(signature = (name, shape, dtype=None))]
    fn posix_array(
        &self,
        py: Python<'_>,
        name: &str,
        shape: Bound<'_, PyAny>,
        dtype: Option<Bound<'_, PyAny>>,
    ) -> PyResult<PyArray> {
        // The size is checked first, so that an overflow names the shape.
        let n = nbytes(&shape_of(&shape)?, dtype_or_f32(dtype.clone())?)?;
        crate::array::host_array(py, &self.core, &shape, dtype, |c, shape, d| {
            c.posix_buffer(name, n)?.tensor(shape, d)
        })
    }

    /// A host array of ``shape`` and ``dtype`` for tasks to fill (strata's
    /// buffers start zeroed, so this is ``zeros``; do not rely on it).
    #[pyo3(signature = (shape, dtype=None))]
    fn empty(
        &self,
        py: Python<'_>,
        shape: Bound<'_, PyAny>,
        dtype: Option<Bound<'_, PyAny>>,
    ) -> PyResult<PyArray> {
        self.zeros(py, shape, dtype)
    }

    /// A host array holding the array of a ``.npy`` file (C order,
    /// little-endian; f4, f2, i1-i8, u1-u8, b1).
    // The Python name mirrors numpy's loaders; it takes the cluster.
    #[allow(clippy::wrong_self_convention)]
    fn from_npy(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<PyArray> {
        let core = Arc::clone(&self.core);
        let view = py
            .detach(|| core.run(|c| c.buffer_from_npy(&path)))
            .map_err(err)?;
        Ok(PyArray::new(view, Arc::clone(&self.core)))
    }

    /// A zero-filled device array in ``worker``'s device memory: tasks that
    /// use it run on that worker. With ``run=True`` it lives in the run
    /// region and ends at the next ``wait_all()``. With ``shared=True`` it
    /// is device memory of its own that this process maps in place
    /// through DLPack (``Array.__dlpack__``: ``numpy.from_dlpack`` on a
    /// simulated chip, ``cupy``/``torch.from_dlpack`` on a GPU), from a
    /// worker in this process or on this host.
    #[pyo3(signature = (worker, shape, dtype=None, run=false, shared=false))]
    #[allow(clippy::too_many_arguments)]
    fn device_zeros(
        &self,
        py: Python<'_>,
        worker: u32,
        shape: Bound<'_, PyAny>,
        dtype: Option<Bound<'_, PyAny>>,
        run: bool,
        shared: bool,
    ) -> PyResult<PyArray> {
        if run && shared {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "device_zeros: run=True and shared=True: a shared array is of its own, not of the run region",
            ));
        }
        let shape = shape_of(&shape)?;
        let d = dtype_or_f32(dtype)?;
        let n = nbytes(&shape, d)?;
        let core = Arc::clone(&self.core);
        let view = py
            .detach(|| {
                core.run(|c| {
                    let w = worker_id(worker);
                    let b = if run {
                        c.run_buffer(w, n)?
                    } else if shared {
                        c.shared_buffer(w, n)?
                    } else {
                        c.device_buffer(w, n)?
                    };
                    // A worker hands out every device block zeroed.
                    b.tensor(&shape, d)
                })
            })
            .map_err(err)?;
        Ok(PyArray::new(view, Arc::clone(&self.core)))
    }

    /// Submits a task and returns its :class:`Task`.
    ///
    /// ``args`` are the kernel's tensor arguments in order — bare arrays
    /// (tagged by the kernel's signature: read → INPUT, write → OUTPUT,
    /// read-write → INOUT) or tagged ones (``strata.input(v)``...) — and
    /// its scalars as Python numbers, typed by the signature. ``on=`` runs
    /// it on that worker; ``after=`` adds explicit edges to earlier tasks.
    ///
    /// Raises :class:`UnknownCallable`, :class:`WrongTag` (a tag the
    /// kernel contradicts, or wrong argument counts) or
    /// :class:`SubmitError` (grant mismatch, a task's own arguments
    /// overlapping where one is written, placement, a timeout that is not
    /// a positive number of seconds...): nothing is queued.
    ///
    /// ``timeout=`` bounds the task, in seconds, counted from when it is
    /// sent to its worker. Past it the task fails (:class:`TaskFailed`,
    /// ``cause`` starting ``task N (name@v) timed out after …``) and its
    /// worker is treated as lost, since a running kernel cannot be trusted
    /// to stop: a worker the cluster spawned is killed and restarted; the
    /// bytes the task writes on a worker it connected to (or an
    /// in-process one) stay quarantined until the kernel has ended; other
    /// tasks running there fail with :class:`WorkerLost`.
    ///
    /// ``flops=`` declares the task's cost in floating-point operations:
    /// the scheduler's performance models predict its duration from it
    /// before they have measured its kernel at these shapes.
    #[pyo3(signature = (callable, *args, on=None, after=None, timeout=None, flops=None))]
    #[allow(clippy::too_many_arguments)]
    fn submit(
        &self,
        py: Python<'_>,
        callable: &str,
        args: Bound<'_, PyTuple>,
        on: Option<u32>,
        after: Option<Bound<'_, PyAny>>,
        timeout: Option<f64>,
        flops: Option<u64>,
    ) -> PyResult<PyTask> {
        let sig = self.core.sig(callable)?;
        let mut task = build(&sig, callable, &args, on, after.as_ref(), timeout)?;
        if let Some(f) = flops {
            task = task.flops(f);
        }
        let core = &self.core;
        let handle = py.detach(|| core.run(|c| c.submit(task))).map_err(err)?;
        Ok(PyTask {
            handle,
            core: Arc::clone(&self.core),
        })
    }

    /// Submits many tasks of one callable: ``tasks`` is an iterable of
    /// argument tuples, one per task, each as ``submit`` takes its
    /// positional arguments (``on=`` and ``flops=`` apply to every one).
    /// Returns their :class:`Task` objects, in order. The same as a loop
    /// of ``submit`` calls, at less cost per task: the arguments of every
    /// task are checked first (a refusal there submits nothing), then all
    /// are submitted with the GIL released once. An error names the
    /// task's place in the batch; one the engine raises (an argument
    /// written where another of the same task reads) leaves the tasks
    /// before it submitted, and ``wait_all()`` collects them.
    #[pyo3(signature = (callable, tasks, on=None, flops=None))]
    fn submit_many(
        &self,
        py: Python<'_>,
        callable: &str,
        tasks: Bound<'_, PyAny>,
        on: Option<u32>,
        flops: Option<u64>,
    ) -> PyResult<Vec<PyTask>> {
        let sig = self.core.sig(callable)?;
        let mut built = Vec::new();
        for (i, args) in tasks.try_iter()?.enumerate() {
            let args = args?;
            let args = match args.cast::<PyTuple>() {
                Ok(t) => t.clone(),
                Err(_) => PyTuple::new(py, args.try_iter()?.collect::<PyResult<Vec<_>>>()?)?,
            };
            let mut task =
                build(&sig, callable, &args, on, None, None).map_err(|e| in_batch(py, e, i))?;
            if let Some(f) = flops {
                task = task.flops(f);
            }
            built.push(task);
        }
        let core = &self.core;
        let mut handles = Vec::with_capacity(built.len());
        let failed = py.detach(|| {
            core.run(|c| {
                for (i, task) in built.into_iter().enumerate() {
                    match c.submit(task) {
                        Ok(h) => handles.push(h),
                        Err(e) => return Ok(Some((i, e))),
                    }
                }
                Ok(None)
            })
        });
        match failed.map_err(err)? {
            None => Ok(handles
                .into_iter()
                .map(|handle| PyTask {
                    handle,
                    core: Arc::clone(&self.core),
                })
                .collect()),
            Some((i, e)) => Err(in_batch(py, err(e), i)),
        }
    }

    /// A group member, as ``submit`` takes it, for :meth:`submit_group`.
    #[pyo3(signature = (callable, *args, on=None, after=None, timeout=None))]
    fn task(
        &self,
        callable: &str,
        args: Bound<'_, PyTuple>,
        on: Option<u32>,
        after: Option<Bound<'_, PyAny>>,
        timeout: Option<f64>,
    ) -> PyResult<PyTaskSpec> {
        let sig = self.core.sig(callable)?;
        Ok(PyTaskSpec {
            task: build(&sig, callable, &args, on, after.as_ref(), timeout)?,
        })
    }

    /// Submits a group: one member per worker (from :meth:`task`), launched
    /// all-or-nothing, one node of the DAG. Returns its :class:`Task`.
    fn submit_group(&self, py: Python<'_>, members: Vec<Py<PyTaskSpec>>) -> PyResult<PyTask> {
        let tasks: Vec<_> = members.iter().map(|m| m.get().task.clone()).collect();
        let core = &self.core;
        let handle = py
            .detach(|| core.run(|c| c.submit_group(tasks)))
            .map_err(err)?;
        Ok(PyTask {
            handle,
            core: Arc::clone(&self.core),
        })
    }

    /// Waits for ``task`` (as ``task.wait()``).
    #[pyo3(signature = (task, timeout=None))]
    fn wait(&self, py: Python<'_>, task: &PyTask, timeout: Option<f64>) -> PyResult<()> {
        crate::task::wait_task(py, &self.core, task.handle, timeout)
    }

    /// Waits until every submitted task has finished and returns the run's
    /// :class:`Summary`; the next call starts a new run (run device arrays
    /// end here). The GIL is released; Ctrl-C raises ``KeyboardInterrupt``
    /// within 50 ms.
    ///
    /// With ``timeout=`` (seconds) it gives up after that long and raises
    /// :class:`WaitTimeout`; the run goes on, and a later ``wait_all()``
    /// collects it. A ``close()`` from another thread makes it raise
    /// :class:`ClusterClosed` within 50 ms.
    ///
    /// Raises the run's first task failure (:class:`TaskFailed` and its
    /// subclasses).
    #[pyo3(signature = (timeout=None))]
    fn wait_all(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<PySummary> {
        let core = Arc::clone(&self.core);
        let mut watch = crate::task::Watch::new("wait_all", timeout)?;
        let r = py.detach(|| core.run(|c| c.wait_all_while(watch.slice(), || watch.go_on(&core))));
        watch.given_up("the run is unfinished")?;
        match r.map_err(err)? {
            Some(s) => Ok(s.into()),
            None => Err(raise("Error", "wait_all was given up", &[])),
        }
    }

    /// Cancels ``task`` if it has not started.
    fn cancel(&self, py: Python<'_>, task: &PyTask) -> PyResult<()> {
        let core = Arc::clone(&self.core);
        let h = task.handle;
        py.detach(|| core.run(|c| c.cancel(h))).map_err(err)
    }

    /// Figures since the cluster started.
    fn totals(&self, py: Python<'_>) -> PyResult<PySummary> {
        let core = Arc::clone(&self.core);
        py.detach(|| core.run(|c| c.totals()))
            .map(Into::into)
            .map_err(err)
    }

    /// Opens a :class:`Scope`, a context manager: ``with cluster.scope()
    /// as s: t = s.alloc((64, 64), np.float32)``. What it allocates (and
    /// the arrays added to it) is reclaimed once the block has ended and
    /// no unfinished task uses it.
    fn scope(&self, py: Python<'_>) -> PyResult<PyScope> {
        let core = Arc::clone(&self.core);
        let scope = py.detach(|| core.run(|c| c.open_scope())).map_err(err)?;
        Ok(PyScope::new(scope, Arc::clone(&self.core)))
    }

    /// Whether ``worker`` is up (connected and taking tasks).
    fn is_up(&self, worker: u32) -> PyResult<bool> {
        self.core
            .run(|c| Ok(c.is_up(worker_id(worker))))
            .map_err(err)
    }

    /// The process id of ``worker`` now, for a worker this cluster spawned.
    fn worker_pid(&self, worker: u32) -> PyResult<Option<u32>> {
        self.core
            .run(|c| Ok(c.worker_pid(worker_id(worker))))
            .map_err(err)
    }

    /// Waits up to ``timeout`` seconds for ``worker`` to be up.
    fn wait_up(&self, py: Python<'_>, worker: u32, timeout: f64) -> PyResult<()> {
        let core = Arc::clone(&self.core);
        let limit = std::time::Duration::from_secs_f64(timeout.max(0.0));
        py.detach(|| core.run(|c| c.wait_up(worker_id(worker), limit)))
            .map_err(err)
    }

    /// A worker's counters as a dict (tasks, imports, bytes staged and
    /// copied, the device cache's counters under ``cache``, device memory
    /// regions).
    fn worker_stats<'py>(&self, py: Python<'py>, worker: u32) -> PyResult<Bound<'py, PyDict>> {
        let core = Arc::clone(&self.core);
        let s = py
            .detach(|| core.run(|c| c.worker_stats(worker_id(worker))))
            .map_err(err)?;
        let d = PyDict::new(py);
        d.set_item("tasks_succeeded", s.tasks_succeeded)?;
        d.set_item("tasks_failed", s.tasks_failed)?;
        d.set_item("kernels_panicked", s.kernels_panicked)?;
        d.set_item("tasks_in_flight", s.tasks_in_flight)?;
        d.set_item("zeroed", s.zeroed)?;
        d.set_item("bounced", s.bounced)?;
        d.set_item("shared", s.shared)?;
        d.set_item("imports", s.imports)?;
        d.set_item("sessions", s.sessions)?;
        d.set_item("staged_to_device", s.staged_to_device)?;
        d.set_item("staged_to_host", s.staged_to_host)?;
        d.set_item("copied_to_device", s.copied_to_device)?;
        d.set_item("copied_to_host", s.copied_to_host)?;
        let c = s.cache;
        let cache = PyDict::new(py);
        for (name, v) in [
            ("hits", c.hits),
            ("hit_bytes", c.hit_bytes),
            ("misses", c.misses),
            ("loaded", c.loaded),
            ("written_back", c.written_back),
            ("write_backs", c.write_backs),
            ("evictions", c.evictions),
            ("device_to_device", c.device_to_device),
            ("bypassed", c.bypassed),
            ("entries", c.entries),
            ("held", c.held),
            ("dirty", c.dirty),
            ("prefetched", c.prefetched),
        ] {
            cache.set_item(name, v)?;
        }
        d.set_item("cache", cache)?;
        for (name, r) in [
            ("persistent", s.persistent),
            ("run", s.run),
            ("scratch", s.scratch),
        ] {
            let rd = PyDict::new(py);
            rd.set_item("capacity", r.capacity)?;
            rd.set_item("in_use", r.in_use)?;
            rd.set_item("peak", r.peak)?;
            rd.set_item("allocs", r.allocs)?;
            rd.set_item("frees", r.frees)?;
            d.set_item(name, rd)?;
        }
        Ok(d)
    }

    /// Runs a graph (a JSON graph file's path, or the same document as a
    /// dict: see docs/graph-format.md) on this cluster: buffers made,
    /// tasks submitted in order, waited for, outputs written as ``.npy``
    /// (relative paths under ``out_dir``, default the file's folder or the
    /// current one) and checked. Returns ``{"summary", "outputs",
    /// "mismatches"}``.
    #[pyo3(signature = (graph, out_dir=None))]
    fn run_graph<'py>(
        &self,
        py: Python<'py>,
        graph: Bound<'py, PyAny>,
        out_dir: Option<std::path::PathBuf>,
    ) -> PyResult<Bound<'py, PyDict>> {
        use strata_graph::Graph;
        let loaded = if graph.is_instance_of::<PyDict>() {
            let text: String = py
                .import("json")?
                .call_method1("dumps", (&graph,))?
                .extract()?;
            let json: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| raise("GraphError", format!("$: {e}"), &[]))?;
            let here = std::env::current_dir()?;
            Graph::from_json(&json, &here, out_dir.as_deref().unwrap_or(&here))
        } else {
            let path: std::path::PathBuf = graph.extract()?;
            Graph::load_with(&path, out_dir.as_deref())
        }
        .map_err(|e| raise("GraphError", e.to_string(), &[]))?;
        let core = Arc::clone(&self.core);
        let run = py
            .detach(|| core.run(|c| loaded.run(c, &|f| f())))
            .map_err(err)?;
        let d = PyDict::new(py);
        d.set_item("summary", Bound::new(py, PySummary::from(run.summary))?)?;
        d.set_item("outputs", PyList::new(py, &run.outputs)?)?;
        d.set_item("mismatches", PyList::new(py, &run.mismatches)?)?;
        Ok(d)
    }

    /// Writes a Chrome/Perfetto trace of the tasks finished since the last
    /// call (one track per worker lane, one slice per task, arrows for
    /// dependency edges) to ``path``; open it in https://ui.perfetto.dev.
    /// Needs ``Cluster(trace=True)``. Returns the number of tasks written.
    fn trace(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<usize> {
        let core = Arc::clone(&self.core);
        let r = py.detach(|| {
            core.run(|c| {
                let Some(t) = c.take_trace()? else {
                    return Ok(None);
                };
                t.write_chrome(&path, c.workers())?;
                Ok(Some(t.tasks.len()))
            })
        });
        match r.map_err(err)? {
            Some(n) => Ok(n),
            None => Err(raise(
                "TraceError",
                "this cluster records no trace: start it with Cluster(..., trace=True)",
                &[],
            )),
        }
    }

    fn __repr__(&self) -> String {
        match self.core.run(|c| Ok(c.workers().len())) {
            Ok(n) => format!("strata.Cluster({n} workers)"),
            Err(_) => "strata.Cluster(closed)".to_owned(),
        }
    }
}

/// One worker of a cluster, as it described itself when it joined.
#[pyclass(name = "Worker", module = "strata", frozen)]
pub(crate) struct PyWorker(WorkerInfo);

#[pymethods]
impl PyWorker {
    /// Its id (what ``on=`` and ``device_zeros`` take).
    #[getter]
    fn id(&self) -> u32 {
        self.0.id.0
    }
    /// Where it was reached.
    #[getter]
    fn endpoint(&self) -> &str {
        &self.0.endpoint
    }
    /// Its chip.
    #[getter]
    fn chip(&self) -> u32 {
        self.0.chip
    }
    /// Its device kind.
    #[getter]
    fn device(&self) -> &str {
        &self.0.device
    }
    /// Its device memory in bytes.
    #[getter]
    fn memory(&self) -> u64 {
        self.0.memory
    }
    /// Its lanes (tasks it runs at once).
    #[getter]
    fn lanes(&self) -> u32 {
        self.0.lanes
    }
    /// Whether host buffers reach it by fd (zero-copy).
    #[getter]
    fn fd_passing(&self) -> bool {
        self.0.fd_passing
    }
    /// How tasks reach it: ``in-process``, ``ring``, ``grpc-unix`` or
    /// ``grpc-tcp``.
    #[getter]
    fn transport(&self) -> String {
        self.0.transport.to_string()
    }
    /// Its process id, when this cluster spawned it.
    #[getter]
    fn pid(&self) -> Option<u32> {
        self.0.pid
    }
    /// The callables it offers (``name@version``).
    #[getter]
    fn callables(&self) -> Vec<String> {
        self.0.callables.clone()
    }
    /// The kernels registered on it that its chip has no body for
    /// (``name@version``; a CUDA chip runs only kernels with a CUDA
    /// body): not offered, and named when a task asks for one.
    #[getter]
    fn no_body(&self) -> Vec<String> {
        self.0.no_body.clone()
    }
    /// The dtypes its chip computes on (``["F32", "F64", ...]``): a task
    /// with an argument of another is not placed there.
    #[getter]
    fn dtypes(&self) -> Vec<&'static str> {
        self.0
            .capabilities
            .dtypes
            .iter()
            .map(|d| d.name())
            .collect()
    }
    /// The kinds of buffer its tasks' arguments may be backed by, through
    /// this cluster (``["DEVICE_MALLOC", "MEMFD"]``).
    #[getter]
    fn backends(&self) -> Vec<&'static str> {
        self.0
            .capabilities
            .backends
            .iter()
            .map(|k| k.name())
            .collect()
    }
    /// The protocol features it offers (``["DEVICE_CACHE", "HOST_BYTES"]``;
    /// a bit this build has no name for as ``"bit N"``).
    #[getter]
    fn features(&self) -> Vec<String> {
        let f = self.0.capabilities.features;
        if f.is_empty() {
            return Vec::new();
        }
        f.to_string().split('|').map(str::to_owned).collect()
    }
    fn __repr__(&self) -> String {
        format!(
            "strata.Worker(id={}, endpoint={:?}, chip={}, device={:?}, transport={}, pid={:?})",
            self.0.id.0, self.0.endpoint, self.0.chip, self.0.device, self.0.transport, self.0.pid
        )
    }
}

/// `e` again, its message saying which task of a batch it is about (the
/// same exception type, its attributes kept).
fn in_batch(py: Python<'_>, e: PyErr, i: usize) -> PyErr {
    let value = e.value(py);
    let message = format!("task {i} of the batch: {value}");
    let again = (|| -> PyResult<PyErr> {
        let new = e.get_type(py).call1((message,))?;
        if let Ok(attrs) = value.getattr("__dict__") {
            if let Ok(d) = attrs.cast::<pyo3::types::PyDict>() {
                for (k, v) in d.iter() {
                    new.setattr(k.cast::<pyo3::types::PyString>()?, v)?;
                }
            }
        }
        Ok(PyErr::from_value(new))
    })();
    again.unwrap_or(e)
}
