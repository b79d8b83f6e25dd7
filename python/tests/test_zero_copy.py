"""Zero copy: a 1 GiB host array's numpy view is the mapped buffer."""

import numpy as np

import strata

GIB = 1 << 30


def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_one_gib_array_is_shared_not_copied():
    with strata.Cluster(local=1, device="sim:mode=unified") as cluster:
        a = cluster.zeros(GIB // 4, np.float32)
        before = rss()
        view = a.numpy()
        grown = rss() - before
        assert view.nbytes == GIB
        # Making the ndarray allocates nothing of the buffer's size.
        assert grown < 64 << 20, grown
        assert np.shares_memory(view, np.asarray(a))
        assert view.__array_interface__["data"][0] == np.asarray(a).__array_interface__["data"][0]
        tail = a[GIB // 4 - 1024 :]
        assert np.shares_memory(tail.numpy(), view)
        # A worker process writes the last 4 KiB; the driver's array sees
        # it in place.
        summary_before = cluster.totals()
        cluster.submit("fill", tail, 2.5).wait()
        assert (view[-1024:] == 2.5).all()
        assert view[-1025] == 0
        s = cluster.wait_all()
        assert s.succeeded == 1
        # Passed by fd, not copied: the buffer's bytes counted once.
        assert cluster.totals().fd_bytes - summary_before.fd_bytes == GIB
        # Still no copy of the buffer in this process.
        assert rss() - before < 64 << 20


def test_driver_writes_reach_the_worker(inproc):
    x = inproc.zeros((16, 16), np.float32)
    y = inproc.zeros((16, 16), np.float32)
    x.numpy()[...] = np.arange(256, dtype=np.float32).reshape(16, 16)
    inproc.submit("copy", x[::2], y[8:]).wait()
    assert np.array_equal(y.numpy()[8:], x.numpy()[::2])
