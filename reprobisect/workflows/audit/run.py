"""``run_audit``: run every check of an audit config, judge each in four tiers, keep the history.

Tiers (``TIERS``): ``bitwise`` (identical), ``within-noise`` (differs, inside the accepted
band: a golden's calibrated noise band, or the check's ``tolerance``), ``diverged`` (the
first divergence: step · stage · tensor, rank where it applies), ``inconclusive`` (the
probe could not run: skip, timeout, infra, a crash, a missing golden — never a pass).
A check that fails or raises never stops the others. A diverged golden check is bisected
by itself (``bisect runs`` between the last good revision and the current one) when the
config names ``repo`` and a last good revision is known (``last_good:`` or the history).

Checks call the workflows' library functions (``run_repro``, ``run_seeds``, ``run_envs``,
``find_first_bad``). The night opens ONE executor (``--executor``, ``--jobs K``) that every
check borrows (``ProbeOptions.shared_executor``: one Ray start a night, not one per check),
and runs up to ``jobs`` checks at once; a check's ``env`` travels in its own options
(``ProbeOptions.env``) into its own probes' specs, never through this process's
environment, so checks running together cannot see each other's. Results keep the
config's order whatever order the checks end in.
"""

from __future__ import annotations

import math
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from reprobisect.core.options import ProbeOptions
from reprobisect.errors import ProbeError, ReproError, UsageError
from reprobisect.executors import executor_for, submit_all
from reprobisect.executors.retry import retry
from reprobisect.workflows.audit import golden as goldens
from reprobisect.workflows.audit import history as hist
from reprobisect.workflows.audit.config import AuditConfig, CheckSpec

__all__ = ["TIERS", "Culprit", "CheckResult", "AuditResult", "run_audit"]

TIERS = ("bitwise", "within-noise", "diverged", "inconclusive")
PASSING = ("bitwise", "within-noise")


@dataclass(frozen=True)
class Culprit:
    """The commit an automatic ``bisect runs`` named (or why it named none)."""

    commit: str | None
    subject: str = ""
    line: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"commit": self.commit, "subject": self.subject, "line": self.line}


@dataclass(frozen=True)
class CheckResult:
    """One check's verdict; truthy when it passed (bitwise or within-noise)."""

    name: str
    check: str
    verdict: str
    line: str
    command: tuple[str, ...]
    wall_s: float
    first_divergence: dict[str, Any] | None = None
    reason: str | None = None
    traces: dict[str, str] = field(default_factory=dict)
    envdiff: tuple[str, ...] = ()
    culprit: Culprit | None = None
    noise: dict[str, Any] | None = None
    trend: hist.CheckTrend | None = None

    def __post_init__(self) -> None:
        if self.verdict not in TIERS:
            raise ValueError(f"unknown audit verdict '{self.verdict}' (one of {', '.join(TIERS)})")

    def __bool__(self) -> bool:
        return self.verdict in PASSING


@dataclass(frozen=True)
class AuditResult:
    """A whole night: every check's result and the history; truthy when every check passed."""

    config: str
    name: str
    started: str
    wall_s: float
    checks: tuple[CheckResult, ...]
    history: tuple[hist.Night, ...] = ()
    revision: str | None = None
    updated: bool = False
    """``--update-golden``: goldens were recorded, nothing was judged."""
    results_dir: str = ""

    def __bool__(self) -> bool:
        return all(bool(c) for c in self.checks)

    @property
    def exit_code(self) -> int:
        return 0 if self else 1


# --------------------------------------------------------------------------- helpers


_DVC_LOCK = threading.Lock()
"""DVC commands on one repository (goldens pulled or pushed) never run at once."""
_BISECT_LOCK = threading.Lock()
"""Auto-bisections run one at a time: a ``bisect runs`` session holds its repository's lock,
so a second one started alongside would fail at once instead of waiting."""


def revision_of(folder: Path) -> str | None:
    """``git rev-parse HEAD`` of the repository holding ``folder`` (None: not a git checkout)."""
    try:
        p = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return (p.stdout.strip() or None) if p.returncode == 0 else None


def first_divergence(comp: Any) -> tuple[dict[str, Any] | None, str]:
    """The contract's ``first_divergence`` and its one line, from a ``Comparison``."""
    d = getattr(comp, "first", None)
    if d is None:
        structure = getattr(comp, "structure", "") or "the traces differ in structure"
        return None, f"traces differ: {structure}"
    tensor = f"{d.kind} '{d.name}'"
    rank = f" (rank {d.rank})" if d.rank is not None else ""
    size = f" (max abs {d.diff.max_abs:.3g})" if d.diff.max_abs is not None else ""
    fd = {"step": d.step, "stage": d.kind, "tensor": tensor, "rank": d.rank}
    return fd, f"first divergence at step {d.step} · {d.kind} · {tensor}{rank}{size}"


def _close(comps: Any) -> bool:
    """Whether any comparison agreed only within tolerance (some record ``close``, not identical)."""
    return any(s.close for c in comps for s in getattr(c, "per_step", ()))


def _agreeing(name: str, kind: str, comps: Any, tol_text: str) -> tuple[str, str, dict[str, Any] | None]:
    if _close(comps):
        return "within-noise", f"agree within tolerance ({tol_text})", {"tolerance": tol_text}
    return "bitwise", "identical", None


# --------------------------------------------------------------------------- checks


def _options(base: ProbeOptions, spec: CheckSpec, out: Path, **kw: Any) -> ProbeOptions:
    if spec.check == "envs" or (spec.tolerance is not None and spec.tolerance.mode != "bitwise"):
        # a value tolerance needs the tensors to tell close from diverged (stats alone cannot)
        kw.setdefault("full_steps", tuple(range(spec.steps + 1)))
    return replace(base, steps=spec.steps, timeout=spec.timeout if spec.timeout is not None else base.timeout,
                   detail=spec.detail, tolerance=spec.tolerance, keep=True, out=out, quiet=True,
                   env={**base.env, **spec.env}, **kw)


def _repro(spec: CheckSpec, opts: ProbeOptions, cwd: Path) -> dict[str, Any]:
    from reprobisect.workflows.repro import run_repro

    r = run_repro(list(spec.command), opts, runs=spec.runs, cwd=cwd)
    traces = {"a": r.runs[0].trace_dir or "", "b": r.runs[-1].trace_dir or ""}
    if r:
        verdict, line, noise = _agreeing(spec.name, "repro", r.comparisons, r.tolerance.describe())
        return {"verdict": verdict, "line": f"{len(r.runs)} runs {line}", "noise": noise, "traces": traces}
    i, comp = r.first_difference
    fd, line = first_divergence(comp)
    traces["b"] = r.runs[i].trace_dir or ""
    if _unmeasured(comp):
        return _inconclusive(f"run {i} differs from run 0", comp, traces)
    return {"verdict": "diverged", "line": f"run {i} differs from run 0: {line}", "first_divergence": fd, "traces": traces,
            "envdiff": [str(e) for e in comp.env if not e.info]}


def _seeds(spec: CheckSpec, opts: ProbeOptions, cwd: Path) -> dict[str, Any]:
    from reprobisect.workflows.seeds import run_seeds

    m = run_seeds(list(spec.command), opts, seeds=spec.seeds, cwd=cwd)
    traces = {"a": m.runs[0].trace_dir or "", "b": m.runs[1].trace_dir or ""}
    if m:
        changed = ", ".join(c.component for c in m.components if c.status == "changed") or "none"
        return {"verdict": "bitwise", "line": f"every component follows the seed as it should (changed with the seed: {changed})",
                "traces": traces}
    fd, where = first_divergence(m.first_divergence) if m.first_divergence is not None else (None, "")
    return {"verdict": "diverged", "line": "; ".join(m.flags) + (f" ({where})" if fd else ""), "first_divergence": fd,
            "traces": traces}


def _envs(spec: CheckSpec, opts: ProbeOptions, cwd: Path) -> dict[str, Any]:
    from reprobisect.workflows.envs import run_envs

    r = run_envs(list(spec.command), opts, a=spec.a, b=spec.b, cwd=cwd)
    traces = {"a": r.runs[0].trace_dir or "", "b": r.runs[1].trace_dir or ""}
    envdiff = [str(e) for e in r.env_changes if not e.info]
    if r:
        verdict, line, noise = _agreeing(spec.name, "envs", [r.comparison], r.comparison.tolerance.describe())
        return {"verdict": verdict, "line": f"{spec.a} and {spec.b} {line}", "noise": noise, "traces": traces,
                "envdiff": envdiff}
    if _unmeasured(r.comparison):
        return {**_inconclusive(f"{spec.a} and {spec.b} differ", r.comparison, traces), "envdiff": envdiff}
    fd, line = first_divergence(r.comparison)
    return {"verdict": "diverged", "line": line, "first_divergence": fd, "traces": traces, "envdiff": envdiff}


def _unmeasured(comp: Any) -> bool:
    """The comparison's only differences are bits nothing sized (``Comparison.verdict``)."""
    return getattr(comp, "verdict", "") == "inconclusive"


def _inconclusive(what: str, comp: Any, traces: dict[str, str]) -> dict[str, Any]:
    """An ``inconclusive`` check from an unmeasured comparison: as ``compare`` says it."""
    d = comp.first
    why = (f"{what} in bits at step {d.step} · {d.kind} · '{d.name}', size not measured (no tensor stored); "
           f"re-run with --full-steps {d.step}")
    return {"verdict": "inconclusive", "line": why, "reason": why, "traces": traces}


def _resume(spec: CheckSpec, opts: ProbeOptions, cwd: Path) -> dict[str, Any]:
    from reprobisect.workflows.resume import check_resume

    r = check_resume(list(spec.command), list(spec.resume_args), at=spec.at, options=opts, cwd=cwd)
    # named by role, never a/b: the resumed run's step 0 is step K of the others, so a report must
    # not plot them side by side as one pair
    traces = {s.role: s.trace for s in r.runs if s.trace}
    where = f"resumed after step {spec.at - 1}"
    if r.verdict == "bitwise":
        first, last = r.compared_steps  # from an older checkpoint's next step when the resume restarted there
        note = f"; {r.reason}" if r.reason else ""
        return {"verdict": "bitwise", "line": f"{where}, steps {first}..{last} continue the "
                f"uninterrupted run bitwise{note}", "traces": traces}
    if r.verdict == "diverged" and r.finding is not None:
        f = r.finding
        fd = {"step": f.step, "stage": f.component, "tensor": f.what, "rank": None}
        return {"verdict": "diverged", "line": f"{where}: first divergence at step {f.step} · {f.component} · "
                f"{f.what}", "first_divergence": fd, "traces": traces}
    return {"verdict": "inconclusive", "line": f"{where}: {r.reason}", "reason": r.reason, "traces": traces}


def _full(opts: ProbeOptions, spec: CheckSpec) -> ProbeOptions:
    # goldens keep every recorded step's full tensors: the noise band is sized from them
    return replace(opts, full_steps=tuple(range(spec.steps + 1)))


def _probe(spec: CheckSpec, opts: ProbeOptions, cwd: Path, n: int) -> list[Any]:
    from reprobisect.workflows.repro import spec_for

    tag = uuid.uuid4().hex[:6]
    specs = [spec_for(list(spec.command), opts, key=f"golden-{tag}-{i}", workdir=cwd) for i in range(n)]
    with executor_for(opts) as ex:
        return [retry(ex, f.result()) for f in submit_all(ex, specs)]  # a timeout or infra failure: once more


def _noise(band: goldens.NoiseBand) -> dict[str, Any]:
    """The band as the result document says it (non-finite figures as null: strict JSON)."""
    def f(x: float) -> float | None:
        return x if math.isfinite(x) else None

    return {"tensors": len(band.tensors), "max_rel": f(band.max_rel), "max_abs": f(band.max_abs), "runs": band.runs,
            "safety": goldens.SAFETY}


def _ended(r: Any) -> str:
    o = r.outcome
    return f"the run ended {o.status}" + (f": {o.detail}" if o.detail else "")


def _golden(spec: CheckSpec, opts: ProbeOptions, cfg: AuditConfig, history: list[hist.Night],
            revision: str | None) -> dict[str, Any]:
    assert spec.golden is not None
    fetched = bool(cfg.golden_remote and cfg.repo is not None)
    if fetched:
        with _DVC_LOCK:
            goldens.dvc_fetch(cfg.repo, spec.golden, cfg.golden_remote)  # type: ignore[arg-type]
    # a local golden was verified whole before the night began (_check_before); a pulled one is verified now
    gtrace, band = goldens.load_golden(spec.golden, verify=fetched)
    (run,) = _probe(spec, _full(opts, spec), cfg.folder, 1)
    if not run.outcome:
        if run.outcome.status.is_evidence:  # crashed / nonfinite: the code no longer trains as the golden did
            return {"verdict": "diverged", "line": _ended(run), "traces": {"a": gtrace}}
        return {"verdict": "inconclusive", "line": _ended(run), "reason": _ended(run), "traces": {"a": gtrace}}
    tier, comp, band = goldens.judge(spec.golden, run.trace_dir, verify=False)
    traces = {"a": gtrace, "b": run.trace_dir}
    envdiff = [str(e) for e in comp.env if not e.info]
    noise = _noise(band)
    if tier == "bitwise":
        return {"verdict": tier, "line": "identical to the golden", "traces": traces, "envdiff": envdiff}
    if tier == "within-noise":
        return {"verdict": tier, "line": f"differs from the golden within its noise band ({len(band.tensors)} tensors "
                f"calibrated from {band.runs} runs, x{goldens.SAFETY:g})", "traces": traces, "noise": noise, "envdiff": envdiff}
    fd, line = first_divergence(comp)
    out = {"verdict": "diverged", "line": f"{line} (outside the golden's noise band)" if band.tensors else line,
           "first_divergence": fd, "traces": traces, "envdiff": envdiff, "noise": noise if band.tensors else None}
    out["culprit"] = _bisect(spec, opts, cfg, history, revision, band)
    return out


def _bisect(spec: CheckSpec, opts: ProbeOptions, cfg: AuditConfig, history: list[hist.Night], revision: str | None,
            band: goldens.NoiseBand) -> Culprit | None:
    if cfg.repo is None or revision is None:
        return None
    good = cfg.last_good or hist.last_pass_revision(history, spec.name)
    if not good:
        return None
    from reprobisect.workflows.runs import RunsConfig, find_first_bad

    p = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{good}^{{commit}}"], cwd=cfg.repo,
                       capture_output=True, text=True, timeout=30)
    good_hash = p.stdout.strip()
    if p.returncode != 0 or not good_hash:
        return Culprit(None, line=f"auto-bisect could not run: last good revision '{good}' is not a commit of {cfg.repo}")
    if good_hash == revision:
        return Culprit(None, line="no commit since the last good revision: the change is not in the code "
                                  "(environment, data or hardware)")
    rc = RunsConfig(good=good, bad=revision, command=tuple(spec.command), repo=str(cfg.repo), cwd=str(cfg.folder),
                    check="match", env=dict(spec.env),
                    options=replace(opts, tolerance=goldens.band_tolerance(band), keep=False, out=None, full_steps=()))
    try:
        with _BISECT_LOCK:
            r = find_first_bad(rc)
    except ReproError as e:
        return Culprit(None, line=f"auto-bisect could not run: {e}")
    if r.first_bad is None or r.inconclusive:
        return Culprit(None, line=f"auto-bisect inconclusive: {r.inconclusive or r.reason}")
    c = r.first_bad
    return Culprit(c.hash, subject=c.subject, line=f"first bad commit {c.hash[:10]} {c.subject}".rstrip())


_KINDS = {"repro": _repro, "seeds": _seeds, "envs": _envs, "resume": _resume}


def _judged(spec: CheckSpec, judge: Callable[[], dict[str, Any]]) -> CheckResult:
    """``judge()``'s verdict as the check's result, timed. What it raises makes the check
    inconclusive with why: one check's failure or bug never stops the others, never a pass."""
    t0 = time.perf_counter()
    try:
        got = judge()
    except ReproError as e:  # a run that could not produce a trace, a missing golden, DVC failing
        got = {"verdict": "inconclusive", "line": str(e), "reason": str(e)}
    except Exception as e:  # noqa: BLE001
        why = f"internal error: {type(e).__name__}: {e}"
        got = {"verdict": "inconclusive", "line": why, "reason": why}
    return CheckResult(name=spec.name, check=spec.check, command=spec.command, wall_s=time.perf_counter() - t0,
                       verdict=got["verdict"], line=got["line"], first_divergence=got.get("first_divergence"),
                       reason=got.get("reason"), traces=got.get("traces") or {}, envdiff=tuple(got.get("envdiff") or ()),
                       culprit=got.get("culprit"), noise=got.get("noise"))


def _run_check(spec: CheckSpec, base: ProbeOptions, cfg: AuditConfig, out: Path, history: list[hist.Night],
               revision: str | None) -> CheckResult:
    opts = _options(base, spec, out / spec.name)
    if spec.check == "golden":
        return _judged(spec, lambda: _golden(spec, opts, cfg, history, revision))
    return _judged(spec, lambda: _KINDS[spec.check](spec, opts, cfg.folder))


def _record_golden(spec: CheckSpec, base: ProbeOptions, cfg: AuditConfig, out: Path) -> CheckResult:
    opts = _full(_options(base, spec, out / spec.name), spec)

    def record() -> dict[str, Any]:
        runs = _probe(spec, opts, cfg.folder, max(1, spec.noise_runs))
        bad = next((r for r in runs if not r.outcome), None)
        if bad is not None:
            raise UsageError(f"cannot record golden '{spec.name}': {_ended(bad)}")
        assert spec.golden is not None
        band = goldens.save_golden(spec.golden, [r.trace_dir for r in runs])
        if cfg.golden_remote and cfg.repo is not None:
            with _DVC_LOCK:
                goldens.dvc_publish(cfg.repo, spec.golden, cfg.golden_remote)
        kind = "bitwise-reproducible" if not band.tensors else f"noise band over {len(band.tensors)} tensors"
        return {"verdict": "bitwise", "line": f"golden recorded from {len(runs)} runs ({kind})",
                "noise": _noise(band), "traces": {"a": str(spec.golden / goldens.TRACE_DIR)}}

    return _judged(spec, record)


def _in_order(calls: list[Any], jobs: int) -> list[Any]:
    """Every call's value in the calls' order, up to ``jobs`` of them running at once."""
    if jobs <= 1 or len(calls) <= 1:
        return [c() for c in calls]
    with ThreadPoolExecutor(max_workers=min(jobs, len(calls)), thread_name_prefix="audit-check") as pool:
        futures = [pool.submit(c) for c in calls]
        return [f.result() for f in futures]


def _record_goldens(cfg: AuditConfig, opts: ProbeOptions, out: Path) -> list[CheckResult]:
    """``--update-golden``: record every golden once (checks sharing one golden: its first check records it)."""
    recorded: dict[Path, str] = {}
    calls: list[Any] = []
    for s in cfg.checks:
        if s.check != "golden":
            continue
        if s.golden in recorded:
            line = f"shares the golden recorded by '{recorded[s.golden]}'"
            calls.append(lambda s=s, line=line: CheckResult(name=s.name, check=s.check, command=s.command, wall_s=0.0,
                                                            verdict="bitwise", line=line))
            continue
        recorded[s.golden] = s.name  # type: ignore[index]
        calls.append(lambda s=s: _record_golden(s, opts, cfg, out))
    return _in_order(calls, opts.jobs)


def _check_before(cfg: AuditConfig, base: ProbeOptions, update_golden: bool) -> None:
    """Everything that would refuse the night, checked before any file or probe (a ``UsageError``: exit 2).

    Each check's probe options; the history (ours, adoptable, or a new path); with
    ``update_golden`` that every golden path may be replaced (new, empty or a golden we
    wrote), else that every golden on disk is sealed, its band plausible and its trace
    whole (``verify_trace``: each file's SHA-256). Goldens pulled from ``golden_remote`` are
    checked after the pull, inside their check.
    """
    for spec in cfg.checks:
        _options(base, spec, cfg.folder)
    hist.check_history(cfg.history_path)
    seen: set[Path] = set()
    for spec in cfg.checks:
        if spec.golden is None or spec.golden in seen:
            continue
        seen.add(spec.golden)
        if update_golden:
            goldens.check_golden_target(spec.golden)
        elif not cfg.golden_remote and spec.golden.exists():
            goldens.load_golden(spec.golden, verify=True)


def run_audit(cfg: AuditConfig, options: ProbeOptions | None = None, *, update_golden: bool = False,
              results_dir: Path | None = None) -> AuditResult:
    """Run every check of ``cfg`` (or, with ``update_golden``, record every golden) and keep the night.

    ``options``: the executor settings (``executor``, ``jobs``, its config); each check sets
    its own steps, timeout, detail and tolerance. Traces are kept under ``results_dir``
    (default ``.bisect-audit/<night>/`` beside the config). The night is appended to the
    history database in one transaction, under a night id of its own (not on ``update_golden``).
    What would refuse the night is a ``UsageError`` before any file is written (``_check_before``).
    """
    base = options or ProbeOptions()
    _check_before(cfg, base, update_golden)
    t0 = time.perf_counter()
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    stamp = started.replace(":", "").replace("+0000", "Z")
    out = Path(results_dir) if results_dir else cfg.folder / ".bisect-audit" / f"{stamp}-{uuid.uuid4().hex[:4]}"
    out.mkdir(parents=True, exist_ok=True)
    db = cfg.history_path
    key = str(cfg.path)
    # one executor for the whole night (one Ray start, one worktree pool), lent to every check
    try:
        ex = executor_for(replace(base, out=out / "probes", keep=True, shared_executor=None))
    except ProbeError as e:  # Ray unreachable, say: every check is inconclusive with the reason, still reported
        why = f"the {base.executor} executor could not start: {e}"
        down = tuple(CheckResult(name=s.name, check=s.check, command=s.command, wall_s=0.0, verdict="inconclusive",
                                 line=why, reason=why) for s in cfg.checks if not update_golden or s.check == "golden")
        if update_golden:
            return AuditResult(config=key, name=cfg.name, started=started, wall_s=time.perf_counter() - t0,
                               checks=down, updated=True, results_dir=str(out), history=tuple(hist.nights(db, key)))
        ex, results = None, list(down)
    revision = revision_of(cfg.repo or cfg.folder)
    if ex is not None:
        with ex:
            shared = replace(base, shared_executor=ex)
            if update_golden:
                checks = tuple(_record_goldens(cfg, shared, out))
                return AuditResult(config=key, name=cfg.name, started=started, wall_s=time.perf_counter() - t0,
                                   checks=checks, updated=True, results_dir=str(out),
                                   history=tuple(hist.nights(db, key)))
            past = hist.nights(db, key)
            results = _in_order([lambda s=s: _run_check(s, shared, cfg, out, past, revision) for s in cfg.checks],
                                base.jobs)
    hist.record_night(db, key, started, [hist.Night(started, r.name, r.check, revision, r.verdict, r.line, r.wall_s)
                                         for r in results])
    now = hist.nights(db, key)
    results = [replace(r, trend=hist.trend(now, r.name)) for r in results]
    return AuditResult(config=key, name=cfg.name, started=started, wall_s=time.perf_counter() - t0,
                       checks=tuple(results), history=tuple(now), revision=revision, results_dir=str(out))
