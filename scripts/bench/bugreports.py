"""Run the bug-report corpus (examples/bugreports/) and judge each answer against its thread.

Each case folder holds a tiny ``train.py`` adapted from a public issue thread and a
``case.yaml`` naming the thread, the root cause its maintainers established, the ``bisect``
command a user would run, and what a right answer must say (``must_say``) and must not state
as fact (``must_not_say``). A case runs in a fresh copy of its folder under a temporary
directory, committed to a fresh git repository (``runs`` needs history, and every trace
records a revision), after the case's optional ``setup`` script. Its stdout and stderr are
judged:

- ``right``: every ``must_say`` regex matches and no ``must_not_say`` regex does;
- ``wrong``: a ``must_not_say`` regex matches (a wrong cause stated as fact);
- ``missed``: neither (the cause not named, a crash, a timeout).

The commands run in a clean environment: ``PYTHONHASHSEED`` and the ``REPROBISECT_*``
variables of the caller are removed (a hash-order case must see what a user's shell has).

    python scripts/bench/bugreports.py                  # every case, one line each + summary
    python scripts/bench/bugreports.py --only clock_seeded_shuffle --json
    python scripts/bench/bugreports.py --jobs 2

The summary line is ``right N of M; wrong cause stated: K``. Exit 0, or 1 with ``--check``
when a case's verdict differs from the ``expected`` its case file records.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

__all__ = ["CORPUS", "FIELDS", "VERDICTS", "Case", "CaseResult", "judge", "load_case", "load_cases",
           "run_case", "summary_line"]

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "examples" / "bugreports"
FIELDS = ("source", "framework", "kind", "root_cause", "command", "must_say", "must_not_say", "expected")
"""Fields every case.yaml must give."""
FRAMEWORKS = ("torch", "lightning", "keras")
KINDS = ("resume", "nondeterminism", "doctor", "compare")
VERDICTS = ("right", "wrong", "missed")
DEFAULT_TIMEOUT = 240.0
_SOURCE = re.compile(r"^https://github\.com/[^/\s]+/[^/\s]+/(issues|pull)/\d+$")


@dataclass(frozen=True)
class Case:
    """One bug report adapted into a runnable case (the parsed case.yaml and its folder)."""

    name: str
    folder: Path
    source: str
    framework: str
    kind: str
    root_cause: str
    command: str
    must_say: tuple[str, ...]
    must_not_say: tuple[str, ...]
    expected: str
    setup: str | None = None
    timeout: float = DEFAULT_TIMEOUT


@dataclass(frozen=True)
class CaseResult:
    """What one case's command printed and how it was judged."""

    name: str
    verdict: str
    expected: str
    seconds: float
    returncode: int | None
    missing: tuple[str, ...] = field(default_factory=tuple)
    """``must_say`` regexes that did not match."""
    stated: tuple[str, ...] = field(default_factory=tuple)
    """``must_not_say`` regexes that matched (wrong causes stated)."""
    output: str = ""

    def __bool__(self) -> bool:
        return self.verdict == "right"


def _problems(data: dict, folder: Path) -> list[str]:
    """What is wrong with one parsed case file (empty when it is valid)."""
    out = [f"missing field '{name}'" for name in FIELDS if name not in data]
    if out:
        return out
    if not _SOURCE.match(str(data["source"])):
        out.append(f"source is not a GitHub issue/pull URL: {data['source']!r}")
    for name, allowed in (("framework", FRAMEWORKS), ("kind", KINDS), ("expected", VERDICTS)):
        if data[name] not in allowed:
            out.append(f"{name} {data[name]!r} is not one of {', '.join(allowed)}")
    if not str(data["command"]).startswith("bisect "):
        out.append(f"command does not start with 'bisect ': {data['command']!r}")
    if not data["must_say"]:
        out.append("must_say is empty: a right answer must name the cause")
    for name in ("must_say", "must_not_say"):
        for rx in data[name] or ():
            try:
                re.compile(rx)
            except re.error as e:
                out.append(f"{name} regex {rx!r} does not compile: {e}")
    if not (folder / "train.py").is_file():
        out.append("no train.py")
    if data.get("setup") and not (folder / data["setup"]).is_file():
        out.append(f"setup script {data['setup']!r} not in the folder")
    return out


def load_case(folder: Path) -> Case:
    """Parse ``folder/case.yaml``; ValueError naming the folder and every problem when invalid."""
    path = folder / "case.yaml"
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"{path}: cannot read: {e}") from e
    problems = _problems(data, folder)
    if problems:
        raise ValueError(f"{path}: " + "; ".join(problems))
    return Case(name=folder.name, folder=folder, source=data["source"], framework=data["framework"],
                kind=data["kind"], root_cause=str(data["root_cause"]).strip(), command=data["command"],
                must_say=tuple(data["must_say"]), must_not_say=tuple(data["must_not_say"] or ()),
                expected=data["expected"], setup=data.get("setup"),
                timeout=float(data.get("timeout", DEFAULT_TIMEOUT)))


def load_cases(corpus: Path = CORPUS, only: list[str] | None = None) -> list[Case]:
    """Every case of the corpus in name order (or the ``only`` ones; ValueError for an unknown name)."""
    folders = sorted(p for p in corpus.iterdir() if (p / "case.yaml").is_file())
    if only:
        names = {p.name for p in folders}
        unknown = [n for n in only if n not in names]
        if unknown:
            raise ValueError(f"no case named {', '.join(unknown)} in {corpus}")
        folders = [p for p in folders if p.name in only]
    return [load_case(p) for p in folders]


def judge(case: Case, output: str) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """(verdict, must_say regexes missing, must_not_say regexes matched) for one output."""
    missing = tuple(rx for rx in case.must_say if not re.search(rx, output, re.MULTILINE))
    stated = tuple(rx for rx in case.must_not_say if re.search(rx, output, re.MULTILINE))
    if stated:
        return "wrong", missing, stated
    return ("missed" if missing else "right"), missing, stated


def _env() -> dict[str, str]:
    """The caller's environment less what would make a case unlike a user's shell."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED" and not k.startswith("REPROBISECT_")}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["CUDA_VISIBLE_DEVICES"] = ""
    for name in ("GIT_AUTHOR_NAME", "GIT_COMMITTER_NAME"):
        env[name] = "bugreports"
    for name in ("GIT_AUTHOR_EMAIL", "GIT_COMMITTER_EMAIL"):
        env[name] = "bugreports@example.invalid"
    return env


def _prepare(case: Case, work: Path, env: dict[str, str]) -> None:
    """Copy the case into ``work``, commit it to a fresh repository, run its setup script."""
    shutil.copytree(case.folder, work, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "case as filed"]):
        subprocess.run(["git", *args], cwd=work, env=env, check=True, capture_output=True)
    if case.setup:
        subprocess.run(["bash", case.setup], cwd=work, env=env, check=True, capture_output=True, timeout=60)


def _argv(command: str) -> list[str]:
    """The case's command with ``bisect`` run by this interpreter (``python -m reprobisect``)."""
    argv = shlex.split(command)
    return [sys.executable, "-m", "reprobisect", *argv[1:]]


def run_case(case: Case, tmp: Path | None = None) -> CaseResult:
    """Run one case in a fresh copy under ``tmp`` (a new temporary folder when None) and judge it."""
    env = _env()
    own = tmp is None
    base = Path(tempfile.mkdtemp(prefix="bugreport-")) if own else tmp
    work = base / case.name
    start = time.monotonic()
    try:
        _prepare(case, work, env)
        done = subprocess.run(_argv(case.command), cwd=work, env=env, capture_output=True, text=True,
                              timeout=case.timeout, start_new_session=True)
        output, rc = done.stdout + "\n" + done.stderr, done.returncode
    except subprocess.TimeoutExpired as e:
        output = _text(e.stdout) + "\n" + _text(e.stderr) + f"\n[bugreports] {e.cmd[0]} timed out after {e.timeout:g} s"
        rc = None
    except subprocess.CalledProcessError as e:  # the copy's git set-up or the case's setup script failed
        output = f"[bugreports] set-up failed: {' '.join(map(str, e.cmd))}: {_text(e.stderr).strip()}"
        rc = None
    finally:
        if own:
            shutil.rmtree(base, ignore_errors=True)
    verdict, missing, stated = judge(case, output)
    return CaseResult(name=case.name, verdict=verdict, expected=case.expected, seconds=time.monotonic() - start,
                      returncode=rc, missing=missing, stated=stated, output=output)


def _text(data: bytes | str | None) -> str:
    """Captured output as text, whatever subprocess handed back."""
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def summary_line(results: list[CaseResult]) -> str:
    """``right N of M; wrong cause stated: K``."""
    right = sum(r.verdict == "right" for r in results)
    wrong = sum(r.verdict == "wrong" for r in results)
    return f"right {right} of {len(results)}; wrong cause stated: {wrong}"


def _line(r: CaseResult) -> str:
    """One case's line: name, verdict, time, and what decided it."""
    why = ""
    if r.stated:
        why = " stated: " + " | ".join(r.stated)
    elif r.missing:
        why = " missing: " + " | ".join(r.missing)
    flag = "" if r.verdict == r.expected else f" (expected {r.expected})"
    return f"{r.name:<34} {r.verdict:<6} {r.seconds:6.1f} s{flag}{why}"


def main(argv: list[str] | None = None) -> int:
    """The command line: run the cases, print a line each and the summary (or JSON)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", action="append", metavar="NAME", help="run only this case (repeatable)")
    p.add_argument("--jobs", type=int, default=1, help="cases run at once [1]")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--check", action="store_true", help="exit 1 when a verdict differs from the case's expected")
    p.add_argument("--corpus", type=Path, default=CORPUS, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    try:
        cases = load_cases(a.corpus, a.only)
    except ValueError as e:
        print(f"bugreports: {e}", file=sys.stderr)
        return 2
    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        results = []
        for r in pool.map(run_case, cases):
            results.append(r)
            if not a.json:
                print(_line(r), flush=True)
    if a.json:
        print(json.dumps({"summary": summary_line(results),
                          "cases": [{**asdict(r), "output": r.output[-4000:]} for r in results]}, indent=1))
    else:
        print(summary_line(results))
    return 1 if a.check and any(r.verdict != r.expected for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
