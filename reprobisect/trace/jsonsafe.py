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

__all__ = ["MAX_DEPTH", "depth", "loads_bounded"]

MAX_DEPTH = 64
"""Deepest nesting a manifest or a steps.jsonl line may have (real ones stay under 10)."""

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_OPEN = (ord("["), ord("{"))
_CLOSE = (ord("]"), ord("}"))


def depth(text: str) -> int:
    """Deepest bracket nesting of JSON ``text`` (exact for valid JSON, a bound otherwise)."""
    if text.count("[") + text.count("{") <= 1:
        return int("[" in text or "{" in text)
    b = np.frombuffer(_STRING.sub("", text).encode("utf-8", "surrogatepass"), dtype=np.uint8)
    idx = np.flatnonzero((b == _OPEN[0]) | (b == _OPEN[1]) | (b == _CLOSE[0]) | (b == _CLOSE[1]))
    if idx.size == 0:
        return 0
    sel = b[idx]
    steps = np.where((sel == _OPEN[0]) | (sel == _OPEN[1]), 1, -1).astype(np.int32)
    return int(np.cumsum(steps).max())


def _no_constant(name: str) -> Any:
    raise ValueError(f"non-standard constant {name}")


def loads_bounded(raw: bytes | str, *, max_depth: int = MAX_DEPTH,
                  object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None) -> Any:
    """``json.loads`` of UTF-8 ``raw`` nested at most ``max_depth`` deep.

    Raises ``TraceError`` ("is nested N deep, more than M") for too deep a document and
    ``ValueError`` for anything that is not strict JSON (including bad UTF-8).
    """
    text = raw.decode("utf-8") if isinstance(raw, (bytes, bytearray, memoryview)) else raw
    if text.count("[") + text.count("{") > max_depth:
        d = depth(text)
        if d > max_depth:
            raise TraceError(f"is nested {d} deep, more than {max_depth}")
    try:
        return json.loads(text, parse_constant=_no_constant, object_pairs_hook=object_pairs_hook)
    except RecursionError:  # unreachable after the depth check; kept as a last guard
        raise TraceError(f"is nested more than {max_depth} deep") from None
