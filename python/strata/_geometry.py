"""View geometry by numpy's own rules.

strata views are numpy-style (offset, shape, strides) over a buffer. The
extension computes the common cases itself (basic indexing, no-copy
``reshape``, ``.view(dtype)``: ``PyArray::basic_index``,
``native_reshape``, ``native_retype``); everything else, and every
refusal, is answered here by numpy itself, applied to a *stand-in* array
with the view's shape and strides. The
stand-in's memory is never touched: only basic indexing (which computes a
pointer and strides), ``reshape(copy=False)`` and ``.view`` are applied to
it, each of which never reads an element, and anything that would make
numpy copy (fancy indexing) is refused before numpy sees it. The new
view's byte offset is the difference of the two data pointers.

The result is checked against what a strata view can be: 1 to 5 axes,
every axis at least 1 long, positive strides that are whole elements.
"""

from __future__ import annotations

import numbers

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .errors import InvalidIndex, InvalidView

MAX_DIMS = 5


def _stand_in(shape, strides, itemsize):
    # A one-element array of the view's item size, re-strided: numpy
    # accepts any strides here and never reads through them unless asked
    # for elements, which nothing below does.
    base = np.zeros(1, dtype=np.dtype(f"V{itemsize}"))
    return base, as_strided(base, shape=tuple(shape), strides=tuple(strides), writeable=False)


def _address(a):
    return a.__array_interface__["data"][0]


def _finish(base, result, itemsize, what):
    shape = list(result.shape)
    strides = list(result.strides)
    if len(shape) > MAX_DIMS:
        raise InvalidView(f"{what}: {len(shape)} axes; a strata view has at most {MAX_DIMS}")
    if any(n == 0 for n in shape):
        raise InvalidView(f"{what}: shape {tuple(shape)} has an empty axis; a strata view has at least one element")
    if not shape:
        # Every axis indexed away: the one element, as a 1-element view.
        shape, strides = [1], [itemsize]
    elems = []
    inner = 1
    for n, s in reversed(list(zip(shape, strides))):
        if n == 1:
            # The stride of a length-1 axis moves nothing; give it the
            # row-major one so that contiguous views stay recognisable.
            elems.append(inner)
        else:
            if s <= 0:
                raise InvalidView(
                    f"{what}: stride {s} bytes; strata views step forward only (no reversed or broadcast axes)"
                )
            if s % itemsize:
                raise InvalidView(f"{what}: stride {s} bytes is not a whole number of {itemsize}-byte elements")
            elems.append(s // itemsize)
        inner = elems[-1] * n
    elems.reverse()
    delta = _address(result) - _address(base)
    if delta < 0:
        raise InvalidView(f"{what}: starts before the view")
    return delta, shape, elems


def _check_key(key):
    parts = key if isinstance(key, tuple) else (key,)
    for k in parts:
        if k is None or k is Ellipsis or isinstance(k, slice):
            continue
        if isinstance(k, (bool, np.bool_)):
            raise InvalidIndex(
                "boolean index: numpy answers masks with a copy; strata views never copy (index with slices and integers, or take arr.numpy()[mask] to copy)"
            )
        if isinstance(k, numbers.Integral):
            continue
        if isinstance(k, (list, np.ndarray)) or hasattr(k, "__array__") or hasattr(k, "__array_interface__"):
            raise InvalidIndex(
                f"fancy index {type(k).__name__}: numpy answers it with a copy; strata views never copy (index with slices and integers, or take arr.numpy()[...] to copy)"
            )
        raise InvalidIndex(f"index {k!r} of type {type(k).__name__}: strata views take integers, slices, ... and None")
    return parts


def index(shape, strides, itemsize, key):
    """(byte delta, shape, element strides) of ``view[key]``."""
    parts = _check_key(key)
    if not any(k is Ellipsis for k in parts):
        # With an Ellipsis numpy answers a view even when every axis is
        # indexed (a 0-d array), never a scalar it would have to read.
        parts = parts + (Ellipsis,)
    base, a = _stand_in(shape, strides, itemsize)
    return _finish(base, a[parts], itemsize, f"index {key!r}")


def reshape(shape, strides, itemsize, newshape):
    """(byte delta, shape, element strides) of ``view.reshape(newshape)``,
    refused where numpy would copy."""
    base, a = _stand_in(shape, strides, itemsize)
    try:
        r = np.reshape(a, newshape, copy=False)
    except TypeError:  # numpy < 2.1: no copy argument
        r = a.view()
        try:
            r.shape = newshape
        except AttributeError as e:
            raise InvalidView(
                f"reshape {tuple(shape)} -> {newshape}: these bytes cannot be seen with that shape without a copy ({e})"
            ) from None
    except ValueError as e:
        raise InvalidView(
            f"reshape {tuple(shape)} -> {newshape}: these bytes cannot be seen with that shape without a copy ({e})"
        ) from None
    return _finish(base, r, itemsize, f"reshape to {newshape}")


def view(shape, strides, itemsize, new_itemsize):
    """(byte delta, shape, element strides) of the same bytes seen with
    elements of ``new_itemsize`` bytes (numpy's ``ndarray.view(dtype)``)."""
    base, a = _stand_in(shape, strides, itemsize)
    try:
        r = a.view(np.dtype(f"V{new_itemsize}"))
    except ValueError as e:
        raise InvalidView(f"view as {new_itemsize}-byte elements: {e}") from None
    return _finish(base, r, new_itemsize, f"view as {new_itemsize}-byte elements")


def gather(data, shape, strides, typestr):
    """A C-ordered copy of the elements of a view whose extent's bytes are
    ``data`` (a device view read back to the host)."""
    raw = np.frombuffer(data, dtype=np.uint8)
    dt = np.dtype(typestr)
    a = as_strided(raw.view(dt) if len(raw) % dt.itemsize == 0 else raw[: len(raw) - len(raw) % dt.itemsize].view(dt),
                   shape=tuple(shape), strides=tuple(s * dt.itemsize for s in strides), writeable=False)
    return np.array(a, copy=True)


class Interface:
    """An ``__array_interface__`` holder: ``numpy.asarray`` of it is an
    array over the memory it names, whose ``base`` is this object (which
    keeps ``owner`` alive)."""

    __slots__ = ("__array_interface__", "owner")

    def __init__(self, interface, owner):
        self.__array_interface__ = interface
        self.owner = owner
