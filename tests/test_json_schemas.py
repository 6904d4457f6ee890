"""One JSON (issue 37): every ``--json`` document starts with the same envelope and matches the
schema published under ``docs/schemas/``.

Each command's real output, from real runs of a tiny torch script (``bisect`` as a subprocess,
so ``exit_code`` is checked against the process's own status): ``kind``, ``schema_version``,
``verdict`` from the one vocabulary (``reprobisect.render.envelope``), then the command's own
fields, validated with ``jsonschema`` (draft 2020-12). A command given ``--json`` that fails
still prints one document (``verdict: error``). The runs are shared by module fixtures; the
commands that need three runs or a git repository (``resume``, ``runs``, ``audit``) are slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from reprobisect.render import envelope
from reprobisect.trace import TraceWriter, record_array

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = ROOT / "docs" / "schemas"
PY = sys.executable

TRAIN = """
import sys, torch
torch.manual_seed(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
lr = float(sys.argv[2]) if len(sys.argv) > 2 else 0.1
m = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(m.parameters(), lr=lr)
x, y = torch.randn(8, 4), torch.randn(8, 2)
for step in range(20):
    opt.zero_grad(); ((m(x) - y) ** 2).mean().backward(); opt.step()
"""


def _bisect(*args: str, cwd: Path, timeout: float = 300) -> tuple[int, dict]:
    """Run ``bisect ARGS`` as a process: its exit status and the JSON document on its stdout."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    p = subprocess.run([PY, "-m", "reprobisect", *args], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=timeout, stdin=subprocess.DEVNULL)
    try:
        doc = json.loads(p.stdout)
    except ValueError:
        raise AssertionError(f"bisect {' '.join(args)} (exit {p.returncode}) printed no JSON:\n{p.stdout[-1500:]}\n"
                             f"{p.stderr[-1500:]}") from None
    return p.returncode, doc


def _schema(name: str) -> dict:
    return json.loads((SCHEMAS / f"{name}.schema.json").read_text())


def _check(doc: dict, kind: str, rc: int) -> None:
    """``doc`` is a valid ``kind`` document (its schema and the shared envelope's) whose exit code is ``rc``."""
    for name in ("envelope", kind):
        errors = sorted(jsonschema.Draft202012Validator(_schema(name)).iter_errors(doc), key=lambda e: e.path)
        assert not errors, (name, [f"{list(e.path)}: {e.message[:300]}" for e in errors])
    assert list(doc)[:4] == ["kind", "schema_version", "verdict", "exit_code"], list(doc)[:6]
    assert doc["kind"] == kind and doc["schema_version"] == envelope.SCHEMA_VERSION
    assert doc["verdict"] in envelope.VERDICTS and doc["verdict"] in envelope.KIND_VERDICTS[kind]
    assert doc["exit_code"] == rc, (doc["exit_code"], rc)


def _trace(path: Path, value: float) -> str:
    """A one-step trace whose one parameter holds ``value`` (no run: a diverged pair in milliseconds)."""
    with TraceWriter(path, command=["python", "train.py"], environment={}) as wr:
        wr.begin_step(0)
        x = np.full(4, value, dtype=np.float32)
        wr.record(record_array("fc.weight", "param", x), x)
        wr.end_step({"loss": float(value)})
    return str(path)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A folder holding the tiny script and its captured trace ``a.trace`` (the capture's document kept)."""
    root = tmp_path_factory.mktemp("json")
    (root / "train.py").write_text(TRAIN)
    rc, doc = _bisect("capture", "-o", "a.trace", "--steps", "2", "--json", "--", "python", "train.py", "0", cwd=root)
    (root / "capture.json").write_text(json.dumps({"rc": rc, "doc": doc}))
    return root


@pytest.fixture(scope="module")
def answers(work: Path) -> dict[str, tuple[int, dict]]:
    """The probing commands' documents, two at a time: one or two 2-step runs each."""
    cmd = ["--steps", "2", "--", "python", "train.py"]
    todo = {
        "probe": ["probe", "--json", "--check", "match", "--reference", "a.trace", *cmd, "0"],
        "repro": ["repro", "--json", "--runs", "2", "--no-confirm", *cmd, "0"],
        "envs": ["envs", "--json", "--no-confirm", "--a", "env.JSON_SIDE=1", "--b", "env.JSON_SIDE=2", *cmd, "0"],
        "seeds": ["seeds", "--json", "--no-confirm", "--seeds", "0,1", *cmd, "{seed}"],
        "doctor": ["doctor", "--json", "--check", "finite", *cmd, "0"],
    }
    with ThreadPoolExecutor(2) as pool:
        futures = {k: pool.submit(_bisect, *args, cwd=work) for k, args in todo.items()}
        return {k: f.result() for k, f in futures.items()}


# --------------------------------------------------------------------------- the schemas


def test_every_schema_is_valid_2020_12_and_lists_its_kinds_verdicts():
    names = sorted(p.name.removesuffix(".schema.json") for p in SCHEMAS.glob("*.schema.json"))
    assert names == sorted(["envelope", *envelope.KIND_VERDICTS])
    for name in names:
        schema = _schema(name)
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema" and schema["description"]
        jsonschema.Draft202012Validator.check_schema(schema)
    assert _schema("envelope")["properties"]["verdict"]["enum"] == list(envelope.VERDICTS)
    for kind, verdicts in envelope.KIND_VERDICTS.items():
        answer, error = _schema(kind)["oneOf"]
        assert answer["properties"]["verdict"]["enum"] + ["error"] == list(verdicts), kind
        assert error["properties"]["verdict"] == {"const": "error"}


def test_a_document_whose_exit_code_contradicts_its_verdict_is_refused_by_the_schema():
    doc = {"kind": "compare", "schema_version": 1, "verdict": "agree", "exit_code": 1}
    assert not jsonschema.Draft202012Validator(_schema("compare")).is_valid(doc)
    with pytest.raises(ValueError, match="contradicts the envelope"):
        envelope.document("compare", "agree", 0, {"verdict": "diverged"})
    with pytest.raises(ValueError, match="is not one 'runs' gives"):
        envelope.document("runs", "agree", 0, {})


# --------------------------------------------------------------------------- every command's real output


def test_capture(work):
    saved = json.loads((work / "capture.json").read_text())
    _check(saved["doc"], "capture", saved["rc"])
    assert saved["rc"] == 0 and saved["doc"]["verdict"] == "agree" and saved["doc"]["outcome"]["status"] == "ok"


def test_compare_agree_and_diverged(work, tmp_path):
    rc, doc = _bisect("compare", "--json", "a.trace", "a.trace", cwd=work)
    _check(doc, "compare", rc)
    assert (rc, doc["verdict"]) == (0, "agree")
    a, b = _trace(tmp_path / "x", 1.0), _trace(tmp_path / "y", 2.0)
    rc, doc = _bisect("compare", "--json", a, b, cwd=tmp_path)
    _check(doc, "compare", rc)
    assert (rc, doc["verdict"], doc["first"]["name"]) == (1, "diverged", "fc.weight")


@pytest.mark.parametrize("kind, verdict, rc", [
    ("probe", "agree", 0), ("repro", "agree", 0), ("envs", "agree", 0), ("seeds", "agree", 0), ("doctor", "agree", 0)])
def test_probing_commands(answers, kind, verdict, rc):
    got_rc, doc = answers[kind]
    _check(doc, kind, got_rc)
    assert (got_rc, doc["verdict"]) == (rc, verdict), doc


def test_probe_keeps_its_own_verdict_under_probe_verdict(answers):
    doc = answers["probe"][1]
    assert doc["probe_verdict"]["verdict"] == "good" and doc["probe_verdict"]["check"] == "match"


@pytest.mark.parametrize("args, kind, rc, says", [
    (["compare", "--json", "no-such-a", "no-such-b"], "compare", 2, "no trace at"),
    (["probe", "--json", "--stepz", "2", "--", "python", "train.py"], "probe", 128, "no such option '--stepz'"),
    (["repro", "--json", "--runs", "2"], "repro", 2, "training command"),
])
def test_a_failing_command_still_prints_one_error_document(tmp_path, args, kind, rc, says):
    got_rc, doc = _bisect(*args, cwd=tmp_path)
    _check(doc, kind, got_rc)
    assert (got_rc, doc["verdict"]) == (rc, "error") and says in doc["error"], doc
    assert set(doc) == {"kind", "schema_version", "verdict", "exit_code", "error"}


# --------------------------------------------------------------------------- three runs, a repository, a night


RESUMABLE = """
import os, sys, torch
torch.manual_seed(0)
m = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
x, y = torch.randn(8, 4), torch.randn(8, 2)
start = 0
if "--resume" in sys.argv and os.path.exists("ckpt.pt"):
    ck = torch.load("ckpt.pt")
    m.load_state_dict(ck["model"]); opt.load_state_dict(ck["opt"]); start = ck["step"] + 1
for step in range(start, 6):
    opt.zero_grad(); ((m(x) - y) ** 2).mean().backward(); opt.step()
    torch.save({"model": m.state_dict(), "opt": opt.state_dict(), "step": step}, "ckpt.pt")
"""


@pytest.mark.slow
def test_resume(tmp_path):
    (tmp_path / "train.py").write_text(RESUMABLE)
    rc, doc = _bisect("resume", "--json", "--steps", "4", "--at", "2", "--resume-args", "--resume",
                      "--", "python", "train.py", cwd=tmp_path)
    _check(doc, "resume", rc)
    assert doc["verdict"] == {"bitwise": "agree", "diverged": "diverged"}.get(doc["resume_verdict"], "inconclusive")


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


@pytest.mark.slow
def test_runs(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "train.py").write_text(TRAIN)
    _git(repo, "add", "train.py")
    _git(repo, "commit", "-q", "-m", "lr 0.1")
    (repo / "train.py").write_text(TRAIN.replace("else 0.1", "else 0.2"))
    _git(repo, "commit", "-q", "-am", "lr 0.2")
    rc, doc = _bisect("runs", "--json", "--good", "HEAD~1", "--bad", "HEAD", "--steps", "2", "--",
                      "python", "train.py", "0", cwd=repo)
    _check(doc, "runs", rc)
    assert (rc, doc["verdict"], doc["first_bad"]["subject"]) == (0, "found", "lr 0.2"), doc


@pytest.mark.slow
def test_audit_document(work, tmp_path):
    config = tmp_path / "audit.yaml"
    config.write_text(f"name: json\nsteps: 2\ncommand: python {work / 'train.py'} 0\n"
                      "checks:\n  - name: deterministic\n    check: repro\n    runs: 2\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    p = subprocess.run([PY, "-m", "reprobisect", "audit", str(config), "--json", str(tmp_path / "audit.json")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    doc = json.loads((tmp_path / "audit.json").read_text())
    _check(doc, "audit", p.returncode)
    assert (p.returncode, doc["verdict"], doc["version"]) == (0, "agree", 1), p.stderr[-2000:]
