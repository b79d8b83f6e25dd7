"""Errors: each a Python exception naming what was wrong; the
interpreter never aborts."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

import strata
from conftest import alive


def test_unknown_callable_and_bad_view(inproc):
    a = inproc.zeros((4, 4))
    with pytest.raises(strata.UnknownCallable, match='unknown callable "matmull"'):
        inproc.submit("matmull", a, a, a)
    with pytest.raises(strata.InvalidView, match="without a copy"):
        a[:, 1:3].reshape(8)
    with pytest.raises(strata.SubmitError, match="overlap|share"):
        inproc.submit("copy", a[:2], a[1:3])


def test_kernel_exception_fails_only_its_task(local2):
    c = local2
    x = c.zeros((3, 5))
    t = c.submit("test.fail", x[::2, 1:])
    with pytest.raises(strata.TaskFailed) as e:
        t.wait()
    err = e.value
    assert err.callable == "test.fail@1"
    assert err.outcome == "TASK_FAILURE"
    assert err.kind is strata.FailureKind.KERNEL
    assert "Traceback" in err.cause and "ValueError: kernel says no to (2, 4)" in err.cause
    assert err.worker is not None and err.task == t.id
    with pytest.raises(strata.TaskFailed):
        c.wait_all()
    # The worker goes on.
    y = c.zeros(4)
    c.submit("fill", y, 1.0).wait()
    assert (y.numpy() == 1).all()
    c.wait_all()


def test_python_kernel_on_strided_views_matches_numpy(local2):
    c = local2
    base = np.random.default_rng(3).standard_normal((12, 20)).astype(np.float32)
    x = c.array(base)
    y = c.zeros((6, 20))
    xv = x[::2, 1:].T.T  # rows stepped, columns offset
    c.submit("test.stencil", xv, y[:, 2:])
    c.wait_all()
    want = base[::2, 1:][:, :-1] * np.float32(2) + base[::2, 1:][:, 1:]
    assert y.numpy()[:, 2:].tobytes() == want.tobytes()
    # in-process workers run it too
    import pykernels

    with strata.Cluster(in_process=1, kernels=[pykernels.stencil]) as ip:
        x2 = ip.array(base)
        y2 = ip.zeros((6, 20))
        ip.submit("test.stencil", x2[::2, 1:], y2[:, 2:]).wait()
        assert y2.numpy()[:, 2:].tobytes() == want.tobytes()


def test_killed_worker_is_worker_lost_and_retry_reruns(tmp_path, monkeypatch):
    import pykernels

    monkeypatch.setenv("STRATA_TEST_MARKER", str(tmp_path / "marker"))
    with strata.Cluster(local=2, kernels=[pykernels.die_once]) as c:
        out = c.zeros(4)
        with pytest.raises(strata.WorkerLost) as e:
            c.submit("test.die_once", out).wait()
        assert e.value.outcome == "ENDPOINT_FAILURE"
        assert e.value.kind is strata.FailureKind.WORKER_LOST
        # How the process ended, not only that the link broke.
        assert "was killed by signal 9 (SIGKILL)" in str(e.value), str(e.value)
        with pytest.raises(strata.WorkerLost):
            c.wait_all()
    os.unlink(tmp_path / "marker")
    with strata.Cluster(local=2, retry=1, kernels=[pykernels.die_once]) as c:
        out = c.zeros(4)
        c.submit("test.die_once", out).wait()
        assert (out.numpy() == 7).all()
        pids = [w.pid for w in c.workers]
        assert sum(alive(p) for p in pids) == 1


def test_a_worker_that_exits_is_reported_with_its_status_and_log():
    import pykernels

    with strata.Cluster(local=1, kernels=[pykernels.exit_3]) as c:
        with pytest.raises(strata.WorkerLost) as e:
            c.submit("test.exit_3", c.zeros(4)).wait()
        msg = str(e.value)
        assert "exited with status 3" in msg, msg
        assert "exit_3: leaving with status 3" in msg, msg


def start_tcp_worker(tmp_path, token):
    tok = tmp_path / "token"
    tok.write_text(token)
    p = subprocess.Popen(
        [sys.executable, "-m", "strata.worker", "--listen", "tcp:127.0.0.1:0", "--token-file", str(tok)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    line = p.stdout.readline()
    addr = next(w.split("=", 1)[1] for w in line.split() if w.startswith("listen="))
    return p, addr


def test_wrong_token_is_refused(tmp_path):
    p, addr = start_tcp_worker(tmp_path, "right-token")
    try:
        with pytest.raises(strata.AuthenticationError, match="authentication"):
            strata.Cluster(workers=[addr], token="wrong-token")
        with strata.Cluster(workers=[addr], token="right-token") as c:
            assert c.workers[0].transport == "grpc-tcp"
            a = c.array(np.arange(6, dtype=np.float32))
            b = c.zeros(6)
            c.submit("copy", a[::2], b[3:]).wait()
            assert b.numpy().tolist() == [0, 0, 0, 0, 2, 4]
    finally:
        p.terminate()
        p.wait(10)


def test_closed_cluster_and_start_errors():
    c = strata.Cluster(in_process=1)
    a = c.zeros(4)
    c.close()
    assert c.closed
    with pytest.raises(strata.ClusterClosed):
        c.submit("fill", a, 1.0)
    with pytest.raises(strata.ClusterError, match="no workers"):
        strata.Cluster()
    with pytest.raises(strata.ClusterError):
        strata.Cluster(workers=["unix:/nonexistent/strata.sock"])


def test_a_task_past_its_timeout_fails_and_its_spawned_worker_is_restarted():
    import pykernels

    with strata.Cluster(local=1, kernels=[pykernels.sleep]) as c:
        x = c.zeros(4)
        first = c.worker_pid(0)
        # In time: the timeout changes nothing.
        c.submit("test.sleep", x, 0.01, timeout=10).wait()
        assert c.worker_pid(0) == first
        t0 = time.monotonic()
        with pytest.raises(strata.TaskFailed) as e:
            c.submit("test.sleep", x, 5.0, timeout=0.3).wait()
        assert time.monotonic() - t0 < 4
        assert not isinstance(e.value, strata.WorkerLost)
        assert e.value.outcome == "TASK_FAILURE"
        assert e.value.kind is strata.FailureKind.TIMED_OUT
        assert "timed out after 300 ms" in e.value.cause, e.value.cause
        # Its kernel cannot be trusted to stop: the worker was killed...
        assert not alive(first)
        # ...and restarted, though no respawn budget was given.
        c.wait_up(0, 15)
        assert c.worker_pid(0) != first
        c.submit("test.sleep", x, 0.0, timeout=5).wait()
        assert (x.numpy() == 1).all()


def test_a_timeout_must_be_a_positive_number_of_seconds(inproc):
    x = inproc.zeros(4)
    for bad in (0, -1.5, float("nan"), float("inf")):
        with pytest.raises(strata.SubmitError, match="timeout"):
            inproc.submit("fill", x, 1.0, timeout=bad)
        with pytest.raises(strata.SubmitError, match="timeout"):
            inproc.task("fill", x, 1.0, timeout=bad)
    inproc.submit("fill", x, 2.0, timeout=30).wait()
    assert (x.numpy() == 2).all()


def test_an_unknown_device_is_refused_at_once_naming_the_kinds_there_are():
    import pykernels

    for kw in ({"local": 1}, {"in_process": 1}, {"local": 1, "kernels": [pykernels.sleep]}):
        t0 = time.monotonic()
        with pytest.raises(strata.ClusterError, match=r'unknown device kind "gpu" \(known: sim, cuda\)'):
            strata.Cluster(device="gpu", **kw)
        assert time.monotonic() - t0 < 2, kw


def _cuda_driver_here():
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(_cuda_driver_here(), reason="a CUDA driver is here: its absence cannot be shown")
def test_a_cuda_device_without_a_driver_fails_the_start_naming_the_library():
    import pykernels

    for device, kw in (
        ("cuda:0", {"local": 1}),
        ("cuda:0", {"in_process": 1}),
        ("cuda:0", {"local": 1, "kernels": [pykernels.sleep]}),
        ("cuda:all", {}),
        ("cuda:all,mem=1GiB", {"local": 2}),
    ):
        t0 = time.monotonic()
        with pytest.raises(strata.ClusterError, match=r"no CUDA driver: libcuda\.so\.1 could not be loaded"):
            strata.Cluster(device=device, **kw)
        assert time.monotonic() - t0 < 2, (device, kw)


def _test_worker_binary():
    """`strata-test-worker` of this build: $STRATA_TEST_WORKER, or next to
    the strata binary the package spawns."""
    path = os.environ.get("STRATA_TEST_WORKER")
    if path:
        return path
    strata_bin = os.environ.get("STRATA_BIN")
    if strata_bin:
        cand = os.path.join(os.path.dirname(strata_bin), "strata-test-worker")
        if os.path.exists(cand):
            return cand
    return None


def test_a_callable_registered_without_a_body_for_the_chip_is_named(tmp_path):
    binary = _test_worker_binary()
    if binary is None:
        pytest.skip("no strata-test-worker: set STRATA_TEST_WORKER (cargo build -p strata-tests)")
    sock = tmp_path / "w.sock"
    proc = subprocess.Popen(
        [binary, "--listen", f"unix:{sock}", "--runs-only", "copy,fill"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        ready = proc.stdout.readline()
        assert ready.startswith("strata worker ready"), ready
        with strata.Cluster(workers=[f"unix:{sock}"]) as c:
            w = c.workers[0]
            assert w.callables == ["copy@1", "fill@1"]
            assert "axpy@1" in w.no_body
            x, y = c.zeros(16), c.zeros(16)
            c.submit("fill", x, 2.0).wait()
            with pytest.raises(strata.NoBody, match=r'callable "axpy" has no body for the chip of worker 0 \(sim') as e:
                c.submit("axpy", x, y, 1.0)
            assert isinstance(e.value, strata.UnknownCallable)
            assert (e.value.callable, e.value.workers) == ("axpy", [0])
            assert (x.numpy() == 2).all()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_an_integer_scalar_out_of_the_arguments_range_is_refused_at_submit(inproc):
    x = inproc.zeros(4, dtype=np.uint8)
    with pytest.raises(strata.SubmitError, match=r"scalar value=300 does not fit argument 0 \(out\) of dtype u8 \(0\.\.=255\)"):
        inproc.submit("fill", x, 300)
    with pytest.raises(strata.SubmitError, match="value=-1 does not fit"):
        inproc.submit("fill", x, -1)
    inproc.submit("fill", x, 255).wait()
    assert (x.numpy() == 255).all()
    y = inproc.zeros(4, dtype=np.int16)
    with pytest.raises(strata.SubmitError, match=r"value=-32769 does not fit .* \(-32768\.\.=32767\)"):
        inproc.submit("fill", y, -32769)
    inproc.submit("fill", y, -32768).wait()
    assert (y.numpy() == -32768).all()
    # A float64 argument's value is a float (it was taken for an integer).
    z = inproc.zeros(4, dtype=np.float64)
    inproc.submit("fill", z, 1.5).wait()
    assert (z.numpy() == 1.5).all()


def test_dtypes_and_ranks_are_checked_against_the_signature_at_submit(inproc):
    inproc.wait_all()
    a32, a64 = inproc.zeros((4, 4), np.float32), inproc.zeros((4, 4), np.float64)
    with pytest.raises(strata.SubmitError, match=r"argument 1 \(b\): dtype F64 differs from argument 0 \(a\)'s F32"):
        inproc.submit("add", a32, a64, a32)
    with pytest.raises(strata.SubmitError, match=r"argument 0 \(a\): has 1 axes; the kernel takes 2 axes"):
        inproc.submit("matmul", inproc.zeros(4, np.float32), a32, a32)
    with pytest.raises(strata.SubmitError, match=r"argument 0 \(a\): dtype I32 is not accepted \(accepted: F32, F64\)"):
        inproc.submit("potrf", inproc.zeros((4, 4), np.int32))
    with pytest.raises(strata.SubmitError, match="not accepted"):
        inproc.task("potrf", inproc.zeros((4, 4), np.int32))
    # Nothing was queued; the right ones run.
    inproc.submit("add", a64, a64, inproc.zeros((4, 4), np.float64))
    inproc.submit("matmul", a32, a32, inproc.zeros((4, 4), np.float32))
    s = inproc.wait_all()
    assert (s.submitted, s.failed) == (2, 0)


def test_python_names_every_failure_kind_of_the_engine():
    assert [k.value for k in strata.FailureKind] == strata._strata._failure_kinds()
    assert strata.FailureKind("no such kind") is strata.FailureKind.OTHER


def test_each_failure_kind_reaches_python_typed_from_a_worker_process():
    import pykernels

    with strata.Cluster(local=1, device="sim:mem=256KiB", kernels=[pykernels.fail, pykernels.sleep]) as c:
        x = c.zeros((3, 5))
        bad = c.submit("test.fail", x)
        skipped = c.submit("fill", x, 1.0, after=[bad])
        with pytest.raises(strata.TaskFailed) as e:
            bad.wait()
        assert e.value.kind is strata.FailureKind.KERNEL
        with pytest.raises(strata.TaskSkipped) as e:
            skipped.wait()
        assert e.value.kind is strata.FailureKind.SKIPPED and e.value.because == bad.id
        assert e.value.cause is None
        # Held behind a sleeper on the only worker, then cancelled.
        y = c.zeros(4)
        sleeper = c.submit("test.sleep", y, 0.3)
        later = c.submit("fill", y, 2.0)
        later.cancel()
        with pytest.raises(strata.TaskCancelled) as e:
            later.wait()
        assert e.value.kind is strata.FailureKind.CANCELLED
        sleeper.wait()
        # A MiB staged onto a chip of 256 KiB.
        big = c.zeros(1 << 18)
        with pytest.raises(strata.TaskFailed) as e:
            c.submit("fill", big, 1.0).wait()
        assert e.value.kind is strata.FailureKind.DEVICE
        assert "out of device memory" in e.value.cause
        with pytest.raises(strata.TaskFailed):
            c.wait_all()
        assert c.totals().by_kind == {
            strata.FailureKind.KERNEL: 1,
            strata.FailureKind.SKIPPED: 1,
            strata.FailureKind.CANCELLED: 1,
            strata.FailureKind.DEVICE: 1,
        }


def test_a_dtype_no_worker_has_is_refused_at_submit():
    """A chip without F64: the task is refused when it is submitted, naming
    the argument, what it needs and the workers without it; nothing is
    queued, and a task the workers can take runs."""
    with strata.Cluster(in_process=2, device="sim:mem=64MiB,dtypes=F32") as c:
        assert all(w.dtypes == ["F32"] for w in c.workers)
        x = c.zeros(8, dtype=np.float64)
        with pytest.raises(strata.Unsupported) as e:
            c.submit("fill", x, 1.0)
        err = e.value
        assert isinstance(err, strata.SubmitError)
        assert err.placed is None
        assert err.lacks == [(0, "dtype F64", [0, 1])]
        assert (
            "argument 0 needs dtype F64, which worker 0 (in-process:0) "
            "and worker 1 (in-process:1) lack"
        ) in str(err)
        with pytest.raises(strata.Unsupported) as e:
            c.submit("fill", x, 1.0, on=1)
        assert e.value.placed == "worker 1 (in-process:1)"
        assert e.value.lacks == [(0, "dtype F64", [1])]
        y = c.zeros(8, dtype=np.float32)
        c.submit("fill", y, 2.0).wait()
        assert (y.numpy() == 2).all()
        assert c.wait_all().submitted == 1
