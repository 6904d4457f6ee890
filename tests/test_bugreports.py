"""The bug-report corpus (examples/bugreports/): every case valid, runnable, and judged in CI.

Each case adapts a public issue thread into a seconds-long script, the ``bisect`` command a
user would run, and regexes a right answer must (``must_say``) and must not (``must_not_say``)
contain. ``scripts/bench/bugreports.py`` runs and judges them; these tests:

- validate every case file (fields, a thread URL, regexes that compile, the corpus' shape:
  at least 8 resume, 8 nondeterminism, 10 doctor and 4 compare cases, 3 Lightning, 3 Keras);
- run each ``train.py`` as plain python (it must work without the tool);
- run each case through the tool (one test per case). A case the tool does not answer right
  today records that in its ``expected`` field and is ``xfail(strict=True)``: when a fix
  makes it right, the test fails and tells us to update ``expected``;
- pin the runner's own judging and its errors on small cases written here.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_runner():
    """scripts/bench/bugreports.py as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("bugreports_under_test", ROOT / "scripts" / "bench" / "bugreports.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve their module by name
    spec.loader.exec_module(mod)
    return mod


bugreports = _load_runner()
FOLDERS = sorted(p for p in bugreports.CORPUS.iterdir() if (p / "case.yaml").is_file())
CASES = {c.name: c for c in bugreports.load_cases()}


def _case_param(name: str):
    """One case as a pytest param: xfail(strict) unless its case file says the tool is right today."""
    case = CASES[name]
    marks = [pytest.mark.slow]
    if case.expected != "right":
        marks.append(pytest.mark.xfail(strict=True, reason=f"today's answer: {case.expected} (see case.yaml)"))
    return pytest.param(name, id=name, marks=marks)


# --- the corpus' files -------------------------------------------------------------------


@pytest.mark.parametrize("folder", FOLDERS, ids=[p.name for p in FOLDERS])
def test_case_file_is_valid(folder: Path) -> None:
    case = bugreports.load_case(folder)
    assert case.source.startswith("https://github.com/")
    assert len(case.root_cause) > 60, "root_cause should say what the thread established"
    assert case.must_not_say, "a case must name at least one wrong cause stated as fact"


def test_corpus_shape() -> None:
    kinds = [c.kind for c in CASES.values()]
    frameworks = [c.framework for c in CASES.values()]
    assert len(CASES) >= 30
    assert kinds.count("resume") >= 8 and kinds.count("nondeterminism") >= 8
    assert kinds.count("doctor") >= 10 and kinds.count("compare") >= 4
    assert frameworks.count("lightning") >= 3 and frameworks.count("keras") >= 3
    assert len({c.source for c in CASES.values()}) == len(CASES), "one thread per case"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_train_py_runs_as_plain_python(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    work = tmp_path / name
    shutil.copytree(case.folder, work)
    env = {k: v for k, v in os.environ.items() if not k.startswith("REPROBISECT_")}
    done = subprocess.run([sys.executable, "train.py"], cwd=work, env=env, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]


# --- each case through the tool ------------------------------------------------------------


@pytest.fixture(scope="module")
def answers(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every selected case run once, ``BUGREPORTS_JOBS`` (default 2) at a time: the corpus fits CI's budget."""
    names = [item.callspec.params["name"] for item in request.session.items
             if getattr(item, "originalname", "") == "test_case_answer_is_right"]
    base = tmp_path_factory.mktemp("bugreports")
    jobs = int(os.environ.get("BUGREPORTS_JOBS", "2"))
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return dict(zip(names, pool.map(lambda n: bugreports.run_case(CASES[n], base), names)))


@pytest.mark.parametrize("name", [_case_param(n) for n in sorted(CASES)])
def test_case_answer_is_right(name: str, answers: dict) -> None:
    result = answers[name]
    assert result.verdict == "right", (
        f"{name}: {result.verdict} (missing {list(result.missing)}, stated {list(result.stated)})\n"
        + result.output[-3000:])


# --- the runner itself (fast: no training) -----------------------------------------------


def _write_case(folder: Path, **fields) -> Path:
    """A case folder with a trivial train.py and a case.yaml built from ``fields``."""
    import yaml

    folder.mkdir(parents=True)
    (folder / "train.py").write_text("print('trained')\n")
    data = {"source": "https://github.com/example/repo/issues/1", "framework": "torch", "kind": "doctor",
            "root_cause": "x", "command": "bisect --version", "must_say": ["version"],
            "must_not_say": ["Traceback"], "expected": "right", **fields}
    (folder / "case.yaml").write_text(yaml.safe_dump({k: v for k, v in data.items() if v is not None}))
    return folder


def test_judge_right_wrong_missed(tmp_path: Path) -> None:
    case = bugreports.load_case(_write_case(tmp_path / "c", must_say=["(?i)schedul"],
                                            must_not_say=["PYTHONHASHSEED was unset"]))
    assert bugreports.judge(case, "the LR Scheduler's state was not saved")[0] == "right"
    assert bugreports.judge(case, "resume differs: step counter")[0] == "missed"
    verdict, _, stated = bugreports.judge(case, "scheduler? PYTHONHASHSEED was unset, so ...")
    assert verdict == "wrong" and stated == ("PYTHONHASHSEED was unset",)


@pytest.mark.parametrize("fields, message", [
    ({"source": "https://example.com/thread"}, "source is not a GitHub issue/pull URL"),
    ({"must_say": ["(unclosed"]}, "must_say regex '\\(unclosed' does not compile"),
    ({"expected": "maybe"}, "expected 'maybe' is not one of right, wrong, missed"),
    ({"command": "python train.py"}, "command does not start with 'bisect '"),
    ({"root_cause": None}, "missing field 'root_cause'"),
])
def test_invalid_case_file_is_named_with_the_problem(tmp_path: Path, fields: dict, message: str) -> None:
    folder = _write_case(tmp_path / "bad", **fields)
    with pytest.raises(ValueError, match=rf"bad[/\\]case\.yaml: .*{message}"):
        bugreports.load_case(folder)


def test_run_case_in_a_fresh_repository_and_summary(tmp_path: Path) -> None:
    folder = _write_case(tmp_path / "corpus" / "version", must_say=["(?i)\\d+\\.\\d+"])
    result = bugreports.run_case(bugreports.load_case(folder), tmp_path / "work")
    assert result.verdict == "right" and result.returncode == 0, result.output
    assert (tmp_path / "work" / "version" / ".git").is_dir()
    assert not (folder / ".git").exists(), "the case folder itself is never touched"
    assert bugreports.summary_line([result]) == "right 1 of 1; wrong cause stated: 0"


def test_cli_unknown_case_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert bugreports.main(["--only", "no_such_case"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bugreports: no case named no_such_case in ")


def test_failing_setup_is_missed_with_the_reason(tmp_path: Path) -> None:
    folder = _write_case(tmp_path / "corpus" / "broken", setup="setup.sh")
    (folder / "setup.sh").write_text("echo 'no such revision' >&2; exit 3\n")
    result = bugreports.run_case(bugreports.load_case(folder), tmp_path / "work")
    assert result.verdict == "missed" and result.returncode is None
    assert "set-up failed: bash setup.sh: no such revision" in result.output
