"""Scheduling policies, performance models and float64 tiles: a tiled
Cholesky in the built-in kernels under each policy against numpy."""

import json

import numpy as np
import pytest

import strata


def tiled_cholesky(cluster, a, t):
    n = a.shape[0]
    for k in range(0, n, t):
        kk = a[k : k + t, k : k + t]
        cluster.submit("potrf", kk)
        for r in range(k + t, n, t):
            cluster.submit("trsm", kk, a[r : r + t, k : k + t])
        for r in range(k + t, n, t):
            cluster.submit("syrk", a[r : r + t, k : k + t], a[r : r + t, r : r + t])
            for c in range(k + t, r, t):
                cluster.submit("gemm", a[r : r + t, k : k + t], a[c : c + t, k : k + t].T, a[r : r + t, c : c + t], -1.0, 1.0)
    return cluster.wait_all()


@pytest.mark.parametrize("scheduler", ["least-loaded", "dmda", "dmdas"])
def test_float64_cholesky_matches_numpy_under_each_policy(scheduler, tmp_path):
    n, t = 192, 48
    i, j = np.indices((n, n))
    host = 1.0 / (i + j + 1) + n * (i == j)
    models = tmp_path / "models.json"
    with strata.Cluster(in_process=2, scheduler=scheduler, perf_models=models) as c:
        a = c.array(host)
        assert a.dtype == np.float64
        s = tiled_cholesky(c, a, t)
        assert s.succeeded == 20
        got = np.tril(a.numpy())
        c.shutdown()
    np.testing.assert_allclose(got, np.linalg.cholesky(host), rtol=0, atol=1e-12)
    saved = json.loads(models.read_text())
    assert saved["strata_perf_models"] == 1 and saved["entries"]


def test_declared_flops_give_a_first_prediction():
    with strata.Cluster(in_process=1) as c:
        x = c.zeros((64, 64), np.float32)
        c.submit("fill", x, 1.0, flops=10_000)
        s = c.wait_all()
        # The first task of an unseen kernel was predicted from its flops.
        assert s.predicted == 1


def test_an_unknown_scheduler_names_the_known_ones():
    with pytest.raises(ValueError, match="least-loaded, dmda, dmdas"):
        strata.Cluster(in_process=1, scheduler="fastest")


def test_a_corrupt_models_file_fails_the_start_naming_it(tmp_path):
    bad = tmp_path / "models.json"
    bad.write_text("{not json")
    with pytest.raises(strata.ClusterError, match="models.json.*delete it"):
        strata.Cluster(in_process=1, perf_models=bad)


def test_potrf_refuses_a_matrix_that_is_not_positive_definite():
    with strata.Cluster(in_process=1) as c:
        a = c.array(np.array([[1.0, 2.0], [2.0, 1.0]]))
        with pytest.raises(strata.TaskFailed, match="not positive definite"):
            c.wait(c.submit("potrf", a))
