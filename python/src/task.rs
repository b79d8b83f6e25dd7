//! Tasks from Python: explicit tags (`strata.input(v)`...), the kernel
//! signatures that tag bare views and type Python numbers as scalars,
//! task handles, group members and run summaries.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::types::{PyComplex, PyFloat, PyInt, PyTuple};
use strata_chip_runtime::kernel::{ArgSpec, ScalarKind, ScalarSpec};
use strata_orchestrator::{RunSummary, Task, TaskHandle, WorkerId};
use strata_wire::{Access, ArgTag, DType};

use crate::array::PyArray;
use crate::core::Core;
use crate::dtype;
use crate::errors::{err, raise, wrong_tag};
use crate::sig::Sig;

/// A view with an explicit tag, from :func:`strata.input`,
/// :func:`strata.output`, :func:`strata.inout`,
/// :func:`strata.output_existing` or :func:`strata.no_dep`.
#[pyclass(name = "Tagged", module = "strata", frozen)]
pub(crate) struct Tagged {
    pub(crate) array: Py<PyArray>,
    pub(crate) tag: ArgTag,
}

#[pymethods]
impl Tagged {
    /// The view.
    #[getter]
    fn array(&self, py: Python<'_>) -> Py<PyArray> {
        self.array.clone_ref(py)
    }

    /// The tag's name (``"INPUT"``, ``"OUTPUT"``...).
    #[getter]
    fn tag(&self) -> &'static str {
        tag_name(self.tag)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "strata.{}({})",
            tag_name(self.tag).to_ascii_lowercase(),
            self.array.bind(py).repr()?
        ))
    }
}

fn tag_name(t: ArgTag) -> &'static str {
    match t {
        ArgTag::Input => "INPUT",
        ArgTag::Output => "OUTPUT",
        ArgTag::OutputExisting => "OUTPUT_EXISTING",
        ArgTag::InOut => "INOUT",
        ArgTag::NoDep => "NO_DEP",
    }
}

fn tagged(array: Py<PyArray>, tag: ArgTag) -> Tagged {
    Tagged { array, tag }
}

/// ``view`` as an argument the task reads (INPUT): it runs after earlier
/// writers of any of its bytes.
#[pyfunction]
pub(crate) fn input(view: Py<PyArray>) -> Tagged {
    tagged(view, ArgTag::Input)
}

/// ``view`` as an argument the task writes whole (OUTPUT): it runs after
/// earlier readers and writers of its bytes; its old bytes do not matter.
#[pyfunction]
pub(crate) fn output(view: Py<PyArray>) -> Tagged {
    tagged(view, ArgTag::Output)
}

/// ``view`` as an argument the task reads and writes (INOUT).
#[pyfunction]
pub(crate) fn inout(view: Py<PyArray>) -> Tagged {
    tagged(view, ArgTag::InOut)
}

/// ``view`` as an argument the task writes, keeping the bytes it does not
/// write (OUTPUT_EXISTING: a remote worker receives the old bytes).
#[pyfunction]
pub(crate) fn output_existing(view: Py<PyArray>) -> Tagged {
    tagged(view, ArgTag::OutputExisting)
}

/// ``view`` outside dependency tracking (NO_DEP): the caller orders it
/// (with ``after=``).
#[pyfunction]
pub(crate) fn no_dep(view: Py<PyArray>) -> Tagged {
    tagged(view, ArgTag::NoDep)
}

/// The tag a bare view gets from the kernel's access.
fn tag_of(a: Access) -> ArgTag {
    match a {
        Access::Read => ArgTag::Input,
        Access::Write => ArgTag::Output,
        Access::ReadWrite => ArgTag::InOut,
    }
}

/// Whether an explicit `tag` is consistent with what the kernel does:
/// a task must declare at least what its kernel touches (a kernel that
/// writes needs a writing tag; one that reads needs a reading tag, or it
/// would read bytes nothing ordered), NO_DEP being the caller's own
/// promise.
fn tag_fits(tag: ArgTag, kernel: Access) -> bool {
    matches!(
        (tag, kernel),
        (ArgTag::NoDep | ArgTag::InOut, _)
            | (ArgTag::Input, Access::Read)
            | (ArgTag::Output | ArgTag::OutputExisting, Access::Write)
    )
}

/// Builds the [`Task`] of `callable` with Python arguments `args`:
/// arrays and tagged arrays in the signature's tensor order, numbers as its
/// scalars in order.
pub(crate) fn build(
    sig: &Sig,
    callable: &str,
    args: &Bound<'_, PyTuple>,
    on: Option<u32>,
    after: Option<&Bound<'_, PyAny>>,
    timeout: Option<f64>,
) -> PyResult<Task> {
    let mut task = Task::new(callable);
    if let Some(secs) = timeout {
        task = task.timeout(timeout_of(&sig.qualified, secs)?);
    }
    let mut tensors = 0usize;
    let mut dtypes: Vec<DType> = Vec::with_capacity(sig.sig.args.len());
    let mut ranks: Vec<usize> = Vec::with_capacity(sig.sig.args.len());
    let mut numbers: Vec<Bound<'_, PyAny>> = Vec::new();
    for (pos, a) in args.iter().enumerate() {
        let (array, explicit) = if let Ok(arr) = a.cast::<PyArray>() {
            (arr.clone(), None)
        } else if let Ok(t) = a.cast::<Tagged>() {
            let t = t.get();
            (t.array.bind(a.py()).clone(), Some(t.tag))
        } else if a.is_instance_of::<PyInt>()
            || a.is_instance_of::<PyFloat>()
            || a.is_instance_of::<PyComplex>()
        {
            numbers.push(a);
            continue;
        } else {
            return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "{}: argument {pos} is a {}; a task takes strata arrays (bare or tagged with strata.input/output/...) and Python numbers",
                sig.qualified,
                a.get_type().name()?
            )));
        };
        let Some(ArgSpec { name, access, .. }) = sig.sig.args.get(tensors) else {
            return Err(wrong_tag(format!(
                "{} takes {} tensor arguments ({}); got more",
                sig.qualified,
                sig.sig.args.len(),
                sig.arg_names()
            )));
        };
        let tag = match explicit {
            None => tag_of(*access),
            Some(t) if tag_fits(t, *access) => t,
            Some(t) => {
                return Err(wrong_tag(format!(
                    "{}: argument {tensors} ({name}) is tagged {} but the kernel {} it",
                    sig.qualified,
                    tag_name(t),
                    match access {
                        Access::Read => "only reads",
                        Access::Write => "writes",
                        Access::ReadWrite => "reads and writes",
                    }
                )));
            }
        };
        let arr = array.get();
        dtypes.push(arr.view.dtype());
        ranks.push(arr.view.shape().len());
        task = task.arg(&arr.view, tag);
        tensors += 1;
    }
    if tensors != sig.sig.args.len() {
        return Err(wrong_tag(format!(
            "{} takes {} tensor arguments ({}); got {tensors}",
            sig.qualified,
            sig.sig.args.len(),
            sig.arg_names()
        )));
    }
    sig.check_args(&dtypes, &ranks)?;
    if numbers.len() != sig.sig.scalars.len() {
        return Err(wrong_tag(format!(
            "{} takes {} scalars ({}); got {}",
            sig.qualified,
            sig.sig.scalars.len(),
            sig.sig
                .scalars
                .iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            numbers.len()
        )));
    }
    for (ScalarSpec { name, kind }, v) in sig.sig.scalars.iter().zip(&numbers) {
        // A value like an integer argument's must fit its dtype: 300 in a
        // u8 would otherwise arrive as 44.
        if let ScalarKind::LikeArg(i) = kind
            && let Some(&d) = dtypes.get(*i)
            && let Some((lo, hi)) = dtype::int_range(d)
            && let Ok(n) = v.extract::<i128>()
            && !(lo..=hi).contains(&n)
        {
            return Err(raise(
                "SubmitError",
                format!(
                    "{}: scalar {name}={n} does not fit argument {i} ({}) of dtype {} ({lo}..={hi})",
                    sig.qualified,
                    sig.sig.args.get(*i).map_or("?", |a| a.name.as_str()),
                    d.name().to_ascii_lowercase()
                ),
                &[],
            ));
        }
        let complex_arg = match kind {
            ScalarKind::LikeArg(i) => dtypes.get(*i).copied().filter(|d| d.is_complex()),
            _ => None,
        };
        let kind = match kind {
            ScalarKind::LikeArg(i) => match dtypes.get(*i) {
                Some(&d) if dtype::is_float(d) => ScalarKind::F64,
                Some(&d) if dtype::is_unsigned(d) => ScalarKind::U64,
                Some(_) => ScalarKind::I64,
                None => ScalarKind::F64,
            },
            k => *k,
        };
        let bad = |want: &str| {
            pyo3::exceptions::PyTypeError::new_err(format!(
                "{}: scalar {name} is {want}; got {}",
                sig.qualified,
                v.repr().map(|r| r.to_string()).unwrap_or_default()
            ))
        };
        // A complex value goes only to a complex argument, and only with an
        // imaginary part of 0 (its scalars are real: a scalar is one 64-bit
        // word); anywhere else it is refused, never cut to its real part as
        // numpy's own conversion would.
        let real = match v.cast::<PyComplex>() {
            Err(_) => None,
            Ok(c) => match (kind, complex_arg) {
                (ScalarKind::F64, Some(_)) if c.imag() == 0.0 => Some(c.real()),
                (ScalarKind::F64, Some(d)) => {
                    return Err(raise(
                        "SubmitError",
                        format!(
                            "{}: scalar {name}={} is complex; a scalar is one 64-bit word, so scalars of {} arguments are real (fill with a real value, or write complex values with numpy)",
                            sig.qualified,
                            v.repr().map(|r| r.to_string()).unwrap_or_default(),
                            d.name().to_ascii_lowercase()
                        ),
                        &[],
                    ));
                }
                (ScalarKind::F64, None) => return Err(bad("a float")),
                (ScalarKind::I64, _) => return Err(bad("an integer (i64)")),
                _ => return Err(bad("an unsigned integer (u64)")),
            },
        };
        task = match (kind, real) {
            (ScalarKind::F64, Some(re)) => task.scalar_f64(re),
            (ScalarKind::F64, None) => {
                task.scalar_f64(v.extract::<f64>().map_err(|_| bad("a float"))?)
            }
            (ScalarKind::I64, _) => {
                if v.is_instance_of::<PyFloat>() {
                    return Err(bad("an integer (i64)"));
                }
                task.scalar_i64(v.extract::<i64>().map_err(|_| bad("an integer (i64)"))?)
            }
            (ScalarKind::U64 | ScalarKind::LikeArg(_), _) => {
                if v.is_instance_of::<PyFloat>() {
                    return Err(bad("an unsigned integer (u64)"));
                }
                task.scalar_u64(
                    v.extract::<u64>()
                        .map_err(|_| bad("an unsigned integer (u64)"))?,
                )
            }
        };
    }
    if let Some(w) = on {
        task = task.on(WorkerId(w));
    }
    if let Some(after) = after {
        for t in after.try_iter()? {
            let t = t?;
            let h = t.cast::<PyTask>().map_err(|_| {
                pyo3::exceptions::PyTypeError::new_err(format!(
                    "after= takes tasks (what submit returned); got a {}",
                    t.get_type()
                        .name()
                        .map(|n| n.to_string())
                        .unwrap_or_default()
                ))
            })?;
            task = task.after(h.get().handle);
        }
    }
    Ok(task)
}

/// ``timeout=`` seconds as a bound: positive and finite, or
/// :class:`SubmitError` naming the callable.
fn timeout_of(qualified: &str, secs: f64) -> PyResult<Duration> {
    if secs <= 0.0 || !secs.is_finite() {
        return Err(crate::errors::raise(
            "SubmitError",
            format!(
                "{qualified}: timeout={secs} can never be met; give a positive number of seconds, or None"
            ),
            &[],
        ));
    }
    Duration::try_from_secs_f64(secs).map_err(|_| {
        crate::errors::raise(
            "SubmitError",
            format!("{qualified}: timeout={secs} seconds is too long to count"),
            &[],
        )
    })
}

/// A submitted task: ``wait()`` for it, ``cancel()`` it, or name it in
/// another task's ``after=``.
#[pyclass(name = "Task", module = "strata", frozen)]
pub(crate) struct PyTask {
    pub(crate) handle: TaskHandle,
    pub(crate) core: Arc<Core>,
}

#[pymethods]
impl PyTask {
    /// The task's id (its submission order, from 1).
    #[getter]
    fn id(&self) -> u64 {
        self.handle.id().0
    }

    /// Waits for the task (the GIL released; Ctrl-C interrupts).
    ///
    /// Raises :class:`TaskFailed` (or :class:`WorkerLost`,
    /// :class:`TaskSkipped`, :class:`TaskCancelled`) when it did not
    /// succeed.
    ///
    /// With ``timeout=`` (seconds) it gives up after that long and raises
    /// :class:`WaitTimeout` (the task goes on); a ``close()`` from another
    /// thread makes it raise :class:`ClusterClosed` within 50 ms.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        wait_task(py, &self.core, self.handle, timeout)
    }

    /// Whether the task has finished successfully (``False`` while it
    /// runs); raises as ``wait`` when it did not succeed.
    fn done(&self, py: Python<'_>) -> PyResult<bool> {
        let core = Arc::clone(&self.core);
        let h = self.handle;
        py.detach(|| core.run(|c| c.wait_timeout(h, Duration::ZERO)))
            .map_err(err)
    }

    /// Cancels the task if it has not started (its consumers are then
    /// skipped); raises :class:`SubmitError` when it is running or done.
    fn cancel(&self, py: Python<'_>) -> PyResult<()> {
        let core = Arc::clone(&self.core);
        let h = self.handle;
        py.detach(|| core.run(|c| c.cancel(h))).map_err(err)
    }

    fn __repr__(&self) -> String {
        format!("strata.Task({})", self.handle.id().0)
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<PyTask>()
            .is_ok_and(|o| o.get().handle == self.handle)
    }

    fn __hash__(&self) -> u64 {
        self.handle.id().0
    }
}

/// Waits for `task` with the GIL released, running Python's signal
/// handlers every [`SLICE`] (Ctrl-C raises `KeyboardInterrupt`).
pub(crate) fn wait_task(
    py: Python<'_>,
    core: &Arc<Core>,
    task: TaskHandle,
    timeout: Option<f64>,
) -> PyResult<()> {
    let mut watch = Watch::new("wait", timeout)?;
    let r = py.detach(|| core.run(|c| c.wait_while(task, watch.slice(), || watch.go_on(core))));
    watch.given_up(&format!("task {} is unfinished", task.id().0))?;
    r.map(drop).map_err(err)
}

/// What a wait keeps an eye on between its slices: Ctrl-C (Python's
/// signal handlers), a `close()` from another thread, and its deadline.
pub(crate) struct Watch {
    what: &'static str,
    timeout: Option<f64>,
    deadline: Option<Instant>,
    why: Option<GaveUp>,
}

enum GaveUp {
    Signal(PyErr),
    Closed,
    Timeout,
}

impl Watch {
    /// `timeout`: seconds, zero or more and finite, or `None` (no limit).
    pub(crate) fn new(what: &'static str, timeout: Option<f64>) -> PyResult<Self> {
        let deadline = match timeout {
            None => None,
            Some(t) if t.is_finite() && t >= 0.0 => {
                Instant::now().checked_add(Duration::from_secs_f64(t))
            }
            Some(t) => {
                return Err(raise(
                    "Error",
                    format!(
                        "{what}: timeout={t} is not a number of seconds; give zero or more, or None"
                    ),
                    &[],
                ));
            }
        };
        Ok(Watch {
            what,
            timeout,
            deadline,
            why: None,
        })
    }

    /// How long each slice of the wait lasts: [`SLICE`], or less when the
    /// deadline is nearer.
    pub(crate) fn slice(&self) -> Duration {
        match self.deadline {
            Some(d) => d
                .saturating_duration_since(Instant::now())
                .clamp(Duration::from_millis(1), SLICE),
            None => SLICE,
        }
    }

    /// Whether to wait another slice.
    pub(crate) fn go_on(&mut self, core: &Core) -> bool {
        self.why = if let Err(e) = Python::attach(|py| py.check_signals()) {
            Some(GaveUp::Signal(e))
        } else if core.closing() {
            Some(GaveUp::Closed)
        } else if self.deadline.is_some_and(|d| Instant::now() >= d) {
            Some(GaveUp::Timeout)
        } else {
            None
        };
        self.why.is_none()
    }

    /// The error for a wait given up, if it was; `unfinished` says what
    /// was still running.
    pub(crate) fn given_up(&mut self, unfinished: &str) -> PyResult<()> {
        match self.why.take() {
            None => Ok(()),
            Some(GaveUp::Signal(e)) => Err(e),
            Some(GaveUp::Closed) => Err(raise(
                "ClusterClosed",
                format!("{}: the cluster was closed while waiting", self.what),
                &[],
            )),
            Some(GaveUp::Timeout) => Err(raise(
                "WaitTimeout",
                format!(
                    "{}: {unfinished} after timeout={} s; it goes on (wait again to collect it)",
                    self.what,
                    self.timeout.unwrap_or(0.0)
                ),
                &[],
            )),
        }
    }
}

/// How long one slice of a wait lasts before signals are checked.
pub(crate) const SLICE: Duration = Duration::from_millis(50);

/// One member of a group, from :meth:`Cluster.task`; submit members
/// together with :meth:`Cluster.submit_group`.
#[pyclass(name = "TaskSpec", module = "strata", frozen)]
pub(crate) struct PyTaskSpec {
    pub(crate) task: Task,
}

#[pymethods]
impl PyTaskSpec {
    fn __repr__(&self) -> String {
        format!("strata.TaskSpec({:?})", self.task)
    }
}

/// What a run did: ``wait_all()``'s answer (and ``totals()``'s).
#[pyclass(name = "Summary", module = "strata", frozen)]
pub(crate) struct PySummary {
    /// Tasks submitted.
    #[pyo3(get)]
    submitted: u64,
    /// Tasks that succeeded.
    #[pyo3(get)]
    succeeded: u64,
    /// Tasks that failed.
    #[pyo3(get)]
    failed: u64,
    /// Tasks skipped because a producer failed.
    #[pyo3(get)]
    skipped: u64,
    /// Tasks cancelled.
    #[pyo3(get)]
    cancelled: u64,
    /// Dependency edges inferred.
    #[pyo3(get)]
    edges: u64,
    /// Bytes of host buffers passed to local workers by fd (not copied).
    #[pyo3(get)]
    fd_bytes: u64,
    /// View bytes sent to remote workers.
    #[pyo3(get)]
    sent_bytes: u64,
    /// View bytes remote workers sent back.
    #[pyo3(get)]
    returned_bytes: u64,
    /// Bytes workers staged between host and device memory.
    #[pyo3(get)]
    staged_bytes: u64,
    /// Of those, bytes copied host → device.
    #[pyo3(get)]
    to_device_bytes: u64,
    /// Of those, bytes copied device → host.
    #[pyo3(get)]
    from_device_bytes: u64,
    /// Of ``to_device_bytes``, bytes copied in ahead of their task.
    #[pyo3(get)]
    prefetched_bytes: u64,
    /// Bytes copied on the chips (from a cached copy to a writing
    /// kernel's block).
    #[pyo3(get)]
    on_chip_bytes: u64,
    /// Arguments whose bytes a chip held already.
    #[pyo3(get)]
    cache_hits: u64,
    /// Arguments whose bytes a chip copied in.
    #[pyo3(get)]
    cache_misses: u64,
    /// Dirty cached copies written back.
    #[pyo3(get)]
    write_backs: u64,
    /// Cached copies evicted to make room.
    #[pyo3(get)]
    evictions: u64,
    /// View bytes left out of tasks for remote workers whose chips held
    /// them.
    #[pyo3(get)]
    held_bytes: u64,
    /// Tasks sent again because a chip no longer held such bytes.
    #[pyo3(get)]
    resent: u64,
    /// Completions whose kernel time the performance models predicted.
    #[pyo3(get)]
    predicted: u64,
    /// The models' relative error over those (Σ|predicted − measured| /
    /// Σ measured), or ``None`` when they predicted none.
    #[pyo3(get)]
    prediction_error: Option<f64>,
    /// Tasks that did not succeed by kind (``by_kind`` in Python).
    kinds: Vec<(&'static str, u64)>,
}

impl From<RunSummary> for PySummary {
    fn from(s: RunSummary) -> Self {
        PySummary {
            submitted: s.submitted,
            succeeded: s.succeeded,
            failed: s.failed,
            skipped: s.skipped,
            cancelled: s.cancelled,
            edges: s.edges,
            fd_bytes: s.fd_bytes,
            sent_bytes: s.sent_bytes,
            returned_bytes: s.returned_bytes,
            staged_bytes: s.staged_bytes,
            to_device_bytes: s.to_device_bytes,
            from_device_bytes: s.from_device_bytes,
            prefetched_bytes: s.prefetched_bytes,
            on_chip_bytes: s.on_chip_bytes,
            cache_hits: s.cache_hits,
            cache_misses: s.cache_misses,
            write_backs: s.write_backs,
            evictions: s.evictions,
            held_bytes: s.held_bytes,
            resent: s.resent,
            predicted: s.predicted,
            prediction_error: s.prediction_error(),
            kinds: s.by_kind.iter().map(|(k, n)| (k.name(), *n)).collect(),
        }
    }
}

#[pymethods]
impl PySummary {
    /// The tasks that did not succeed (failed, skipped or cancelled), by
    /// kind: a dict from ``strata.FailureKind`` to a count, with only the
    /// kinds that happened.
    #[getter]
    fn by_kind<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let cls = py.import("strata.errors")?.getattr("FailureKind")?;
        let d = pyo3::types::PyDict::new(py);
        for (name, n) in &self.kinds {
            d.set_item(cls.call1((*name,))?, n)?;
        }
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!(
            "strata.Summary(submitted={}, succeeded={}, failed={}, skipped={}, cancelled={}, edges={}, fd_bytes={}, sent_bytes={}, returned_bytes={}, staged_bytes={}, to_device_bytes={}, from_device_bytes={}, prefetched_bytes={}, on_chip_bytes={}, cache_hits={}, cache_misses={}, write_backs={}, evictions={}, held_bytes={}, resent={}, predicted={}, prediction_error={})",
            self.submitted,
            self.succeeded,
            self.failed,
            self.skipped,
            self.cancelled,
            self.edges,
            self.fd_bytes,
            self.sent_bytes,
            self.returned_bytes,
            self.staged_bytes,
            self.to_device_bytes,
            self.from_device_bytes,
            self.prefetched_bytes,
            self.on_chip_bytes,
            self.cache_hits,
            self.cache_misses,
            self.write_backs,
            self.evictions,
            self.held_bytes,
            self.resent,
            self.predicted,
            self.prediction_error
                .map_or_else(|| "None".to_owned(), |e| format!("{e:.3}"))
        )
    }
}
