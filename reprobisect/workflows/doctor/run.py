"""One recorded run of the user's command, for the checks that observe one run.

The command runs through ``workflows.capture`` (the probe path of ``bisect capture``) at
full detail, stopping at the first NaN/Inf. How the run ended becomes findings of its own
(check ``run``): a crash with its last line, an import failure, a run that never stepped an
optimizer, a timeout; a crash that says the loss has no graph is an ``update`` error (every
parameter frozen when the recorder saw them all with ``requires_grad=False`` before the first
step, its ``manifest.extra["before_first_step"]``; else a cut graph), and so is a run that
never stepped because every backward started from a tensor with no graph (a loss rebuilt
from ``.item()``); a crash in the loss over the targets' dtype or range is a ``contract`` error.
``keep_first_bad`` re-records the run up to its first non-finite step, keeping that step's
full tensors (the bad batch, the forward, loss and gradients) and the complete state after
the step before it (the last healthy state), and checks that the re-run met the same
tensor at the same step on the same samples.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from reprobisect.core.options import ProbeOptions
from reprobisect.core.outcome import Outcome, Status
from reprobisect.errors import ReproError
from reprobisect.executors import executor_for
from reprobisect.trace.ranks import read_rank0
from reprobisect.trace.reader import Trace
from reprobisect.workflows.capture import CaptureConfig, CaptureResult, capture
from reprobisect.workflows.doctor.contract import CRASH_CONTRACT, crash_cause
from reprobisect.workflows.doctor.finite import first_nonfinite
from reprobisect.workflows.doctor.model import RUN, Finding

__all__ = ["RecordedRun", "record_run", "ended_early"]

_DETACHED = ("does not require grad and does not have a grad_fn",)


@dataclass
class RecordedRun:
    """The outcome of the one recorded run, its trace (None when it left none to read) and
    the findings about how it ended."""

    argv: list[str]
    options: ProbeOptions
    cwd: str | os.PathLike | None
    outcome: Outcome
    trace: Trace | None
    findings: list[Finding] = field(default_factory=list)

    def keep_first_bad(self, finding: Finding, dest: Path, kept: dict[str, str]) -> Finding:
        """``finding`` (the first non-finite tensor) with what was kept of it in ``dest``."""
        k = int(finding.evidence["step"])
        config = _config(self.options, steps=k + 1, full_steps=(k,), state_steps=(k - 1,) if k > 0 else ())
        res = _capture(self.argv, dest, config, self.options, self.cwd)
        ev = dict(finding.evidence)
        try:
            again = first_nonfinite(read_rank0(dest, allow_incomplete=True).steps)
        except ReproError:
            again = None
        if again is None or again[0].step != k or f"{again[1].kind} '{again[1].name}'" != ev["tensor"] \
                or list(again[0].batch_ids or []) != list(ev.get("sample_ids") or []):
            where = f"{again[1].kind} '{again[1].name}' at step {again[0].step}" if again else f"none ({res.outcome})"
            ev["kept"] = {"folder": str(dest), "note": f"a second run to keep the tensors met {where}, not the same "
                          "tensor: the run is not reproducible (see `bisect doctor --check repro`)"}
        else:
            kept["first-nonfinite"] = str(dest)
            ev["kept"] = {"folder": str(dest), "first_bad_step": f"tensors/step-{k:06d}.safetensors (batch, forward, "
                          f"loss, gradients and parameters of step {k})",
                          "last_healthy_state": f"state/step-{k - 1}/ (after step {k - 1})" if k > 0 else None}
        return replace(finding, evidence=ev)


def _config(options: ProbeOptions, **kw: object) -> CaptureConfig:
    base = {"steps": options.steps, "timeout": options.timeout, "stop_on_nonfinite": True, "quiet": True,
            "detail": "full"}
    base.update(kw)
    return CaptureConfig(**base)  # type: ignore[arg-type]


def _capture(argv: list[str], dest: Path, config: CaptureConfig, options: ProbeOptions,
             cwd: str | os.PathLike | None) -> CaptureResult:
    if options.executor == "local":
        return capture(argv, dest, config, cwd=cwd)
    with executor_for(options) as ex:
        return capture(argv, dest, config, cwd=cwd, executor=ex)


def record_run(argv: list[str], options: ProbeOptions, dest: Path,
               cwd: str | os.PathLike | None = None, **config: object) -> RecordedRun:
    """Record ``argv`` into ``dest`` (full detail, stop at the first NaN/Inf, unless ``config``
    overrides ``CaptureConfig`` fields) and read it."""
    res = _capture(argv, dest, _config(options, **config), options, cwd)
    o = res.outcome
    trace = None
    if o.status in (Status.OK, Status.NONFINITE, Status.CRASHED, Status.TIMEOUT, Status.NO_STEPS):
        try:
            trace = read_rank0(dest, allow_incomplete=True)
        except ReproError:
            trace = None
    run = RecordedRun(argv=argv, options=options, cwd=cwd, outcome=o, trace=trace)
    run.findings = _outcome_findings(res, trace)
    return run


def _last_line(res: CaptureResult) -> str:
    text = res.outcome.traceback or res.output_tail or res.stderr_tail or ""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def _outcome_findings(res: CaptureResult, trace: Trace | None) -> list[Finding]:
    """Findings about how the run ended (none when it recorded its steps or stopped at a NaN)."""
    o = res.outcome
    steps = len(trace.steps) if trace is not None else 0
    ev = {"outcome": str(o.status), "step": o.step, "steps_recorded": steps, "last_line": _last_line(res),
          "output_log": res.output_log}
    if o.status in (Status.OK, Status.NONFINITE):
        return []
    before = _before_first_step(trace)
    if o.status is Status.CRASHED:
        if any(p in (o.traceback or "") + ev["last_line"] for p in _DETACHED):
            return [_no_graph_crash(ev, before)]
        for line, where, cause, nxt in CRASH_CONTRACT:
            m = re.search(line, ev["last_line"])
            if m and (not where or re.search(where, o.traceback or "")):
                return [Finding("contract", "error", f"the loss raised{_at(o)}: {crash_cause(cause, m)}", ev, nxt)]
        return [Finding(RUN, "error", f"the command crashed{_at(o)}: {ev['last_line'] or o.detail}", ev,
                        "fix the crash (the whole output is output.log in the trace with -o), then run the doctor again")]
    if o.status is Status.NO_STEPS:
        n, leaf = int(before.get("backwards") or 0), int(before.get("backwards_without_graph") or 0)
        if n and leaf == n:
            ev["backwards"] = n
            return [Finding("update", "error", f"backward ran {n} time(s), every time from a tensor with no graph (a "
                            "leaf: a loss rebuilt with torch.tensor() from .item()/.numpy(), or detached), so no "
                            "parameter ever got a gradient and nothing was updated", ev,
                            "compute the loss from the model's output tensors without .item()/.detach()/torch.tensor(); "
                            "loss.grad_fn must not be None")]
        return [Finding(RUN, "error", "the command ended without an optimizer step, so nothing could be checked"
                        + (f" ({o.detail})" if o.detail else ""), ev,
                        "check that the command trains (optimizer.step() runs) within the first steps")]
    what = {Status.SKIP: "could not start or import what it needs", Status.TIMEOUT: "timed out",
            Status.INFRA: "was stopped from outside or the recorder failed"}.get(o.status, str(o.status))
    return [Finding(RUN, "error", f"the command {what}{_at(o)}" + (f": {o.detail}" if o.detail else ""), ev,
                    "make the command run as a plain `python ...` first; raise --timeout for slow starts")]


def _before_first_step(trace: Trace | None) -> dict:
    """What the recorder saw before a run that wrote no step ended (``manifest.extra``)."""
    extra = trace.manifest.extra if trace is not None else None
    got = (extra or {}).get("before_first_step")
    return got if isinstance(got, dict) else {}


def _no_graph_crash(ev: dict, before: dict) -> Finding:
    """Backward refused a loss without a graph: every parameter frozen, or the graph cut."""
    frozen = list(before.get("frozen_params") or [])
    seen = int(before.get("parameters_seen") or 0)
    if frozen and len(frozen) >= seen:
        ev = {**ev, "frozen_params": frozen[:8] + ([f"... ({len(frozen)} in all)"] if len(frozen) > 8 else []),
              "parameters_seen": seen}
        return Finding("update", "error", f"every one of the model's {seen} parameter(s) is frozen (requires_grad="
                       "False), so the loss has no graph and backward refuses it: nothing can train", ev,
                       "unfreeze the parameters meant to train (check the names a freeze/unfreeze loop matches, "
                       "e.g. the head's), then build the optimizer on them")
    if frozen:
        ev = {**ev, "frozen_params": frozen[:8], "parameters_seen": seen}
    return Finding("update", "error", "backward refused the loss: it has no graph to the model (a .detach(), "
                   ".item()/.numpy() round trip or a forward under torch.no_grad())", ev,
                   "follow the loss back to the model's output and remove what cuts the graph; "
                   "loss.grad_fn must not be None")


def _at(o: Outcome) -> str:
    return f" at step {o.step}" if o.step is not None else ""


def ended_early(finding: Finding) -> Finding:
    """``finding`` of a check whose run the script ended before the steps the check needs
    (``steps_run`` < ``steps_asked`` in its evidence) as "not checked" (info), with the count it
    reached and the count it needs: a fixed-batch test of 2 steps out of 20 says nothing, and a
    "cannot fit" from it would mislead. A conclusive finding (it fit, or went non-finite) stays."""
    ev = finding.evidence
    run, asked = ev.get("steps_run"), ev.get("steps_asked")
    if not (isinstance(run, int) and isinstance(asked, int) and 0 < run < asked):
        return finding
    if finding.severity == "error" or finding.cause.startswith(("fits one batch", "on one repeated batch the loss")):
        return finding
    return Finding(finding.check, "info", f"not checked — the script ended after {run} step(s); it needs {asked}",
                   ev, f"let the script run at least {asked} optimizer steps (more batches or epochs), or ask for "
                       f"fewer with --overfit-steps {max(2, run)}" if finding.check == "overfit" else
                   f"let the script run at least {asked} optimizer steps")
