//! The driver's errors as the exception classes of `strata.errors`
//! (python/strata/errors.py): [`err`] maps every
//! [`strata_orchestrator::Error`] to the class a program catches, with
//! structured attributes where the error has them.
//!
//! The classes are Python ones so that they can have two bases
//! (`InvalidView` is also a `ValueError`, `InvalidIndex` an `IndexError`).

use pyo3::IntoPyObjectExt;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use strata_orchestrator::{
    BufferError, ClusterError, Error, FailureKind, LinkError, Outcome, RunError, SubmitError,
    ViewError,
};

/// `v` as a Python object (`None` if it cannot be one).
pub(crate) fn obj<'py, T: IntoPyObject<'py>>(py: Python<'py>, v: T) -> Py<PyAny> {
    v.into_py_any(py).unwrap_or_else(|_| py.None())
}

/// An exception of class `class` of `strata.errors`, with `message` and
/// the attributes `fields`.
pub(crate) fn raise(
    class: &str,
    message: impl Into<String>,
    fields: &[(&str, Py<PyAny>)],
) -> PyErr {
    let message = message.into();
    Python::attach(|py| {
        let built = (|| -> PyResult<PyErr> {
            let cls = py.import("strata.errors")?.getattr(class)?;
            let kwargs = PyDict::new(py);
            for (k, v) in fields {
                kwargs.set_item(*k, v)?;
            }
            let value = cls.call((message.clone(),), Some(&kwargs))?;
            Ok(PyErr::from_value(value))
        })();
        // Without the package (the module imported on its own) the
        // message still reaches the caller.
        built.unwrap_or_else(|_| pyo3::exceptions::PyRuntimeError::new_err(message))
    })
}

/// The exception for a driver error.
pub(crate) fn err(e: Error) -> PyErr {
    let message = e.to_string();
    match e {
        Error::Cluster(ClusterError::Unreachable {
            error: LinkError::Auth(_),
            ..
        }) => raise("AuthenticationError", message, &[]),
        Error::Cluster(ClusterError::InsideAsync) => raise("Error", message, &[]),
        Error::Cluster(_) => raise("ClusterError", message, &[]),
        Error::Buffer(BufferError::ScopeEnded { .. } | BufferError::AllocScope(_)) => {
            raise("ScopeEnded", message, &[])
        }
        Error::Submit(SubmitError::DeadArgument { ref source, .. })
            if matches!(**source, BufferError::ScopeEnded { .. }) =>
        {
            raise("ScopeEnded", message, &[])
        }
        Error::Buffer(_) => raise("BufferError", message, &[]),
        Error::View(ViewError::ReadOnly { .. }) => raise("ReadOnlyView", message, &[]),
        Error::View(_) => raise("InvalidView", message, &[]),
        Error::Quarantined(q) => Python::attach(|py| {
            raise(
                "Quarantined",
                message,
                &[
                    ("buffer", obj(py, q.buffer.to_string())),
                    ("bytes", obj(py, (q.bytes.start, q.bytes.end))),
                    ("task", obj(py, q.task.0)),
                    ("callable", obj(py, q.callable.as_str())),
                    ("worker", obj(py, q.worker.0)),
                ],
            )
        }),
        Error::Submit(SubmitError::NoBody { callable, ids, .. }) => Python::attach(|py| {
            let ids: Vec<u32> = ids.iter().map(|w| w.0).collect();
            raise(
                "NoBody",
                message,
                &[
                    ("callable", obj(py, callable.as_str())),
                    ("workers", obj(py, ids)),
                ],
            )
        }),
        Error::Submit(SubmitError::UnknownCallable { .. } | SubmitError::UnknownVersion { .. }) => {
            raise("UnknownCallable", message, &[])
        }
        Error::Submit(SubmitError::Incapable { placed, lacks, .. }) => Python::attach(|py| {
            let lacks: Vec<(Option<usize>, String, Vec<u32>)> = lacks
                .iter()
                .map(|l| {
                    (
                        l.arg,
                        l.need.to_string(),
                        l.workers.iter().map(|(w, _)| w.0).collect(),
                    )
                })
                .collect();
            raise(
                "Unsupported",
                message,
                &[("placed", obj(py, placed)), ("lacks", obj(py, lacks))],
            )
        }),
        Error::Submit(_) => raise("SubmitError", message, &[]),
        Error::Worker { worker, error } => Python::attach(|py| {
            let lost = matches!(error, LinkError::Lost(_));
            raise(
                "WorkerError",
                message,
                &[("worker", obj(py, worker.0)), ("lost", obj(py, lost))],
            )
        }),
        Error::Run(r) => run_error(r),
        Error::Npy { .. } => raise("NpyError", message, &[]),
        Error::Trace(_) => raise("TraceError", message, &[]),
        Error::Closed => raise("ClusterClosed", message, &[]),
        _ => raise("Error", message, &[]),
    }
}

/// A task's failure as `TaskFailed`, or the subclass of its outcome.
pub(crate) fn run_error(r: RunError) -> PyErr {
    let message = r.to_string();
    Python::attach(|py| {
        let (class, outcome, because) = match &r.outcome {
            Outcome::TaskFailure(_) => ("TaskFailed", "TASK_FAILURE", None),
            Outcome::EndpointFailure(_) => ("WorkerLost", "ENDPOINT_FAILURE", None),
            Outcome::Skipped { because } => ("TaskSkipped", "SKIPPED", Some(because.0)),
            Outcome::Cancelled => ("TaskCancelled", "CANCELLED", None),
            Outcome::Success => ("TaskFailed", "SUCCESS", None),
        };
        let cause = r.outcome.cause().map(|c| c.message.as_str());
        let kind = failure_kind(py, r.outcome.kind());
        raise(
            class,
            message,
            &[
                ("task", obj(py, r.task.0)),
                ("callable", obj(py, r.callable.as_str())),
                ("worker", obj(py, r.worker.as_deref())),
                ("outcome", obj(py, outcome)),
                ("kind", kind),
                ("cause", obj(py, cause)),
                ("because", obj(py, because)),
            ],
        )
    })
}

/// `kind` as a member of `strata.errors.FailureKind` (`None` for none,
/// or without the package).
fn failure_kind(py: Python<'_>, kind: Option<FailureKind>) -> Py<PyAny> {
    kind.and_then(|k| {
        let cls = py
            .import("strata.errors")
            .ok()?
            .getattr("FailureKind")
            .ok()?;
        cls.call1((k.name(),)).ok().map(Bound::unbind)
    })
    .unwrap_or_else(|| py.None())
}

/// Every kind's name, in the engine's order: what
/// `strata.errors.FailureKind` must cover (a test checks it does).
#[pyfunction]
pub(crate) fn _failure_kinds() -> Vec<&'static str> {
    FailureKind::ALL.iter().map(|k| k.name()).collect()
}

/// `InvalidView` with `message`.
pub(crate) fn invalid_view(message: impl Into<String>) -> PyErr {
    raise("InvalidView", message, &[])
}

/// `WrongTag` with `message`.
pub(crate) fn wrong_tag(message: impl Into<String>) -> PyErr {
    raise("WrongTag", message, &[])
}
