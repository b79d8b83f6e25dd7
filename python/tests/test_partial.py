"""Partial writers: Python kernels that write a seeded random subset of
their OUTPUT_EXISTING and INOUT views keep every other element, on every
path (staged and unified chips, in-process workers, spawned workers with
and without the ring, workers the cluster connects to over Unix and TCP,
two clients sharing them), byte-identical to the same program run one task
at a time with numpy."""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import pykernels
import strata
from conftest import HERE

ROWS, COLS = 16, 24
KERNELS = [pykernels.partial_write, pykernels.partial_copy, pykernels.partial_update]


def view_key(rng, shape):
    r, c = shape
    sr, sc = int(rng.integers(1, 3)), int(rng.integers(1, 3))
    r0 = int(rng.integers(0, ROWS - (r - 1) * sr))
    c0 = int(rng.integers(0, COLS - (c - 1) * sc))
    return (slice(r0, r0 + (r - 1) * sr + 1, sr), slice(c0, c0 + (c - 1) * sc + 1, sc))


def program(seed, n_ops=30):
    rng = np.random.default_rng(seed)
    ops = []
    for _ in range(n_ops):
        shape = (int(rng.integers(1, 8)), int(rng.integers(1, 8)))
        kind = ["write", "copy", "update"][int(rng.integers(3))]
        bufs = (int(rng.integers(2)), int(rng.integers(2)))
        keys = (view_key(rng, shape), view_key(rng, shape))
        ops.append((kind, bufs, keys, int(rng.integers(1 << 30)), float(rng.integers(-8, 9))))
    return ops


def apply_numpy(bufs, op):
    kind, (bx, by), (kx, ky), seed, value = op
    y = bufs[by][ky]
    m = pykernels._chosen(y.shape, seed)
    if kind == "write":
        y[m] = value
    elif kind == "copy":
        x = bufs[bx][kx]
        if np.shares_memory(x, y):
            return False
        y[m] = x[m]
    else:
        y[m] = y[m] * np.float32(2) + np.float32(1)
    return True


def check_programs(cluster, seeds):
    for seed in seeds:
        rng = np.random.default_rng(seed)
        init = [rng.integers(-8, 9, size=(ROWS, COLS)).astype(np.float32) for _ in range(2)]
        want = [b.copy() for b in init]
        arrays = [cluster.array(b) for b in init]
        for op in program(seed):
            if not apply_numpy(want, op):
                continue  # a copy between views that share bytes: refused at submit
            kind, (bx, by), (kx, ky), s, value = op
            y = arrays[by][ky]
            if kind == "write":
                cluster.submit("test.partial_write", strata.output_existing(y), s, value)
            elif kind == "copy":
                cluster.submit("test.partial_copy", arrays[bx][kx], strata.output_existing(y), s)
            else:
                cluster.submit("test.partial_update", strata.inout(y), s)
        cluster.wait_all()
        for got, w in zip(arrays, want):
            assert got.numpy().tobytes() == w.tobytes(), f"seed {seed}"


@pytest.mark.parametrize(
    "config",
    [
        {"in_process": 1, "device": "sim:mode=staged"},
        {"in_process": 1, "device": "sim:mode=unified"},
        {"local": 2, "device": "sim:mode=staged"},
        {"local": 1, "device": "sim:mode=unified"},
        {"local": 1, "device": "sim:mode=staged", "ring": False},
    ],
    ids=["inproc-staged", "inproc-unified", "local-staged", "local-unified", "local-staged-no-ring"],
)
def test_partial_writers_keep_the_rest(config):
    with strata.Cluster(kernels=KERNELS, **config) as cluster:
        check_programs(cluster, range(4))


def serve(args):
    env = dict(os.environ, PYTHONPATH=HERE)
    p = subprocess.Popen(
        [sys.executable, "-m", "strata.worker", "--kernels", "pykernels", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    line = p.stdout.readline()
    endpoint = next(w for w in line.split() if w.startswith("listen=")).split("=", 1)[1]
    return p, endpoint


def test_partial_writers_keep_the_rest_with_two_clients_on_shared_workers(tmp_path):
    token = tmp_path / "token"
    token.write_text("partial")
    procs = []
    try:
        for args in (
            ["--listen", f"unix:{tmp_path / 'staged.sock'}", "--device", "sim:mode=staged"],
            ["--listen", f"unix:{tmp_path / 'unified.sock'}", "--device", "sim:mode=unified"],
            ["--listen", "tcp:127.0.0.1:0", "--token-file", str(token), "--device", "sim:mode=staged"],
        ):
            procs.append(serve(args))
        endpoints = [e for _, e in procs]
        errors = []

        def client(seeds):
            try:
                with strata.Cluster(workers=endpoints, token="partial") as c:
                    assert {w.transport for w in c.workers} == {"ring", "grpc-tcp"}
                    check_programs(c, seeds)
            except BaseException as e:  # reported by the main thread
                errors.append(e)

        threads = [threading.Thread(target=client, args=(range(s, s + 4),)) for s in (0, 100)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
    finally:
        for p, _ in procs:
            p.terminate()
            p.wait(10)
