"""The audit config file: read it, check all of it, and hand back frozen values.

``bisect audit CONFIG.yaml`` reads one YAML/JSON mapping: top-level keys are defaults for
every check, ``checks:`` lists the checks. Every key is checked before any probe runs and
before any file is written, what it names on disk included (the repository, the last good
commit, the history database, the golden folders); the first mistake is a ``UsageError``
whose one line names the key and the fix (exit 2).
"""

from __future__ import annotations

import math
import os
import shlex
import subprocess
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
        raise _bad(where, key, f"must be an integer >= {minimum} (got {_short(v)})")
    return v


def _short(v: Any) -> str:
    """``repr`` of a value for a one-line message, cut short."""
    try:
        text = repr(v)
    except ValueError:  # an integer too long to print
        return "a number too large to print"
    return text if len(text) <= 80 else text[:77] + "..."


def _command(v: Any, where: str, key: str = "command") -> tuple[str, ...]:
    """A string split as a shell would, or a list of strings (a number is refused: quote it)."""
    if isinstance(v, str):
        try:
            argv = shlex.split(v)
        except ValueError as e:
            raise _bad(where, key, f"cannot be split as a shell would ({e}); check its quotes") from None
    elif isinstance(v, list) and all(isinstance(x, str) for x in v):
        argv = list(v)
    else:
        bad = next((x for x in v if not isinstance(x, str)), None) if isinstance(v, list) else v
        raise _bad(where, key, f"must be a string or a list of strings (got {_short(bad)} in it; quote numbers, "
                   "e.g. ['python', 'train.py', '--steps', '5'])" if isinstance(v, list) else
                   f"must be a string or a list of strings (got {_short(v)})")
    if not argv:
        raise _bad(where, key, "is empty; give the training command, e.g. 'python train.py'")
    if any("\0" in a for a in argv):
        raise _bad(where, key, "holds a NUL character, which no command line can carry; remove it")
    return tuple(argv)


def _env(v: Any, where: str) -> dict[str, str]:
    """``NAME: value`` with string or number values (numbers as written); anything nested is refused."""
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise _bad(where, "env", f"must be a mapping of NAME: value (got {_short(v)})")
    out: dict[str, str] = {}
    for k, x in v.items():
        if not isinstance(k, str) or not k or "=" in k or "\0" in k:
            raise _bad(where, "env", f"has {_short(k)}, which is not an environment variable name")
        if isinstance(x, bool) or x is None or not isinstance(x, (str, int, float)):
            raise _bad(where, "env", f"value of {k} must be a string or a number (got {_short(x)}); quote it, "
                       f"e.g. {k}: \"1\"")
        text = str(x)
        if "\0" in text:
            raise _bad(where, "env", f"value of {k} holds a NUL character; remove it")
        out[k] = text
    return out


def _timeout(v: Any, where: str) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
        raise _bad(where, "timeout", f"must be a finite number of seconds > 0 (got {_short(v)})")
    return float(v)


def _seeds(v: Any, where: str) -> tuple[str, ...]:
    seeds = [s.strip() for s in v.split(",") if s.strip()] if isinstance(v, str) else v
    if (not isinstance(seeds, list) or len(seeds) < 2
            or any(isinstance(s, bool) or not isinstance(s, (int, str)) or s == "" for s in seeds)):
        raise _bad(where, "seeds", f"must list at least two seeds (integers or strings), e.g. [0, 1] (got {_short(v)})")
    return tuple(str(s) for s in seeds)


def _golden_path(v: Any, where: str, folder: Path) -> Path:
    """The golden folder: relative paths must stay inside the config's folder (absolute ones are on purpose)."""
    if not isinstance(v, str) or not v.strip():
        raise _bad(where, "golden", "is missing; give the golden folder, e.g. golden: goldens/train (relative to the config)")
    if "\0" in v:
        raise _bad(where, "golden", "holds a NUL character; remove it")
    if not os.path.isabs(v):
        norm = os.path.normpath(v)
        if norm in (".", "..") or norm.startswith(".." + os.sep):
            raise _bad(where, "golden", f"is {v!r}, which is not a folder inside the config's folder '{folder}'; "
                       "give one inside it (e.g. golden: goldens/NAME), or an absolute path to put it elsewhere on purpose")
        return (folder / norm).resolve()
    return Path(v).resolve()


def _check_name(raw: Mapping[str, Any], where: str) -> str:
    """A unique, non-empty name; it names the check's folder under the night's results, so no path tricks."""
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        raise _bad(where, "name", "is missing; give every check a unique name")
    parts = name.replace("\\", "/").split("/")
    if name.startswith("/") or any(p in ("", ".", "..") for p in parts) or any(ord(c) < 32 for c in name):
        raise _bad(where, "name", f"is {_short(name)}; a check's name names its results folder: use letters, digits, "
                   "'-', '_' (no '..', leading '/', empty parts or control characters)")
    return name


def _tolerance(v: Any, where: str) -> Tolerance | None:
    if v is None:
        return None
    if isinstance(v, str):
        if v not in POLICIES:
            raise _bad(where, "tolerance", f"takes bitwise, default or {{atol: X, rtol: Y}} (got {_short(v)})")
        return Tolerance(mode=v)
    if isinstance(v, Mapping) and set(v) <= {"atol", "rtol", "override"} and ("atol" in v or "rtol" in v):
        def num(x: Any) -> float | None:  # YAML 1.1 reads 1e-3 (no dot) as a string
            if x is None:
                return None
            try:
                return float(x) if not isinstance(x, bool) else float("nan")
            except (TypeError, ValueError, OverflowError):
                raise _bad(where, "tolerance", f"atol/rtol take numbers (got {_short(x)})") from None

        try:
            return Tolerance.from_flags(None, num(v.get("atol")), num(v.get("rtol")), v.get("override") or {})
        except UsageError as e:
            raise _bad(where, "tolerance", f"is not valid ({e})") from None
    raise _bad(where, "tolerance", f"takes bitwise, default or {{atol: X, rtol: Y}} (got {_short(v)})")


def _check(raw: Any, i: int, defaults: Mapping[str, Any], folder: Path) -> CheckSpec:
    where = f"checks[{i}]"
    if not isinstance(raw, Mapping):
        raise UsageError(f"audit config {where}: each check must be a mapping with name, check and command")
    name = _check_name(raw, where)
    where = f"check '{name}'"
    kind = raw.get("check")
    if kind not in KINDS:
        raise _bad(where, "check", f"is {_short(kind)}; use one of {', '.join(KINDS)}")
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
    env = _env(merged.get("env"), where)
    timeout = _timeout(merged.get("timeout"), where)
    detail = merged.get("detail", "full")
    if not isinstance(detail, str) or detail not in DETAILS:
        raise _bad(where, "detail", f"takes {' or '.join(DETAILS)} (got {_short(detail)})")
    seeds = _seeds(merged.get("seeds", [0, 1]), where)
    golden = _golden_path(raw.get("golden"), where, folder) if kind == "golden" else None
    if kind == "envs":
        _env_specs(raw, where)
    steps = _int(merged.get("steps", 3), where, "steps", 1)
    at, resume_args = 1, ()
    if kind == "resume":
        at, resume_args = _resume_keys(raw, where, steps)
    return CheckSpec(
        name=name, check=kind, command=_command(merged["command"], where), env=env,
        steps=steps, timeout=timeout,
        detail=detail, tolerance=_tolerance(merged.get("tolerance"), where),
        runs=_int(merged.get("runs", 2), where, "runs", 2), seeds=seeds, golden=golden,
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
        argv = _command(args, where, "resume_args")
    except UsageError:
        raise _bad(where, "resume_args", f"must be a non-empty string or list of strings, e.g. --resume ckpt.pt "
                   f"(got {_short(args)})") from None
    return at, argv


def _env_specs(raw: Mapping[str, Any], where: str) -> None:
    """An envs check's ``a:`` and ``b:``, parsed as ``bisect envs`` parses them."""
    from reprobisect.workflows.envs import parse_env_spec

    for side in ("a", "b"):
        if not isinstance(raw.get(side), str) or not raw[side].strip():
            raise _bad(where, side, "is missing; an envs check needs a: and b: specs, e.g. a: env.OMP_NUM_THREADS=1")
        try:
            parse_env_spec(raw[side], side)
        except UsageError as e:
            raise _bad(where, side, f"is not a valid spec ({e})") from None


def parse_audit_config(data: Any, path: Path) -> AuditConfig:
    """Check a config mapping (read from ``path``) and build the ``AuditConfig``.

    Checks every key's type and value, then what the config points at on disk (``repo`` a git
    repository, ``last_good`` a commit of it, ``history`` an audit history or a new path,
    each ``golden`` a golden this tool wrote, an empty folder or a new path, never a folder
    holding the config, its history or the repository). Nothing is created or changed.
    """
    path = Path(path).resolve()
    if not isinstance(data, Mapping):
        raise UsageError(f"audit config '{path}' must hold a mapping with a 'checks:' list")
    for key in data:
        if key not in _TOP_ONLY | _SHARED:
            known = ", ".join(sorted(_TOP_ONLY | _SHARED))
            raise _bad("top level", _short(key) if not isinstance(key, str) else key, f"is not a known key; known: {known}")
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
        if v is not None and (not isinstance(v, str) or not v.strip() or "\0" in v):
            raise _bad("top level", key, f"must be a string (got {_short(v)})")
    if data.get("last_good") and not data.get("repo"):
        raise _bad("top level", "last_good", "needs repo: (the git repository to bisect), e.g. repo: .")
    if str(data.get("last_good") or "").startswith("-"):
        raise _bad("top level", "last_good", f"is {data['last_good']!r}, which is not a revision; give a commit, tag or branch")
    goldens = [s for s in specs if s.check == "golden"]
    if data.get("golden_remote") and not data.get("repo") and goldens:
        raise _bad("top level", "golden_remote", "needs repo: (the git + DVC repository that versions the goldens)")
    cfg = AuditConfig(
        path=path, name=str(data.get("name") or path.stem), checks=specs,
        repo=(folder / data["repo"]).resolve() if data.get("repo") else None,
        last_good=data.get("last_good"), golden_remote=data.get("golden_remote"),
        history=(folder / data["history"]).resolve() if data.get("history") else None,
    )
    _check_on_disk(cfg)
    return cfg


def _git_ok(repo: Path, *args: str) -> bool:
    try:
        p = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return p.returncode == 0


def _holds(outer: Path, inner: Path) -> bool:
    return outer == inner or outer in inner.parents


def _check_on_disk(cfg: AuditConfig) -> None:
    """What the config names on disk, checked before anything runs (nothing is created)."""
    from reprobisect.workflows.audit import golden as goldens
    from reprobisect.workflows.audit import history as hist

    if cfg.repo is not None:
        if not cfg.repo.is_dir():
            raise _bad("top level", "repo", f"is '{cfg.repo}', which is not a folder; give the git repository (relative to the config)")
        if not _git_ok(cfg.repo, "rev-parse", "--git-dir"):
            raise _bad("top level", "repo", f"is '{cfg.repo}', which is not a git repository; give one (e.g. repo: .) or run git init")
        if cfg.last_good and not _git_ok(cfg.repo, "rev-parse", "--verify", "--quiet", f"{cfg.last_good}^{{commit}}"):
            raise _bad("top level", "last_good", f"is {cfg.last_good!r}, which is not a commit of '{cfg.repo}'; "
                       "give a commit, tag or branch of it (git log shows them)")
    try:
        hist.check_history(cfg.history_path)
    except UsageError as e:  # "history 'PATH' is ...; give 'history:' ..."
        raise UsageError(f"audit config top level: {e}") from None
    keep = [("the config's folder", cfg.folder), ("the history", cfg.history_path)]
    keep += [("the repository", cfg.repo)] if cfg.repo is not None else []
    for spec in cfg.checks:
        if spec.golden is None:
            continue
        where = f"check '{spec.name}'"
        for what, p in keep:
            if _holds(spec.golden, p):
                raise _bad(where, "golden", f"is '{spec.golden}', which holds {what} ('{p}'); a golden is replaced "
                           "whole: give a folder of its own, e.g. golden: goldens/NAME")
        why = goldens.foreign_reason(spec.golden)
        if why is not None:
            raise _bad(where, "golden", f"is '{spec.golden}', which {why}; --update-golden replaces it whole: choose a "
                       "new or empty folder, or move it away yourself (nothing was touched)")


def load_audit_config(path: str | Path) -> AuditConfig:
    """Read and check an audit config file (YAML or JSON); a bad one is a one-line ``UsageError``."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"audit config '{p}' does not exist; check the path") from None
    except OSError as e:
        raise UsageError(f"cannot read audit config '{p}': {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"audit config '{p}' is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); "
                         "save it as UTF-8") from None
    try:
        import yaml

        data = yaml.safe_load(text)
    except Exception as e:  # yaml.YAMLError
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(f"audit config '{p}' is not valid YAML/JSON ({first})") from None
    return parse_audit_config(data, p)
