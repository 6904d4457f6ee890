"""The command's own output (stdout + stderr), kept bounded: ``output.log`` in the trace folder.

A training script's prints are often the first thing a user wants when a probe crashed,
but a chatty script can print gigabytes. ``BoundedOutput`` keeps the first ``KEEP_BYTES``
and the last ``KEEP_BYTES`` of everything written to it, with one marker line in between
that says how much was left out; memory and disk stay bounded whatever the script does.
``pump`` copies a child's pipes into it (and, for ``bisect capture``, to the terminal as
``git bisect run`` does) from reader threads.

``output.log`` is written next to the trace's files by the controller after the command
ended; it is not listed in the manifest (it is not evidence: nothing compares it), so
adding it keeps every trace valid, and a trace without one (older, or fetched without it)
is still a whole trace.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import BinaryIO

__all__ = ["OUTPUT_LOG", "KEEP_BYTES", "BoundedOutput", "pump"]

OUTPUT_LOG = "output.log"
"""File name of the command's output inside a trace folder."""
KEEP_BYTES = 1 << 20
"""Bytes kept from the start and from the end of the output (1 MiB each)."""


class BoundedOutput:
    """Everything written, bounded: the first ``head`` bytes, the last ``tail`` bytes, a marker."""

    def __init__(self, head: int = KEEP_BYTES, tail: int = KEEP_BYTES) -> None:
        self.head_limit = head
        self.tail_limit = tail
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0
        self._lock = threading.Lock()

    def write(self, data: bytes) -> None:
        with self._lock:
            self.total += len(data)
            room = self.head_limit - len(self._head)
            if room > 0:
                self._head += data[:room]
                data = data[room:]
            if data:
                self._tail += data
                if len(self._tail) > 2 * self.tail_limit:  # trim in batches: amortised O(1)
                    del self._tail[: len(self._tail) - self.tail_limit]

    @property
    def omitted(self) -> int:
        """Bytes left out between the kept head and tail."""
        with self._lock:
            return max(0, self.total - len(self._head) - min(len(self._tail), self.tail_limit))

    def getvalue(self) -> bytes:
        """The kept output: head, a marker line when something was left out, tail."""
        with self._lock:
            tail = bytes(self._tail[-self.tail_limit :]) if self.tail_limit else b""
            head = bytes(self._head)
            omitted = self.total - len(head) - len(tail)
        if omitted <= 0:
            return head + tail
        marker = (f"\n[reprobisect: {omitted} bytes of output left out here; kept the first {len(head)} "
                  f"and the last {len(tail)} bytes]\n").encode()
        return head + marker + tail

    def tail_text(self, n: int = 4096) -> str:
        """The last ``n`` bytes as text."""
        data = self.getvalue()
        return data[-n:].decode("utf-8", errors="replace")

    def save(self, path: str | os.PathLike) -> Path:
        """Write the kept output to ``path`` (replaced atomically)."""
        p = Path(path)
        tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}")
        tmp.write_bytes(self.getvalue())
        os.replace(tmp, p)
        return p


def pump(streams: list[tuple[BinaryIO, BinaryIO | None]], log: BoundedOutput,
         tail_bytes: int = 4096) -> tuple[list[threading.Thread], list[BoundedOutput]]:
    """Start one daemon thread per ``(pipe, echo)`` copying the pipe into ``log``, into a
    ``BoundedOutput`` of its last ``tail_bytes`` and, when ``echo`` is given, to it (live);
    returns the threads (join them once the command ended) and the per-stream tails
    (``.tail_text(tail_bytes)``)."""
    threads: list[threading.Thread] = []
    rings: list[BoundedOutput] = []
    for pipe, echo in streams:
        ring = BoundedOutput(head=0, tail=tail_bytes)
        rings.append(ring)

        def run(pipe: BinaryIO = pipe, echo: BinaryIO | None = echo, ring: BoundedOutput = ring) -> None:
            fd = pipe.fileno()
            while True:
                try:
                    data = os.read(fd, 65536)
                except OSError:
                    break
                if not data:
                    break
                log.write(data)
                ring.write(data)
                if echo is not None:
                    try:
                        echo.write(data)
                        echo.flush()
                    except (OSError, ValueError):
                        echo = None  # the terminal went away: keep logging
            try:
                pipe.close()
            except OSError:
                pass

        t = threading.Thread(target=run, name="probe-output", daemon=True)
        t.start()
        threads.append(t)
    return threads, rings


def echo_streams() -> tuple[BinaryIO | None, BinaryIO | None]:
    """This process's stdout and stderr as binary streams (None where there is none)."""
    out = getattr(sys.stdout, "buffer", None)
    err = getattr(sys.stderr, "buffer", None)
    return out, err
