"""Views by numpy indexing: each the same bytes as numpy's own answer."""

import numpy as np
import pytest

import strata

KEYS = [
    (slice(1, 7, 2),),
    (slice(None), slice(2, None, 3)),
    (3,),
    (Ellipsis, 2),
    (2, slice(1, 5)),
    (slice(None, None, 2), slice(None, None, 3)),
    (None, slice(1, 3)),
    (slice(5, 6), 4),
    (-1, -2),
]


@pytest.mark.parametrize("key", KEYS)
def test_indexing_is_numpys_view(inproc, key):
    ref = np.arange(8 * 9, dtype=np.int32).reshape(8, 9)
    a = inproc.array(ref)
    v = a[key]
    want = a.numpy()[key]
    got = v.numpy()
    if want.ndim == 0:
        assert got.shape == (1,)
        assert got[0] == want
    else:
        assert got.shape == want.shape
        assert np.array_equal(got, want)
        assert got.__array_interface__["data"][0] == want.__array_interface__["data"][0]
    assert np.shares_memory(got, a.numpy())


def test_transpose_reshape_and_dtype_views(inproc):
    ref = np.arange(4 * 6 * 2, dtype=np.float32).reshape(4, 6, 2)
    a = inproc.array(ref)
    assert np.array_equal(a.T.numpy(), ref.T)
    assert np.array_equal(a.transpose(1, 0, 2).numpy(), ref.transpose(1, 0, 2))
    assert np.array_equal(a.transpose((2, 0, 1)).numpy(), ref.transpose(2, 0, 1))
    assert np.array_equal(a.reshape(8, 6).numpy(), ref.reshape(8, 6))
    assert np.array_equal(a.reshape(-1).numpy(), ref.reshape(-1))
    assert np.array_equal(a.view(np.uint16).numpy(), ref.view(np.uint16))
    assert a.view("u1").shape == (4, 6, 8)
    assert np.array_equal(a[1:3].view(np.int32).numpy(), ref[1:3].view(np.int32))
    # A stepped column block cannot be flattened without a copy.
    with pytest.raises(strata.InvalidView, match="without a copy"):
        a[:, ::2].reshape(-1)


def test_refusals_name_the_problem(inproc):
    a = inproc.array(np.zeros((4, 4), np.float32))
    with pytest.raises(strata.InvalidIndex, match="fancy index"):
        a[[0, 2]]
    with pytest.raises(strata.InvalidIndex, match="fancy index"):
        a[np.array([1, 2])]
    with pytest.raises(strata.InvalidIndex, match="boolean"):
        a[True]
    with pytest.raises(strata.InvalidView, match="forward only"):
        a[::-1]
    with pytest.raises(strata.InvalidView, match="empty axis"):
        a[2:2]
    with pytest.raises(IndexError):
        a[4]
    with pytest.raises(strata.InvalidView, match="not a permutation"):
        a.transpose(0, 0)
    with pytest.raises(strata.InvalidView):
        inproc.zeros((0, 3))
    with pytest.raises(strata.InvalidView, match="dtype"):
        inproc.zeros((3,), np.clongdouble)  # complex64 and complex128 exist
    # InvalidView is also a ValueError, InvalidIndex an IndexError.
    assert issubclass(strata.InvalidIndex, IndexError)
    assert issubclass(strata.InvalidView, ValueError)


def test_numpy_writes_are_the_buffers(inproc):
    a = inproc.zeros((3, 5), np.int64)
    a[1, 2:4] = 9
    a.numpy()[2] = np.arange(5)
    b = a[1:, 1:]
    assert b.numpy().tolist() == [[0, 9, 9, 0], [1, 2, 3, 4]]
    assert a.to_numpy().base is None or not np.shares_memory(a.to_numpy(), a.numpy())


def test_strata_dtypes_numpy_lacks(inproc):
    b = inproc.zeros((4, 4), "bf16")
    assert b.dtype == "bf16"
    assert b.numpy().dtype == np.uint16
    assert inproc.zeros(3, "f16").dtype == np.float16


def _random_key(rng, ndim):
    parts, ellipsis = [], False
    for _ in range(int(rng.integers(0, ndim + 2))):
        kind = rng.integers(0, 10)
        if kind < 3:
            parts.append(int(rng.integers(-8, 8)))
        elif kind < 8:
            start = None if rng.random() < 0.3 else int(rng.integers(-9, 9))
            stop = None if rng.random() < 0.3 else int(rng.integers(-9, 12))
            step = None if rng.random() < 0.4 else int(rng.integers(1, 4)) * (-1 if rng.random() < 0.1 else 1)
            parts.append(slice(start, stop, step))
        elif kind == 8 and not ellipsis:
            parts.append(Ellipsis)
            ellipsis = True
        else:
            parts.append(None)
    return parts[0] if len(parts) == 1 and rng.random() < 0.5 else tuple(parts)


def test_indexing_computes_numpys_geometry_on_random_keys(inproc):
    """The native path for basic keys against numpy's own rules (the
    stand-in path), on random keys over views of every layout; a key numpy
    refuses is refused the same way."""
    from strata import _geometry

    rng = np.random.default_rng(5)
    for dtype in (np.float32, np.float64, np.int16):
        base = inproc.array(np.zeros((6, 7, 5), dtype))
        for v in (base, base[1:, ::2], base.T, base[:, 2], base[3]):
            for _ in range(400):
                key = _random_key(rng, v.ndim)
                try:
                    delta, shape, elems = _geometry.index(list(v.shape), list(v.strides), v.itemsize, key)
                except Exception as e:  # noqa: BLE001 - the same refusal is expected
                    with pytest.raises(type(e)):
                        v[key]
                    continue
                got = v[key]
                assert got.offset - v.offset == delta, key
                assert list(got.shape) == list(shape), key
                assert [s // v.itemsize for s in got.strides] == list(elems), key


def _factorizations(rng, total, ndim):
    dims = []
    for _ in range(ndim - 1):
        divisors = [d for d in range(1, total + 1) if total % d == 0]
        d = int(rng.choice(divisors))
        dims.append(d)
        total //= d
    dims.append(total)
    rng.shuffle(dims)
    if rng.random() < 0.3:
        dims[int(rng.integers(0, len(dims)))] = -1
    return tuple(dims)


def test_reshape_and_retype_compute_numpys_geometry(inproc):
    """``reshape`` and ``view(dtype)``, computed natively where they can
    be, against numpy's own rules (the stand-in path) on random shapes
    over views of every layout; what numpy refuses is refused the same
    way, with the same message."""
    from strata import _geometry

    rng = np.random.default_rng(6)
    base = inproc.array(np.zeros((6, 8, 4), np.float32))
    views = (base, base[1:5], base[:, 2:6], base[:, ::2], base.T, base[2], base[:, 3, 1:], base[1:2, :, 2:3])
    for v in views:
        for _ in range(300):
            ndim = int(rng.integers(1, 7))
            new = _factorizations(rng, v.size, ndim)
            if rng.random() < 0.1:
                new = new + (int(rng.integers(2, 5)),)  # a wrong size
            try:
                delta, shape, elems = _geometry.reshape(list(v.shape), list(v.strides), v.itemsize, new)
            except Exception as e:  # noqa: BLE001 - the same refusal is expected
                with pytest.raises(type(e)) as got:
                    v.reshape(new)
                assert str(got.value) == str(e), new
                continue
            got = v.reshape(new)
            assert got.offset - v.offset == delta, new
            assert list(got.shape) == list(shape), new
            assert [s // v.itemsize for s in got.strides] == list(elems), new
        for dtype, size in ((np.float32, 4), (np.float64, 8), (np.int16, 2), (np.uint8, 1)):
            try:
                delta, shape, elems = _geometry.view(list(v.shape), list(v.strides), v.itemsize, size)
            except Exception as e:  # noqa: BLE001 - the same refusal is expected
                with pytest.raises(type(e)) as got:
                    v.view(dtype)
                assert str(got.value) == str(e), dtype
                continue
            got = v.view(dtype)
            assert (got.offset - v.offset, list(got.shape)) == (delta, list(shape)), dtype
            assert [s // size for s in got.strides] == list(elems), dtype
            assert got.dtype == np.dtype(dtype)


def test_numpys_attributes(inproc):
    ref = np.arange(6 * 8, dtype=np.float64).reshape(6, 8)
    a = inproc.array(ref)
    for v, r in ((a, ref), (a[1:5, ::3], ref[1:5, ::3]), (a.T, ref.T), (a[2], ref[2])):
        assert (v.shape, v.ndim, v.size, v.itemsize, v.nbytes, len(v)) == (
            r.shape, r.ndim, r.size, r.itemsize, r.nbytes, len(r)
        )
        assert np.array_equal(np.asarray(v), r)
        # np.asarray is the buffer's memory, not a copy.
        assert np.shares_memory(np.asarray(v), np.asarray(a))


def test_python_maps_every_dtype_of_the_engine(inproc):
    """Each dtype the engine has makes an array from Python, and the dtype
    the array reports names it back (numpy's where numpy has one)."""
    names = strata._strata._dtype_names()
    assert {"f32", "f64", "c64", "c128", "bf16", "fp4e2m1"} <= set(names)
    for name in names:
        a = inproc.zeros((4,), name)
        b = inproc.zeros((4,), a.dtype)
        assert b.dtype == a.dtype, name
        assert b.nbytes == a.nbytes, name
        if isinstance(a.dtype, str):
            assert a.dtype == name
        else:
            assert a.dtype.itemsize == a.itemsize, name
