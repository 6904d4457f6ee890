"""Golden traces: record one with its noise band, judge a new run against it, version it with DVC.

A golden is a folder: ``trace/`` (the reference run's trace, full tensors at every recorded
step), ``noise.json`` (its noise band) and ``golden.json`` (the seal: the SHA-256 of
``noise.json`` and of the trace's manifest, which lists every trace file's SHA-256; a
golden whose band was edited is refused, not judged with). ``--update-golden`` replaces
only a folder that is verifiably a golden (or empty, or new): never the user's files.

``--update-golden`` runs the reference command ``noise_runs`` times; the band holds, per
tensor (``kind/name``), the largest absolute and relative difference seen between run 0 and any repeat at any step. A later run is judged:

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

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reprobisect.core.compare import Comparison, Tolerance, compare_paths
from reprobisect.errors import ProbeError, ReproError, TraceError, UsageError
from reprobisect.trace.jsonsafe import is_int, loads_bounded
from reprobisect.trace.outdir import is_trace_dir
from reprobisect.trace.reader import Trace, read_trace

__all__ = ["SAFETY", "NoiseBand", "calibrate", "band_tolerance", "judge", "save_golden", "load_golden",
           "check_band", "check_golden_target", "foreign_reason", "dvc_publish", "dvc_fetch", "REMOTE_NAME",
           "GOLDEN_FILE", "GOLDEN_FORMAT"]

SAFETY = 4.0
"""Factor on the largest difference seen across the repeats (see the module docstring)."""

NOISE_FILE = "noise.json"
TRACE_DIR = "trace"
GOLDEN_FILE = "golden.json"
"""The seal: format marker, version, SHA-256 of ``noise.json`` and of the trace's ``manifest.json``."""
GOLDEN_FORMAT = "reprobisect-golden"
GOLDEN_VERSION = 1
_SEAL_MAX = 64 << 10
_NOISE_MAX = 64 << 20
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
        """Strict JSON: a figure no band can be claimed for (inf, NaN: not sized) is ``null``."""
        def f(x: float) -> float | None:
            return x if math.isfinite(x) else None

        return {"runs": self.runs, "safety": SAFETY,
                "tensors": {k: {"max_abs": f(a), "max_rel": f(r)} for k, (a, r) in sorted(self.tensors.items())}}

    @classmethod
    def from_json(cls, d: Any, where: str = "noise band") -> "NoiseBand":
        """Parse what ``to_json`` wrote; anything else is a one-line ``UsageError`` naming ``where``."""
        return _parse_band(d, where)


def _parse_band(d: Any, where: str) -> NoiseBand:
    if not isinstance(d, dict) or not set(d) <= {"runs", "safety", "tensors"}:
        raise UsageError(f"{where} must be an object with runs and tensors (got {_short(d)})")
    runs = d.get("runs", 1)
    if not is_int(runs) or runs < 1:
        raise UsageError(f"{where}: 'runs' must be an integer >= 1 (got {_short(runs)})")
    tensors = d.get("tensors", {})
    if not isinstance(tensors, dict):
        raise UsageError(f"{where}: 'tensors' must be an object (got {_short(tensors)})")
    out: dict[str, tuple[float, float]] = {}
    for k, v in tensors.items():
        if "/" not in k or not isinstance(v, dict) or set(v) != {"max_abs", "max_rel"}:
            raise UsageError(f"{where}: tensor {_short(k)} must be kind/name: {{max_abs, max_rel}} (got {_short(v)})")
        out[k] = (_figure(v["max_abs"], where, k, "max_abs"), _figure(v["max_rel"], where, k, "max_rel"))
    return NoiseBand(runs=runs, tensors=out)


def _figure(x: Any, where: str, key: str, name: str) -> float:
    """A band figure: a finite number >= 0, or null (no band claimed: read as infinite, never applied)."""
    if x is None:
        return math.inf
    try:
        f = float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else math.nan
    except OverflowError:
        f = math.inf
    if not math.isfinite(f) or f < 0:
        raise UsageError(f"{where}: {name} of tensor {_short(key)} must be a finite number >= 0 or null "
                         f"(got {_short(x)})")
    return f


def _short(x: Any) -> str:
    try:
        text = repr(x)
    except ValueError:  # an integer too long to print
        return "a number too large to print"
    return text if len(text) <= 60 else text[:57] + "..."


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


def judge(golden: Path, trace: str, *, verify: bool = True) -> tuple[str, Comparison, NoiseBand]:
    """``(tier, comparison, band)`` of a new run's ``trace`` against the golden folder
    (``verify``: check every file of the golden's trace first; see ``load_golden``)."""
    g, band = load_golden(golden, verify=verify)
    exact = compare_paths(g, trace, tolerance=Tolerance(mode="bitwise"), allow_incomplete=True)
    if exact:
        return "bitwise", exact, band
    if not band.tensors:
        return "diverged", exact, band
    banded = compare_paths(g, trace, tolerance=band_tolerance(band), allow_incomplete=True)
    return ("within-noise" if banded else "diverged"), banded, band


def foreign_reason(golden: Path) -> str | None:
    """Why ``golden`` may not be written as a golden (None: it is new, an empty folder, or a golden we wrote).

    Ours: a folder holding only ``golden.json`` (with our format marker), ``noise.json`` and
    ``trace/``; or, as an earlier version wrote them, exactly ``noise.json`` (an object with
    ``tensors``) and ``trace/`` (a trace). Recognised by content, as ``-o`` recognises a trace.
    """
    g = Path(golden)
    if not g.exists() and not g.is_symlink():
        return None
    if not g.is_dir():
        return "exists and is not a folder"
    try:
        names = sorted(e.name for e in g.iterdir())
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    if not names:
        return None
    other = [n for n in names if n not in (GOLDEN_FILE, NOISE_FILE, TRACE_DIR)]
    if other:
        shown = ", ".join(other[:3]) + (f" and {len(other) - 3} more" if len(other) > 3 else "")
        return f"is a folder holding files a golden does not ({shown})"
    if GOLDEN_FILE in names and _seal_of(g) is not None:
        return None
    if names == [NOISE_FILE, TRACE_DIR] and is_trace_dir(g / TRACE_DIR) and _legacy_noise(g / NOISE_FILE):
        return None
    return "is a folder that is not a golden reprobisect wrote"


def check_golden_target(golden: Path) -> Path:
    """Refuse (one ``UsageError`` line, nothing touched) a golden path ``--update-golden`` may not replace."""
    why = foreign_reason(golden)
    if why is not None:
        raise UsageError(f"golden '{golden}' {why}; choose a new or empty folder, or move it away yourself "
                         "(nothing was touched)")
    return Path(golden)


def _legacy_noise(p: Path) -> bool:
    try:
        raw = loads_bounded(p.read_bytes()) if p.stat().st_size <= _NOISE_MAX else None
    except (OSError, ValueError, ReproError):
        return False
    return isinstance(raw, dict) and "tensors" in raw


def _sha256(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _seal(folder: Path) -> dict[str, Any]:
    return {"format": GOLDEN_FORMAT, "version": GOLDEN_VERSION,
            "noise_sha256": _sha256(folder / NOISE_FILE),
            "manifest_sha256": _sha256(folder / TRACE_DIR / "manifest.json")}


def _seal_of(golden: Path) -> dict[str, Any] | None:
    """``golden.json`` when it is a seal of ours (any version), else None."""
    p = golden / GOLDEN_FILE
    try:
        if not p.is_file() or p.stat().st_size > _SEAL_MAX:
            return None
        raw = loads_bounded(p.read_bytes())
    except (OSError, ValueError, ReproError):
        return None
    if not isinstance(raw, dict) or raw.get("format") != GOLDEN_FORMAT or not is_int(raw.get("version")) \
            or raw["version"] < 1:
        return None
    return raw


def _check_seal(golden: Path) -> None:
    """``golden.json`` matches ``noise.json`` and the trace's manifest (which lists every trace file's SHA-256)."""
    fix = "re-record it with bisect audit CONFIG --update-golden"
    seal = _seal_of(golden)
    if seal is None:
        what = "is not a golden seal" if (golden / GOLDEN_FILE).exists() else "is missing (an older reprobisect wrote it)"
        raise UsageError(f"golden '{golden}': {GOLDEN_FILE} {what}; {fix}")
    if seal["version"] > GOLDEN_VERSION:
        raise UsageError(f"golden '{golden}' was written by a newer reprobisect ({GOLDEN_FILE} version "
                         f"{seal['version']}); upgrade reprobisect or {fix}")
    for key, rel in (("noise_sha256", NOISE_FILE), ("manifest_sha256", f"{TRACE_DIR}/manifest.json")):
        want = seal.get(key)
        if not isinstance(want, str) or len(want) != 64:
            raise UsageError(f"golden '{golden}': {GOLDEN_FILE} has no valid '{key}'; {fix}")
        try:
            got = _sha256(golden / rel)
        except OSError as e:
            raise UsageError(f"golden '{golden}': cannot read {rel} ({e.strerror or e}); {fix}") from None
        if got != want:
            raise UsageError(f"golden '{golden}': {rel} does not match its seal in {GOLDEN_FILE} (edited or "
                             f"damaged since it was recorded); {fix}")


def _read_band(golden: Path) -> NoiseBand:
    p = golden / NOISE_FILE
    where = f"golden '{golden}': {NOISE_FILE}"
    try:
        if p.stat().st_size > _NOISE_MAX:
            raise UsageError(f"{where} is larger than {_NOISE_MAX >> 20} MiB; re-record it with --update-golden")
        raw = loads_bounded(p.read_bytes())
    except OSError as e:
        raise UsageError(f"{where} cannot be read ({e.strerror or e})") from None
    except (ValueError, ReproError) as e:
        raise UsageError(f"{where} is not strict JSON ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    return _parse_band(raw, where)


def _magnitudes(trace: Trace) -> dict[str, float]:
    """Per band key, the largest |x| the trace recorded for it (from its stats; scalars by value)."""
    out: dict[str, float] = {}

    def fold(key: str, m: float) -> None:
        out[key] = max(out.get(key, 0.0), m) if math.isfinite(m) else math.inf

    for step in trace:
        for r in step.records:
            lo, hi = r.stat("min"), r.stat("max")
            fold(f"{r.kind}/{r.name}", max(abs(lo), abs(hi)) if lo is not None and hi is not None else math.inf)
        for k, v in _scalars(step).items():
            fold(f"scalar/{k}", abs(v))
    return out


def check_band(band: NoiseBand, trace: Trace, where: str) -> None:
    """Refuse a band no repeat could have produced: a tensor the trace lacks, or a ``max_abs`` wider than
    twice the largest |x| of the tensor (|a - b| <= |a| + |b|, and repeats are alike)."""
    size = _magnitudes(trace)
    for key, (a, _) in sorted(band.tensors.items()):
        if key not in size:
            raise UsageError(f"{where}: the band names tensor {_short(key)}, which the golden's trace does not record")
        m = size[key]
        if math.isfinite(a) and math.isfinite(m) and a > 2.0 * m * (1 + 1e-9):
            raise UsageError(f"{where}: the band of tensor '{key}' (max_abs {a:.3g}) is wider than the tensor itself "
                             f"(largest |x| {m:.3g}); no repeat differs by that much")


def save_golden(golden: Path, traces: list[str]) -> NoiseBand:
    """Write the golden folder atomically: run 0's trace + the band from the repeats + the seal.

    Refuses (``UsageError``, nothing touched) a path that is neither new, empty nor a golden
    this tool wrote, and a band wider than the tensors it is for (the repeats did not repeat).
    """
    golden = check_golden_target(Path(golden))
    band = calibrate(traces)
    check_band(band, read_trace(traces[0]), f"cannot record golden '{golden}'")
    golden.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{golden.name}.tmp-", dir=golden.parent))
    old = golden.with_name(f".{golden.name}.old-{uuid.uuid4().hex[:12]}")
    try:
        shutil.copytree(traces[0], tmp / TRACE_DIR)
        (tmp / NOISE_FILE).write_text(json.dumps(band.to_json(), indent=1, allow_nan=False))
        (tmp / GOLDEN_FILE).write_text(json.dumps(_seal(tmp), indent=1) + "\n")
        if golden.exists():
            check_golden_target(golden)  # still ours (or empty) at the moment it is replaced
            golden.rename(old)
        tmp.rename(golden)
    except BaseException:
        if old.is_dir() and not golden.exists():
            old.rename(golden)  # put the previous golden back
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
    return band


def load_golden(golden: Path, *, verify: bool = True) -> tuple[str, NoiseBand]:
    """The golden's trace folder and its band, checked: a missing golden, a broken seal, a malformed
    or implausible band, or (``verify``) a damaged trace is one ``UsageError`` line naming the fix."""
    golden = Path(golden)
    if not (golden / TRACE_DIR).is_dir() or not (golden / NOISE_FILE).is_file():
        raise UsageError(f"golden '{golden}' is missing; record it with bisect audit CONFIG --update-golden")
    _check_seal(golden)
    band = _read_band(golden)
    try:
        trace = read_trace(golden / TRACE_DIR, verify=verify)
    except TraceError as e:
        raise UsageError(f"golden '{golden}': its trace is damaged ({e}); re-record it with --update-golden") from None
    check_band(band, trace, f"golden '{golden}': {NOISE_FILE}")
    return str(golden / TRACE_DIR), band


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
