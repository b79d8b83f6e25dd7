"""Views are numpy indexing over the same bytes, and the edges strata
infers are exactly the byte overlaps: disjoint tiles run in parallel,
a transposed read of a written tile waits for its writer.

    python examples/python/views.py
"""

import numpy as np

import strata

with strata.Cluster(in_process=2) as cluster:
    x = cluster.array(np.arange(64, dtype=np.float32).reshape(8, 8))
    y = cluster.zeros((8, 8), np.float32)

    # Two writers of disjoint stepped columns: no edge between them.
    cluster.submit("fill", y[:, ::2], 1.0)
    cluster.submit("fill", y[:, 1::2], 2.0)
    # A reader of a transposed block overlapping both: a RAW edge to each.
    out = cluster.zeros((4, 8), np.float32)
    cluster.submit("add", y.T[:4], x[4:], out)
    s = cluster.wait_all()
    # Edges are counted to predecessors still unfinished when a task is
    # submitted: 2 here unless the fills were already done.
    print(f"{s.succeeded} tasks, {s.edges} edges")
    assert np.array_equal(out.numpy(), y.numpy().T[:4] + x.numpy()[4:])

    # Indexing that numpy would copy for is refused.
    try:
        x[[0, 3]]
    except strata.InvalidIndex as e:
        print("refused:", e)
