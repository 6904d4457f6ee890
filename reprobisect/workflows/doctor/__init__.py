"""``bisect doctor``: the checks of the training-debugging guide on the user's unmodified command.

``run_doctor(argv, options, checks=...)`` runs the command through the same probe path as
``bisect capture`` (the launcher and its recorder; nothing in the script changes) and
reads the trace; it imports no ML framework. The checks that observe one run (``finite``,
``update``, ``contract``, ``modes``, ``input``, ``memory``) share one recording at full detail that
stops at the first NaN/Inf (with the recorder's ``memory`` switch when ``memory`` runs);
``overfit`` records a second, sentinel-detail run with the recorder's ``overfit`` switch
(one batch repeated, dropout and weight decay off); ``repro`` runs the command twice and
compares (``reprobisect.workflows.repro``). It returns a ``Diagnosis``: every ``Finding``,
most important first (``render.doctor`` prints it).

Frameworks: every check runs on PyTorch (and Lightning, which drives PyTorch). On a
TensorFlow/Keras run (``FRAMEWORK_CHECKS``) ``finite``, ``update`` and ``repro`` run on
the TensorFlow recorder's trace; the others read what only the PyTorch recorder records,
so they are reported in ``Diagnosis.not_applicable`` and as an ``info`` "not run" finding,
never as a pass.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from reprobisect.core.options import ProbeOptions
from reprobisect.errors import UsageError
from reprobisect.trace.reader import Trace
from reprobisect.workflows.doctor.contract import check_contract, loss_findings
from reprobisect.workflows.doctor.finite import check_finite, first_nonfinite
from reprobisect.workflows.doctor.input import check_input
from reprobisect.workflows.doctor.memory import check_memory
from reprobisect.workflows.doctor.model import CHECKS, Diagnosis, Finding, ranked
from reprobisect.workflows.doctor.modes import check_modes
from reprobisect.workflows.doctor.overfit import DEFAULT_OVERFIT_STEPS, check_overfit
from reprobisect.workflows.doctor.repro import check_repro
from reprobisect.workflows.doctor.run import ended_early, record_run
from reprobisect.workflows.doctor.update import check_update

__all__ = ["CHECKS", "DEFAULT_OVERFIT_STEPS", "DEFAULT_STEPS", "Diagnosis", "FRAMEWORK_CHECKS", "Finding",
           "parse_checks", "run_doctor"]

DEFAULT_STEPS = 10
"""Optimizer steps the doctor records when ``--steps`` is not given: enough for a loss to
move (or visibly not), and for a NaN a few batches in."""
_SINGLE = ("finite", "update", "contract", "modes", "input", "memory")
FRAMEWORK_CHECKS = {"torch": CHECKS, "tensorflow": ("finite", "update", "repro")}
"""The checks that run on each framework's trace (Lightning runs on the PyTorch recorder)."""
_TF_WHY = {"overfit": "repeating a batch and switching dropout/weight decay off is done by the PyTorch recorder only",
           "contract": "it reads the PyTorch loss graph (broadcasts, softmax into a loss on logits)",
           "modes": "it reads PyTorch's train()/eval() flags of dropout and batch-norm modules",
           "input": "the TensorFlow recorder does not time the input pipeline",
           "memory": "the memory figures are recorded by the PyTorch recorder only"}


def parse_checks(names: Sequence[str] | None) -> tuple[str, ...]:
    """The checks to run (all, in priority order, when none is named); an unknown name is a
    ``UsageError`` naming the valid ones."""
    if not names:
        return CHECKS
    wanted = []
    for raw in names:
        for n in str(raw).split(","):
            n = n.strip()
            if n not in CHECKS:
                raise UsageError(f"unknown check '{n}'; the checks are: {', '.join(CHECKS)}")
            if n not in wanted:
                wanted.append(n)
    return tuple(c for c in CHECKS if c in wanted)


def run_doctor(argv: Sequence[str], options: ProbeOptions, *, checks: Sequence[str] | None = None,
               cwd: str | os.PathLike | None = None, overfit_steps: int = DEFAULT_OVERFIT_STEPS) -> Diagnosis:
    """Run the ``checks`` (default: all) on ``argv`` and return the ranked ``Diagnosis``.

    ``options.out`` (``-o``): the traces are kept there (``run/``, ``overfit/``,
    ``first-nonfinite/``, ``repro/``); without it they are removed at the end.
    ``overfit_steps``: optimizer steps of the fixed-batch run.
    """
    argv = list(argv)
    if not argv:
        raise UsageError("give the training command after --, e.g. bisect doctor -- python train.py")
    if isinstance(overfit_steps, bool) or not isinstance(overfit_steps, int) or overfit_steps < 2:
        raise UsageError(f"--overfit-steps takes a whole number >= 2 (got {overfit_steps!r})")
    todo = parse_checks(checks)
    t0 = time.monotonic()
    out = Path(options.out) if options.out is not None else None
    scratch = None if out is not None else Path(tempfile.mkdtemp(prefix="reprobisect-doctor-"))
    base = out if out is not None else scratch
    findings: list[Finding] = []
    kept: dict[str, str] = {}
    frame: list[str | None] = [None]
    try:
        if any(c in todo for c in _SINGLE):
            findings += _single_run(argv, options, todo, base, cwd, kept, frame)
        if "overfit" in todo and frame[0] != "tensorflow":
            findings += _overfit_run(argv, options, base, cwd, kept, overfit_steps, frame, quiet_crash=bool(findings))
        if "repro" in todo:
            ended = any(f.evidence.get("outcome") not in (None, "ok") for f in findings if f.severity == "error")
            findings += check_repro(argv, options, out=out / "repro" if out else None,
                                    cwd=str(cwd) if cwd else None, quiet_crash=ended)
            if out is not None:
                kept["repro"] = str(out / "repro")
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    findings = _clearing_cross_check(_weight_decay_cross_check(findings))
    skipped: dict[str, str] = {}
    if frame[0] == "tensorflow":
        skipped = {c: _TF_WHY[c] for c in todo if c not in FRAMEWORK_CHECKS["tensorflow"]}
        findings = [f for f in findings if f.check not in skipped]
        findings += [Finding(c, "info", f"not run on a TensorFlow run: {why}", {"framework": "tensorflow"}, "")
                     for c, why in skipped.items()]
    return Diagnosis(findings=ranked(findings), checks=todo, command=tuple(argv), steps=options.steps,
                     traces=kept if out is not None else {}, wall_s=round(time.monotonic() - t0, 3),
                     framework=frame[0], not_applicable=skipped)


def _weight_decay_cross_check(findings: list[Finding]) -> list[Finding]:
    """Diverging updates in the run, and a fixed-batch run whose loss falls once weight decay
    is off: the weight decay is named as the likely cause (in the ``update`` finding)."""
    upd = next((f for f in findings if f.check == "update" and "loss_growth" in f.evidence), None)
    fit = next((f for f in findings if f.check == "overfit" and f.severity == "info"), None)
    wd = (fit.evidence.get("weight_decay_zeroed") or {}) if fit is not None else {}
    losses = [v for v in ((fit.evidence.get("table") or {}).get("loss") or []) if isinstance(v, (int, float))] \
        if fit is not None else []
    if upd is None or not wd or len(losses) < 2 or not losses[-1] < losses[0]:
        return findings
    new = replace(upd, cause=upd.cause + f"; with weight decay switched off (it was "
                  f"{', '.join(f'{v:g}' for v in wd.values())}) the fixed-batch run's loss falls ({losses[0]:.4g} -> "
                  f"{losses[-1]:.4g}): the weight decay is the likely cause",
                  evidence={**upd.evidence, "weight_decay": wd},
                  next="lower weight_decay (typical: 1e-4..1e-1); lr x weight_decay must stay well below 1")
    return [new if f is upd else f for f in findings]


def _clearing_cross_check(findings: list[Finding]) -> list[Finding]:
    """Gradients cleared wrongly (never, before the step, inside accumulation: an ``update``
    finding of ``workflows.doctor.clearing``): the fixed-batch result is no evidence about the
    model until that is fixed, so ``overfit`` says so instead of "cannot fit" or "works"."""
    clearing = next((f for f in findings if f.check == "update" and "zero_grad_calls" in f.evidence), None)
    if clearing is None:
        return findings
    out = []
    for f in findings:
        if f.check == "overfit" and not f.cause.startswith("not checked"):
            f = replace(f, severity="info", cause="inconclusive: the gradients are cleared wrongly (see [update]), "
                        "so the fixed-batch run says nothing about the model until that is fixed",
                        evidence={**f.evidence, "fixed_batch_result": f.cause},
                        next="fix the gradient clearing first, then run the doctor again")
        out.append(f)
    return out


_STEPS_NEEDED = {"update": 2}
"""Steps a one-run check needs before "no problem" means anything (``update``: a parameter
change, and a step after a step for gradients never cleared)."""


def _short_run(findings: list[Finding], recorded: int, asked: int) -> list[Finding]:
    """A one-run check's "no problem" (info) when the script ended before the steps it needs:
    "not checked — the script ended after N step(s); it needs M" (``run.ended_early``)."""
    if recorded >= asked:
        return findings
    return [ended_early(replace(f, evidence={**f.evidence, "steps_run": recorded,
                                             "steps_asked": _STEPS_NEEDED[f.check]}))
            if f.check in _STEPS_NEEDED and f.severity == "info" and 0 < recorded < _STEPS_NEEDED[f.check] else f
            for f in findings]


def framework_of(trace: Trace) -> str:
    """``tensorflow`` when the TensorFlow recorder wrote ``trace``, else ``torch``."""
    env = trace.manifest.environment or {}
    return "tensorflow" if "tensorflow" in env and "torch" not in env else "torch"


def _single_run(argv: list[str], options: ProbeOptions, todo: tuple[str, ...], base: Path,
                cwd: str | os.PathLike | None, kept: dict[str, str], frame: list[str | None]) -> list[Finding]:
    """The findings of the checks that read one recorded run."""
    switches = ("memory",) if "memory" in todo else ()
    run = record_run(argv, options, base / "run", cwd=cwd, doctor=switches)
    kept["run"] = str(base / "run")
    findings = list(run.findings)
    if run.trace is None:
        return findings
    frame[0] = framework_of(run.trace)
    if "finite" in todo:
        found = check_finite(run.trace)
        if options.out is not None and first_nonfinite(run.trace.steps) is not None:
            found = [run.keep_first_bad(found[0], base / "first-nonfinite", kept)]
        elif options.out is None and found and found[0].severity != "info":
            f = found[0]
            found = [Finding(f.check, f.severity, f.cause, f.evidence,
                             f.next + "; `bisect doctor -o DIR --check finite` keeps the first bad batch and the "
                             "last healthy state")]
        findings += found
    for name, check in (("update", check_update), ("contract", check_contract), ("modes", check_modes),
                        ("input", check_input), ("memory", check_memory)):
        if name in todo:
            findings += check(run.trace)
    findings = _short_run(findings, len(run.trace.steps), options.steps)
    return loss_findings(run.trace, findings) if "update" in todo else findings


def _overfit_run(argv: list[str], options: ProbeOptions, base: Path, cwd: str | os.PathLike | None,
                 kept: dict[str, str], steps: int, frame: list[str | None], *, quiet_crash: bool) -> list[Finding]:
    """The fixed-batch run (sentinel detail, the recorder's ``overfit`` switch) and its finding."""
    t0 = time.monotonic()
    run = record_run(argv, options, base / "overfit", cwd=cwd, steps=steps, detail="sentinel",
                     state_every=10**9, doctor=("overfit",))
    wall = time.monotonic() - t0
    kept["overfit"] = str(base / "overfit")
    if run.trace is not None and frame[0] is None:
        frame[0] = framework_of(run.trace)
    if frame[0] == "tensorflow":
        return []
    if run.trace is None or not run.trace.steps:
        if quiet_crash:  # the one-run checks already report how the command ends
            return [Finding("overfit", "info", "inconclusive: the fixed-batch run ended without steps "
                            f"({run.outcome.status})", {"wall_s": round(wall, 2)}, "")]
        return run.findings
    return [ended_early(f) for f in check_overfit(run.trace, wall_s=wall, asked=steps)]
