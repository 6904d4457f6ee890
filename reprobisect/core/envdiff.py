"""Differences between two environment records, split into numerics-relevant and info.

The environment record (``reprobisect.runners.environment.collect_environment``) is a
nested dict grouped by source. ``diff_environments`` flattens both sides to dotted key
paths (``determinism.cudnn_benchmark``, ``packages.torch.version``) and returns one
``EnvChange`` per path whose value differs, present on one side only included.

Every change is marked:

``numerics``  can change the numbers a run produces: package versions, torch/TF settings
              (dtype, autocast, compile mode, thread counts, CUDA/cuDNN, devices),
              determinism flags, numerics env vars, data hashes, the code revision.
``info``      worth showing but not a cause by itself: host name and platform, package
              import paths, interpreter path, cwd, git branch/root, argv.

Nothing is silently dropped: the record holds no timestamps or pids, so there is no
key that always differs. A host difference is shown (it often explains the rest, e.g.
another CPU), but as ``info``, after the numerics changes. Lists (devices) compare whole.
Pure: no framework import, no I/O. ``reprobisect.render.envs.format_changes`` says a list of changes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping

__all__ = ["ABSENT", "EnvChange", "INFO_PATHS", "category_of", "diff_environments"]

ABSENT = "(absent)"
"""The value shown for a key present on one side only."""

INFO_PATHS = (
    "host",
    "cwd",
    "python.executable",
    "python.prefix",
    "python.argv",
    "git.root",
    "git.branch",
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

    def __str__(self) -> str:
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


def diff_environments(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> list[EnvChange]:
    """The changes from ``a`` to ``b``: numerics changes first, then info, each in key order."""
    fa, fb = _flatten(a or {}), _flatten(b or {})
    changes = []
    for path in sorted(set(fa) | set(fb)):
        va, vb = fa.get(path, ABSENT), fb.get(path, ABSENT)
        if va == vb and (path in fa) == (path in fb):
            continue
        changes.append(EnvChange(path=path, a=va, b=vb, category=category_of(path)))
    changes.sort(key=lambda c: c.category != "numerics")
    return changes
