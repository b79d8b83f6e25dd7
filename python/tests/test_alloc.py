"""Runtime-managed memory: ``Cluster.alloc`` and ``Scope.alloc`` against
numpy, the pool's recycling (zeroed, bounded over a long job), nested
scopes, ``ndarray``s that keep a scope's memory, and every misuse raising
by name."""

import os
import time

import numpy as np
import pytest

import strata


def eventually(what, cond, limit=20.0):
    deadline = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.005)


def test_alloc_is_zeroed_memory_shaped_like_numpy(inproc):
    c = inproc
    a = c.alloc((3, 5), np.int32)
    assert a.shape == (3, 5)
    assert a.dtype == np.int32
    assert np.array_equal(a.numpy(), np.zeros((3, 5), np.int32))
    b = c.alloc(7)
    assert b.shape == (7,) and b.dtype == np.float32
    with c.scope() as s:
        t = s.alloc((2, 4), "bf16")
        assert t.shape == (2, 4)
        assert t.dtype == "bf16"


def test_a_scope_reclaims_its_temporaries_and_refuses_them_after(local2):
    c = local2
    x = c.array(np.arange(64, dtype=np.float32).reshape(8, 8))
    out = c.zeros((8, 8))
    before = c.pool_stats()
    with c.scope() as s:
        t = s.alloc((8, 8), np.float32)
        u = s.alloc((8, 8), np.float32)
        c.submit("mul", x, x, t)
        c.submit("add", t, x, u)
        c.submit("copy", u, out)
        c.wait_all()
        # Inside the scope its arrays are ordinary arrays.
        np.testing.assert_array_equal(t.numpy(), x.numpy() ** 2)
        np.testing.assert_array_equal(u.to_numpy(), x.numpy() ** 2 + x.numpy())
        assert not s.ended
    assert s.ended
    np.testing.assert_array_equal(out.numpy(), x.numpy() ** 2 + x.numpy())
    # Every use of a temporary after its scope raises, naming the scope.
    for use in (
        lambda: t.numpy(),
        lambda: np.asarray(u),
        lambda: t.to_numpy(),
        lambda: t.write(np.zeros((8, 8), np.float32)),
        lambda: t.__setitem__(0, 1.0),
        lambda: c.submit("copy", t, out),
        lambda: s.alloc(4),
    ):
        with pytest.raises(strata.ScopeEnded, match="has ended"):
            use()
    assert issubclass(strata.ScopeEnded, strata.BufferError)
    # The memory went back to the pool (the workers released it first).
    eventually(
        "the temporaries are back",
        lambda: c.pool_stats()["out"] == before["out"]
        and c.pool_stats()["idle"] >= before["idle"] + 2,
    )


def test_recycled_memory_is_zeroed_and_a_new_buffer(local2):
    c = local2
    with c.scope() as s:
        t = s.alloc((32, 32), np.float64)
        c.submit("fill", t, 7.0)
        c.wait_all()
        assert (t.numpy() == 7).all()
    eventually("back in the pool", lambda: c.pool_stats()["out"] == 0)
    reused = c.pool_stats()["reused"]
    # The same size class: the memfd comes back, zeroed.
    again = c.alloc((32, 32), np.float64)
    assert c.pool_stats()["reused"] == reused + 1
    assert (again.numpy() == 0).all()
    total = c.zeros(1, np.float64)
    c.submit("reduce_sum", again.reshape(1024), total)
    c.wait_all()
    assert total.numpy()[0] == 0.0


def test_nested_scopes_reclaim_their_own(local2):
    c = local2
    acc = c.zeros(16)
    with c.scope() as outer:
        a = outer.alloc(16)
        c.submit("fill", a, 1.0)
        with outer.scope() as inner:
            b = inner.alloc(16)
            c.submit("fill", b, 2.0)
            c.submit("add", a, b, acc)
        assert inner.ended and not outer.ended
        with pytest.raises(strata.ScopeEnded):
            b.numpy()
        c.wait_all()
        assert (a.numpy() == 1).all()
        # Ending the outer scope ends one still open inside it.
        open_inner = outer.scope()
        d = open_inner.alloc(4)
        outer.end()
        assert open_inner.ended
        with pytest.raises(strata.ScopeEnded):
            d.numpy()
        with pytest.raises(strata.SubmitError, match="already ended"):
            open_inner.end()
    # Leaving the block of a scope already ended raises nothing.
    assert (acc.numpy() == 3).all()


def test_an_ndarray_keeps_its_scope_memory_while_it_lives(inproc):
    c = inproc
    with c.scope() as s:
        t = s.alloc(8)
        t.write(np.arange(8, dtype=np.float32))
        kept = t.numpy()
        via_interface = np.asarray(t)
    out_with_arrays = c.pool_stats()["out"]
    time.sleep(0.05)
    assert c.pool_stats()["out"] == out_with_arrays >= 1
    # The ndarray still reads the bytes it was handed; strata refuses.
    np.testing.assert_array_equal(kept, np.arange(8, dtype=np.float32))
    np.testing.assert_array_equal(via_interface, np.arange(8, dtype=np.float32))
    with pytest.raises(strata.ScopeEnded):
        t.numpy()
    del kept, via_interface, t
    eventually("reclaimed once the arrays go", lambda: c.pool_stats()["out"] == 0)


def test_bad_shapes_and_dtypes_raise_by_name(inproc):
    c = inproc
    with c.scope() as s:
        with pytest.raises(strata.InvalidView, match="axis length 0"):
            s.alloc((4, 0))
        with pytest.raises(strata.InvalidView, match="axis length -1"):
            c.alloc((-1,))
        with pytest.raises(strata.BufferError, match="0 axes"):
            s.alloc(())
        with pytest.raises(strata.BufferError, match="6 axes"):
            c.alloc((1,) * 6)
        with pytest.raises(strata.BufferError, match="overflows 64 bits"):
            s.alloc((2**32 - 1,) * 3, np.complex128)
        with pytest.raises(strata.InvalidView, match="float33.*not a dtype"):
            s.alloc(4, "float33")
        with pytest.raises(strata.InvalidView, match="strata has f64"):
            c.alloc(4, object)
    assert c.pool_stats()["out"] == 0


def test_a_long_job_of_scoped_temporaries_stays_bounded():
    # Unfinished tasks bounded, so that the driver cannot run far ahead of
    # the workers (each step's temporaries live until its tasks are done).
    with strata.Cluster(local=2, max_unfinished=48) as c:
        run_steps(c)


def run_steps(c):
    x = c.array(np.ones((32, 32), np.float32))
    acc = [c.zeros((32, 32)) for _ in range(8)]
    fds = lambda: len(os.listdir("/proc/self/fd"))
    start_fds = fds()
    steps = 1000
    most_out = 0
    for i in range(steps):
        with c.scope() as s:
            t = s.alloc((32, 32), np.float32)
            u = s.alloc((32, 32), np.float32)
            c.submit("copy", x[:16], t[:16])
            c.submit("mul", t, t, u)
            c.submit("axpy", u, acc[i % 8], 1.0)
        if i % 100 == 99:
            most_out = max(most_out, c.pool_stats()["out"])
    c.wait_all()
    for a in acc:
        got = a.numpy()
        assert (got[:16] == steps // 8).all()
        assert (got[16:] == 0).all(), "a recycled byte reached a result"
    eventually("every temporary is back", lambda: c.pool_stats()["out"] == 0)
    p = c.pool_stats()
    # 2,000 temporaries from a bounded number of memfds.
    assert p["created"] <= 200, p
    assert p["reused"] >= 2 * steps - 200, p
    assert most_out <= 200, most_out
    assert fds() - start_fds <= p["idle"] + 16
