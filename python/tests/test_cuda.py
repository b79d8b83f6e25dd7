"""CUDA bodies from Python: kernels with CUDA C source, alone
(``strata.raw_kernel``) or beside a Python function; which chips offer
them; the errors of bad source specs and of CUDA chips where there is no
GPU; and, where a GPU is (or the fake CUDA of scripts/fakecuda.sh),
the launches themselves against numpy. Without one those say why they
skip, and fail instead under STRATA_REQUIRE_CUDA=1."""

import os

import numpy as np
import pytest

import strata

import pykernels


def test_a_raw_kernel_says_what_it_is():
    k = pykernels.scale_cu
    assert k.qualified_name == "test.scale_cu@1"
    assert k.func is None
    assert "scale_cu" in k.cuda
    with pytest.raises(TypeError, match="only CUDA source"):
        k(1, 2)
    assert pykernels.scale_both.cuda == pykernels.SCALE_CU


@pytest.mark.parametrize(
    "kwargs, why",
    [
        (dict(entry="not an identifier"), "not a C identifier"),
        (dict(grid="columns"), 'is not "elements"'),
        (dict(grid="rows:3"), "tensor argument 3"),
        (dict(grid=((1, 2), 32)), "an int or an \\(x, y, z\\) triple"),
        (dict(grid=(1, 32, "big")), "shared is not a byte count"),
    ],
)
def test_bad_source_specs_are_refused_naming_why(kwargs, why):
    with pytest.raises(ValueError, match=why):
        strata.raw_kernel("k", pykernels.SCALE_CU, args=("x:rw:f32",), scalars=("alpha:f64",), **kwargs)


def test_a_kernel_needs_a_function_or_source():
    with pytest.raises(ValueError, match="neither a function nor CUDA source"):
        strata.Kernel("k", None, ["x:rw"])
    with pytest.raises(ValueError, match="go with cuda= source"):
        strata.Kernel("k", lambda x: None, ["x:rw"], entry="k")


def test_cpu_chips_run_the_function_and_do_not_offer_cuda_only_kernels():
    kernels = [pykernels.scale_cu, pykernels.scale_both]
    with strata.Cluster(in_process=1, kernels=kernels) as c:
        x = c.array(np.arange(8, dtype=np.float32))
        c.submit("test.scale_both", x, 2.0)
        c.wait_all()
        np.testing.assert_array_equal(x.to_numpy(), np.arange(8, dtype=np.float32) * 2)
        with pytest.raises(strata.SubmitError, match="test.scale_cu"):
            c.submit("test.scale_cu", x, 2.0)


def test_worker_processes_import_a_raw_kernel_by_its_module_variable():
    with strata.Cluster(local=1, kernels=[pykernels.scale_cu, pykernels.scale_both]) as c:
        x = c.array(np.ones(4, dtype=np.float32))
        c.submit("test.scale_both", x, 3.0)
        c.wait_all()
        np.testing.assert_array_equal(x.to_numpy(), np.full(4, 3, dtype=np.float32))
        with pytest.raises(strata.SubmitError, match="test.scale_cu"):
            c.submit("test.scale_cu", x, 2.0)


def _on_gpu(**kw):
    """A cluster on cuda:0, or a skip naming why there is none (a
    failure under STRATA_REQUIRE_CUDA=1)."""
    try:
        # A small arena: on a real GPU other processes (other tests'
        # workers) share the device.
        return strata.Cluster(device="cuda:0,mem=1GiB", **kw)
    except strata.ClusterError as e:
        if os.environ.get("STRATA_REQUIRE_CUDA") == "1":
            raise
        pytest.skip(f"no GPU here: {e}")


@pytest.mark.parametrize("where", [{"local": 1}, {"in_process": 1}])
def test_kernels_run_on_a_gpu_as_numpy_computes(where):
    rng = np.random.default_rng(3)
    kernels = [pykernels.scale_cu, pykernels.scale_both]
    with _on_gpu(kernels=kernels, **where) as c:
        a0 = rng.standard_normal((48, 40)).astype(np.float32)
        b0 = rng.standard_normal((40, 24)).astype(np.float32)
        a, b = c.array(a0), c.array(b0)
        out = c.array(np.zeros((48, 24), dtype=np.float32))
        c.submit("matmul", a, b, out)
        x0 = rng.standard_normal(1000).astype(np.float32)
        x = c.array(x0)
        c.submit("test.scale_cu", x, 2.0)
        c.submit("test.scale_both", x, -0.5)
        # A strided view: every other column of a, added to itself.
        s = a[:, ::2]
        t = c.array(np.zeros((48, 20), dtype=np.float32))
        c.submit("add", s, s, t)
        c.wait_all()
        np.testing.assert_allclose(out.to_numpy(), a0 @ b0, rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(x.to_numpy(), x0 * np.float32(2) * np.float32(-0.5))
        np.testing.assert_array_equal(t.to_numpy(), a0[:, ::2] + a0[:, ::2])
