"""One Triton kernel that reads each row of a tensor once for its fingerprint and statistics.

Why: on a GPU the batched path's torch ops (``batched_torch``) read every packed byte about
a dozen times (a widening multiply written out as int64 and summed, then float64 sum, norm,
NaN and Inf counts, min/max), and each is a launch. This kernel does all of it in one pass
per row and one launch per slot class: per row of ``LANES`` 32-bit lanes, the weighted lane
sum modulo 2**64 (exactly ``reprobisect.trace.fingerprint``'s row sum: integer arithmetic,
the same in any order) and, over the row's valid elements, the float64 sum, sum of squares,
min, max, NaN count and Inf count (min and max are NaN where the row holds a NaN, as
``torch.aminmax`` gives).

Used only where ``batched_torch`` finds it usable: a CUDA device with Triton importable
(CUDA builds of torch ship it), after a self-check on that device against the torch-op path
(``batched_torch.fused_ok``); anything else, or ``REPROBISECT_FP_TRITON=0``, keeps the
torch-op path, which gives the same fingerprints. ``REPROBISECT_FP_TRITON=1`` uses it on any
device, which on CPU means Triton's interpreter (``TRITON_INTERPRET=1``, set before Triton
is imported): how the tests run the kernel on a machine without a GPU.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch

__all__ = ["constexprs", "import_error", "mode", "rows"]

_BLOCK = 1024  # elements a program reads at a time (bounds its registers)
_kernel: Any = None
_import_error: str | None = None


def mode() -> str:
    """``REPROBISECT_FP_TRITON``: ``"off"`` (0), ``"on"`` (1: any device) or ``"auto"`` (CUDA)."""
    v = os.environ.get("REPROBISECT_FP_TRITON", "").strip()
    return "off" if v == "0" else ("on" if v == "1" else "auto")


def import_error() -> str | None:
    """Why the kernel cannot be built here (None: it can)."""
    _load()
    return _import_error


def _load() -> Any:
    global _kernel, _import_error
    if _kernel is not None or _import_error is not None:
        return _kernel
    try:
        from reprobisect.runners import triton_kernel
    except Exception as e:  # CPU builds of torch do not ship Triton
        _import_error = f"triton is not importable ({type(e).__name__}: {e})"
        return None
    _kernel = triton_kernel.rows
    return _kernel


def rows(lanes: torch.Tensor, values: torch.Tensor | None, width: int, weights: torch.Tensor, sums: torch.Tensor,
         stats: torch.Tensor | None, valid: torch.Tensor | None = None) -> None:
    """One launch over the rows of ``width`` lanes (a power of 2, at most the weights'
    length) of ``lanes`` (1-D int32, contiguous; a short last row reads as zero-padded): each
    row's weighted sum into ``sums`` (int64) and, with ``stats`` ((6, >= rows) float64, each
    row of it contiguous), the statistics of the same bytes as floats (``values``, 1-D):
    sum, sum of squares, min, max, NaN and Inf counts over the row's first ``valid[row]``
    elements (without ``valid``: every element of ``values`` in the row)."""
    kernel = _load()
    if kernel is None:
        raise RuntimeError(_import_error)
    n_lanes = lanes.numel()
    with_stats = stats is not None and values is not None
    es = values.element_size() if with_stats else 4
    # Triton launches on the current device and stream, not the tensors': a model spread over
    # GPUs in one process has tensors on others
    with torch.cuda.device(lanes.device) if lanes.is_cuda else contextlib.nullcontext():
        kernel[(-(-n_lanes // width),)](
            lanes, values if with_stats else lanes, weights, valid if valid is not None else lanes,
            sums, stats if with_stats else sums, stats.stride(0) if with_stats else 0, n_lanes,
            values.numel() if with_stats else 0, **constexprs(width, es, with_stats, valid is not None),
            enable_fp_fusion=False,  # no FMA contraction: the statistics are what the source says, on any GPU
        )


def constexprs(width: int, element_size: int, with_stats: bool, valid: bool) -> dict[str, Any]:
    """The kernel's compile-time arguments for rows of ``width`` lanes of elements of
    ``element_size`` bytes (one compiled variant per distinct set)."""
    epr = width * 4 // element_size if with_stats else 1
    return {"LANES": width, "EPR": epr, "BL": min(width, _BLOCK), "BE": min(epr, _BLOCK), "STATS": with_stats,
            "VALID": valid, "HALF": with_stats and element_size == 2}
