"""strata: task graphs over multi-chip accelerators, from Python.

A driver names *views* — typed, strided windows over shared buffers,
written with numpy's indexing — and submits *tasks*: a kernel plus its
arguments. strata infers the dependency graph from the bytes each task
reads and writes, and runs every ready task on a worker process (one per
chip; the default chip is simulated), passing host buffers to local
workers by file descriptor, without copying.

    import numpy as np
    import strata

    with strata.Cluster(local=2) as cluster:
        a = cluster.array(np.random.rand(256, 256).astype(np.float32))
        b = cluster.array(np.random.rand(256, 256).astype(np.float32))
        c = cluster.zeros((256, 256), np.float32)
        for i in range(0, 256, 128):
            for j in range(0, 256, 128):
                cluster.submit("matmul", a[i:i+128, :], b[:, j:j+128], c[i:i+128, j:j+128])
        cluster.wait_all()
        np.testing.assert_allclose(c.numpy(), a.numpy() @ b.numpy(), rtol=1e-4)

See docs/python.md for the tour: views and what becomes an edge, tags,
scalars, groups, scopes, device buffers, Python kernels, errors, threads.
"""

from __future__ import annotations

from . import errors
from ._strata import (
    Array,
    Cluster,
    Kernel,
    Scope,
    Summary,
    Tagged,
    Task,
    TaskSpec,
    Worker,
    builtin_kernels,
    inout,
    input,
    no_dep,
    output,
    output_existing,
)
from .errors import (
    AuthenticationError,
    BufferError,
    ClusterClosed,
    WaitTimeout,
    ClusterError,
    Error,
    FailureKind,
    GraphError,
    InvalidIndex,
    InvalidView,
    NoBody,
    NpyError,
    Quarantined,
    ReadOnlyView,
    ScopeEnded,
    SubmitError,
    TaskCancelled,
    TaskFailed,
    TaskSkipped,
    TraceError,
    UnknownCallable,
    Unsupported,
    WorkerError,
    WorkerLost,
    WrongTag,
)
from .kernels import kernel, raw_kernel, serve

__all__ = [
    "Array",
    "Cluster",
    "Kernel",
    "Scope",
    "Summary",
    "Tagged",
    "Task",
    "TaskSpec",
    "Worker",
    "builtin_kernels",
    "errors",
    "inout",
    "input",
    "kernel",
    "raw_kernel",
    "no_dep",
    "output",
    "output_existing",
    "serve",
    "AuthenticationError",
    "BufferError",
    "ClusterClosed",
    "WaitTimeout",
    "ClusterError",
    "Error",
    "GraphError",
    "InvalidIndex",
    "InvalidView",
    "NpyError",
    "Quarantined",
    "ReadOnlyView",
    "ScopeEnded",
    "SubmitError",
    "TaskCancelled",
    "TaskFailed",
    "FailureKind",
    "TaskSkipped",
    "TraceError",
    "UnknownCallable",
    "NoBody",
    "Unsupported",
    "WorkerError",
    "WorkerLost",
    "WrongTag",
]
