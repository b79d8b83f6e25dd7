"""The driver keeps its own promises: a read-only view refuses the driver's
writes and hands numpy read-only memory, and every host access checks the
quarantine of bytes a lost task may still write."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import strata
from conftest import HERE


def test_a_read_only_array_gives_a_read_only_ndarray(inproc):
    a = inproc.array(np.arange(16, dtype=np.float32))
    ro = a.read_only()
    assert (a.access, ro.access) == ("rw", "r")
    for n in (ro.numpy(), np.asarray(ro), ro[2:10:2].numpy(), ro.reshape(4, 4).T.numpy()):
        assert not n.flags.writeable
        assert np.shares_memory(n, a.numpy())
        with pytest.raises(ValueError):
            n[0] = -1
        # numpy re-enables WRITEABLE only where the memory's owner allows it.
        with pytest.raises(ValueError):
            n.flags.writeable = True
    assert ro.__array_interface__["data"] == (a.__array_interface__["data"][0], True)
    assert a.__array_interface__["data"][1] is False
    with pytest.raises(ValueError):
        np.copyto(ro.numpy(), 0)
    assert np.array_equal(a.numpy(), np.arange(16, dtype=np.float32))
    # Reads see the writes made through a writable view of the same bytes.
    a[3] = 99
    assert ro.numpy()[3] == 99
    # A copy is the caller's own.
    c = ro.to_numpy()
    c[0] = 5
    assert c.flags.writeable and a.numpy()[0] == 0


def test_setitem_and_write_are_refused_on_a_read_only_view(inproc):
    a = inproc.array(np.ones((4, 4), np.float32))
    ro = a.read_only()
    attempts = [
        lambda: ro.__setitem__(0, 7),
        lambda: ro.__setitem__((slice(None), 1), 7),
        lambda: ro.write(np.full((4, 4), 7, np.float32)),
        lambda: ro.write(7),
        lambda: ro[1:3].write(7),
        lambda: ro.T.__setitem__(..., 7),
    ]
    for attempt in attempts:
        with pytest.raises(strata.ReadOnlyView) as e:
            attempt()
        assert isinstance(e.value, strata.InvalidView) and isinstance(e.value, ValueError)
        assert "grants READ" in str(e.value)
    assert np.array_equal(a.numpy(), np.ones((4, 4), np.float32)), "a refused write landed"
    # The full view still writes.
    a[0] = 2
    a.write(a.numpy() + 1)
    assert a.numpy()[0, 0] == 3 and a.numpy()[1, 0] == 2


def test_a_read_only_device_view_refuses_write(inproc):
    d = inproc.device_zeros(0, 8, np.float32)
    d.write(np.arange(8, dtype=np.float32))
    ro = d.read_only()
    with pytest.raises(strata.ReadOnlyView):
        ro.write(np.zeros(8, np.float32))
    assert np.array_equal(ro.to_numpy(), np.arange(8, dtype=np.float32))


@pytest.fixture
def connected_worker(tmp_path):
    """A Python worker process the cluster connects to (not one it spawns,
    so that its loss is not fenced: the cluster cannot kill it)."""
    sock = tmp_path / "w.sock"
    p = subprocess.Popen(
        [sys.executable, "-m", "strata.worker", "--listen", f"unix:{sock}", "--kernels", "pykernels"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=dict(os.environ, PYTHONPATH=HERE),
    )
    try:
        assert "listen=" in p.stdout.readline()
        yield p, f"unix:{sock}"
    finally:
        try:
            os.kill(p.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        p.terminate()
        p.wait(10)


def until(what, cond, seconds=20):
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.02)


def refused(access):
    try:
        access()
    except strata.Quarantined:
        return True
    return False


def test_every_host_access_checks_the_quarantine(connected_worker, tmp_path):
    p, address = connected_worker
    with strata.Cluster(workers=[address]) as c:
        x = c.zeros(1024, np.float32)
        other = c.array(np.full(8, 3, np.float32))
        t = c.submit("test.sleep", x, 3.0)
        until("the task runs", lambda: c.worker_stats(0)["tasks_in_flight"] > 0)
        kept = x.numpy()  # taken before the loss: not checked (see docs/python.md)
        os.kill(p.pid, signal.SIGSTOP)
        with pytest.raises(strata.WorkerLost) as lost:
            t.wait()
        assert "quarantined" in str(lost.value)

        accesses = {
            "numpy()": lambda: x.numpy(),
            "numpy.asarray": lambda: np.asarray(x),
            "__array_interface__": lambda: x.__array_interface__,
            "a part's numpy()": lambda: x[100:200:3].numpy(),
            "a read-only view's numpy()": lambda: x.read_only().numpy(),
            "a reshaped view's numpy()": lambda: x.reshape(32, 32).T.numpy(),
            "__setitem__": lambda: x.__setitem__(slice(0, 4), 1),
            "write": lambda: x.write(np.zeros(1024, np.float32)),
            "a part's write": lambda: x[:8].write(1),
            "to_numpy": lambda: x.to_numpy(),
            "save_npy": lambda: x.save_npy(tmp_path / "x.npy"),
            "a numpy function": lambda: np.add(x, 1),
        }
        for name, access in accesses.items():
            with pytest.raises(strata.Quarantined) as e:
                access()
            q = e.value
            assert (q.task, q.worker, q.bytes) == (t.id, 0, (0, 4096)), name
            assert q.callable.startswith("test.sleep") and "worker 0" in str(q), name
        assert not (tmp_path / "x.npy").exists()
        # Other buffers are not concerned.
        assert np.array_equal(other.numpy(), np.full(8, 3, np.float32))
        other[0] = 4
        # The array kept from before the loss still points at the bytes:
        # nothing stops it, which is why it must not be used meanwhile.
        assert kept.shape == (1024,) and kept.flags.writeable

        # The worker wakes, its task ends, it comes back proving so: the
        # fence lifts the quarantine and every access works again.
        os.kill(p.pid, signal.SIGCONT)
        until("the fence lifts the quarantine", lambda: not refused(lambda: x.numpy()))
        for name, access in accesses.items():
            access()
        x[...] = 5
        assert np.array_equal(x.numpy(), np.full(1024, 5, np.float32))
        assert np.load(tmp_path / "x.npy").shape == (1024,)
