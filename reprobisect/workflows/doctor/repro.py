"""``repro``: run the command twice and name the first difference (``workflows.repro``).

The guide's check for "results are not reproducible": the first batch's IDs, the initial
parameters, the logits, the loss, the gradient norm and the parameters after each step,
twice; the first record (in chain order) that differs is the boundary, and its kind says
which control is missing (an unseeded initialisation, an unseeded data order, a random
op in the forward, a nondeterministic kernel).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from reprobisect.core.options import ProbeOptions
from reprobisect.errors import ProbeError
from reprobisect.workflows.doctor.model import Finding
from reprobisect.workflows.repro import ReproResult, run_repro

__all__ = ["check_repro", "repro_findings"]


def _cause(kind: str, name: str, module: str | None, localization: str) -> tuple[str, str]:
    if kind == "init":
        return ("the initial parameters differ between two runs: the model's initialisation is not seeded",
                "call torch.manual_seed(SEED) (or lightning's seed_everything) before the model is built")
    if kind == "batch" and name in ("ids", "<batch_ids>"):
        return ("the two runs draw different samples in the same step: the data order (shuffle/sampler) is not seeded",
                "give the DataLoader a seeded generator (generator=torch.Generator().manual_seed(SEED)) and seed its "
                "workers (worker_init_fn)")
    if kind in ("batch", "input"):
        return ("the same samples arrive with different contents: a random transform or augmentation is not seeded",
                "seed Python's random, NumPy and torch in the process and in every DataLoader worker")
    if kind in ("activation", "output") and localization == "origin":
        return (f"module '{module or name}' gives different outputs from identical inputs: a random op (dropout) "
                "that is not seeded, or a nondeterministic kernel",
                "seed before training; for kernels, torch.use_deterministic_algorithms(True) names the op")
    if kind == "grad":
        return ("the forward and loss agree but the gradients differ: a nondeterministic backward kernel "
                "(atomic adds on GPU, scatter/index_add)",
                "torch.use_deterministic_algorithms(True) (and CUBLAS_WORKSPACE_CONFIG=:4096:8 on CUDA) names the op")
    return (f"the two runs first differ at {kind} '{name}'",
            "`bisect repro --runs 3 -- CMD` shows the whole comparison")


def _also(first: Any, rest: tuple[Any, ...]) -> list[tuple[str, str]]:
    """Other missing seed controls the same step shows (an unseeded init besides an unseeded
    data order): the causes of differences at ``init`` or in the batch IDs after the first."""
    out, seen = [], {(first.kind, first.name in ("ids", "<batch_ids>"))}
    for d in rest:
        key = (d.kind, d.name in ("ids", "<batch_ids>"))
        if d.step != first.step or key in seen or not (d.kind == "init" or key == ("batch", True)):
            continue
        seen.add(key)
        out.append(_cause(d.kind, d.name, d.module, d.localization))
    return out


def repro_findings(result: ReproResult) -> list[Finding]:
    """The finding of a finished ``run_repro``: identical (info), or the first difference (warning)."""
    first = result.first_difference
    steps = result.runs[0].spec.steps
    if first is None:
        return [Finding("repro", "info", f"two runs are identical ({result.tolerance.mode}) over {steps} step(s): batch "
                        "IDs, initial parameters, activations, loss, gradients and parameters", {"steps": steps}, "")]
    _, comp = first
    d = comp.first
    if d is None:
        return [Finding("repro", "warning", f"the two runs differ in structure: {comp.structure}",
                        {"structure": comp.structure}, "`bisect repro -- CMD` shows the whole comparison")]
    cause, nxt = _cause(d.kind, d.name, d.module, d.localization)
    also = _also(d, comp.next)
    if also:
        cause += "; also " + "; and ".join(c for c, _ in also)
        nxt += "; " + "; ".join(n for _, n in also)
    ev: dict[str, Any] = {"step": d.step, "tensor": f"{d.kind} '{d.name}'", "module": d.module,
                          "localization": d.localization, "verdict": d.verdict, "tolerance": result.tolerance.mode,
                          "next_differences": [f"step {x.step} {x.kind} '{x.name}'" for x in comp.next[:5]]}
    if d.diff.max_abs is not None:
        ev["max_abs"] = d.diff.max_abs
    if d.diff.stat_deltas:
        ev["stat_deltas"] = d.diff.stat_deltas
    return [Finding("repro", "warning", f"step {d.step}: {cause}", ev, nxt)]


def check_repro(argv: list[str], options: ProbeOptions, *, out: Path | None = None,
                cwd: str | None = None, quiet_crash: bool = False) -> list[Finding]:
    """Run ``argv`` twice (``run_repro``) and return its finding; a run that ends without a
    trace is a finding too (a warning, or ``info`` with ``quiet_crash``: another finding
    already reports how the command ends), never a traceback."""
    opts = replace(options, out=out, keep=out is not None, quiet=True)
    try:
        result = run_repro(argv, opts, runs=2, cwd=cwd)
    except ProbeError as e:
        return [Finding("repro", "info" if quiet_crash else "warning", f"cannot judge reproducibility: {e}", {},
                        "fix the run first (see the other findings)")]
    return repro_findings(result)
