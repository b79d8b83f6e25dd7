"""Random programs over numpy-sliced views of shared buffers (float32,
int32 bits seen as int16, and float64), run through strata (1-4 local
workers, and in-process workers), end byte-identical to the same program
run one task at a time with numpy."""

import numpy as np
import pytest

import strata

ROWS, COLS = 24, 32


def make_view(rng, shape):
    """A numpy index of a (ROWS, COLS) array giving `shape`, maybe
    transposed: (key, transposed)."""
    r, c = shape
    transposed = bool(rng.integers(2))
    if transposed:
        r, c = c, r
    sr = int(rng.integers(1, 3))
    sc = int(rng.integers(1, 4))
    r0 = int(rng.integers(0, ROWS - (r - 1) * sr))
    c0 = int(rng.integers(0, COLS - (c - 1) * sc))
    key = (slice(r0, r0 + (r - 1) * sr + 1, sr), slice(c0, c0 + (c - 1) * sc + 1, sc))
    return key, transposed


def pick(arr, spec):
    key, transposed = spec
    v = arr[key]
    return v.T if transposed else v


def program(seed, n_ops=40):
    rng = np.random.default_rng(seed)
    ops = []
    for _ in range(n_ops):
        shape = (int(rng.integers(1, 7)), int(rng.integers(1, 7)))
        kind = ["copy", "add", "mul", "fill", "copy_bits", "iadd16", "copy64", "add64", "mul64", "fill64"][
            int(rng.integers(10))
        ]
        if kind.endswith("64"):
            # float64 programs on buffers 3-4 (float64 from the start).
            bufs = [int(rng.integers(3, 5)) for _ in range(3)]
        else:
            bufs = [int(rng.integers(3)) for _ in range(3)]
        specs = [make_view(rng, shape) for _ in range(3)]
        value = int(rng.integers(-4, 5))
        ops.append((kind, bufs, specs, value))
    return ops


def as_kind(arr, kind):
    # f32 arithmetic on buffers 0-1; buffer 2 is int32 bytes, also
    # seen as int16 (a dtype view over the same bytes).
    return arr


def run_numpy(init, ops):
    bufs = [b.copy() for b in init]
    for kind, bi, specs, value in ops:
        apply(kind, [bufs[i] for i in bi], specs, value, lambda a, s: pick(a, s))
    return bufs


def operands(kind, arrays, specs, get):
    if kind.endswith("64"):
        return [get(arrays[i], specs[i]) for i in range(3)]
    if kind in ("copy", "add", "mul", "fill"):
        arrs = [arrays[i].view(np.float32) if arrays[i].dtype != np.float32 else arrays[i] for i in range(3)]
        return [get(arrs[i], specs[i]) for i in range(3)]
    if kind == "copy_bits":
        # A byte-for-byte copy between views of any of the buffers, as int32.
        return [get(arrays[i].view(np.int32), specs[i]) for i in range(3)]
    # iadd16: int16 views (the last axis doubles) of the same bytes.
    return [get(arrays[i].view(np.int16), specs[i]) for i in range(3)]


def apply(kind, arrays, specs, value, get):
    x, y, z = operands(kind, arrays, specs, get)
    kind = kind.removesuffix("64")
    if kind in ("copy", "copy_bits"):
        y[...] = x
    elif kind == "add":
        z[...] = x + y
    elif kind == "mul":
        z[...] = x * y
    elif kind == "fill":
        z[...] = value
    elif kind == "iadd16":
        z[...] = x + y


def written(kind, views):
    kind = kind.removesuffix("64")
    return views[1] if kind in ("copy", "copy_bits") else views[2]


def read(kind, views):
    kind = kind.removesuffix("64")
    if kind in ("copy", "copy_bits"):
        return [views[0]]
    if kind == "fill":
        return []
    return [views[0], views[1]]


def overlapping(kind, np_views):
    w = written(kind, np_views)
    return any(np.shares_memory(w, r) for r in read(kind, np_views))


def run_strata(cluster, init, ops):
    bufs = [cluster.array(b) for b in init]
    expected_refusals = []
    for n, (kind, bi, specs, value) in enumerate(ops):
        arrs = [bufs[i] for i in bi]
        views = operands(kind, arrs, specs, pick)
        np_views = [v.numpy() for v in views]
        base = kind.removesuffix("64")
        name = {"copy": "copy", "copy_bits": "copy", "add": "add", "mul": "mul", "fill": "fill", "iadd16": "add"}[base]
        if base in ("copy", "copy_bits"):
            args = (views[0], views[1])
        elif base == "fill":
            args = (views[2], value)
        else:
            args = tuple(views)
        if overlapping(kind, np_views):
            with pytest.raises(strata.SubmitError):
                cluster.submit(name, *args)
            expected_refusals.append(n)
            continue
        cluster.submit(name, *args)
    cluster.wait_all()
    return [b.numpy().copy() for b in bufs], expected_refusals


@pytest.mark.parametrize(
    "workers",
    [{"local": 1}, {"local": 2}, {"local": 4}, {"in_process": 2}, {"local": 1, "in_process": 1}],
    ids=["local1", "local2", "local4", "inproc2", "mixed"],
)
def test_differential(workers):
    with strata.Cluster(**workers) as cluster:
        for seed in range(6):
            rng = np.random.default_rng(1000 + seed)
            init = [
                rng.integers(-8, 9, size=(ROWS, COLS)).astype(np.float32),
                rng.integers(-8, 9, size=(ROWS, COLS)).astype(np.float32),
                rng.integers(-1000, 1000, size=(ROWS, COLS)).astype(np.int32).view(np.float32),
                rng.integers(-8, 9, size=(ROWS, COLS)).astype(np.float64),
                rng.integers(-8, 9, size=(ROWS, COLS)).astype(np.float64),
            ]
            # Buffer 2 holds int32 bits: float ops on it would meet NaN
            # patterns, so arithmetic programs keep floats on 0-1 by
            # viewing it only through copy_bits / iadd16.
            ops = program(seed)
            ops = [
                (k, bi, s, v)
                for (k, bi, s, v) in ops
                if k in ("copy_bits", "iadd16") or k.endswith("64") or all(i < 2 for i in bi)
            ]
            got, refused = run_strata(cluster, init, ops)
            ref_ops = [op for n, op in enumerate(ops) if n not in refused]
            want = run_numpy(init, ref_ops)
            for g, w in zip(got, want):
                assert g.tobytes() == w.tobytes(), f"seed {seed}"
