"""strata's exceptions.

Every error strata raises is a :class:`Error`; programs catch the kind they
can handle. Each carries the message of the Rust driver (naming what was
wrong: the argument, the field, the worker) and, where it has them,
structured attributes.
"""

from __future__ import annotations

import enum

__all__ = [
    "FailureKind",
    "Error",
    "ClusterError",
    "AuthenticationError",
    "WorkerError",
    "BufferError",
    "ScopeEnded",
    "InvalidView",
    "InvalidIndex",
    "ReadOnlyView",
    "SubmitError",
    "UnknownCallable",
    "NoBody",
    "Unsupported",
    "WrongTag",
    "TaskFailed",
    "WorkerLost",
    "TaskSkipped",
    "TaskCancelled",
    "Quarantined",
    "ClusterClosed",
    "WaitTimeout",
    "NpyError",
    "GraphError",
    "TraceError",
]


class FailureKind(enum.Enum):
    """What kind of failure ended a task (``TaskFailed.kind``): what a
    program matches on, where ``TaskFailed.cause`` is for a person.

    The members are the engine's kinds, one for one; each member's value is
    its name in text (``FailureKind("import_refused")``). A kind added to
    the engine that this package does not know yet arrives as ``OTHER``.
    """

    #: The kernel ran and reported an error (for a Python kernel, it
    #: raised; ``cause`` is the traceback).
    KERNEL = "kernel"
    #: The worker refused the task's arguments before running it: a buffer
    #: it could not import or find, a view its grant does not allow.
    IMPORT_REFUSED = "import_refused"
    #: The task itself was refused before it ran: a request that fails the
    #: worker's checks, a callable it does not have, an ended session, a
    #: task too big for a message.
    REFUSED = "refused"
    #: The chip could not run it: device memory or staging failed.
    DEVICE = "device"
    #: It ran past its ``timeout=``.
    TIMED_OUT = "timed_out"
    #: It writes bytes quarantined by a task lost without a fence.
    QUARANTINED = "quarantined"
    #: Its worker died, hung or was cut off.
    WORKER_LOST = "worker_lost"
    #: Cancelled before it started.
    CANCELLED = "cancelled"
    #: Not run, because a task it depends on failed (``because``).
    SKIPPED = "skipped"
    #: A failure that fits no other kind.
    OTHER = "other"
    #: The worker lacks what the task needs: a feature the task requires,
    #: a dtype its chip does not support, a kind of buffer it does not take
    #: (the driver refuses such a task at submit, :class:`Unsupported`).
    UNSUPPORTED = "unsupported"

    @classmethod
    def _missing_(cls, value: object) -> "FailureKind":
        return cls.OTHER


class Error(Exception):
    """Base class of every strata error.

    Keyword arguments given when it is raised become attributes (for
    example ``TaskFailed.task``).
    """

    def __init__(self, message: str, **fields: object) -> None:
        super().__init__(message)
        for name, value in fields.items():
            setattr(self, name, value)


class ClusterError(Error):
    """The cluster could not start, or a worker could not be reached or
    spawned (the message names the worker and, for a spawned one, ends
    with its log)."""


class AuthenticationError(ClusterError):
    """A worker refused the cluster's credentials (a wrong or missing
    token)."""


class WorkerError(Error):
    """A worker refused or failed a control call (device memory, stats).
    ``.worker`` is its id."""


class BufferError(Error):
    """A buffer could not be made, read or written (a device buffer read
    as host memory, bytes past the end, a run buffer whose run ended...)."""


class ScopeEnded(BufferError):
    """An array a scope allocated, used after the scope ended (read,
    written, handed to numpy or to a task), or an allocation in a scope
    that has ended. Its memory is reclaimed once the scope's tasks are
    done: allocate what must outlive the block outside it
    (``Cluster.alloc``, ``Cluster.zeros``)."""


class InvalidView(Error, ValueError):
    """A view that does not fit its buffer, or a geometry strata cannot
    express without copying (negative steps, an empty axis, more than five
    axes, a reshape that would copy)."""


class InvalidIndex(InvalidView, IndexError):
    """Indexing that numpy would answer with a copy (fancy indexing with
    lists, arrays or masks) or that is not an index at all."""


class ReadOnlyView(InvalidView):
    """A write by the driver itself (``arr[...] = v``, ``write``) through a
    view that does not grant WRITE (a :meth:`Array.read_only` view): the
    grant binds the driver as it binds tasks. A ``ValueError``, as numpy's
    own refusal to assign to a read-only ``ndarray``."""


class SubmitError(Error, ValueError):
    """A task was refused at submit; nothing was queued. The message names
    the argument or member at fault."""


class UnknownCallable(SubmitError):
    """No worker offers the callable (or that version of it)."""


class NoBody(UnknownCallable):
    """The callable is registered on workers whose chips have no body for
    it (a CUDA chip runs only kernels with a CUDA body), and no worker the
    task may go to offers it. ``callable`` is the name as given,
    ``workers`` the ids of the workers without a body."""


class Unsupported(SubmitError):
    """No worker the task may go to can take it: a worker's chip lacks an
    argument's dtype, it does not take an argument's kind of buffer, or it
    lacks a feature the task requires. ``lacks`` lists each
    ``(argument, need, workers)``: the argument index (``None`` for a
    required feature), what it needs in words (``"dtype F64"``), and the
    ids of the workers without it; ``placed`` is the worker the task was
    placed on (``"worker 1 (unix:/...)"``), if it was."""


class WrongTag(SubmitError):
    """An argument's tag contradicts the kernel's signature (``input`` for
    an argument the kernel writes, ``output`` for one it only reads...), or
    the task has the wrong number of arguments or scalars."""


class TaskFailed(Error):
    """A task did not succeed.

    Attributes: ``task`` (its id), ``callable`` (``name@version``),
    ``worker`` (where it ran, or ``None``), ``outcome`` (``"TASK_FAILURE"``,
    ``"ENDPOINT_FAILURE"``, ``"SKIPPED"`` or ``"CANCELLED"``), ``kind``
    (a :class:`FailureKind`: what to match on) and ``cause`` (what happened
    in words: the kernel's message, for a Python kernel its traceback;
    ``None`` when skipped or cancelled).
    """


class WorkerLost(TaskFailed):
    """A task failed because its worker died, hung or was cut off
    (``outcome == "ENDPOINT_FAILURE"``)."""


class TaskSkipped(TaskFailed):
    """A task did not run because a task it depends on failed
    (``because`` is that task's id)."""


class TaskCancelled(TaskFailed):
    """A task was cancelled before it started."""


class Quarantined(Error):
    """The bytes are quarantined: a task writing them was lost without a
    fence and its worker may still write them. Raised by every host access
    to them (``numpy()``, ``numpy.asarray``, ``arr[...] = v``, ``write``,
    ``to_numpy``, ``save_npy``) until the worker is fenced.

    Attributes: ``buffer`` (its identity, as text), ``bytes`` (the
    quarantined ``(start, end)`` byte range), ``task`` (the lost task's
    id), ``callable`` and ``worker`` (its id)."""


class ClusterClosed(Error):
    """The cluster is closed (or its actors stopped); also what a wait
    blocked in another thread raises when ``close()`` is called."""


class WaitTimeout(Error, TimeoutError):
    """A ``wait(timeout=)`` or ``wait_all(timeout=)`` gave up: what it
    waited for is unfinished and goes on (wait again to collect it, or
    cancel it)."""


class NpyError(Error):
    """A ``.npy`` file could not be read or written."""


class GraphError(Error):
    """A graph file (or dict) is malformed; the message has the JSON path
    of the problem."""


class TraceError(Error):
    """A trace could not be taken or written."""
