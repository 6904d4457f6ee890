"""Differences between two environment records, split into numerics-relevant and info.

The environment record (``reprobisect.runners.environment.collect_environment``) is a
nested dict grouped by source. ``diff_environments`` flattens both sides to dotted key
paths (``determinism.cudnn_benchmark``, ``packages.torch.version``) and returns one
``EnvChange`` per path whose value differs, present on one side only included.

Every change is marked:

``numerics``  can change the numbers a run produces: package versions, torch/TF settings
              (dtype, autocast, compile mode, thread counts, CUDA/cuDNN, devices),
              determinism flags, numerics env vars, data hashes.
``info``      provenance and launch context, worth showing but not a cause by itself: the
              git revision (commit, dirty, branch, root: the code's changes are what the
              traces show, a commit id changes no number), host name and platform, package
              import paths, interpreter path, cwd, argv.

A command line that differs (``python.argv``) stays ``info`` for the tolerance (the same
program with a path spelled otherwise is the same run) but is named apart
(``command_changes``): with other arguments the comparison is not like for like, which the
renderers say as a warning.

The data version (group ``data``: ``{"dvc": {FILE: {OUT: HASH}}}``, from the checkout's
DVC files) is flattened per DVC file: ``data.data/train.csv.dvc`` when the file declares
one output, ``data.dvc.lock:data/prepared`` per output otherwise; such a change reads
``data: data/train.csv.dvc md5 3f2a9c1e… -> 7b0d44e2…`` and comes first among the
numerics changes (a different dataset explains every tensor after it; ``data_changes``).

Nothing is silently dropped: the record holds no timestamps or pids, so there is no
key that always differs. A host difference is shown (it often explains the rest, e.g.
another CPU), but as ``info``, after the numerics changes. Lists (devices) compare whole.
Pure: no framework import, no I/O. ``reprobisect.render.envs.format_changes`` says a list of changes.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping

__all__ = ["ABSENT", "EnvChange", "INFO_PATHS", "COMMAND_PATHS", "category_of", "command_changes", "data_changes",
           "diff_environments"]

ABSENT = "(absent)"
"""The value shown for a key present on one side only."""

INFO_PATHS = (
    "host",
    "cwd",
    "python.executable",
    "python.prefix",
    "python.argv",
    "git",
    "packages.*.path",
    "torch.devices.*.memory_gib",
    "recorder",
    "probe",
    "tensorflow.keras.note",
    "tensorflow.keras.api.how",
    "keras.note",
    "keras.api.how",
    "distributed.rendezvous",
    "distributed.rank",
    "distributed.local_rank",
)
"""Key paths (``*`` matches one level; a prefix covers everything below it) marked ``info``."""

COMMAND_PATHS = ("python.argv",)
"""Key paths of the command line a run was started with (``command_changes``)."""


@dataclass(frozen=True)
class EnvChange:
    """One key path whose value differs between environment ``a`` and environment ``b``."""

    path: str
    """Dotted key path, e.g. ``determinism.cudnn_benchmark``."""
    a: Any
    """The value on side a (``ABSENT`` when the key is missing there)."""
    b: Any
    """The value on side b (``ABSENT`` when the key is missing there)."""
    category: str
    """``numerics`` (can change results) or ``info`` (context only)."""

    @property
    def numerics(self) -> bool:
        return self.category == "numerics"

    @property
    def info(self) -> bool:
        """Launch context (host, cwd, paths, placement), not something that changes numerics."""
        return self.category == "info"

    @property
    def key(self) -> str:
        return self.path

    @property
    def change(self) -> str:
        """``added`` / ``removed`` going from a to b, else ``changed``."""
        if self.a is ABSENT:
            return "added"
        return "removed" if self.b is ABSENT else "changed"

    @property
    def is_data(self) -> bool:
        """A change of the data version (a DVC-tracked output's hash)."""
        return self.path.startswith(_DATA)

    def __str__(self) -> str:
        if self.is_data:
            return _data_text(self.path[len(_DATA):], self.a, self.b)
        whole = self.path.rsplit(".", 1)[-1] in _WHOLE
        return f"{self.path}: {_show(self.a, whole)} -> {_show(self.b, whole)}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


_WHOLE = ("argv", "command", "orig_argv")
"""Keys whose values are shown whole: a command line's differing flag may be its last word."""


def _show(v: Any, whole: bool = False) -> str:
    if isinstance(v, str):
        return v if v == ABSENT else repr(v)
    return repr(v) if whole or not isinstance(v, (list, dict)) else _short(v)


_DATA = "data."
_HEX = re.compile(r"^[0-9a-f]{32}(\.dir)?$")


def _data_text(name: str, a: Any, b: Any) -> str:
    """``data: data/train.csv.dvc md5 3f2a9c1e… -> 7b0d44e2…`` (a folder's hash keeps ``.dir``)."""
    def h(v: Any) -> str:
        if not isinstance(v, str) or v == ABSENT:
            return str(v)
        return f"{v[:8]}…" + (".dir" if v.endswith(".dir") else "") if _HEX.match(v) else v

    md5 = all(isinstance(v, str) and (v == ABSENT or _HEX.match(v)) for v in (a, b))
    return f"data: {name} {'md5 ' if md5 else ''}{h(a)} -> {h(b)}"


def _data_view(data: Any, other: Any) -> dict[str, Any] | None:
    """The ``data`` group as {name: hash}: one entry per DVC file that declares one output on
    both sides (``FILE``), else one per output (``FILE:OUT``). None: not a data version record."""
    files = data.get("dvc") if isinstance(data, Mapping) else None
    if not isinstance(files, Mapping) or set(data) - {"dvc"}:
        return None
    theirs = other.get("dvc") if isinstance(other, Mapping) and isinstance(other.get("dvc"), Mapping) else {}
    out: dict[str, Any] = {}
    for f, outs in files.items():
        outs = outs if isinstance(outs, Mapping) else {"": outs}
        names = set(outs) | set(theirs.get(f) or {}) if isinstance(theirs.get(f), Mapping) else set(outs)
        if len(names) == 1 and "error" not in names:
            out[str(f)] = next(iter(outs.values()))
        else:
            out.update({f"{f}:{o}" if o else str(f): h for o, h in outs.items()})
    return out


def command_changes(changes: Iterable["EnvChange"]) -> list["EnvChange"]:
    """The changes of the command line among ``changes``: the runs had other arguments, so
    their comparison is not like for like (a warning, whatever the tolerance makes of it)."""
    return [c for c in changes if any(_matches(c.path, p) for p in COMMAND_PATHS)]


def data_changes(changes: Iterable["EnvChange"]) -> list["EnvChange"]:
    """The changes of the data version among ``changes`` (``EnvChange.is_data``)."""
    return [c for c in changes if c.is_data]


def _short(v: Any, limit: int = 120) -> str:
    s = repr(v)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(d, Mapping) and d:
        for k, v in d.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            out.update(_flatten(v, key))
    elif prefix:
        out[prefix] = d
    return out


def _matches(path: str, pattern: str) -> bool:
    parts, pat = path.split("."), pattern.split(".")
    if len(parts) < len(pat):
        return False
    return all(p == "*" or p == q for p, q in zip(pat, parts))


def category_of(path: str, info_paths: Iterable[str] = INFO_PATHS) -> str:
    """``info`` when ``path`` falls under one of ``info_paths``, else ``numerics``."""
    return "info" if any(_matches(path, p) for p in info_paths) else "numerics"


def _flat(env: Mapping[str, Any] | None, other: Mapping[str, Any] | None) -> dict[str, Any]:
    """``env`` flattened to key paths; the data version per DVC file (``_data_view``)."""
    env = dict(env or {})
    view = _data_view(env.get("data"), (other or {}).get("data"))
    if view is None:
        if env.get("data") is None and _data_view((other or {}).get("data"), None) is not None:
            env.pop("data", None)  # no DVC files on this side: the other side's files say "(absent)"
        return _flatten(env)
    del env["data"]
    return {**_flatten(env), **{_DATA + k: v for k, v in view.items()}}


def diff_environments(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> list[EnvChange]:
    """The changes from ``a`` to ``b``: data version changes first, then the other numerics
    changes, then info, each in key order."""
    fa, fb = _flat(a, b), _flat(b, a)
    changes = []
    for path in sorted(set(fa) | set(fb)):
        va, vb = fa.get(path, ABSENT), fb.get(path, ABSENT)
        if va == vb and (path in fa) == (path in fb):
            continue
        changes.append(EnvChange(path=path, a=va, b=vb, category=category_of(path)))
    changes.sort(key=lambda c: (c.category != "numerics", not c.is_data))
    return changes
