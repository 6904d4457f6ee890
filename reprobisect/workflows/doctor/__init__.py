"""``bisect doctor``: the checks of the training-debugging guide on the user's unmodified command.

``run_doctor(argv, options, checks=...)`` runs the command through the same probe path as
``bisect capture`` (the launcher and its recorder; nothing in the script changes) and
reads the trace; it imports no ML framework. The checks that observe one run (``finite``,
``update``, ``modes``, ``contract``) share one recording at full detail that stops at the first NaN/Inf;
``repro`` runs the command twice and compares (``reprobisect.workflows.repro``). It
returns a ``Diagnosis``: every ``Finding``, most important first (``render.doctor``
prints it).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Sequence

from reprobisect.core.options import ProbeOptions
from reprobisect.errors import UsageError
from reprobisect.workflows.doctor.finite import check_finite, first_nonfinite
from reprobisect.workflows.doctor.contract import check_contract
from reprobisect.workflows.doctor.modes import check_modes
from reprobisect.workflows.doctor.model import CHECKS, Diagnosis, Finding, ranked
from reprobisect.workflows.doctor.repro import check_repro
from reprobisect.workflows.doctor.run import record_run
from reprobisect.workflows.doctor.update import check_update

__all__ = ["CHECKS", "DEFAULT_STEPS", "Diagnosis", "Finding", "parse_checks", "run_doctor"]

DEFAULT_STEPS = 10
"""Optimizer steps the doctor records when ``--steps`` is not given: enough for a loss to
move (or visibly not), and for a NaN a few batches in."""
_SINGLE = ("finite", "update", "modes", "contract")


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
               cwd: str | os.PathLike | None = None) -> Diagnosis:
    """Run the ``checks`` (default: all) on ``argv`` and return the ranked ``Diagnosis``.

    ``options.out`` (``-o``): the traces are kept there (``run/``, ``first-nonfinite/``,
    ``repro/``); without it they are removed at the end.
    """
    argv = list(argv)
    if not argv:
        raise UsageError("give the training command after --, e.g. bisect doctor -- python train.py")
    todo = parse_checks(checks)
    t0 = time.monotonic()
    out = Path(options.out) if options.out is not None else None
    scratch = None if out is not None else Path(tempfile.mkdtemp(prefix="reprobisect-doctor-"))
    base = out if out is not None else scratch
    findings: list[Finding] = []
    kept: dict[str, str] = {}
    try:
        if any(c in todo for c in _SINGLE):
            findings += _single_run(argv, options, todo, base, cwd, kept)
        if "repro" in todo:
            findings += check_repro(argv, options, out=out / "repro" if out else None,
                                    cwd=str(cwd) if cwd else None)
            if out is not None:
                kept["repro"] = str(out / "repro")
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return Diagnosis(findings=ranked(findings), checks=todo, command=tuple(argv), steps=options.steps,
                     traces=kept if out is not None else {}, wall_s=round(time.monotonic() - t0, 3))


def _single_run(argv: list[str], options: ProbeOptions, todo: tuple[str, ...], base: Path,
                cwd: str | os.PathLike | None, kept: dict[str, str]) -> list[Finding]:
    """The findings of the checks that read one recorded run."""
    run = record_run(argv, options, base / "run", cwd=cwd)
    kept["run"] = str(base / "run")
    findings = list(run.findings)
    if run.trace is None:
        return findings
    if "finite" in todo:
        found = check_finite(run.trace)
        if options.out is not None and first_nonfinite(run.trace) is not None:
            found = [run.keep_first_bad(found[0], base / "first-nonfinite", kept)]
        elif options.out is None and found and found[0].severity != "info":
            f = found[0]
            found = [Finding(f.check, f.severity, f.cause, f.evidence,
                             f.next + "; `bisect doctor -o DIR --check finite` keeps the first bad batch and the "
                             "last healthy state")]
        findings += found
    if "update" in todo:
        findings += check_update(run.trace)
    if "modes" in todo:
        findings += check_modes(run.trace)
    if "contract" in todo:
        findings += check_contract(run.trace)
    return findings
