"""Python kernels: served by `python -m strata.worker`, strata.serve, and
the workers a Cluster spawns; read-only inputs; bad specs."""

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import strata
from conftest import HERE, alive


def test_python_m_strata_worker_serves_a_module(tmp_path):
    sock = tmp_path / "chip0.sock"
    env = dict(os.environ, PYTHONPATH=HERE)
    p = subprocess.Popen(
        [sys.executable, "-m", "strata.worker", "--listen", f"unix:{sock}", "--kernels", "pykernels", "--chip", "3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        assert "listen=" in p.stdout.readline()
        with strata.Cluster(workers=[f"unix:{sock}"]) as c:
            (w,) = c.workers
            assert w.chip == 3 and "test.scale@1" in w.callables and "matmul@1" in w.callables
            x = c.array(np.arange(12, dtype=np.float32).reshape(3, 4))
            y = c.zeros((4, 3))
            c.submit("test.scale", x.T, y, 0.5).wait()
            assert np.array_equal(y.numpy(), 0.5 * x.numpy().T)
    finally:
        p.terminate()
        assert p.wait(10) == 0


def test_serve_in_a_thread(tmp_path):
    import pykernels

    sock = tmp_path / "served.sock"
    ready = tmp_path / "ready.json"
    # serve() blocks this thread until SIGTERM: run it in a subprocess
    # that calls it, as a user's script would.
    script = (
        "import sys; sys.path.insert(0, %r); import strata, pykernels; "
        "sys.exit(strata.serve('unix:%s', [pykernels.scale], chip=1, ready_file=%r))" % (HERE, sock, str(ready))
    )
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        p.stdout.readline()
        assert ready.exists()
        with strata.Cluster(workers=[f"unix:{sock}"]) as c:
            x = c.array(np.ones(8, np.float32))
            y = c.zeros(8)
            c.submit("test.scale", x, y, 3.0).wait()
            assert (y.numpy() == 3).all()
            with pytest.raises(strata.UnknownCallable):
                c.submit("test.sleep", y, 0.0)
    finally:
        p.terminate()
        assert p.wait(10) == 0


def test_inputs_are_read_only_in_kernels():
    @strata.kernel("t.bad_write", args=("x:r",))
    def bad_write(x):
        x[0] = 1

    with strata.Cluster(in_process=1, kernels=[bad_write]) as c:
        x = c.zeros(4)
        with pytest.raises(strata.TaskFailed, match="read-only"):
            c.submit("t.bad_write", x).wait()
        assert (x.numpy() == 0).all()


def test_kernel_specs_are_checked():
    with pytest.raises(ValueError, match="access is r, w or rw"):
        strata.kernel("k", args=("x:q",))(lambda x: None)
    with pytest.raises(ValueError, match="likeN"):
        strata.kernel("k", args=("r",), scalars=("a:like3",))(lambda x, a: None)
    k = strata.kernel("k2", args=("a:r:f32", "b:w"), scalars=("n:i64",))(lambda a, b, n: n)
    assert k.signature == "k2@1(a:R:F32:*,b:W:*:*;n:i64)"
    assert k(1, 2, 3) == 3  # still the function
    with strata.Cluster(in_process=1) as c:
        pass
    local_k = strata.kernel("k3", args=("r",))(lambda x: None)
    with pytest.raises(strata.ClusterError, match="__main__|cannot import"):
        # A lambda's module is this test module: importable, but a lambda
        # has no importable name.
        local_k.func.__module__ = "__main__"
        strata.Cluster(local=1, kernels=[local_k])


def test_leaving_the_block_leaves_no_process(local2):
    import pykernels

    with strata.Cluster(local=2, kernels=[pykernels.sleep]) as c:
        pids = [w.pid for w in c.workers]
        a = c.zeros(2)
        c.submit("test.sleep", a, 5.0)  # still running when we leave
        time.sleep(0.2)
    start = time.monotonic()
    while any(alive(p) for p in pids) and time.monotonic() - start < 3:
        time.sleep(0.05)
    assert not any(alive(p) for p in pids)
