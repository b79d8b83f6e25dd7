//! Kernels written in Python, and a worker process that offers them.
//!
//! `@strata.kernel("scale", args=("r", "w"), scalars=("alpha:f64",))`
//! makes a [`PyKernelSpec`]; a worker registers it as a [`PyKernel`],
//! whose `run` takes the GIL, hands the function numpy arrays over the
//! materialized arguments (zero-copy, with their strides; read-only where
//! the signature only reads) and the scalars as Python numbers, and turns
//! a Python exception into the task's failure with the traceback as its
//! cause. The arrays are valid only during the call.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};
use strata_chip_runtime::Registry;
use strata_chip_runtime::kernel::cuda::{CudaBody, CudaSource, Entry, Grid, SourceKernel};
use strata_chip_runtime::kernel::{
    ArgSpec, Kernel, KernelContext, ScalarKind, ScalarSpec, Signature,
};

use crate::dtype;
use crate::errors::raise;

/// A kernel written in Python: a name, a signature and a function, and
/// optionally CUDA C source for CUDA chips. Made by the
/// :func:`strata.kernel` decorator (calling it calls the function) or, with
/// CUDA source alone, by :func:`strata.raw_kernel`.
#[pyclass(name = "Kernel", module = "strata", frozen)]
pub(crate) struct PyKernelSpec {
    desc: Signature,
    /// The CPU body; `None` for a kernel with only CUDA source.
    func: Option<Py<PyAny>>,
    /// The CUDA body.
    cuda: Option<CudaSource>,
    /// For a kernel without a function: the module that made it.
    module: Option<String>,
}

impl PyKernelSpec {
    pub(crate) fn name(&self) -> String {
        self.desc.qualified_name()
    }

    /// The module and the name in it a worker process imports: the
    /// function's, or for a kernel with only CUDA source, the module
    /// variable that holds it (found by its name and version).
    pub(crate) fn origin(&self, py: Python<'_>) -> PyResult<(String, String)> {
        if let Some(func) = &self.func {
            let f = func.bind(py);
            return Ok((
                f.getattr("__module__")?.extract()?,
                f.getattr("__qualname__")?.extract()?,
            ));
        }
        let module = self.module.clone().unwrap_or_else(|| "__main__".into());
        let found = (|| -> PyResult<Option<String>> {
            let m = py.import("sys")?.getattr("modules")?.get_item(&module)?;
            let vars: Bound<'_, PyDict> = m.getattr("__dict__")?.extract()?;
            for (k, v) in vars.iter() {
                if let Ok(spec) = v.extract::<PyRef<'_, PyKernelSpec>>()
                    && spec.desc.qualified_name() == self.desc.qualified_name()
                {
                    return Ok(Some(k.extract()?));
                }
            }
            Ok(None)
        })()
        .ok()
        .flatten();
        match found {
            Some(name) => Ok((module, name)),
            None if module == "__main__" => Ok((module, self.desc.name.clone())),
            None => Err(bad_spec(
                &self.name(),
                format!(
                    "it is not a top-level variable of module {module}, which worker processes import"
                ),
            )),
        }
    }
}

/// The launch shape `grid` names: ``"elements"`` (one thread per element
/// of the first written argument), ``"elements:N"``, ``"rows:N"``, or
/// ``(blocks, threads)`` / ``(blocks, threads, shared_bytes)`` with blocks
/// and threads an int or an (x, y, z) triple.
fn parse_grid(kernel: &str, grid: &Bound<'_, PyAny>, desc: &Signature) -> PyResult<Grid> {
    if let Ok(text) = grid.extract::<String>() {
        let (kind, n) = match text.split_once(':') {
            Some((k, n)) => (
                k,
                Some(n.parse::<usize>().map_err(|_| {
                    bad_spec(
                        kernel,
                        format!("grid {text:?}: {n:?} is not an argument index"),
                    )
                })?),
            ),
            None => (text.as_str(), None),
        };
        let first_written = || {
            desc.args
                .iter()
                .position(|a| a.access.allows_write())
                .unwrap_or(0)
        };
        return match kind {
            "elements" => Ok(Grid::Elements(n.unwrap_or_else(first_written))),
            "rows" => Ok(Grid::Rows(n.unwrap_or(0))),
            _ => Err(bad_spec(
                kernel,
                format!(
                    "grid {text:?} is not \"elements\", \"elements:N\", \"rows:N\" or (blocks, threads[, shared])"
                ),
            )),
        };
    }
    let three = |v: &Bound<'_, PyAny>, what: &str| -> PyResult<[u32; 3]> {
        if let Ok(n) = v.extract::<u32>() {
            return Ok([n, 1, 1]);
        }
        v.extract::<(u32, u32, u32)>()
            .map(|(x, y, z)| [x, y, z])
            .map_err(|_| {
                bad_spec(
                    kernel,
                    format!("grid: {what} is not an int or an (x, y, z) triple"),
                )
            })
    };
    let parts: Vec<Bound<'_, PyAny>> = grid.extract().map_err(|_| {
        bad_spec(
            kernel,
            "grid is not a string or a (blocks, threads[, shared]) tuple".into(),
        )
    })?;
    match parts.as_slice() {
        [b, t] => Ok(Grid::Fixed {
            blocks: three(b, "blocks")?,
            threads: three(t, "threads")?,
            shared: 0,
        }),
        [b, t, sh] => Ok(Grid::Fixed {
            blocks: three(b, "blocks")?,
            threads: three(t, "threads")?,
            shared: sh
                .extract()
                .map_err(|_| bad_spec(kernel, "grid: shared is not a byte count".into()))?,
        }),
        _ => Err(bad_spec(
            kernel,
            "grid is not (blocks, threads[, shared])".into(),
        )),
    }
}

fn bad_spec(kernel: &str, what: String) -> PyErr {
    pyo3::exceptions::PyValueError::new_err(format!("kernel {kernel}: {what}"))
}

#[pymethods]
impl PyKernelSpec {
    /// A kernel named ``name`` running ``func``.
    ///
    /// ``args``: one entry per tensor argument, ``"r"`` (reads),
    /// ``"w"`` (writes every element) or ``"rw"``, optionally named and
    /// typed: ``"x:r"``, ``"out:w:f32|f64"``. ``scalars``: ``"f64"``,
    /// ``"i64"``, ``"u64"`` or ``"likeN"`` (in argument N's dtype),
    /// optionally named: ``"alpha:f64"``.
    #[new]
    #[pyo3(signature = (name, func, args, scalars=Vec::new(), version=1, *, cuda=None, entry=None, grid=None, module=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        name: String,
        func: Option<Py<PyAny>>,
        args: Vec<String>,
        scalars: Vec<String>,
        version: u32,
        cuda: Option<String>,
        entry: Option<String>,
        grid: Option<Bound<'_, PyAny>>,
        module: Option<String>,
    ) -> PyResult<Self> {
        strata_chip_runtime::kernel::check_name(&name).map_err(|e| bad_spec(&name, e))?;
        match &func {
            Some(f) if !f.bind(py).is_callable() => {
                return Err(bad_spec(&name, "the function is not callable".into()));
            }
            None if cuda.is_none() => {
                return Err(bad_spec(
                    &name,
                    "it has neither a function nor CUDA source: give one or both".into(),
                ));
            }
            _ => {}
        }
        if cuda.is_none() && (entry.is_some() || grid.is_some()) {
            return Err(bad_spec(
                &name,
                "entry= and grid= go with cuda= source".into(),
            ));
        }
        let dtype = |d: &str| {
            dtype::parse(PyString::new(py, d).as_any()).map_err(|e| e.value(py).to_string())
        };
        let specs = args
            .iter()
            .enumerate()
            .map(|(i, a)| {
                ArgSpec::parse_short(a, i, dtype)
                    .map_err(|e| bad_spec(&name, format!("argument {i} {a:?}: {e}")))
            })
            .collect::<PyResult<Vec<_>>>()?;
        let scalar_specs = scalars
            .iter()
            .enumerate()
            .map(|(i, s)| {
                ScalarSpec::parse_short(s, i, specs.len())
                    .map_err(|e| bad_spec(&name, format!("scalar {i} {s:?}: {e}")))
            })
            .collect::<PyResult<Vec<_>>>()?;
        let desc = Signature {
            name: name.clone(),
            version,
            args: specs,
            scalars: scalar_specs,
        };
        let cuda = match cuda {
            None => None,
            Some(code) => {
                let grid = match &grid {
                    Some(g) => parse_grid(&name, g, &desc)?,
                    None => parse_grid(&name, PyString::new(py, "elements").as_any(), &desc)?,
                };
                let entry = Entry::One(entry.unwrap_or_else(|| name.clone()).into());
                // The checks a worker makes when it registers it, made now.
                let source = SourceKernel::new(desc.clone(), code, entry, grid)
                    .map_err(pyo3::exceptions::PyValueError::new_err)?;
                match source.cuda() {
                    Some(CudaBody::Source(s)) => Some(s.clone()),
                    _ => None,
                }
            }
        };
        Ok(PyKernelSpec {
            desc,
            func,
            cuda,
            module,
        })
    }

    /// ``name@version``.
    #[getter]
    fn qualified_name(&self) -> String {
        self.desc.qualified_name()
    }

    /// The kernel's name.
    #[getter(name)]
    fn name_getter(&self) -> String {
        self.desc.name.clone()
    }

    /// The canonical signature, as workers report it.
    #[getter]
    fn signature(&self) -> String {
        self.desc.canonical()
    }

    /// The function (``None`` for a kernel with only CUDA source).
    #[getter]
    fn func(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.func.as_ref().map(|f| f.clone_ref(py))
    }

    /// The CUDA C source (``None``: it runs on CPU chips only).
    #[getter]
    fn cuda(&self) -> Option<String> {
        self.cuda.as_ref().map(|c| c.code.to_string())
    }

    #[pyo3(signature = (*args, **kwargs))]
    fn __call__<'py>(
        &self,
        py: Python<'py>,
        args: Bound<'py, PyTuple>,
        kwargs: Option<Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        match &self.func {
            Some(f) => f.bind(py).call(args, kwargs.as_ref()),
            None => Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "kernel {} has only CUDA source: it runs as a task on a CUDA chip, not as a Python call",
                self.name()
            ))),
        }
    }

    fn __repr__(&self) -> String {
        format!("strata.Kernel({})", self.desc.canonical())
    }
}

/// A Python kernel as a worker runs it.
struct PyKernel {
    desc: Signature,
    func: Py<PyAny>,
    cuda: Option<CudaBody>,
}

impl PyKernel {
    fn call(&self, py: Python<'_>, ctx: &KernelContext<'_>) -> Result<(), String> {
        let py_err = |e: PyErr| traceback(py, &e);
        let np = py.import("numpy").map_err(py_err)?;
        let holder = py
            .import("strata._geometry")
            .and_then(|m| m.getattr("Interface"))
            .map_err(py_err)?;
        let mut call_args: Vec<Py<PyAny>> = Vec::new();
        let mut dtypes = Vec::new();
        for i in 0..ctx.arg_count() {
            let t = ctx.arg(i)?;
            let (addr, writable) = ctx.arg_address(i)?;
            let (ts, item) = match (dtype::typestr(t.dtype()), dtype::itemsize(t.dtype())) {
                (Some(ts), Some(item)) => (ts, item),
                _ => {
                    return Err(format!(
                        "argument {i}: {} has no numpy form",
                        t.dtype().name()
                    ));
                }
            };
            dtypes.push(t.dtype());
            let array = (|| -> PyResult<Py<PyAny>> {
                let d = PyDict::new(py);
                d.set_item("version", 3)?;
                d.set_item("shape", PyTuple::new(py, t.shape())?)?;
                d.set_item("typestr", ts)?;
                d.set_item("data", (addr as usize, !writable))?;
                let strides: Vec<usize> = t.strides().iter().map(|&s| s as usize * item).collect();
                d.set_item("strides", PyTuple::new(py, strides)?)?;
                let h = holder.call1((d, py.None()))?;
                Ok(np.call_method1("asarray", (h,))?.unbind())
            })()
            .map_err(py_err)?;
            call_args.push(array);
        }
        for (i, s) in self.desc.scalars.iter().enumerate() {
            let bits = ctx.scalar(i)?;
            let kind = match s.kind {
                ScalarKind::LikeArg(n) => match dtypes.get(n) {
                    Some(&d) if dtype::is_float(d) => ScalarKind::F64,
                    Some(&d) if dtype::is_unsigned(d) => ScalarKind::U64,
                    _ => ScalarKind::I64,
                },
                k => k,
            };
            let v = match kind {
                ScalarKind::F64 => crate::errors::obj(py, f64::from_bits(bits)),
                ScalarKind::I64 => crate::errors::obj(py, bits as i64),
                _ => crate::errors::obj(py, bits),
            };
            call_args.push(v);
        }
        let args = PyTuple::new(py, call_args).map_err(py_err)?;
        self.func.bind(py).call1(args).map_err(py_err)?;
        Ok(())
    }
}

/// The exception with its traceback, as Python prints it.
fn traceback(py: Python<'_>, e: &PyErr) -> String {
    let formatted = (|| -> PyResult<String> {
        let tb = py.import("traceback")?;
        let lines = tb.call_method1(
            "format_exception",
            (e.get_type(py), e.value(py), e.traceback(py)),
        )?;
        let joined: String = PyString::new(py, "")
            .call_method1("join", (lines,))?
            .extract()?;
        Ok(joined.trim_end().to_owned())
    })();
    formatted.unwrap_or_else(|_| e.to_string())
}

impl Kernel for PyKernel {
    fn descriptor(&self) -> &Signature {
        &self.desc
    }

    fn run(&self, ctx: &mut KernelContext<'_>) -> Result<(), String> {
        keep_thread_state();
        Python::attach(|py| self.call(py, ctx))
    }

    fn cuda(&self) -> Option<&CudaBody> {
        self.cuda.as_ref()
    }
}

thread_local! {
    /// Whether this thread's Python thread state is kept (see
    /// [`keep_thread_state`]).
    static KEPT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Makes the Python thread state of this thread (a chip's lane, which
/// Python did not start) live as long as the thread. Without it each
/// kernel call's `Python::attach` made a thread state and its frame stack
/// (an mmap) and dropped both on the way out (a munmap): a third of a
/// no-op kernel's cost. A thread that has a thread state already (one
/// Python started) is left alone.
///
/// The crate's one `unsafe`: two calls of CPython's stable API.
#[allow(unsafe_code)]
fn keep_thread_state() {
    KEPT.with(|kept| {
        if kept.get() {
            return;
        }
        kept.set(true);
        // Only once `threading` is imported elsewhere (the extension
        // imports it as it loads): imported first on this thread, it would
        // take this thread for the main one and wait at exit for its state
        // to go, which a kept state never does.
        let threading = Python::attach(|py| {
            py.import("sys")
                .and_then(|sys| sys.getattr("modules"))
                .and_then(|m| m.contains("threading"))
                .unwrap_or(false)
        });
        if !threading {
            return;
        }
        // SAFETY: the interpreter runs (this process serves kernels from
        // inside it, or is the driver that made the in-process worker).
        // A thread without a thread state holds no GIL; for it,
        // `PyGILState_Ensure` takes the GIL with a new state for this
        // thread and `PyEval_SaveThread` releases the GIL keeping the state
        // as this thread's: the `Ensure` is never matched, so the later
        // `Ensure`/`Release` pairs of `Python::attach` find the state and
        // leave it in place. Nothing is done on a thread that has one.
        unsafe {
            if !pyo3::ffi::PyGILState_GetThisThreadState().is_null() {
                return;
            }
            let _ = pyo3::ffi::PyGILState_Ensure();
            pyo3::ffi::PyEval_SaveThread();
        }
    });
}

/// The built-in kernels and `kernels`.
pub(crate) fn registry_with(py: Python<'_>, kernels: &[Py<PyKernelSpec>]) -> PyResult<Registry> {
    let mut r = Registry::with_builtins();
    for k in kernels {
        let k = k.get();
        let kernel: Arc<dyn Kernel> = match (&k.func, &k.cuda) {
            (Some(func), cuda) => Arc::new(PyKernel {
                desc: k.desc.clone(),
                func: func.clone_ref(py),
                cuda: cuda.clone().map(CudaBody::Source),
            }),
            (None, Some(src)) => Arc::new(
                SourceKernel::new(
                    k.desc.clone(),
                    src.code.to_string(),
                    src.entry.clone(),
                    src.grid,
                )
                .map_err(|e| raise("Error", e, &[]))?,
            ),
            (None, None) => continue,
        };
        r.register(kernel)
            .map_err(|e| raise("Error", format!("kernel {}: {e}", k.name()), &[]))?;
    }
    Ok(r)
}

/// `python -m strata.worker`'s options after its own.
#[derive(Debug, Parser)]
#[command(
    name = "python -m strata.worker",
    about = "Serve one chip: the built-in kernels and Python kernels"
)]
struct WorkerCmd {
    #[command(flatten)]
    worker: strata_worker::cli::WorkerArgs,
}

/// Runs a worker in this process with `kernels` beside the built-in ones,
/// on `strata worker`'s options `argv`, until SIGTERM or SIGINT (or, with
/// ``--exit-with-stdin``, until stdin closes: the process then ends at
/// once, even while a kernel holds the GIL); returns the exit status.
/// The GIL is released while it serves (kernels take it to run).
#[pyfunction]
pub(crate) fn run_worker(
    py: Python<'_>,
    argv: Vec<String>,
    kernels: Vec<Py<PyKernelSpec>>,
) -> PyResult<i32> {
    let cmd = match WorkerCmd::try_parse_from(
        std::iter::once("python -m strata.worker".to_owned()).chain(argv),
    ) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return Ok(e.exit_code());
        }
    };
    let registry = registry_with(py, &kernels)?;
    let code = py.detach(|| strata_worker::cli::run(cmd.worker, registry));
    Ok(if code == ExitCode::SUCCESS { 0 } else { 1 })
}

/// The names of the built-in kernels (``name@version``), sorted.
#[pyfunction]
pub(crate) fn builtin_kernels() -> Vec<String> {
    let mut v: Vec<String> = Registry::with_builtins()
        .descriptors()
        .map(Signature::qualified_name)
        .collect();
    v.sort();
    v
}
