"""`compare --zoom` re-runs what was recorded (issue 36 item 6), and says so honestly (issue 37).

Each side re-runs at its trace's recorded commit in a detached worktree, from the recorded
folder relative to the repository root, whatever the user's checkout holds now; the
checkout (working tree, index, HEAD) stays byte-identical and no worktree is left. A trace
recorded with uncommitted changes the checkout no longer holds is refused (one line, exit
2); one recorded outside git re-runs in place and the output says so. Real git
repositories in tmp folders, the real launcher and the real CLI; the zoom script is the one
of tests/test_zoom.py.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reprobisect.cli import main
from reprobisect.errors import UsageError
from reprobisect.trace import Record, TraceWriter, read_trace
from reprobisect.workflows.zoom import ZoomResult, _contradiction, run_zoom
from tests.test_zoom import SCRIPT

PY = sys.executable
_SWITCH = '(2.0000002 if os.environ.get("TORCH_ZOOM_TEST_SWITCH") == "1" else 2.0)'
assert _SWITCH in SCRIPT


def _script(factor: str, first: str = "2") -> str:
    """tests/test_zoom.py's script with Scale's second factor fixed (and its first one)."""
    return SCRIPT.replace(_SWITCH, factor).replace("y = x * 2", f"y = x * {first}")


def _git(repo: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    done = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=repo,
                          env=env, capture_output=True, text=True, check=True)
    return done.stdout


def _commit(repo: Path, text: str, message: str) -> str:
    (repo / "src" / "train.py").write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD").strip()


def _record(cwd: Path, trace: Path, env: dict[str, str] | None = None) -> None:
    done = subprocess.run([PY, "-m", "reprobisect.runners.launch", "--trace", str(trace), "--steps", "2", "--",
                           "train.py"], cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def _snapshot(repo: Path) -> dict[str, str]:
    """What the user owns: every file of the working tree (untracked ones too), the index, HEAD."""
    files = {str(p.relative_to(repo)): hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted(repo.rglob("*")) if p.is_file() and ".git" not in p.relative_to(repo).parts}
    git_dir = repo / ".git"
    return {**files, ".git/index": hashlib.sha256((git_dir / "index").read_bytes()).hexdigest(),
            ".git/HEAD": (git_dir / "HEAD").read_text(), "rev": _git(repo, "rev-parse", "HEAD"),
            "status": _git(repo, "status", "--porcelain", "--untracked-files=all")}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "repo"
    (r / "src").mkdir(parents=True)
    (r / "README").write_text("a project\n")
    _git(r, "init", "-q")
    return r.resolve()


@pytest.mark.slow
def test_zoom_reruns_each_side_at_its_recorded_commit_and_leaves_the_checkout_alone(repo, tmp_path, capsys, monkeypatch):
    pytest.importorskip("torch")
    c1 = _commit(repo, _script("2.0"), "one")
    _record(repo / "src", tmp_path / "a.trace")
    c2 = _commit(repo, _script("2.0000002"), "two: the second factor changes")
    _record(repo / "src", tmp_path / "b.trace")
    # the checkout moves on: a third commit changes the first factor (the second is back),
    # and the user has uncommitted work of their own (a changed file, a staged one, an untracked one)
    _commit(repo, _script("2.0", first="3"), "three")
    (repo / "README").write_text("edited, not committed\n")
    (repo / "staged.txt").write_text("staged\n")
    _git(repo, "add", "staged.txt")
    (repo / "notes.txt").write_text("untracked\n")
    before = _snapshot(repo)
    monkeypatch.chdir(tmp_path)
    code = main(["compare", str(tmp_path / "a.trace"), str(tmp_path / "b.trace"), "--zoom"])
    out = capsys.readouterr().out
    assert code == 1, out
    # the op of commits one/two: the second mul, 2.0 against 2.0000002 (today's code re-ran
    # both sides in commit three and found them agreeing)
    assert "first op whose inputs agree and output differs: aten.mul.Tensor #1" in out, out
    assert "2.0 vs 2.0000002" in out.replace("'", "").replace("[", "").replace("]", ""), out
    assert f"re-ran A at its recorded commit {c1[:10]} (a detached worktree); " \
           f"B at its recorded commit {c2[:10]} (a detached worktree)" in out, out
    assert "disagrees" not in out, out
    assert _snapshot(repo) == before  # working tree, index and HEAD byte-identical
    worktrees = _git(repo, "worktree", "list", "--porcelain")
    assert worktrees.count("worktree ") == 1, worktrees  # only the user's own
    assert not any((repo / ".git" / "reprobisect" / "worktrees").glob("*/wt*"))


def test_a_dirty_trace_the_checkout_no_longer_holds_is_refused(repo, tmp_path, capsys):
    """No framework needed: the refusal comes before anything runs."""
    c1 = _commit(repo, "print('one')\n", "one")
    trace = _fake_trace(tmp_path / "a.trace", repo / "src", {"commit": c1, "dirty": True, "branch": "main",
                                                            "root": str(repo)})
    before = _snapshot(repo)  # clean at c1: the uncommitted changes are gone
    code = main(["compare", str(trace), str(_other(tmp_path)), "--zoom"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0] == (
        f"error: trace '{trace}' was recorded at {c1[:10]} with uncommitted changes that the checkout {repo} "
        "(now at " + c1[:10] + ", clean) no longer holds; zoom cannot re-run it faithfully: re-record it from a "
        "clean commit"), err
    assert _snapshot(repo) == before
    # the checkout moved to another commit, with changes of its own: refused as well
    _commit(repo, "print('two')\n", "two")
    (repo / "src" / "train.py").write_text("print('three')\n")
    before = _snapshot(repo)
    with pytest.raises(UsageError, match=rf"recorded at {c1[:10]} with uncommitted changes .* \(now at [0-9a-f]{{10}} "
                                         r"with uncommitted changes\) no longer holds; .*re-record it from a clean commit"):
        run_zoom(trace, _other(tmp_path), module="scale", step=0, trust=True)
    assert _snapshot(repo) == before and _git(repo, "worktree", "list").count("\n") == 1


def test_a_dirty_trace_reruns_in_the_checkout_when_it_still_holds_changes_and_says_so(repo, tmp_path):
    c1 = _commit(repo, "import sys\nsys.exit(3)\n", "one")
    (repo / "src" / "train.py").write_text("import sys\nsys.exit(4)\n")  # still dirty, at the same commit
    trace = _fake_trace(tmp_path / "a.trace", repo / "src", {"commit": c1, "dirty": True, "branch": None,
                                                            "root": str(repo)})
    from reprobisect.workflows.zoom import ZoomSide, _side_spec

    spec, said = _side_spec(read_trace(trace), ZoomSide(), "scale", 0, "zoom-a", 10.0, "A")
    assert spec.revision is None and spec.workdir == str(repo / "src")
    assert said == (f"A in the checkout itself at {c1[:10]}: its trace was recorded with uncommitted changes, "
                    "assumed to be the ones the checkout holds now (the trace records only that there were some)")


@pytest.mark.slow
def test_a_trace_recorded_outside_git_reruns_in_place_and_says_so(tmp_path, capsys):
    pytest.importorskip("torch")
    work = tmp_path / "nogit"
    work.mkdir()
    (work / "train.py").write_text(SCRIPT)
    _record(work, tmp_path / "a.trace")
    _record(work, tmp_path / "b.trace", {"TORCH_ZOOM_TEST_SWITCH": "1"})
    assert read_trace(tmp_path / "a.trace").manifest.revision is None
    code = main(["compare", str(tmp_path / "a.trace"), str(tmp_path / "b.trace"), "--zoom"])
    out = capsys.readouterr().out
    assert code == 1 and "aten.mul.Tensor #1" in out, out
    assert (f"re-ran A in place in '{work.resolve()}' (its trace was recorded outside any git repository: the files "
            "there are assumed to be the ones it ran)") in out, out


def test_a_zoom_the_traces_contradict_says_so_on_its_own_line(tmp_path):
    """Issue 37: "banner: inputs agree; zoom: inputs differ" is said as a disagreement."""
    from types import SimpleNamespace as D

    recorded = _module_trace(tmp_path / "t", "out1")
    same, moved = _module_trace(tmp_path / "z1", "out1"), _module_trace(tmp_path / "z2", "OTHER")
    origin = D(kind="activation", name="m", step=0, localization="origin")
    r = ZoomResult(module="m", step=0, verdict="inputs_differ", detail="the first differing op ...",
                   reruns=("A at its recorded commit abc (a detached worktree)",))
    said = _contradiction(origin, r, (recorded, recorded), (same, moved))
    assert said.startswith("the zoom disagrees with the trace comparison: the re-run of side B did not reproduce "
                           "its trace (the module's output at step 0 differs from the recorded one")
    assert "side A" not in said
    assert ("the traces show the module's inputs agreeing at step 0, but in the re-run its first differing op "
            "already has differing inputs") in said
    text = str(ZoomResult(**{**r.to_json(), "reruns": tuple(r.reruns), "contradiction": said}))
    assert text.splitlines()[1:] == ["  re-ran A at its recorded commit abc (a detached worktree)", f"  {said}"]
    agree = ZoomResult(module="m", step=0, verdict="agree", detail="all 3 ops agree")
    assert "the divergence did not reproduce" in _contradiction(origin, agree, (recorded, recorded), (same, same))
    ok = ZoomResult(module="m", step=0, verdict="origin", op="aten.mul.Tensor", occurrence=1)
    assert _contradiction(origin, ok, (recorded, recorded), (same, same)) == ""


def test_a_clean_trace_reruns_in_a_worktree_from_its_folder_with_its_paths_and_links(repo, tmp_path):
    """The probe of a clean trace: the recorded commit, the folder relative to the root, the
    command's absolute paths into the checkout made relative (they must name the worktree's
    files), and --link paths checked against the repository."""
    from reprobisect.workflows.zoom import ZoomSide, _side_spec

    c1 = _commit(repo, "print('one')\n", "one")
    (repo / "data").mkdir()
    (repo / "data" / "x.bin").write_bytes(b"1")
    path = tmp_path / "a.trace"
    with TraceWriter(path, command=[str(repo / "src" / "train.py"), f"--cfg={repo}/conf.yaml", "--n", "3"],
                     revision={"commit": c1, "dirty": False, "branch": "main", "root": str(repo)},
                     recorder={"cwd": str(repo / "src")}, environment={"env_vars": {"OMP_NUM_THREADS": "1"}}) as w:
        w.begin_step(0)
        w.end_step()
    _commit(repo, "print('two')\n", "two")  # HEAD moves on
    spec, said = _side_spec(read_trace(path), ZoomSide(env={"X": "1"}), "m", 2, "zoom-b", 5.0, "B", ("data",))
    assert (spec.repo, spec.revision, spec.subdir, spec.workdir, spec.links) == (str(repo), c1, "src", None, ("data",))
    assert spec.argv[1:] == ("train.py", "--cfg=../conf.yaml", "--n", "3")
    assert spec.env == {"OMP_NUM_THREADS": "1", "X": "1"} and spec.steps == 3
    assert said == f"B at its recorded commit {c1[:10]} (a detached worktree)"
    with pytest.raises(UsageError, match="--link nothere: nothere does not exist in"):
        _side_spec(read_trace(path), ZoomSide(), "m", 2, "zoom-b", 5.0, "B", ("nothere",))


def test_the_report_shows_the_zooms_disagreement_and_where_it_reran(tmp_path):
    """Issue 37: the report's op-zoom table carries the zoom's own verdict, not only the banner's."""
    import json

    from reprobisect.core.compare import compare_paths
    from reprobisect.report import write_report

    a, b = _fake_trace(tmp_path / "a.trace", tmp_path, {}), _other(tmp_path)
    doc = compare_paths(a, b).to_json()
    said = "the zoom disagrees with the trace comparison: the traces diverge at this module at step 0, but in the re-run every op agrees"
    doc["zoom"] = ZoomResult(module="scale", step=0, verdict="agree", detail="all 2 ops agree", contradiction=said,
                             reruns=("A at its recorded commit 1234567890 (a detached worktree)", "B in place")).to_json()
    (tmp_path / "c.json").write_text(json.dumps(doc))
    html = write_report(tmp_path / "c.json", tmp_path / "c.html").read_text()
    assert f"<td>contradiction</td><td>{said}</td>" in html
    assert "<td>reruns</td><td>A at its recorded commit 1234567890 (a detached worktree); B in place</td>" in html


# -- helpers -----------------------------------------------------------------------------

def _fake_trace(path: Path, cwd: Path, revision: dict) -> Path:
    """A sealed one-step trace whose manifest records ``revision`` and ``cwd`` (no framework)."""
    with TraceWriter(path, command=["train.py"], revision=revision,
                     recorder={"launcher": "reprobisect.runners.launch", "cwd": str(cwd)}) as w:
        w.begin_step(0)
        w.record(Record(name="scale", kind="activation", dtype="float32", shape=(2,), fingerprint="a", inputs=("x",),
                        module="Scale"))
        w.end_step()
    return path


def _other(tmp_path: Path) -> Path:
    """Side B: differs from ``_fake_trace`` at module 'scale' (inputs agree), recorded outside git."""
    p = tmp_path / "b.trace"
    if not p.exists():
        with TraceWriter(p, command=["train.py"], recorder={"cwd": str(tmp_path)}) as w:
            w.begin_step(0)
            w.record(Record(name="scale", kind="activation", dtype="float32", shape=(2,), fingerprint="b",
                            inputs=("x",), module="Scale"))
            w.end_step()
    return p


def _module_trace(path: Path, fingerprint: str):
    with TraceWriter(path) as w:
        w.begin_step(0)
        w.record(Record(name="m", kind="activation", dtype="float32", shape=(2,), fingerprint=fingerprint))
        w.end_step()
    return read_trace(path)
