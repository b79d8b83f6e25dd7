"""The package itself: docs, graphs, traces, npy, workers described."""

import json
import os

import numpy as np
import pytest

import strata

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_help_reads_well():
    doc = strata.Cluster.__doc__
    assert "context manager" in doc and "submit" in doc
    assert "Raises" in strata.Cluster.wait_all.__doc__ or "Raises" in (strata.Cluster.wait_all.__doc__ or "")
    for name in strata.__all__:
        obj = getattr(strata, name)
        assert getattr(obj, "__doc__", None), name
    assert "matmul@1" in strata.builtin_kernels()


def test_workers_describe_themselves(inproc):
    (w,) = inproc.workers
    assert w.id == 0 and w.transport == "in-process"
    assert "matmul@1" in w.callables
    assert "sim" in w.device


def test_npy_round_trip(inproc, tmp_path):
    ref = np.arange(12, dtype=np.int16).reshape(3, 4)
    np.save(tmp_path / "a.npy", ref)
    a = inproc.from_npy(tmp_path / "a.npy")
    assert np.array_equal(a.numpy(), ref)
    a[1:, ::2].save_npy(tmp_path / "b.npy")
    assert np.array_equal(np.load(tmp_path / "b.npy"), ref[1:, ::2])
    with pytest.raises(strata.NpyError):
        inproc.from_npy(tmp_path / "missing.npy")


def test_run_graph_and_trace(tmp_path):
    graph = os.path.join(ROOT, "examples", "graphs", "tiled_matmul.json")
    with strata.Cluster(local=2, trace=True) as c:
        r = c.run_graph(graph, out_dir=tmp_path)
        assert r["summary"].succeeded > 0
        assert r["mismatches"] == []
        assert all(os.path.exists(p) for p in r["outputs"])
        n = c.trace(tmp_path / "trace.json")
        assert n == r["summary"].submitted
        events = json.load(open(tmp_path / "trace.json"))
        assert events
        with pytest.raises(strata.GraphError, match="buffers"):
            c.run_graph({"buffers": "nope"})
    with strata.Cluster(in_process=1) as c:
        with pytest.raises(strata.TraceError, match="trace=True"):
            c.trace(tmp_path / "t.json")
