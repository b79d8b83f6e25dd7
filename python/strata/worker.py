"""``python -m strata.worker``: a worker process serving one chip — the
built-in kernels and Python kernels — with ``strata worker``'s options.

    python -m strata.worker --listen unix:/tmp/chip0.sock --kernels mykernels
    python -m strata.worker --kernels mykernels:scale,other --listen tcp:0.0.0.0:7420 --token-file tok

Options of its own (before the worker's): ``--kernels SPEC`` (``module``
for every kernel of a module, or ``module:name``; comma-separated, may be
repeated) and ``--sys-path PATHS`` (prepended to ``sys.path``, ``:``
separated; how ``Cluster(local=N, kernels=...)`` passes on the driver's).
Every other option is ``strata worker``'s (``--help`` lists them); a
leading ``worker`` word is accepted, as spawned workers are started with
it.
"""

from __future__ import annotations

import argparse
import os
import sys

from .kernels import load


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--kernels", action="append", default=[])
    pre.add_argument("--sys-path", default=None)
    ours, rest = pre.parse_known_args(argv)
    if ours.sys_path:
        for p in reversed(ours.sys_path.split(os.pathsep)):
            if p and p not in sys.path:
                sys.path.insert(0, p)
    if rest and rest[0] == "worker":
        rest = rest[1:]
    kernels = []
    for spec in ours.kernels:
        kernels.extend(load(spec))
    from ._strata import run_worker

    return run_worker(rest, kernels)


if __name__ == "__main__":
    sys.exit(main())
