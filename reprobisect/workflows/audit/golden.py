"""Golden traces: record one with its noise band, judge a new run against it, version it with DVC.

A golden is a folder: ``trace/`` (the reference run's trace, full tensors at every recorded
step) and ``noise.json`` (its noise band). ``--update-golden`` runs the reference command
``noise_runs`` times; the band holds, per tensor (``kind/name``), the largest absolute and
relative difference seen between run 0 and any repeat at any step. A later run is judged:

- ``bitwise``: every bit equal to the golden;
- ``within-noise``: bits differ, but every differing tensor is inside its band: elementwise
  ``|a - b| <= SAFETY * (max_abs of the tensor + max_rel of its stage * |b|)``; a tensor the
  repeats never moved gets its stage's relative band (``SAFETY * max_rel`` of the stage: the
  stage showed noise, the few repeats happened to miss this tensor), and a tensor of a stage
  that never showed noise has a zero band: any difference in it is a divergence;
- ``diverged``: anything else, with the first tensor outside its band.

The safety factor (4) covers that N repeats only sample the spread: the largest of 2
samples underestimates the largest of the next night, and rounding noise amplified
through a few steps varies by about 2x between runs (measured on examples/audit/train.py);
a real change of the code, data or environment moves
values by far more than rounding noise (measured in tests/test_audit.py: a noise of 1e-6 is
within-noise, a change of 1e-2 diverges).

DVC (``golden_remote:``): ``dvc add`` + ``dvc push`` on update, ``dvc pull`` before checking,
run as ``python -m dvc`` in the config's repository (``reprobisect.vcs.dvc`` is the probes'
data side; this module only versions goldens).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reprobisect.core.compare import Comparison, Tolerance, compare_paths
from reprobisect.errors import ProbeError, UsageError
from reprobisect.trace.reader import Trace, read_trace

__all__ = ["SAFETY", "NoiseBand", "calibrate", "band_tolerance", "judge", "save_golden", "load_golden",
           "dvc_publish", "dvc_fetch", "REMOTE_NAME"]

SAFETY = 4.0
"""Factor on the largest difference seen across the repeats (see the module docstring)."""

NOISE_FILE = "noise.json"
TRACE_DIR = "trace"
REMOTE_NAME = "reprobisect-golden"
"""The DVC remote name ``golden_remote:`` is registered under (in ``.dvc/config.local``)."""


@dataclass(frozen=True)
class NoiseBand:
    """Per tensor ``kind/name``: (largest abs, largest rel) difference seen across repeats."""

    runs: int
    tensors: dict[str, tuple[float, float]]

    @property
    def max_rel(self) -> float:
        return max((r for _, r in self.tensors.values()), default=0.0)

    @property
    def max_abs(self) -> float:
        return max((a for a, _ in self.tensors.values()), default=0.0)

    def to_json(self) -> dict[str, Any]:
        return {"runs": self.runs, "safety": SAFETY,
                "tensors": {k: {"max_abs": a, "max_rel": r} for k, (a, r) in sorted(self.tensors.items())}}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "NoiseBand":
        return cls(runs=int(d.get("runs", 1)),
                   tensors={k: (float(v["max_abs"]), float(v["max_rel"])) for k, v in (d.get("tensors") or {}).items()})


def _scalar(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _scalars(step: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in (step.scalars or {}).items():
        if isinstance(v, list):
            for i, x in enumerate(v):
                if _scalar(x) is not None:
                    out[k if len(v) == 1 else f"{k}[{i}]"] = float(x)
        elif _scalar(v) is not None:
            out[k] = float(v)
    return out


def _spread(ref: Trace, other: Trace, into: dict[str, tuple[float, float]]) -> None:
    """Fold the per-tensor differences of ``other`` against ``ref`` into ``into``."""
    import numpy as np

    def fold(key: str, a: float, r: float) -> None:
        a0, r0 = into.get(key, (0.0, 0.0))
        into[key] = (max(a0, a), max(r0, r))

    for sa in ref:
        sb = other.step(sa.step)
        if sb is None:
            raise ProbeError(f"a repeat of the reference has no step {sa.step}: the reference does not run the same steps twice")
        rb = sb.by_key()
        for ra in sa.records:
            b = rb.get(ra.key)
            if b is None or b.fingerprint == ra.fingerprint:
                continue
            x, y = ref.tensor(sa.step, ra), other.tensor(sb.step, b)
            key = f"{ra.kind}/{ra.name}"
            if x is None or y is None or x.shape != y.shape:
                fold(key, math.inf, math.inf)  # not sized: no band can be claimed for it
                continue
            xf, yf = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
            d = np.abs(xf - yf)
            amax = float(np.nanmax(d)) if d.size else 0.0
            rel = d / np.maximum(np.abs(xf), np.finfo(np.float64).tiny)
            fold(key, amax, float(np.nanmax(rel)) if d.size else 0.0)
        sx, sy = _scalars(sa), _scalars(sb)
        for k, v in sx.items():
            if not k.startswith(_JUDGED_SCALARS):
                continue  # timings and counters: compare never judges them
            if k in sy and sy[k] != v:
                d = abs(sy[k] - v)
                fold(f"scalar/{k}", d, d / abs(v) if v else math.inf)


_JUDGED_SCALARS = ("grad_norm", "lr", "scaler_scale")


def calibrate(traces: list[str]) -> NoiseBand:
    """The noise band of run 0 (``traces[0]``) from every repeat (``traces[1:]``)."""
    ref = read_trace(traces[0])
    band: dict[str, tuple[float, float]] = {}
    for t in traces[1:]:
        _spread(ref, read_trace(t), band)
    return NoiseBand(runs=len(traces), tensors=band)


def _glob_escape(key: str) -> str:
    return "".join(f"[{c}]" if c in "*?[]" else c for c in key)


def band_tolerance(band: NoiseBand) -> Tolerance:
    """Bitwise everywhere but the band's tensors, each allowed ``SAFETY`` x its largest seen |a-b|."""
    stage: dict[str, float] = {}
    for k, (_, r) in band.tensors.items():
        if math.isfinite(r):
            kind = k.split("/", 1)[0]
            stage[kind] = max(stage.get(kind, 0.0), r)
    rules: dict[str, tuple[float, float]] = {}
    for k, (a, _) in band.tensors.items():
        if math.isfinite(a):
            rules[_glob_escape(k)] = (a * SAFETY, stage.get(k.split("/", 1)[0], 0.0) * SAFETY)
    for kind, r in stage.items():  # a tensor of a noisy stage the repeats happened not to move
        rules[_glob_escape(kind) + "/*"] = (0.0, r * SAFETY)
    return Tolerance(mode="bitwise", overrides=rules)


def judge(golden: Path, trace: str) -> tuple[str, Comparison, NoiseBand]:
    """``(tier, comparison, band)`` of a new run's ``trace`` against the golden folder."""
    g, band = load_golden(golden)
    exact = compare_paths(g, trace, tolerance=Tolerance(mode="bitwise"), allow_incomplete=True)
    if exact:
        return "bitwise", exact, band
    if not band.tensors:
        return "diverged", exact, band
    banded = compare_paths(g, trace, tolerance=band_tolerance(band), allow_incomplete=True)
    return ("within-noise" if banded else "diverged"), banded, band


def save_golden(golden: Path, traces: list[str]) -> NoiseBand:
    """Write the golden folder atomically: run 0's trace + the band from the repeats."""
    band = calibrate(traces)
    golden = Path(golden)
    golden.parent.mkdir(parents=True, exist_ok=True)
    tmp = golden.with_name(f".{golden.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    shutil.copytree(traces[0], tmp / TRACE_DIR)
    (tmp / NOISE_FILE).write_text(json.dumps(band.to_json(), indent=1, allow_nan=True))
    old = golden.with_name(f".{golden.name}.old-{os.getpid()}")
    if golden.exists():
        golden.rename(old)
    tmp.rename(golden)
    shutil.rmtree(old, ignore_errors=True)
    return band


def load_golden(golden: Path) -> tuple[str, NoiseBand]:
    """The golden's trace folder and its band; a missing golden is a ``UsageError`` naming the fix."""
    golden = Path(golden)
    if not (golden / TRACE_DIR).is_dir() or not (golden / NOISE_FILE).is_file():
        raise UsageError(f"golden '{golden}' is missing; record it with bisect audit CONFIG --update-golden")
    return str(golden / TRACE_DIR), NoiseBand.from_json(json.loads((golden / NOISE_FILE).read_text()))


# --------------------------------------------------------------------------- DVC


def _dvc(repo: Path, *args: str) -> str:
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    p = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=repo, env=env, capture_output=True, text=True,
                       timeout=600)
    if p.returncode != 0:
        last = [ln for ln in (p.stderr or p.stdout).strip().splitlines() if ln.strip()][-1:] or ["(no output)"]
        raise ProbeError(f"dvc {' '.join(args[:2])} failed in '{repo}': {last[0].strip()}")
    return p.stdout


def _remote(repo: Path, remote: str) -> None:
    if not (repo / ".dvc").is_dir():
        raise UsageError(f"golden_remote needs a DVC repository at '{repo}'; run: cd {repo} && dvc init")
    url = remote
    if "://" not in remote and not os.path.isabs(remote):
        url = str((repo / remote).resolve())
    _dvc(repo, "remote", "add", "--local", "--force", REMOTE_NAME, url)


def dvc_publish(repo: Path, golden: Path, remote: str) -> None:
    """``dvc add`` the golden folder and ``dvc push`` it to ``remote`` (URL or folder)."""
    _remote(repo, remote)
    rel = os.path.relpath(golden, repo)
    _dvc(repo, "add", rel)
    _dvc(repo, "push", "--remote", REMOTE_NAME, rel + ".dvc")


def dvc_fetch(repo: Path, golden: Path, remote: str) -> None:
    """``dvc pull`` the golden folder from ``remote`` (its ``.dvc`` file must be in the repository)."""
    rel = os.path.relpath(golden, repo)
    if not (repo / (rel + ".dvc")).is_file():
        raise UsageError(f"golden '{rel}' is not versioned by DVC yet (no {rel}.dvc); run bisect audit CONFIG --update-golden")
    _remote(repo, remote)
    _dvc(repo, "pull", "--remote", REMOTE_NAME, rel + ".dvc")
