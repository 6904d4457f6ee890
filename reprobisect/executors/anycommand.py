"""The end of a probe whose command was not rewritten (a job script, torchrun, a Python
entry point that starts ranks): its process tree, its shards, its outcome.

Every process of such a probe carries the probe's token in its environment
(``bootstrap.ENV_PROBE``), even those torchrun starts in sessions of their own; ``tree_pids``
finds them all through ``/proc`` so a timeout (or the end of the command) leaves nothing
running. The outcome is judged from what the processes recorded (the flat trace, or one
shard per rank: ``judge_ranks``) and the command's exit status (``judge_flat``), and a
multi-rank trace gets its top manifest from ``assemble``.

Imports no ML framework.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import uuid
from pathlib import Path
from typing import Any

from reprobisect.core.outcome import Outcome, Status
from reprobisect.trace import ranks

__all__ = ["tree_pids", "signal_tree", "clear_trace", "read_shards", "judge_ranks", "judge_flat", "assemble",
           "PORT_IN_USE", "port_in_use"]


# --------------------------------------------------------------------------- the process tree


def tree_pids(token: str | None) -> list[int]:
    """Live processes (this user's) whose environment carries the probe ``token``."""
    if not token:
        return []
    from reprobisect.runners.claims import ENV_PROBE

    needle = f"{ENV_PROBE}={token}".encode()
    me = os.getpid()
    out = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            out.append(int(name))
    return out


def signal_tree(token: str | None, sig: int) -> int:
    """Send ``sig`` to every process of the probe; how many were signalled."""
    n = 0
    for pid in tree_pids(token):
        try:
            os.kill(pid, sig)
            n += 1
        except (ProcessLookupError, PermissionError):
            pass
    return n


def kill_tree(token: str | None) -> None:
    """SIGKILL every process left of the probe (torchrun's ranks in their own sessions included)."""
    signal_tree(token, signal.SIGKILL)


# --------------------------------------------------------------------------- the trace folder


def clear_trace(trace_dir: Path) -> str | None:
    """Make way for a new trace at ``trace_dir`` (a previous trace of a retried probe is
    replaced); the reason when something else is there (nothing is deleted then)."""
    from reprobisect.trace.outdir import is_trace_dir

    if not trace_dir.exists() and not trace_dir.is_symlink():
        return None
    if trace_dir.is_symlink() or not trace_dir.is_dir():
        return f"'{trace_dir}' exists and is not a trace folder"
    if any(trace_dir.iterdir()) and not is_trace_dir(trace_dir) and not (trace_dir / "ranks").is_dir():
        return f"'{trace_dir}' is a non-empty folder that is not a reprobisect trace (nothing was deleted)"
    trash = trace_dir.with_name(f".{trace_dir.name}.old-{uuid.uuid4().hex[:8]}")
    os.replace(trace_dir, trash)
    shutil.rmtree(trash, ignore_errors=True)
    return None


def _manifest(path: Path) -> dict[str, Any] | None:
    try:
        raw = json.loads((path / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    return raw if isinstance(raw, dict) else None


def read_shards(trace_dir: Path) -> dict[int, dict[str, Any] | None]:
    """The manifest of each rank's shard under ``trace_dir/ranks`` (None: unreadable)."""
    out: dict[int, dict[str, Any] | None] = {}
    d = trace_dir / "ranks"
    if not d.is_dir():
        return out
    for p in d.iterdir():
        m = re.fullmatch(r"rank-(\d+)", p.name)
        if m and p.is_dir():
            out[int(m.group(1))] = _manifest(p)
    return dict(sorted(out.items()))


def _shard_outcome(m: dict[str, Any] | None) -> Outcome | None:
    if m is None or m.get("status") == "incomplete" or not isinstance(m.get("outcome"), dict):
        return None
    try:
        return Outcome.from_json(m["outcome"])
    except (TypeError, ValueError):
        return None


# torchrun's error summary ("rank      : 1 (local_rank: 1)"), mp.spawn's ("process 1 terminated with ...")
_FAILING_RANK = re.compile(r"(?:\brank\s*:\s*(\d+)\s*\()|(?:[Pp]rocess (\d+) terminated)")


_PEER_FAILURE = re.compile(r"closed by peer|reset by peer|remote worker crash|remote process exited|peer.*(crash|fail)"
                           r"|Broken pipe|NCCL communicator was aborted|watchdog", re.I)


def _first_crash(hit: list[int], outs: dict[int, Outcome | None], times: dict[int, float]) -> list[int]:
    """``hit`` ordered: ranks that failed on their own before those whose collective broke
    because a peer had gone, then by when they crashed, then by rank."""
    def key(r: int) -> tuple[int, float, int]:
        o = outs[r]
        peer = bool(o is not None and _PEER_FAILURE.search(o.detail or ""))
        return (1 if peer else 0, times.get(r, float("inf")), r)

    return sorted(hit, key=key)


def judge_ranks(shards: dict[int, dict[str, Any] | None], rc: int, err: str,
                times: dict[int, float] | None = None) -> Outcome:
    """The probe's outcome from its ranks' shards and the command's exit status: the rank
    that crashed (or failed in the recorder) first names the crash (one whose collective
    only broke because a peer had gone comes after; then by the ``times`` the ranks noted,
    then the lowest rank); a rank killed before it sealed (torchrun tearing the group down)
    counts only when no rank crashed."""
    outs = {r: _shard_outcome(m) for r, m in shards.items()}
    world = max((int(((m or {}).get("extra") or {}).get("distributed", {}).get("world_size") or 0)
                 for m in shards.values()), default=0)
    for bad in (Status.CRASHED, Status.INFRA):
        hit = _first_crash([r for r, o in outs.items() if o is not None and o.status is bad], outs, times or {})
        if hit:
            o = outs[hit[0]]
            assert o is not None
            where = f" at step {o.step}" if o.step is not None else ""
            others = f"; rank(s) {_ranks(hit[1:])} failed after it" if hit[1:] else ""
            return Outcome(bad, detail=f"rank {hit[0]} {'crashed' if bad is Status.CRASHED else 'failed'}{where}: "
                                       f"{o.detail}{others}", step=o.step, traceback=o.traceback, returncode=rc)
    unsealed = [r for r, o in outs.items() if o is None]
    missing = [r for r in range(world) if r not in shards]
    done = not unsealed and not missing and all(o is not None and o.status is Status.OK for o in outs.values())
    if (rc != 0 and not done) or unsealed:
        m = _FAILING_RANK.search(err or "")
        who = f"rank {m.group(1) or m.group(2)} failed" if m else "a rank failed"
        return Outcome(Status.CRASHED, returncode=rc, detail=(
            f"the command exited with status {rc}: {who}" + (f"; rank(s) {_ranks(unsealed)} never sealed their shard"
                                                             if unsealed else "")))
    for st in (Status.NONFINITE, Status.NO_STEPS):
        hit = [r for r, o in outs.items() if o is not None and o.status is st]
        if hit:
            o = outs[hit[0]]
            assert o is not None
            return Outcome(st, detail=f"rank {hit[0]}: {o.detail}", step=o.step, returncode=rc)
    steps = sorted({int((m or {}).get("steps") or 0) for m in shards.values()})
    n = f"{steps[0]} step(s)" if len(steps) == 1 else f"{steps[0]}-{steps[-1]} step(s)"
    detail = f"recorded {n} on each of {len(shards)} rank(s)"
    if missing:
        detail += f"; rank(s) {_ranks(missing)} of world size {world} never stepped an optimizer (no shard)"
    if rc != 0:  # every rank sealed its steps: what the command did after them is not judged
        detail += f"; the command then exited with status {rc} (after the recording ended)"
    return Outcome(Status.OK, detail=detail, returncode=rc)


def _ranks(rs: list[int]) -> str:
    return ", ".join(str(r) for r in rs)


def judge_flat(sealed: Outcome | None, rc: int, err: str, unrecorded: list[dict[str, Any]]) -> Outcome:
    """The outcome of a wrapped command that wrote the flat trace (or none): the trace's
    sealed outcome decides once it holds its steps (the rest of a job script, cut short by
    ``--steps``, is not judged); else the exit status."""
    note = ""
    if unrecorded:
        note = (f"; {len(unrecorded)} other process(es) stepped an optimizer and were not recorded "
                f"(pid {', '.join(str(u.get('pid')) for u in unrecorded)}): the trace is the first one's")
    if sealed is not None:
        detail = sealed.detail
        if rc != 0 and sealed.status is Status.OK:
            detail += f"; the command then exited with status {rc} (after the recording ended)"
        d = sealed.to_json()
        d.update(detail=detail + note, returncode=rc)
        return Outcome(**d)
    last = _last_line(err)
    busy = _port_in_use(err) if rc != 0 else None
    if busy is not None:
        return Outcome(Status.INFRA, detail=busy, returncode=rc)
    if rc in (126, 127):
        return Outcome(Status.SKIP, detail=f"the command could not start a program (status {rc}): {last}", returncode=rc)
    if rc != 0:
        return Outcome(Status.CRASHED, detail=f"the command exited with status {rc} before any optimizer step: {last}",
                       returncode=rc)
    return Outcome(Status.NO_STEPS, returncode=rc, detail=(
        "the command ended without an optimizer step in any Python process it started (none imported torch, "
        "or none stepped an optimizer)" + note))


PORT_IN_USE = "was already in use (EADDRINUSE)"
"""Words of an ``infra`` outcome whose rendezvous port another process held (``port_in_use``)."""


def port_in_use(outcome: Outcome) -> bool:
    """Whether ``outcome`` is a rendezvous that could not bind its port: worth a retry alone."""
    return outcome.status is Status.INFRA and PORT_IN_USE in (outcome.detail or "")


_ADDR_IN_USE = re.compile(r"EADDRINUSE|[Aa]ddress already in use")
_PORT = re.compile(r"\bport[:= ]+(\d{2,5})\b")


def _port_in_use(err: str) -> str | None:
    """A rendezvous that could not bind its port (before any step): infra, not the code's crash.

    Two probes running at once (``--jobs``) with a port fixed on the command line
    (``--master_port``, ``--rdzv-endpoint``, ``MASTER_PORT`` set by the user) both bind it;
    one fails with ``EADDRINUSE``. That says nothing about the commit under test, so it must
    not count as a crash (a "bad" commit, then "flaky" on re-check)."""
    if not _ADDR_IN_USE.search(err or ""):
        return None
    m = _PORT.search(err or "")
    port = f" {m.group(1)}" if m else ""
    return (f"the rendezvous port{port} {PORT_IN_USE} before any optimizer step: another probe "
            "running at once (--jobs) or another job holds it. A port fixed in the command (--master_port, "
            "--rdzv-endpoint, MASTER_PORT) is kept as given: leave it out (torchrun --standalone, or the free "
            "MASTER_PORT each probe gets) or run one probe at a time (--jobs 1)")


def _last_line(text: str) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1].strip()[:300] if lines else ""


# --------------------------------------------------------------------------- the top manifest


def assemble(trace_dir: Path, *, command: list[str], outcome: Outcome) -> None:
    """Write the top manifest of a multi-rank trace (``trace.ranks.assemble``). A launcher's own empty flat trace
    (``mp.spawn``'s parent under the launcher) gives way to the ranks first."""
    for stray in ("steps.jsonl", "tensors", "state"):
        p = trace_dir / stray
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        elif p.exists():
            p.unlink()
    ranks.assemble(trace_dir, command=list(command), outcome=outcome.to_json())
