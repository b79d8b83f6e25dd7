"""``Cluster.posix_array``: arrays over POSIX shared-memory objects shared
with another Python program through ``multiprocessing.shared_memory``,
against numpy; the worker processes copy the bytes in and out (they never
map the object), and bad names or sizes raise by name."""

import os
from multiprocessing import resource_tracker, shared_memory

import numpy as np
import pytest

import strata


def _name(what):
    return f"strata-py-{what}-{os.getpid()}"


def _producer(name, array):
    """An object made the way a Python program shares memory, holding
    ``array``; the test unlinks it."""
    shm = shared_memory.SharedMemory(name=name, create=True, size=array.nbytes)
    resource_tracker.unregister(shm._name, "shared_memory")
    np.ndarray(array.shape, array.dtype, buffer=shm.buf)[...] = array
    return shm


def test_tasks_on_a_producers_object_match_numpy(local2):
    c = local2
    m = np.arange(8 * 12, dtype=np.float32).reshape(8, 12)
    shm = _producer(_name("matmul"), np.concatenate([m.ravel(), np.zeros(12 * 8, np.float32)]))
    try:
        a = c.posix_array(shm.name, (2, 8, 12), np.float32)
        src, dst = a[0], a[1].reshape(12, 8)
        c.submit("copy", src.T, dst)
        c.wait_all()
        seen = np.ndarray((2, 8, 12), np.float32, buffer=shm.buf)
        assert np.array_equal(seen[0], m)
        assert np.array_equal(seen[1].reshape(12, 8), m.T)
        assert np.array_equal(a.numpy()[1].reshape(12, 8), m.T)
        # The workers hold its fd but never map it.
        for w in c.workers:
            with open(f"/proc/{w.pid}/maps") as f:
                assert f"/dev/shm/{shm.name}" not in f.read()
        del seen
    finally:
        shm.close()
        shm.unlink()


def test_a_new_object_is_created_zeroed_and_unlinked_with_its_array(inproc):
    c = inproc
    name = _name("new")
    a = c.posix_array(name, (4, 4), np.int32)
    assert os.path.exists(f"/dev/shm/{name}")
    assert np.array_equal(a.numpy(), np.zeros((4, 4), np.int32))
    c.submit("fill", a, 7)
    c.wait_all()
    other = shared_memory.SharedMemory(name=name)
    resource_tracker.unregister(other._name, "shared_memory")
    assert np.array_equal(np.ndarray((4, 4), np.int32, buffer=other.buf), np.full((4, 4), 7))
    other.close()


def test_bad_names_and_small_objects_raise_buffer_errors(inproc):
    c = inproc
    with pytest.raises(strata.BufferError, match="may not contain '/'"):
        c.posix_array("a/b", (4,))
    shm = _producer(_name("small"), np.zeros(4, np.float32))
    try:
        with pytest.raises(strata.BufferError, match="it holds 16 bytes"):
            c.posix_array(shm.name, (8,), np.float32)
    finally:
        shm.close()
        shm.unlink()
