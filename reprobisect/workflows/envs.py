"""The library behind ``bisect envs``: one command under two environments, compared.

An environment SPEC is comma-separated items:

``python=PATH``       the interpreter that runs the command (must have reprobisect installed)
``env.NAME=VALUE``    an environment variable set in the child *before it starts* (so
                      variables read at CUDA initialisation, like CUBLAS_WORKSPACE_CONFIG,
                      take effect)
``NAME=VALUE``        a template variable: ``{NAME}`` in the command becomes VALUE
                      (``device=cuda``, ``dtype=bf16``)

``run_envs`` probes both sides (in parallel when the executor has two jobs), then gives
the environment diff (``reprobisect.core.envdiff``: numerics-relevant changes first) and the
first divergence under the ``default`` tolerance (per dtype) unless told otherwise.
A value containing a comma can be written with ``\\,``. With ``--detail sentinel`` the first
difference is escalated (``reprobisect.workflows.escalate``): both sides are replayed under
their own environments with full detail from the last state before it (``EnvsResult.escalation``).
The environment difference is the experiment; when a hint names another cause (string
hashing, an unseeded loader), both sides are re-run with it held fixed to test it
(``reprobisect.workflows.confirm``, ``EnvsResult.confirmations``).
"""

from __future__ import annotations

import os
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from reprobisect.errors import UsageError
from reprobisect.executors import executor_for, submit_all
from reprobisect.executors.base import ProbeResult
from reprobisect.core.compare import Comparison
from reprobisect.core.envdiff import EnvChange, diff_environments
from reprobisect.core.options import ProbeOptions
from reprobisect.core.verdict import compare_results
from reprobisect.executors.retry import retry
from reprobisect.support.progress import progress
from reprobisect.trace.ranks import read_rank0
from reprobisect.workflows.escalate import Escalation, escalate_or_why
from reprobisect.core.hints import cause_candidates
from reprobisect.workflows.confirm import Confirmation, confirm_causes, untested
from reprobisect.workflows.repro import DEFAULT_CONFIRM_MAX, _failed, spec_for

__all__ = ["EnvSpec", "EnvsResult", "parse_env_spec", "apply_template", "run_envs"]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class EnvSpec:
    """One side of an environment comparison."""

    text: str
    """The SPEC as given."""
    python: str | None = None
    """Interpreter path (``python=PATH``), None: the command's own."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables for the child (``env.NAME=VALUE``)."""
    variables: dict[str, str] = field(default_factory=dict)
    """Template variables substituted into the command (``NAME=VALUE`` → ``{NAME}``)."""

    def to_json(self) -> dict[str, Any]:
        return {"spec": self.text, "python": self.python, "env": self.env, "variables": self.variables}


def parse_env_spec(text: str, side: str = "a") -> EnvSpec:
    """Parse ``python=PATH,env.NAME=VALUE,NAME=VALUE``; a malformed item is a UsageError."""
    items = [p.replace("\0", ",") for p in text.replace("\\,", "\0").split(",")]
    python: str | None = None
    env: dict[str, str] = {}
    variables: dict[str, str] = {}
    for raw in items:
        item = raw.strip()
        if not item:
            continue
        if "=" not in item:
            raise UsageError(
                f"--{side} item '{item}' is not KEY=VALUE; use python=PATH, env.NAME=VALUE or NAME=VALUE"
            )
        key, value = item.split("=", 1)
        key = key.strip()
        if key == "python":
            if not value:
                raise UsageError(f"--{side} python= needs an interpreter path")
            python = os.path.expanduser(value)
        elif key.startswith("env."):
            name = key[4:]
            if not _NAME.match(name):
                raise UsageError(f"--{side} '{key}' does not name an environment variable (env.NAME=VALUE)")
            env[name] = value
        elif _NAME.match(key):
            variables[key] = value
        else:
            raise UsageError(f"--{side} key '{key}' is not python, env.NAME or a template NAME")
    return EnvSpec(text=text, python=python, env=env, variables=variables)


def apply_template(argv: list[str], spec: EnvSpec, side: str = "a") -> list[str]:
    """``argv`` with ``{NAME}`` replaced by the spec's variables; a missing one is a UsageError."""
    out = []
    for a in argv:
        def sub(m: re.Match) -> str:
            name = m.group(1)
            if name not in spec.variables:
                raise UsageError(f"the command uses {{{name}}} but --{side} does not set it; add {name}=VALUE to --{side}")
            return spec.variables[name]

        out.append(_PLACEHOLDER.sub(sub, a))
    return out


@dataclass(frozen=True)
class EnvsResult:
    """Both sides' probes, their environment diff and comparison; truthy when they agree."""

    a: EnvSpec
    b: EnvSpec
    runs: tuple[ProbeResult, ProbeResult]
    env_changes: tuple[EnvChange, ...]
    """One per differing key, numerics changes first."""
    comparison: Comparison
    """Side a compared with side b."""
    escalation: Escalation | None = None
    """With ``--detail sentinel``: the full chain where the sides first differ, from replays of
    both under their own environments (``reprobisect.workflows.escalate``); None when they agree
    or recorded full detail."""
    confirmations: tuple[Confirmation, ...] = ()
    """When the sides differ and a hint names a cause other than the environment difference
    (string hashing, the loader's generator): both sides re-run with it held fixed
    (``reprobisect.workflows.confirm``). A variable a SPEC sets is the experiment itself: never
    held fixed over it."""

    def __bool__(self) -> bool:
        return bool(self.comparison)


def run_envs(argv: list[str], options: ProbeOptions, *, a: str, b: str,
             cwd: str | os.PathLike | None = None, confirm: bool = False,
             confirm_max: int = DEFAULT_CONFIRM_MAX) -> EnvsResult:
    """Probe ``argv`` under SPEC ``a`` and SPEC ``b`` and compare (default tolerance).

    The environment difference is the experiment. When the sides differ and a hint names
    another cause (``cause_candidates``), ``confirm`` re-runs both sides with it held fixed
    (two more runs per candidate, at most ``confirm_max``; ``bisect envs`` does unless
    ``--no-confirm``, the library only when asked)."""
    sa, sb = parse_env_spec(a, "a"), parse_env_spec(b, "b")
    argv_a, argv_b = apply_template(argv, sa, "a"), apply_template(argv, sb, "b")
    tag = uuid.uuid4().hex[:8]
    specs = [
        spec_for(argv_a, options, key=f"envs-{tag}-a", workdir=cwd, env=sa.env, python=sa.python),
        spec_for(argv_b, options, key=f"envs-{tag}-b", workdir=cwd, env=sb.env, python=sb.python),
    ]
    with executor_for(options) as ex, progress("envs", total=2, quiet=options.quiet) as p:
        futures = submit_all(ex, specs)
        results = []
        for side, f in zip("ab", futures):
            p.update(f"side {side}")
            results.append(retry(ex, f.result()))
            p.advance()
        if not all(r.outcome for r in results):
            raise _failed(results, "cannot compare the environments")
        ta = read_rank0(results[0].trace_dir, allow_incomplete=True)  # rank 0 of a multi-rank trace
        tb = read_rank0(results[1].trace_dir, allow_incomplete=True)
        changes = tuple(diff_environments(ta.manifest.environment, tb.manifest.environment))
        tol = options.tolerance_for("default")
        comp = compare_results(results[0], results[1], tol)
        esc = escalate_or_why(comp, results[0], results[1], ex, tol)
        found = _other_causes((results[0], results[1]), (ta, tb), comp, (sa, sb), ex, tol, confirm=confirm,
                              confirm_max=confirm_max, note=None if options.quiet else p.note)
    return EnvsResult(a=sa, b=sb, runs=(results[0], results[1]), env_changes=changes, comparison=comp, escalation=esc,
                      confirmations=found)


def _other_causes(pair: tuple[ProbeResult, ProbeResult], traces: tuple[Any, Any], comp: Comparison,
                  specs: tuple[EnvSpec, EnvSpec], ex: Any, tol: Any, *, confirm: bool, confirm_max: int,
                  note: Any) -> tuple[Confirmation, ...]:
    """Candidate causes besides the environment difference, tested (or, unconfirmed, asked)."""
    if comp:
        return ()
    mine = set(specs[0].env) | set(specs[1].env)
    candidates = [c for c in cause_candidates(traces[0], traces[1], comp) if not set(c.env) & mine]
    if not confirm:
        return tuple(untested(c, pair[0].spec.argv, "not tried") for c in candidates)
    return confirm_causes(pair, candidates, ex, tol, max_tries=confirm_max, note=note)
