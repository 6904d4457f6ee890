"""Causes confirmed by experiment: re-run a differing pair with one candidate cause held fixed.

Two runs of one command differ, and the records alone cannot say why: a shuffle that
depends on string hashing and one seeded from the clock leave the same records (the batch
ids differ). So ``bisect repro`` tests the candidates ``reprobisect.core.hints.cause_candidates``
names, one at a time, most likely first: it runs the pair again (two runs, the same
recorded command, arguments, folder and environment, the same steps) with only that
candidate held fixed (``PYTHONHASHSEED=0``, a seeded DataLoader generator, one thread,
deterministic algorithms, TF op determinism, the global RNGs, the generators built without a
seed that the recorder listed: ``reprobisect.runners.hold``), and stops at
the first that makes the runs agree. Each try costs two runs; ``max_tries`` caps them.

The answer is a ``Confirmation`` per candidate: ``confirmed`` (the runs agree with it held:
the cause stated as fact, with that re-run as evidence), ``not this`` (they still differ:
where), or untested (a question with the check to make: ``--no-confirm``, the cap reached,
or a re-run that could not finish).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from typing import Any, Callable

from reprobisect.core.hints import CauseCandidate
from reprobisect.core.verdict import compare_results
from reprobisect.executors import submit_all
from reprobisect.executors.base import ProbeResult
from reprobisect.executors.retry import retry
from reprobisect.render.runs import divergence_place

__all__ = ["Confirmation", "RUNS_PER_TRY", "confirm_causes", "untested"]

RUNS_PER_TRY = 2
"""Runs each candidate costs: the pair, again, with the candidate held fixed."""


@dataclass(frozen=True)
class Confirmation:
    """One candidate cause and what holding it fixed showed (truthy when confirmed)."""

    candidate: str
    """The candidate's name (``hashseed``, ``loader_seed``, ``one_thread``, ``deterministic``, ``tf_determinism``,
    ``numpy_seed``, ``random_seed``, ``global_seed``, ``private_rngs``)."""
    held: str
    """What the re-runs held fixed (``PYTHONHASHSEED=0``)."""
    agreed: bool | None
    """True: the re-runs agree (confirmed); False: they still differ; None: not tested."""
    first_difference: str | None = None
    """``step S · kind · name`` where the re-runs still differ (None unless ``agreed`` is False)."""
    question: str = ""
    cause: str = ""
    fix: str = ""
    outside: str = ""
    check: str = ""
    """The command that would test it by hand."""
    reason: str = ""
    """Why it was not tested (``agreed`` None)."""
    hint: str | None = None
    """The comparison's hint this answers (a renderer shows this in its place)."""
    original: str | None = None
    """Where the judged runs first differed, to say whether the re-runs differ at the same place."""
    runs: int = 0
    """Re-runs spent on it."""

    def __bool__(self) -> bool:
        return self.agreed is True

    @property
    def text(self) -> str:
        """The one line a user reads: confirmed, not this, or the question with its check."""
        if self.agreed is True:
            return f"confirmed: with {self.held} the runs agree ({self.runs} re-runs): {self.cause}; fix: {self.fix}"
        if self.agreed is False:
            again = "again at" if self.first_difference == self.original else "now at"
            return (f"not this: still differs with {self.held} (first difference {again} {self.first_difference}); "
                    f"{self.outside}")
        why = f" ({self.reason})" if self.reason else ""
        return f"{self.question} check: {self.check}{why}"

    def to_json(self) -> dict[str, Any]:
        return {"candidate": self.candidate, "held": self.held, "agreed": self.agreed,
                "first_difference": self.first_difference, "runs": self.runs, "reason": self.reason or None,
                "question": self.question, "cause": self.cause if self.agreed else None, "check": self.check,
                "text": self.text}


def _check(c: CauseCandidate, argv: tuple[str, ...]) -> str:
    """How to test ``c`` by hand: the variables to export, then ``bisect repro``."""
    from reprobisect.core.hints import HOLD_VAR

    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(c.env.items()) if k != HOLD_VAR)
    runner = f"{HOLD_VAR}={c.env[HOLD_VAR]}" if HOLD_VAR in c.env else ""
    prefix = " ".join(x for x in (env, runner) if x)
    return f"{prefix} bisect repro --runs 2 -- {shlex.join(argv)}".strip()


def untested(c: CauseCandidate, argv: tuple[str, ...], reason: str, original: str | None = None) -> Confirmation:
    """``c`` as a question with the check to make, and why it was not tested."""
    return Confirmation(candidate=c.name, held=c.held, agreed=None, question=c.question, cause=c.cause, fix=c.fix,
                        outside=c.outside, check=_check(c, argv), reason=reason, hint=c.hint, original=original)


def _rerun(ex: Any, pair: tuple[ProbeResult, ProbeResult], c: CauseCandidate) -> list[ProbeResult]:
    """The pair again, as recorded (command, folder, environment, steps), with ``c`` held fixed."""
    specs = [replace(r.spec, key=f"{r.spec.key}-hold-{c.name}", env={**r.spec.env, **c.env}, attempt=0)
             for r in pair]
    return [retry(ex, f.result()) for f in submit_all(ex, specs)]


def confirm_causes(pair: tuple[ProbeResult, ProbeResult], candidates: list[CauseCandidate], ex: Any,
                   tolerance: Any, *, max_tries: int, original: str | None = None,
                   note: Callable[[str], None] | None = None) -> tuple[Confirmation, ...]:
    """Test ``candidates`` in order on ``pair`` (two runs that differ); stop at the first confirmed.

    At most ``max_tries`` are tested (two runs each); the rest come back untested. A re-run
    that ends without a trace leaves its candidate untested, with how it ended (a
    deterministic-algorithms run that raises names the op). ``note`` is told before each try.
    """
    argv = pair[0].spec.argv
    out: list[Confirmation] = []
    for i, c in enumerate(candidates):
        if i >= max_tries:
            out.append(untested(c, argv, f"not tried: --confirm-max {max_tries} reached", original))
            continue
        if note is not None:
            note(f"confirm: re-running the pair with {c.held} ({RUNS_PER_TRY} more runs)")
        runs = _rerun(ex, pair, c)
        failed = next((r for r in runs if not r.outcome), None)
        if failed is not None:
            tail = failed.last_lines(1)
            out.append(replace(untested(c, argv, f"the re-run ended {failed.outcome.status}"
                                        + (f": {tail[:200]}" if tail else ""), original), runs=RUNS_PER_TRY))
            continue
        comp = compare_results(runs[0], runs[1], tolerance)
        agreed = bool(comp)
        out.append(Confirmation(candidate=c.name, held=c.held, agreed=agreed,
                                first_difference=None if agreed else divergence_place(comp, structure_only="structure"),
                                question=c.question, cause=c.cause, fix=c.fix, outside=c.outside,
                                check=_check(c, argv), hint=c.hint, original=original, runs=RUNS_PER_TRY))
        if agreed:
            break
    return tuple(out)
