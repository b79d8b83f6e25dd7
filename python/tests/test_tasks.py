"""Tags from signatures, explicit tags, scalars, on/after, groups,
scopes, device buffers and cancel."""

import os

import numpy as np
import pytest

import strata


def test_tags_come_from_the_signature(local2):
    c = local2
    assert c.signature("matmul").startswith("matmul@1(a:R:")
    x = c.array(np.arange(16, dtype=np.float32))
    y = c.zeros(16)
    z = c.zeros(16)
    # The copy waits for a sleeper, so that every task below is still
    # unfinished when the next is submitted and each inferred edge counts
    # (an edge to a finished task is no edge).
    hold = c.submit("test.sleep", c.zeros(1), 0.2)
    c.submit("copy", x, y, after=[hold])  # x INPUT, y OUTPUT
    c.submit("add", x, y, z)  # reads y: after the copy (RAW)
    c.submit("fill", x, 0.0)  # writes x: after both readers (WAR)
    s = c.wait_all()
    assert s.succeeded == 4
    assert s.edges >= 3
    assert np.array_equal(z.numpy(), 2 * np.arange(16, dtype=np.float32))
    assert (x.numpy() == 0).all()


def test_explicit_tags_and_after(local2):
    c = local2
    a = c.zeros(8)
    b = c.zeros(8)
    t1 = c.submit("test.sleep", a, 0.2)
    # NO_DEP: strata does not order it; after= does.
    t2 = c.submit("copy", strata.no_dep(a), b, after=[t1])
    t2.wait()
    assert (b.numpy() == 1).all()
    # output_existing and inout are accepted where the kernel writes.
    c.submit("fill", strata.output_existing(b[:4]), 5.0)
    c.submit("axpy", strata.input(a), strata.inout(b), 2.0)
    c.wait_all()
    assert b.numpy().tolist() == [7.0] * 4 + [3.0] * 4
    with pytest.raises(strata.WrongTag, match="only reads"):
        c.submit("copy", strata.output(a), b)
    with pytest.raises(strata.WrongTag, match="takes 2 tensor arguments"):
        c.submit("copy", a)
    with pytest.raises(TypeError, match="argument 2"):
        c.submit("copy", a, b, "x")


def test_scalars_are_typed_by_the_signature(local2):
    c = local2
    i = c.zeros(4, np.int32)
    c.submit("fill", i, -3)  # like0: an integer for an int32 view
    f = c.zeros(4, np.float32)
    c.submit("fill", f, 1.25)
    y = c.zeros(4, np.float32)
    c.submit("test.scale", f, y, 4)  # an int where f64 is declared
    c.wait_all()
    assert i.numpy().tolist() == [-3] * 4
    assert y.numpy().tolist() == [5.0] * 4
    with pytest.raises(TypeError, match="scalar value"):
        c.submit("fill", i, 0.5)
    with pytest.raises(strata.WrongTag, match="takes 1 scalars"):
        c.submit("fill", i)


def test_on_places_the_task(local2):
    c = local2
    pids = c.zeros(2, np.int64)
    c.submit("test.write_pid", pids[0:1], on=0)
    c.submit("test.write_pid", pids[1:2], on=1)
    c.wait_all()
    assert pids.numpy().tolist() == [c.worker_pid(0), c.worker_pid(1)]
    with pytest.raises(strata.SubmitError, match="no worker"):
        c.submit("fill", pids, 0, on=7)


def test_groups(local2):
    c = local2
    out = c.zeros(2, np.int64)
    g = c.submit_group(
        [c.task("test.write_pid", out[0:1], on=0), c.task("test.write_pid", out[1:2], on=1)]
    )
    g.wait()
    assert sorted(out.numpy().tolist()) == sorted([c.worker_pid(0), c.worker_pid(1)])
    with pytest.raises(strata.SubmitError, match="needs as many workers"):
        c.submit_group([c.task("noop") for _ in range(3)])


def test_scopes(local2):
    c = local2
    with c.scope() as s:
        tmp = s.add(c.zeros(64))
        out = c.zeros(64)
        c.submit("fill", tmp, 3.0)
        c.submit("copy", tmp, out)
    c.wait_all()
    assert (out.numpy() == 3).all()
    with pytest.raises(strata.SubmitError, match="scope"):
        s.add(c.zeros(4))


def test_device_buffers(local2):
    c = local2
    d = c.device_zeros(1, (4, 4), np.float32)
    assert d.device_worker == 1
    assert (d.to_numpy() == 0).all()
    d.write(np.arange(16, dtype=np.float32).reshape(4, 4))
    h = c.zeros((4, 4))
    c.submit("copy", d.T, h)  # runs on worker 1, where d lives
    c.wait_all()
    assert np.array_equal(h.numpy(), np.arange(16, dtype=np.float32).reshape(4, 4).T)
    assert np.array_equal(d[1:3, ::2].to_numpy(), np.arange(16, dtype=np.float32).reshape(4, 4)[1:3, ::2])
    with pytest.raises(strata.BufferError, match="device"):
        d.numpy()
    with pytest.raises(strata.SubmitError, match="lives on"):
        c.submit("copy", d, h, on=0)
    r = c.device_zeros(0, 8, run=True)
    c.submit("fill", r, 1.0)
    c.wait_all()
    with pytest.raises(strata.SubmitError, match="run"):
        c.submit("fill", r, 1.0)


def test_cancel(local2):
    c = local2
    a = c.zeros(4)
    b = c.zeros(4)
    t1 = c.submit("test.sleep", a, 0.5)
    t2 = c.submit("copy", a, b)  # waits for t1: not started
    t3 = c.submit("copy", b, a[:4])  # depends on t2
    t2.cancel()
    with pytest.raises(strata.TaskCancelled) as e:
        t2.wait()
    assert e.value.outcome == "CANCELLED" and e.value.task == t2.id
    with pytest.raises(strata.TaskSkipped) as e:
        t3.wait()
    assert e.value.because == t2.id
    t1.wait()
    with pytest.raises(strata.SubmitError, match="cannot cancel"):
        c.cancel(t1)
    # A cancel is the driver's own choice, not a failure of the run.
    s = c.wait_all()
    assert (s.cancelled, s.skipped, s.succeeded) == (1, 1, 1)


@pytest.mark.parametrize("cache,write_back", [(True, "through"), (True, "deferred"), (False, "through")])
def test_the_device_cache_sees_the_drivers_writes(cache, write_back):
    """A chip keeps a copy of bytes it read; the driver then writes them
    through a numpy array it kept: the next task reads the new bytes."""
    with strata.Cluster(local=1, device_cache=cache, write_back=write_back) as c:
        x = c.array(np.ones((64, 64), dtype=np.float32))
        kept = x.numpy()
        outs = [c.zeros((64, 64)) for _ in range(3)]
        c.submit("copy", x, outs[0])
        c.wait_all()
        kept[:] = 2.0
        c.submit("copy", x, outs[1])
        c.wait_all()
        x[8:16, 8:16] = 3.0
        c.submit("copy", x, outs[2])
        c.wait_all()
        assert (outs[0].numpy() == 1.0).all()
        assert (outs[1].numpy() == 2.0).all()
        want = np.full((64, 64), 2.0, dtype=np.float32)
        want[8:16, 8:16] = 3.0
        assert np.array_equal(outs[2].numpy(), want)
        stats = c.worker_stats(0)["cache"]
        assert stats["entries"] == (4 if cache else 0), stats


def test_the_summary_counts_what_the_chips_moved():
    """A run's summary says what its tasks copied: a tile two tasks read is
    copied onto the chip once and found there after, within a run and in
    the next one (an array filled by ``c.array`` and never viewed through
    ``numpy()`` cannot have changed); once the driver holds a numpy view of
    it, a new run reads it again."""
    with strata.Cluster(local=1) as c:
        x = c.array(np.ones((64, 64), dtype=np.float32))
        outs = [c.zeros((64, 64)) for _ in range(4)]
        tile = 64 * 64 * 4
        for out in outs[:2]:
            c.submit("copy", x, out)
        s = c.wait_all()
        assert (s.cache_hits, s.cache_misses) == (1, 1), s
        assert (s.to_device_bytes, s.from_device_bytes) == (tile, 2 * tile), s
        assert s.staged_bytes == s.to_device_bytes + s.from_device_bytes
        assert (s.held_bytes, s.resent, s.evictions, s.write_backs) == (0, 0, 0, 0)
        # Reading a copy of it, or filling an array no task has named yet,
        # changes nothing either.
        assert (x.to_numpy() == 1.0).all()
        y = c.zeros((64, 64))
        y[:] = 1.0
        c.submit("copy", x, outs[2])
        c.submit("copy", y, outs[1])
        s = c.wait_all()
        assert (s.cache_hits, s.cache_misses, s.to_device_bytes) == (1, 1, tile), s
        c.submit("copy", y, outs[2])
        s = c.wait_all()
        assert (s.cache_hits, s.cache_misses) == (1, 0), s
        view = x.numpy()
        c.submit("copy", x, outs[3])
        s = c.wait_all()
        assert (s.cache_hits, s.cache_misses) == (0, 1), s
        assert all((o.numpy() == 1.0).all() for o in outs)
        del view


def test_deferred_writes_reach_numpy_at_the_wait():
    """With deferred write-back a chain of updates stays on its chip, and
    the wait writes the result back: numpy sees it, the summary counts the
    write-backs, and a bad write_back value is refused naming it."""
    with strata.Cluster(local=2, write_back="deferred") as c:
        x = c.array(np.ones(1024, dtype=np.float32))
        y = c.zeros(1024)
        for _ in range(8):
            c.submit("axpy", x, y, 1.0)
        s = c.wait_all()
        assert (y.numpy() == 8.0).all()
        assert s.write_backs >= 1, s
        # One update went back, not eight.
        assert s.from_device_bytes < 8 * 4096, s
    with pytest.raises(ValueError, match="write_back"):
        strata.Cluster(local=1, write_back="sometimes")


def test_submit_many_is_a_loop_of_submits_and_names_the_task_it_refuses(inproc):
    import numpy as np

    a = inproc.array(np.arange(64, dtype=np.float32).reshape(8, 8))
    b = inproc.array(np.ones((8, 8), np.float32))
    out = inproc.zeros((8, 8), np.float32)
    tasks = inproc.submit_many("add", ((a[i], b[i], out[i]) for i in range(8)))
    assert len(tasks) == 8
    inproc.wait_all()
    assert np.array_equal(out.numpy(), a.numpy() + 1)
    # A list per task works too, and on= applies to each.
    inproc.submit_many("mul", [[a[i], b[i], out[i]] for i in range(8)], on=0)
    inproc.wait_all()
    assert np.array_equal(out.numpy(), a.numpy())
    # Refused at the check: nothing of the batch is submitted.
    before = inproc.totals().submitted
    bad = [(a[0], b[0], out[0]), (a[1], b[1].view(np.int32), out[1])]
    with pytest.raises(strata.SubmitError, match="task 1 of the batch: .*dtype"):
        inproc.submit_many("add", bad)
    assert inproc.totals().submitted == before
    # Refused by the engine (the output overlaps an input): the ones before stay.
    with pytest.raises(strata.SubmitError, match="task 1 of the batch"):
        inproc.submit_many("add", [(a[0], b[0], out[0]), (a[1], b[1], a[1])])
    inproc.wait_all()
    assert inproc.totals().submitted == before + 1
