import os
import sys

import pytest

import strata

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)


@pytest.fixture(scope="module")
def inproc():
    """One in-process worker: for geometry and API checks."""
    with strata.Cluster(in_process=1) as c:
        yield c


@pytest.fixture(scope="module")
def local2():
    """Two worker processes with the tests' Python kernels."""
    import pykernels

    ks = [v for v in vars(pykernels).values() if isinstance(v, strata.Kernel)]
    with strata.Cluster(local=2, kernels=ks) as c:
        yield c


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # Dead for our purposes once every thread is a zombie: the main
    # thread's entry shows one as soon as that thread exits, while others
    # may still run.
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except (FileNotFoundError, ProcessLookupError):
        return False
    for t in threads:
        try:
            with open(f"/proc/{pid}/task/{t}/stat") as f:
                if f.read().split(")")[-1].split()[0] not in ("Z", "X"):
                    return True
        except (FileNotFoundError, ProcessLookupError):
            # Gone between the listing and the read (reading a vanished
            # thread's stat raises ESRCH).
            continue
    return False
