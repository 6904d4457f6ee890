"""Names from traces and configs are data: ``printable`` shows them, never lets them act.

A module, tensor or check name comes from someone's model or config, and a trace may come
from anyone. Printed raw, ``\\x1b[2J`` in a name clears the user's screen, ``\\r`` or
``\\n`` forges a line of the answer, U+202E turns the text after it around, and most C0
controls cannot stand in XML 1.0 at all (a JUnit report with one is unreadable). So every
name that reaches a terminal, a JUnit file or an HTML page goes through one of these:

``printable(s)``        one name: every control character shown as its escape (``\\x1b``)
``printable_lines(s)``  a multi-line text the tool built: the same, but ``\\n`` kept

What is escaped: C0 controls (``\\x00``-``\\x1f``), DEL and C1 controls (``\\x7f``-``\\x9f``)
as ``\\xNN``; the bidirectional embeddings, overrides and isolates (U+202A-U+202E,
U+2066-U+2069), the line and paragraph separators (U+2028, U+2029), lone surrogates (they
arise from JSON ``\\ud800`` escapes and cannot be encoded) and the non-characters U+FFFE,
U+FFFF as ``\\uNNNN``. Everything else -- accents, CJK, emoji, astral characters -- is
kept as it is. The escapes are distinct per character, so two names that differ only in
their control characters still read differently. A backslash itself is kept (paths and
names with one read as they are), so a name spelled with the four characters ``\\x1b``
reads like one holding ESC: the aim is that nothing acts, not a reversible encoding.
"""

from __future__ import annotations

import re

__all__ = ["printable", "printable_lines"]

_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff\ufffe\uffff]")
_UNSAFE_BUT_NEWLINE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff\ufffe\uffff]")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group(0))
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def printable(s: object) -> str:
    """``s`` as text with every control character written as its escape (``\\x1b``, ``\\u202e``)."""
    return _UNSAFE.sub(_escape, s if isinstance(s, str) else str(s))


def printable_lines(s: object) -> str:
    """Like ``printable``, but line breaks (``\\n``) stay: for the multi-line texts the tool composes."""
    return _UNSAFE_BUT_NEWLINE.sub(_escape, s if isinstance(s, str) else str(s))
