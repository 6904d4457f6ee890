"""The audit config file: read it, check all of it, and hand back frozen values.

``bisect audit CONFIG.yaml`` reads one YAML/JSON mapping: top-level keys are defaults for
every check, ``checks:`` lists the checks. Every key is checked before any probe runs; the
first mistake is a ``UsageError`` whose one line names the key and the fix (exit 2).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from reprobisect.core.compare import POLICIES, Tolerance
from reprobisect.errors import UsageError
from reprobisect.trace.format import DETAILS

__all__ = ["KINDS", "CheckSpec", "AuditConfig", "load_audit_config", "parse_audit_config"]

KINDS = ("repro", "golden", "seeds", "envs", "resume")
"""The ``check:`` kinds an audit runs."""

DEFAULT_NOISE_RUNS = 3
"""Runs of the reference ``--update-golden`` makes to calibrate a golden's noise band."""

_SHARED = {"command", "env", "steps", "seeds", "detail", "tolerance", "timeout", "runs", "noise_runs"}
_OWN = {
    "repro": {"runs"},
    "golden": {"golden", "noise_runs"},
    "seeds": {"seeds"},
    "envs": {"a", "b"},
    "resume": {"at", "resume_args"},
}
_CHECK_ONLY = {"name", "check", "golden", "a", "b", "at", "resume_args"}
_TOP_ONLY = {"name", "checks", "repo", "last_good", "golden_remote", "history"}


@dataclass(frozen=True, kw_only=True)
class CheckSpec:
    """One check of the audit, with the top-level defaults folded in."""

    name: str
    """Unique within the config; the JUnit test case's name."""
    check: str
    """One of ``KINDS``."""
    command: tuple[str, ...]
    """The training command (a string is split as a shell would)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment variables for its probes."""
    steps: int = 3
    """Optimizer steps each probe records."""
    timeout: float | None = None
    """Seconds before a probe is killed (then the check is inconclusive)."""
    detail: str = "full"
    """``full`` or ``sentinel``."""
    tolerance: Tolerance | None = None
    """How traces are judged (None: the kind's default; golden: bitwise + its noise band)."""
    runs: int = 2
    """``repro``: runs compared."""
    seeds: tuple[str, ...] = ("0", "1")
    """``seeds``: the seeds probed (``{seed}`` in the command is substituted)."""
    golden: Path | None = None
    """``golden``: the golden folder (absolute; the config gives it relative to its folder)."""
    noise_runs: int = DEFAULT_NOISE_RUNS
    """``golden``: runs of the reference ``--update-golden`` makes to calibrate the noise band."""
    a: str = ""
    """``envs``: side A's spec (``env.OMP_NUM_THREADS=1``)."""
    b: str = ""
    """``envs``: side B's spec."""
    at: int = 1
    """``resume``: the run is interrupted after this many steps (default: half of ``steps``)."""
    resume_args: tuple[str, ...] = ()
    """``resume``: the arguments that make the command resume (``--resume ckpt.pt``)."""


@dataclass(frozen=True, kw_only=True)
class AuditConfig:
    """A whole audit config: its checks and where its state lives."""

    path: Path
    """The config file (absolute)."""
    name: str
    """The audit's name (``name:``; default the file's stem): JUnit classname."""
    checks: tuple[CheckSpec, ...]
    repo: Path | None = None
    """A git repository (``repo:``, relative to the config's folder) for auto-bisection."""
    last_good: str | None = None
    """A revision known good (``last_good:``); else the history's last passing night."""
    golden_remote: str | None = None
    """A DVC remote (URL or local folder) the goldens are pushed to and pulled from."""
    history: Path | None = None
    """The history database (default ``.bisect-audit.sqlite`` beside the config)."""

    @property
    def folder(self) -> Path:
        return self.path.parent

    @property
    def history_path(self) -> Path:
        return self.history or self.folder / ".bisect-audit.sqlite"


def _bad(where: str, key: str, fix: str) -> UsageError:
    return UsageError(f"audit config {where}: '{key}' {fix}")


def _int(v: Any, where: str, key: str, minimum: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise _bad(where, key, f"must be an integer >= {minimum} (got {v!r})")
    return v


def _command(v: Any, where: str) -> tuple[str, ...]:
    if isinstance(v, str):
        try:
            argv = shlex.split(v)
        except ValueError as e:
            raise _bad(where, "command", f"cannot be split as a shell would ({e}); check its quotes") from None
    elif isinstance(v, list) and all(isinstance(x, (str, int, float)) and not isinstance(x, bool) for x in v):
        argv = [str(x) for x in v]
    else:
        raise _bad(where, "command", f"must be a string or a list of strings (got {v!r})")
    if not argv:
        raise _bad(where, "command", "is empty; give the training command, e.g. 'python train.py'")
    return tuple(argv)


def _tolerance(v: Any, where: str) -> Tolerance | None:
    if v is None:
        return None
    if isinstance(v, str):
        if v not in POLICIES:
            raise _bad(where, "tolerance", f"takes bitwise, default or {{atol: X, rtol: Y}} (got {v!r})")
        return Tolerance(mode=v)
    if isinstance(v, Mapping) and set(v) <= {"atol", "rtol", "override"} and ("atol" in v or "rtol" in v):
        def num(x: Any) -> float | None:  # YAML 1.1 reads 1e-3 (no dot) as a string
            if x is None:
                return None
            try:
                return float(x) if not isinstance(x, bool) else float("nan")
            except (TypeError, ValueError):
                raise _bad(where, "tolerance", f"atol/rtol take numbers (got {x!r})") from None

        try:
            return Tolerance.from_flags(None, num(v.get("atol")), num(v.get("rtol")), v.get("override") or {})
        except UsageError as e:
            raise _bad(where, "tolerance", f"is not valid ({e})") from None
    raise _bad(where, "tolerance", f"takes bitwise, default or {{atol: X, rtol: Y}} (got {v!r})")


def _check(raw: Any, i: int, defaults: Mapping[str, Any], folder: Path) -> CheckSpec:
    where = f"checks[{i}]"
    if not isinstance(raw, Mapping):
        raise UsageError(f"audit config {where}: each check must be a mapping with name, check and command")
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        raise _bad(where, "name", "is missing; give every check a unique name")
    where = f"check '{name}'"
    kind = raw.get("check")
    if kind not in KINDS:
        raise _bad(where, "check", f"is {kind!r}; use one of {', '.join(KINDS)}")
    allowed = _SHARED | _CHECK_ONLY
    for key in raw:
        if key not in allowed:
            raise _bad(where, str(key), f"is not a check key; known: {', '.join(sorted(allowed))}")
        if key in _CHECK_ONLY - {"name", "check"} and key not in _OWN[kind]:
            raise _bad(where, str(key), f"does not apply to a '{kind}' check (it is a key of "
                       f"{' / '.join(k for k, own in _OWN.items() if key in own)} checks)")
    merged = {**{k: v for k, v in defaults.items() if k in _SHARED}, **raw}
    if "command" not in merged:
        raise _bad(where, "command", "is missing; give the training command, e.g. command: python train.py")
    env = merged.get("env") or {}
    if not isinstance(env, Mapping) or not all(isinstance(k, str) for k in env):
        raise _bad(where, "env", f"must be a mapping of NAME: value (got {env!r})")
    env = {k: str(v) for k, v in env.items()}
    timeout = merged.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0):
        raise _bad(where, "timeout", f"must be a number of seconds > 0 (got {timeout!r})")
    detail = merged.get("detail", "full")
    if detail not in DETAILS:
        raise _bad(where, "detail", f"takes {' or '.join(DETAILS)} (got {detail!r})")
    seeds = merged.get("seeds", [0, 1])
    if isinstance(seeds, str):
        seeds = [s.strip() for s in seeds.split(",") if s.strip()]
    if not isinstance(seeds, list) or len(seeds) < 2 or any(isinstance(s, (bool, dict, list)) for s in seeds):
        raise _bad(where, "seeds", f"must list at least two seeds, e.g. [0, 1] (got {merged.get('seeds')!r})")
    golden = None
    if kind == "golden":
        g = raw.get("golden")
        if not isinstance(g, str) or not g.strip():
            raise _bad(where, "golden", "is missing; give the golden folder, e.g. golden: goldens/train (relative to the config)")
        golden = (folder / g).resolve()
    if kind == "envs":
        for side in ("a", "b"):
            if not isinstance(raw.get(side), str) or not raw[side].strip():
                raise _bad(where, side, "is missing; an envs check needs a: and b: specs, e.g. a: env.OMP_NUM_THREADS=1")
    steps = _int(merged.get("steps", 3), where, "steps", 1)
    at, resume_args = 1, ()
    if kind == "resume":
        at, resume_args = _resume_keys(raw, where, steps)
    return CheckSpec(
        name=name, check=kind, command=_command(merged["command"], where), env=env,
        steps=steps, timeout=float(timeout) if timeout else None,
        detail=detail, tolerance=_tolerance(merged.get("tolerance"), where),
        runs=_int(merged.get("runs", 2), where, "runs", 2), seeds=tuple(str(s) for s in seeds), golden=golden,
        noise_runs=_int(merged.get("noise_runs", DEFAULT_NOISE_RUNS), where, "noise_runs", 1),
        a=str(raw.get("a", "")), b=str(raw.get("b", "")), at=at, resume_args=resume_args,
    )


def _resume_keys(raw: Mapping[str, Any], where: str, steps: int) -> tuple[int, tuple[str, ...]]:
    """A resume check's ``at`` (default half its steps) and ``resume_args`` (required)."""
    if steps < 2:
        raise _bad(where, "steps", f"must be at least 2 for a resume check (interrupted after 'at' steps, compared after; got {steps})")
    at = _int(raw.get("at", steps // 2), where, "at", 1)
    if at >= steps:
        raise _bad(where, "at", f"is {at}, which leaves no step to compare with steps: {steps}; use at below steps (e.g. at: {steps // 2})")
    args = raw.get("resume_args")
    if args is None:
        raise _bad(where, "resume_args", "is missing; give the arguments that make the command resume, e.g. resume_args: --resume ckpt.pt")
    try:
        argv = _command(args, where)
    except UsageError:
        raise _bad(where, "resume_args", f"must be a non-empty string or list of arguments, e.g. --resume ckpt.pt (got {args!r})") from None
    return at, argv


def parse_audit_config(data: Any, path: Path) -> AuditConfig:
    """Check a config mapping (read from ``path``) and build the ``AuditConfig``."""
    path = Path(path).resolve()
    if not isinstance(data, Mapping):
        raise UsageError(f"audit config '{path}' must hold a mapping with a 'checks:' list")
    for key in data:
        if key not in _TOP_ONLY | _SHARED:
            known = ", ".join(sorted(_TOP_ONLY | _SHARED))
            raise _bad("top level", str(key), f"is not a known key; known: {known}")
    checks = data.get("checks")
    if not isinstance(checks, list) or not checks:
        raise _bad("top level", "checks", "must be a non-empty list of checks (each with name, check, command)")
    folder = path.parent
    specs = tuple(_check(c, i, data, folder) for i, c in enumerate(checks))
    seen: set[str] = set()
    for s in specs:
        if s.name in seen:
            raise _bad(f"check '{s.name}'", "name", "is used twice; give every check a unique name")
        seen.add(s.name)
    for key in ("name", "last_good", "golden_remote", "repo", "history"):
        v = data.get(key)
        if v is not None and (not isinstance(v, str) or not v.strip()):
            raise _bad("top level", key, f"must be a string (got {v!r})")
    if data.get("last_good") and not data.get("repo"):
        raise _bad("top level", "last_good", "needs repo: (the git repository to bisect), e.g. repo: .")
    goldens = [s for s in specs if s.check == "golden"]
    if data.get("golden_remote") and not data.get("repo") and goldens:
        raise _bad("top level", "golden_remote", "needs repo: (the git + DVC repository that versions the goldens)")
    return AuditConfig(
        path=path, name=str(data.get("name") or path.stem), checks=specs,
        repo=(folder / data["repo"]).resolve() if data.get("repo") else None,
        last_good=data.get("last_good"), golden_remote=data.get("golden_remote"),
        history=(folder / data["history"]).resolve() if data.get("history") else None,
    )


def load_audit_config(path: str | Path) -> AuditConfig:
    """Read and check an audit config file (YAML or JSON); a bad one is a one-line ``UsageError``."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise UsageError(f"audit config '{p}' does not exist; check the path") from None
    except OSError as e:
        raise UsageError(f"cannot read audit config '{p}': {e.strerror}") from None
    try:
        import yaml

        data = yaml.safe_load(text)
    except Exception as e:  # yaml.YAMLError
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(f"audit config '{p}' is not valid YAML/JSON ({first})") from None
    return parse_audit_config(data, p)
