"""Parse untrusted JSON from a trace with its nesting depth bounded before parsing.

Python's ``json`` recurses once per nesting level, so a file nested 100,000 deep raises
``RecursionError`` (not ``ValueError``) and, below the recursion limit, yields objects that
later code may recurse on again. ``loads_bounded`` measures the depth first (strings
removed, then the running count of brackets) and refuses anything deeper than asked, as
well as the non-standard constants ``NaN``/``Infinity`` that strict JSON writers never emit.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable

import numpy as np

from reprobisect.errors import TraceError

__all__ = ["MAX_DEPTH", "depth", "is_int", "loads_bounded"]

MAX_DEPTH = 64
"""Deepest nesting a manifest or a steps.jsonl line may have (real ones stay under 10)."""

def is_int(x: Any) -> bool:
    """A JSON integer as Python parses it: an ``int`` that is not a ``bool`` (``true`` is no step 1)."""
    return isinstance(x, int) and not isinstance(x, bool)


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)


def depth(data: bytes) -> int:
    """Deepest bracket nesting of JSON ``data`` (UTF-8; exact for valid JSON, a bound
    otherwise). Works on bytes: no byte of a multi-byte UTF-8 character is a bracket or
    a quote, so a bracket is structural exactly when an even number of unescaped quotes
    precede it."""
    b = np.frombuffer(data, dtype=np.uint8)
    quotes = np.flatnonzero(b == ord('"'))
    if quotes.size:
        after_backslash = quotes[(quotes > 0) & (b[np.maximum(quotes - 1, 0)] == ord("\\"))]
        if after_backslash.size > 10_000:  # many escaped quotes: let the regex find the strings
            return _depth_of_brackets(np.frombuffer(_STRING.sub(b"", data), dtype=np.uint8), np.zeros(0, np.int64))
        escaped = [q for q in after_backslash.tolist() if _escaped(data, q)]
        if escaped:
            quotes = np.setdiff1d(quotes, np.asarray(escaped, dtype=quotes.dtype), assume_unique=True)
    return _depth_of_brackets(b, quotes)


def _escaped(data: bytes, q: int) -> bool:
    """Whether the quote at ``q`` is escaped: an odd run of backslashes before it."""
    i = q - 1
    while i >= 0 and data[i] == 0x5C:
        i -= 1
    return (q - 1 - i) % 2 == 1


def _depth_of_brackets(b: np.ndarray, quotes: np.ndarray) -> int:
    idx = np.flatnonzero((b == ord("[")) | (b == ord("{")) | (b == ord("]")) | (b == ord("}")))
    if quotes.size:
        idx = idx[np.searchsorted(quotes, idx) % 2 == 0]  # outside strings
    if idx.size == 0:
        return 0
    sel = b[idx]
    steps = np.where((sel == ord("[")) | (sel == ord("{")), 1, -1).astype(np.int32)
    return int(np.cumsum(steps).max())


def _no_constant(name: str) -> Any:
    raise ValueError(f"non-standard constant {name}")


def loads_bounded(raw: bytes | str, *, max_depth: int = MAX_DEPTH,
                  object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None) -> Any:
    """``json.loads`` of UTF-8 ``raw`` nested at most ``max_depth`` deep.

    Raises ``TraceError`` ("is nested N deep, more than M") for too deep a document and
    ``ValueError`` for anything that is not strict JSON (including bad UTF-8).
    """
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else bytes(raw)
    if data.count(b"[") + data.count(b"{") > max_depth:
        d = depth(data)
        if d > max_depth:
            raise TraceError(f"is nested {d} deep, more than {max_depth}")
    text = data.decode("utf-8")
    try:
        return json.loads(text, parse_constant=_no_constant, object_pairs_hook=object_pairs_hook)
    except RecursionError:  # unreachable after the depth check; kept as a last guard
        raise TraceError(f"is nested more than {max_depth} deep") from None
