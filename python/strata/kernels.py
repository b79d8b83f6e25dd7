"""Kernels written in Python, and worker processes that offer them."""

from __future__ import annotations

import importlib
import sys
from typing import Callable, Iterable, Optional, Sequence, Union

from ._strata import Kernel, run_worker

__all__ = ["kernel", "raw_kernel", "serve", "load"]


def kernel(
    name: str,
    args: Sequence[str],
    scalars: Sequence[str] = (),
    version: int = 1,
    *,
    cuda: Optional[str] = None,
    entry: Optional[str] = None,
    grid: object = None,
) -> Callable[[Callable[..., object]], Kernel]:
    """Registers a Python function as a strata kernel.

    ``args`` has one entry per tensor argument: ``"r"`` (the kernel reads
    it), ``"w"`` (writes every element) or ``"rw"``, optionally named and
    typed (``"x:r"``, ``"out:w:f32"``). ``scalars`` lists its scalars:
    ``"f64"``, ``"i64"``, ``"u64"`` or ``"likeN"`` (in argument N's dtype),
    optionally named (``"alpha:f64"``).

    On a worker, the function is called with one numpy array per tensor
    argument — over the argument's memory, zero-copy, with its shape and
    strides; read-only for ``"r"`` arguments — followed by the scalars as
    Python numbers. The arrays are valid only during the call. An exception
    fails that task, with the traceback as :attr:`TaskFailed.cause`; the
    worker goes on.

    The decorated name is a :class:`Kernel`, still callable as the
    function. Give kernels to ``Cluster(kernels=[...])``, ``serve(...)`` or
    ``python -m strata.worker --kernels module``; worker processes import
    the function's module, so define kernels in a module, not in
    ``__main__`` (in-process workers take any).

        @strata.kernel("scale", args=("x:r", "y:w"), scalars=("alpha:f64",))
        def scale(x, y, alpha):
            y[...] = alpha * x

    With ``cuda=`` CUDA C source (and ``entry=``, ``grid=``: see
    :func:`raw_kernel`), the kernel has a body for CUDA chips too: CPU
    chips call the function, CUDA chips launch the source.
    """

    def wrap(func: Callable[..., object]) -> Kernel:
        return Kernel(name, func, list(args), list(scalars), version, cuda=cuda, entry=entry, grid=grid)

    return wrap


def raw_kernel(
    name: str,
    source: str,
    args: Sequence[str],
    scalars: Sequence[str] = (),
    *,
    entry: Optional[str] = None,
    grid: object = "elements",
    version: int = 1,
) -> Kernel:
    """A kernel with only a CUDA body: CUDA C ``source`` whose
    ``extern "C" __global__`` function ``entry`` (default: ``name``) runs
    on CUDA chips, as CuPy's ``RawKernel`` takes source and a name. CPU
    chips do not offer it.

    The function's parameters are the task's tensor arguments in order,
    each a ``strata_tensor`` by value (``addr``, ``start_offset``,
    ``shape[5]``, ``stride[5]`` in elements, ``ndims``, ``dtype``), then
    its scalars, each an ``unsigned long long`` (a float's ``double``
    bits). strata's prelude is compiled in front of the source: the struct,
    ``strata_numel(t)`` and ``strata_at<T>(t, i)`` (the element at
    row-major index ``i``). ``grid``: ``"elements"`` (a thread per element
    of the first written argument, 256 a block; loop with a grid-sized
    stride), ``"elements:N"``, ``"rows:N"`` (a 256-thread block per row of
    argument N), or ``(blocks, threads)`` / ``(blocks, threads,
    shared_bytes)``. Define it at a module's top level: worker processes
    import it from there.

        scale = strata.raw_kernel("scale", SOURCE, args=("x:rw:f32",), scalars=("alpha:f64",))
    """
    module = sys._getframe(1).f_globals.get("__name__", "__main__")
    return Kernel(
        name, None, list(args), list(scalars), version, cuda=source, entry=entry, grid=grid, module=module
    )


def load(spec: str) -> list:
    """The kernels ``spec`` names: ``module`` (every :class:`Kernel` at its
    top level) or ``module:name``, comma-separated."""
    found = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        module, _, attr = part.partition(":")
        mod = importlib.import_module(module)
        if attr:
            obj = mod
            for piece in attr.split("."):
                obj = getattr(obj, piece)
            if not isinstance(obj, Kernel):
                raise TypeError(f"{part} is a {type(obj).__name__}, not a strata.Kernel (decorate it with @strata.kernel, or make it with strata.raw_kernel)")
            found.append(obj)
        else:
            ks = [v for v in vars(mod).values() if isinstance(v, Kernel)]
            if not ks:
                raise ValueError(f"module {module} defines no strata.Kernel")
            found.extend(ks)
    return found


def serve(
    listen: str,
    kernels: Iterable[Kernel] = (),
    *,
    chip: int = 0,
    device: str = "sim",
    token: Optional[str] = None,
    token_file: Optional[str] = None,
    insecure: bool = False,
    ready_file: Optional[str] = None,
    extra: Sequence[str] = (),
) -> int:
    """Serves one chip from this process until SIGTERM or SIGINT: the
    built-in kernels and ``kernels``, on ``listen`` (``"unix:PATH"`` or
    ``"tcp:HOST:PORT"``; TCP needs ``token``/``token_file`` unless
    ``insecure``). Prints the ready line once serving, as ``strata
    worker`` does; returns the exit status. ``extra`` passes further
    ``strata worker`` options."""
    argv = ["--listen", listen, "--chip", str(chip), "--device", device]
    if token is not None:
        import os
        import tempfile

        fd, path = tempfile.mkstemp(prefix="strata-token-")
        with os.fdopen(fd, "w") as f:
            f.write(token)
        token_file = path
    if token_file is not None:
        argv += ["--token-file", token_file]
    if insecure:
        argv.append("--insecure")
    if ready_file is not None:
        argv += ["--ready-file", ready_file]
    argv += list(extra)
    return run_worker(argv, list(kernels))
