"""Temporaries in scopes: each step allocates two scratch arrays in a scope;
strata reclaims them once the step's tasks are done and recycles their
memory (zeroed) for the next steps. Checks the result against numpy and
that the pool stayed small."""

import numpy as np

import strata

STEPS = 2_000

with strata.Cluster(local=2, max_unfinished=64) as cluster:
    rng = np.random.default_rng(7)
    x0 = rng.standard_normal((64, 64)).astype(np.float32)
    x = cluster.array(x0)
    acc = cluster.zeros((64, 64))
    for step in range(STEPS):
        with cluster.scope() as s:
            t = s.alloc((64, 64), np.float32)
            u = s.alloc((64, 64), np.float32)
            cluster.submit("mul", x, x, t)
            cluster.submit("add", t, x, u)
            cluster.submit("axpy", u, acc, 0.5)
    cluster.wait_all()
    want = STEPS * 0.5 * (x0 * x0 + x0)
    np.testing.assert_allclose(acc.numpy(), want, rtol=1e-4, atol=1e-2)
    stats = cluster.pool_stats()
    print(f"{STEPS} steps, {2 * STEPS} temporaries: {stats}")
    assert stats["created"] < 200, stats
