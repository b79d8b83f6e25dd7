"""Python kernels for examples/python/python_kernel.py (a module of their
own, so that worker processes can import them)."""

import numpy as np

import strata


@strata.kernel("example.smooth", args=("x:r:f32", "y:w:f32"), scalars=("weight:f64",))
def smooth(x, y, weight):
    # x and y are numpy arrays over the task's arguments, strided as the
    # views are; y is written in place.
    y[...] = (1 - weight) * x[:, 1:-1] + weight * 0.5 * (x[:, :-2] + x[:, 2:])


@strata.kernel("example.check_positive", args=("x:r",))
def check_positive(x):
    if (x <= 0).any():
        raise ValueError(f"{int((x <= 0).sum())} values are not positive")
