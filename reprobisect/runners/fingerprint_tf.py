"""Exact-bit fingerprints and stats for TensorFlow tensors: the NumPy/torch algorithm, same values.

The algorithm is ``reprobisect.trace.fingerprint``'s (see its docstring): the same bits give
the same fingerprint whether they sit in a NumPy array, a torch tensor or a TF tensor.

A TF tensor on the host is read in place: ``np.asarray(t)`` on an eager CPU tensor is a
view of TensorFlow's own buffer (``EagerTensor.__array__`` -> ``_numpy()``), unlike
``t.numpy()``, which copies; bfloat16 and the float8 types come out as ``ml_dtypes``
arrays, so they hash exactly like ``ml_dtypes`` NumPy arrays and torch's bfloat16. A tensor
on an accelerator is copied to the host (one copy of its bytes; TF has no device-side
reduction here). The native kernel (``reprobisect.native``) reads the bytes once for the row
sums and statistics when it is built; otherwise the NumPy reference does, with the same
fingerprint. Variables (``tf.Variable``, Keras ``Variable``) are read with ``read_value``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from reprobisect import native
from reprobisect.trace.fingerprint import dtype_name, finish_fingerprint
from reprobisect.trace.fingerprint import fingerprint_and_stats as _np_fingerprint_and_stats

__all__ = ["host_array", "fingerprint", "fingerprint_and_stats", "fingerprint_array"]


def host_array(t: Any) -> np.ndarray:
    """``t`` (an eager TF tensor, a variable, a NumPy array) as a NumPy array, without a copy
    where TensorFlow allows one (an eager tensor on the host)."""
    if isinstance(t, np.ndarray):
        return t
    value = getattr(t, "value", None)  # a Keras Variable: its tf.Variable
    if value is not None and not callable(value) and hasattr(value, "read_value"):
        t = value
    if hasattr(t, "read_value") and not hasattr(t, "_numpy"):  # a tf.Variable
        t = t.read_value()
    numpy_view = getattr(t, "_numpy", None)
    if numpy_view is not None:
        a = numpy_view()
        return a if isinstance(a, np.ndarray) else np.asarray(a)
    return np.asarray(t)


def _json_float(x: float) -> float | str:
    if math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def fingerprint_array(a: np.ndarray, with_stats: bool = True) -> tuple[str, dict[str, Any] | None]:
    """``(fingerprint, stats)`` of a NumPy array: the native kernel when built, else NumPy."""
    name = dtype_name(a.dtype)
    k = native.kernel() if a.dtype.kind in "fiub" or name in native.DTYPE_CODES else None
    if k is None or a.dtype.kind == "c" or not a.flags.c_contiguous and a.ndim > 16:
        fp, st = _np_fingerprint_and_stats(a)
        return fp, st if with_stats else None
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    code = name if with_stats and name in native.DTYPE_CODES else None
    sums, st, counts = k.run(a.ctypes.data, a.nbytes, code) if a.nbytes else (np.zeros(0, np.int64), None, (0, 0))
    fp = finish_fingerprint(name, tuple(a.shape), a.nbytes, sums)
    if not with_stats:
        return fp, None
    if st is None:  # no statistics from the kernel for this dtype, or an empty array
        return fp, _np_fingerprint_and_stats(a)[1]
    n = a.size
    return fp, {"norm": _json_float(math.sqrt(st[1]) if st[1] >= 0 else st[1]), "min": _json_float(st[2]),
                "max": _json_float(st[3]), "mean": _json_float(st[0] / n), "nan": int(counts[0]), "inf": int(counts[1])}


def fingerprint_and_stats(t: Any, with_stats: bool = True) -> tuple[str, dict[str, Any] | None]:
    """``(fingerprint, stats)`` of a TF tensor or variable (or a NumPy array)."""
    return fingerprint_array(host_array(t), with_stats)


def fingerprint(t: Any) -> str:
    """Exact-bit fingerprint of a TF tensor: equal to ``trace.fingerprint.fingerprint`` of the same bits."""
    return fingerprint_and_stats(t, with_stats=False)[0]
