"""Shared device arrays through DLPack: mapped into this process in place,
both ways — numpy on a simulated chip (host memory), the capsule's
device and bytes on a GPU (on the fake CUDA of scripts/fakecuda.sh,
STRATA_FAKE_CUDA=1, device pointers are host memory and the bytes are
read directly), and CuPy and PyTorch reading and writing it on a real
GPU where they are installed."""

import ctypes
import os

import numpy as np
import pytest

import strata


@pytest.mark.parametrize("where", [{"local": 1}, {"in_process": 1}])
def test_a_shared_array_is_numpy_memory_in_place(where):
    with strata.Cluster(**where) as c:
        a = c.device_zeros(0, (64, 32), np.float32, shared=True)
        assert a.__dlpack_device__() == (1, 0)
        c.submit("fill", a, 2.0)
        c.wait_all()
        x = np.from_dlpack(a)
        assert x.shape == (64, 32) and x.dtype == np.float32
        assert (x == 2).all()
        # Written here, read by a task.
        x[0, 0] = 5
        out = c.zeros((64, 32), np.float32)
        c.submit("add", a, a, out)
        c.wait_all()
        want = np.full((64, 32), 4, np.float32)
        want[0, 0] = 10
        np.testing.assert_array_equal(out.numpy(), want)
        # A strided view maps with its strides.
        s = np.from_dlpack(a[:, ::2])
        assert s.shape == (64, 16)
        np.testing.assert_array_equal(s, x[:, ::2])
        # Tasks' later writes show in the mapping taken before.
        c.submit("fill", a, 7.0)
        c.wait_all()
        assert (x == 7).all()


@pytest.mark.parametrize("where", [{"local": 2}, {"in_process": 2}])
def test_another_worker_uses_a_shared_array_in_place(where):
    with strata.Cluster(**where) as c:
        a = c.device_zeros(0, (256,), np.float32, shared=True)
        x = np.from_dlpack(a)
        x[:] = np.arange(256, dtype=np.float32)
        # A task with worker 1's own array runs there, on worker 0's
        # memory mapped in place.
        out = c.device_zeros(1, (256,), np.float32)
        c.submit("add", a, a, out)
        c.wait_all()
        np.testing.assert_array_equal(out.to_numpy(), 2 * np.arange(256, dtype=np.float32))
        c.submit("fill", a, 3.0, on=1)
        c.wait_all()
        assert (x == 3).all(), "worker 1's write is in the memory numpy maps"


def test_only_shared_device_arrays_leave_in_place():
    with strata.Cluster(local=1) as c:
        d = c.device_zeros(0, (8,), np.float32)
        with pytest.raises(strata.Error, match="only shared blocks"):
            np.from_dlpack(d)
        h = c.zeros((8,), np.float32)
        assert h.__dlpack_device__() == (1, 0)
        with pytest.raises(strata.Error):
            h.__dlpack__()
        a = c.device_zeros(0, (8,), np.float32, shared=True)
        with pytest.raises(BufferError, match="copy=True"):
            a.__dlpack__(copy=True)
        with pytest.raises(BufferError, match="dl_device"):
            a.__dlpack__(dl_device=(2, 0))
        with pytest.raises(ValueError, match="run=True and shared=True"):
            c.device_zeros(0, (8,), np.float32, run=True, shared=True)


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("code", ctypes.c_uint8),
        ("bits", ctypes.c_uint8),
        ("lanes", ctypes.c_uint16),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


def _tensor_of(capsule):
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return _DLTensor.from_address(get(capsule, b"dltensor"))


def _gpu_cluster():
    """One worker on cuda:0, or a skip naming why there is none (a failure
    under STRATA_REQUIRE_CUDA=1)."""
    try:
        return strata.Cluster(local=1, device="cuda:0,mem=256MiB")
    except strata.ClusterError as e:
        if os.environ.get("STRATA_REQUIRE_CUDA") == "1":
            raise
        pytest.skip(f"no GPU here: {e}")


def test_a_shared_array_on_a_gpu_is_its_device_memory():
    c = _gpu_cluster()
    with c:
        a = c.device_zeros(0, (16, 8), np.float32, shared=True)
        assert a.__dlpack_device__() == (2, 0)
        c.submit("fill", a, 3.0)
        c.wait_all()
        cap = a[2:, ::2].__dlpack__()
        t = _tensor_of(cap)
        assert (t.device_type, t.device_id, t.ndim) == (2, 0, 2)
        assert (t.code, t.bits, t.lanes) == (2, 32, 1)
        assert [t.shape[i] for i in range(2)] == [14, 4]
        assert [t.strides[i] for i in range(2)] == [8, 2]
        assert t.byte_offset == 2 * 8 * 4
        if os.environ.get("STRATA_FAKE_CUDA") == "1":
            raw = ctypes.string_at(t.data + t.byte_offset, 4)
            assert np.frombuffer(raw, np.float32)[0] == 3.0


@pytest.mark.parametrize("lib", ["cupy", "torch"])
def test_cupy_and_torch_use_a_shared_gpu_array_in_place(lib):
    """A real GPU's consumers: the library's tensor is the worker's device
    memory — a task's fill is read there, the library's write is read
    back by the worker — for a strided view too."""
    if os.environ.get("STRATA_FAKE_CUDA") == "1":
        pytest.skip(f"{lib} needs a real GPU, not the fake CUDA")
    mod = pytest.importorskip(lib)
    if lib == "torch" and not mod.cuda.is_available():
        pytest.skip("torch sees no GPU")
    c = _gpu_cluster()
    with c:
        a = c.device_zeros(0, (64, 32), np.float32, shared=True)
        c.submit("fill", a, 3.0)
        c.wait_all()
        g = mod.from_dlpack(a[2:, ::2])
        assert tuple(g.shape) == (62, 16)
        assert float(g.sum()) == 3.0 * 62 * 16
        g *= 2
        if lib == "torch":
            mod.cuda.synchronize()
        else:
            mod.cuda.Device(0).synchronize()
        want = np.full((64, 32), 3, np.float32)
        want[2:, ::2] = 6
        np.testing.assert_array_equal(a.to_numpy(), want)
        # And a task's later write is what the library reads.
        c.submit("fill", a, 5.0)
        c.wait_all()
        assert float(g.sum()) == 5.0 * 62 * 16
        del g
