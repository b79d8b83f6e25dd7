"""The complex dtypes (c64, c128) against numpy: arrays in and out
zero-copy, strided views, every built-in kernel that takes them, .npy
files, and the errors where a scalar cannot be complex."""
import numpy as np
import pytest

import strata

CASES = [(np.complex64, "c64", 1e-5), (np.complex128, "c128", 1e-12)]


def crand(rng, shape, dt):
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)


@pytest.mark.parametrize("dt,name,tol", CASES)
def test_complex_arrays_round_trip_and_view_like_numpy(local2, dt, name, tol):
    rng = np.random.default_rng(1)
    x = crand(rng, (6, 8), dt)
    a = local2.array(x)
    assert a.dtype == np.dtype(dt)
    assert (a.itemsize, a.nbytes) == (np.dtype(dt).itemsize, x.nbytes)
    np.testing.assert_array_equal(np.asarray(a), x)
    # Strided and transposed views read what numpy's read.
    np.testing.assert_array_equal(a[1:5:2, ::3].numpy(), x[1:5:2, ::3])
    np.testing.assert_array_equal(a.T.numpy(), x.T)
    # Strata's own names work too.
    b = local2.zeros((3,), name)
    assert b.dtype == np.dtype(dt)


@pytest.mark.parametrize("dt,name,tol", CASES)
def test_complex_kernels_match_numpy(local2, dt, name, tol):
    rng = np.random.default_rng(2)
    x, y = crand(rng, (16, 12), dt), crand(rng, (16, 12), dt)
    m = crand(rng, (12, 10), dt)
    a, b, w = local2.array(x), local2.array(y), local2.array(m)
    s, p, c, acc = (local2.zeros(sh, name) for sh in [(16, 12), (16, 12), (16, 10), (16, 10)])
    acc.write(np.ones((16, 10), dt))
    t, r, cp, f = local2.zeros((12, 16), name), local2.zeros((16,), name), local2.zeros((16, 12), name), local2.zeros((4, 4), name)
    local2.submit("add", a, b, s)
    local2.submit("mul", a, b, p)
    local2.submit("matmul", a, w, c)
    local2.submit("matmul_acc", a, w, acc)
    local2.submit("transpose", a, t)
    local2.submit("reduce_sum", a, r)
    local2.submit("copy", a, cp)
    local2.submit("fill", f, 2.5)
    local2.wait_all()
    np.testing.assert_allclose(s.numpy(), x + y, rtol=tol, atol=tol)
    np.testing.assert_allclose(p.numpy(), x * y, rtol=tol, atol=tol)
    np.testing.assert_allclose(c.numpy(), x @ m, rtol=tol * 10, atol=tol * 10)
    np.testing.assert_allclose(acc.numpy(), np.ones((16, 10), dt) + x @ m, rtol=tol * 10, atol=tol * 10)
    np.testing.assert_array_equal(t.numpy(), x.T)
    np.testing.assert_allclose(r.numpy(), x.sum(axis=1), rtol=tol * 10, atol=tol * 10)
    np.testing.assert_array_equal(cp.numpy(), x)
    np.testing.assert_array_equal(f.numpy(), np.full((4, 4), 2.5 + 0j, dt))
    # axpy with a real alpha, on strided views of y.
    yv = b[::2, 1:]
    local2.submit("axpy", a[::2, 1:], yv, 0.5)
    local2.wait_all()
    np.testing.assert_allclose(yv.numpy(), y[::2, 1:] + 0.5 * x[::2, 1:], rtol=tol, atol=tol)


def test_a_complex_scalar_is_refused_at_submit_unless_it_is_real(local2):
    f = local2.zeros((4,), "c64")
    with pytest.raises(strata.SubmitError, match=r"scalar value=\(1\+2j\) is complex.*real"):
        local2.submit("fill", f, 1 + 2j)
    with pytest.raises(strata.SubmitError, match="is complex"):
        local2.submit("fill", f, np.complex128(1 + 2j))
    # A complex value where a real argument's scalar goes: refused, never
    # cut to its real part.
    with pytest.raises(TypeError, match="is a float"):
        local2.submit("fill", local2.zeros((2,), "f32"), np.complex128(1 + 2j))
    with pytest.raises(TypeError, match="is a float"):
        local2.submit("axpy", f, local2.zeros((4,), "c64"), 0.5 + 1j)
    local2.submit("fill", f, 3 + 0j)
    local2.submit("fill", local2.zeros((2,), "c128"), np.complex128(-1.0))
    local2.wait_all()
    np.testing.assert_array_equal(f.numpy(), np.full(4, 3 + 0j, np.complex64))
    # softmax has no complex form: refused at submit, naming the dtype.
    x = local2.zeros((2, 3), "c64")
    with pytest.raises(strata.SubmitError, match="C64"):
        local2.submit("softmax", x, local2.zeros((2, 3), "c64"))


def test_complex_npy_files_round_trip(local2, tmp_path):
    rng = np.random.default_rng(3)
    x = crand(rng, (5, 3), np.complex128)
    a = local2.array(x)
    a.save_npy(tmp_path / "x.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "x.npy"), x)
    b = local2.from_npy(tmp_path / "x.npy")
    assert b.dtype == np.complex128
    np.testing.assert_array_equal(b.numpy(), x)
    np.save(tmp_path / "y.npy", x.astype(np.complex64))
    np.testing.assert_array_equal(local2.from_npy(tmp_path / "y.npy").numpy(), x.astype(np.complex64))
