"""Python kernels the tests run on workers (a module, so that worker
processes can import it)."""

import os
import sys
import signal
import time

import numpy as np

import strata


@strata.kernel("test.scale", args=("x:r", "y:w"), scalars=("alpha:f64",))
def scale(x, y, alpha):
    y[...] = alpha * x


@strata.kernel("test.stencil", args=("x:r", "y:w"))
def stencil(x, y):
    # numpy work on strided arguments: y = x[:-1] * 2 + x[1:] (row-wise).
    y[...] = x[:, :-1] * np.float32(2) + x[:, 1:]


def _started(kernel):
    # A test's sign that the kernel runs: $STRATA_TEST_STARTED/<kernel>.<pid>.
    folder = os.environ.get("STRATA_TEST_STARTED")
    if folder:
        open(os.path.join(folder, f"{kernel}.{os.getpid()}"), "w").close()


@strata.kernel("test.sleep", args=("x:w",), scalars=("seconds:f64",))
def sleep(x, seconds):
    _started("test.sleep")
    time.sleep(seconds)
    x[...] = 1


@strata.kernel("test.spin", args=("x:w",))
def spin(x):
    # Busy for ever, holding the GIL and heeding nothing.
    _started("test.spin")
    while True:
        pass


@strata.kernel("test.fail", args=("x:r",))
def fail(x):
    raise ValueError(f"kernel says no to {x.shape}")


@strata.kernel("test.write_pid", args=("out:w:i64",))
def write_pid(out):
    out[...] = os.getpid()


@strata.kernel("test.die_once", args=("out:w:f32",))
def die_once(out):
    # The first run kills its own worker; a rerun (elsewhere) writes 7.
    marker = os.environ["STRATA_TEST_MARKER"]
    if not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(10)
    out[...] = 7


@strata.kernel("test.exit_3", args=("out:w:f32",))
def exit_3(out):
    # Ends its worker process at once, with a last word in its log.
    print("exit_3: leaving with status 3", file=sys.stderr, flush=True)
    os._exit(3)


def _chosen(shape, seed):
    # The elements a partial writer writes: a seeded random half.
    return np.random.default_rng(seed).random(shape) < 0.5


@strata.kernel("test.partial_write", args=("y:w:f32",), scalars=("seed:u64", "value:f64"))
def partial_write(y, seed, value):
    y[_chosen(y.shape, seed)] = value


@strata.kernel("test.partial_copy", args=("x:r:f32", "y:w:f32"), scalars=("seed:u64",))
def partial_copy(x, y, seed):
    m = _chosen(y.shape, seed)
    y[m] = x[m]


@strata.kernel("test.partial_update", args=("y:rw:f32",), scalars=("seed:u64",))
def partial_update(y, seed):
    m = _chosen(y.shape, seed)
    y[m] = y[m] * np.float32(2) + np.float32(1)


# A kernel with only a CUDA body (CPU chips do not offer it) and one with
# both bodies: the function on CPU chips, the source on CUDA chips.
SCALE_CU = """
extern "C" __global__ void scale_cu(strata_tensor x, unsigned long long alpha) {
    double a = __longlong_as_double((long long)alpha);
    for (strata_u64 i = blockIdx.x * (strata_u64)blockDim.x + threadIdx.x;
         i < strata_numel(x); i += (strata_u64)gridDim.x * blockDim.x)
        *strata_at<float>(x, i) *= (float)a;
}
"""

scale_cu = strata.raw_kernel("test.scale_cu", SCALE_CU, args=("x:rw:f32",), scalars=("alpha:f64",), entry="scale_cu")


@strata.kernel("test.scale_both", args=("x:rw:f32",), scalars=("alpha:f64",), cuda=SCALE_CU, entry="scale_cu")
def scale_both(x, alpha):
    x[...] *= np.float32(alpha)
