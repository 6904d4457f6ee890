"""``--verify`` means verified: every listed file unchanged, no file unlisted, every shard
consistent with the records that point into it, every rank of a multi-rank trace, and the
``--reference`` of ``bisect probe`` verified without asking (issue 34).

The tampered traces are made for real: a trace written with the ``TraceWriter``, then a
shard rewritten with the safetensors library and its SHA-256 updated in the manifest, so
that only the consistency checks can catch it. Each refusal is one ``error:`` line, exit 2
(128 for ``bisect probe``), no traceback.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from reprobisect.cli import main
from reprobisect.errors import TraceError
from reprobisect.trace import TraceWriter, read_trace, record_array, verify_trace
from reprobisect.trace.format import shard_name
from reprobisect.trace.ranks import assemble, open_ranks, rank_dir

ROOT = Path(__file__).resolve().parents[1]


def _write(path: Path, *, steps: int = 2, close: bool = True, extra: dict | None = None) -> Path:
    """A small real trace: four stored tensors a step, a state capture after step 1, and the
    command's output.log a capture leaves beside it."""
    w = TraceWriter(path, command=["python", "train.py"], environment={"device": "cpu"}, seed=0, extra=extra)
    for k in range(steps):
        rng = np.random.default_rng(k)
        w.begin_step(k)
        for kind, name in (("input", "x"), ("activation", "fc"), ("grad", "fc.weight"), ("param", "fc.weight")):
            a = rng.standard_normal((4, 4)).astype(np.float32)
            w.record(record_array(name, kind, a), a)
        w.end_step({"loss": 1.0 / (k + 1)}, batch_ids=[k])
        if k == 1:
            w.write_state(k, "model", {"model/fc.weight": rng.standard_normal((4, 4)).astype(np.float32)},
                          {"fc.weight": {"__tensor__": "model/fc.weight"}})
    if close:
        w.close("complete", outcome={"status": "ok", "detail": "ok"})
        (path / "output.log").write_text("step 0\nstep 1\n")
    else:
        w.drain()
        w._steps_file.flush()  # a writer killed here: the manifest still says incomplete
    return path


def _reseal(trace: Path, rel: str) -> None:
    """Update the manifest's size and SHA-256 of ``rel``: what a forger who edits a file does."""
    m = json.loads((trace / "manifest.json").read_text())
    data = (trace / rel).read_bytes()
    m["files"][rel] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (trace / "manifest.json").write_text(json.dumps(m))


def _reshard(trace: Path, step: int, edit) -> None:
    """Rewrite the shard of ``step`` with the safetensors library after ``edit(tensors)``, resealed."""
    rel = shard_name(step)
    tensors = load_file(str(trace / rel))
    edit(tensors)
    save_file(tensors, str(trace / rel))
    _reseal(trace, rel)


def _compare_verify(a: Path, b: Path, capsys) -> tuple[int, str]:
    code = main(["compare", "--verify", str(a), str(b)])
    err = capsys.readouterr().err
    return code, err


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def pair(tmp_path) -> tuple[Path, Path]:
    return _write(tmp_path / "a"), _write(tmp_path / "b")


def test_a_clean_trace_verifies_and_compares_as_before(pair, capsys):
    a, b = pair
    (b / "ray.json").write_text("{}")  # the Ray executor's placement record: unlisted, allowed
    v = verify_trace(b)
    assert v.stored_tensors == 8 and v.files == 5
    assert main(["compare", str(a), str(b)]) == 0
    code, err = _compare_verify(a, b, capsys)
    assert code == 0 and err == ""


@pytest.mark.parametrize("rel", ["tensors/step-000009.safetensors", "notes.txt", "state/step-1/extra.json",
                                 "tensors/.hidden", "tensors/sub/step-000000.safetensors"])
def test_an_unlisted_file_is_refused(pair, capsys, rel):
    a, b = pair
    (b / rel).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(b / shard_name(0), b / rel)
    assert main(["compare", str(a), str(b)]) == 0  # unverified: never looks
    code, err = _compare_verify(a, b, capsys)
    assert code == 2
    assert f"holds '{rel}', which its manifest does not list" in _one_line(err)


def test_a_listed_file_outside_the_layout_is_refused(pair, capsys):
    a, b = pair
    (b / "notes.txt").write_text("hello")
    _reseal(b, "notes.txt")
    code, err = _compare_verify(a, b, capsys)
    assert code == 2 and "lists notes.txt, which is not a file of a trace" in _one_line(err)


def test_a_resealed_shard_with_a_changed_shape_is_refused(pair, capsys):
    a, b = pair
    _reshard(b, 1, lambda t: t.__setitem__("param/fc.weight", t["param/fc.weight"].reshape(2, 8)))
    code, err = _compare_verify(a, b, capsys)
    assert code == 2
    assert ("tensor 'param/fc.weight' in tensors/step-000001.safetensors is float32 (2, 8) "
            "but steps.jsonl records float32 (4, 4)") in _one_line(err)


def test_a_resealed_shard_with_changed_values_is_refused(pair, capsys):
    a, b = pair
    _reshard(b, 1, lambda t: t.__setitem__("param/fc.weight", t["param/fc.weight"] + np.float32(1)))
    assert main(["compare", str(a), str(b)]) == 0  # fingerprints agree: the shard is never read
    code, err = _compare_verify(a, b, capsys)
    assert code == 2
    assert ("tensor 'param/fc.weight' in tensors/step-000001.safetensors does not hold the values its "
            "record's fingerprint names") in _one_line(err)


@pytest.mark.parametrize("name, said", [
    ("../../0.weight", "holds a tensor named '../../0.weight', a path out of its place"),
    ("param/../../0.weight", "holds a tensor named 'param/../../0.weight', a path out of its place"),
    ("<script>", "holds tensor '<script>', which no record of steps.jsonl stores"),
    ("param/fc\x1b[2Jweight", "holds a tensor named 'param/fc\\x1b[2Jweight', with a control character"),
])
def test_a_renamed_tensor_is_refused_by_its_name(pair, capsys, name, said):
    a, b = pair
    _reshard(b, 0, lambda t: t.__setitem__(name, t.pop("param/fc.weight")))
    code, err = _compare_verify(a, b, capsys)
    assert code == 2 and said in _one_line(err)


def test_a_shard_tensor_no_record_points_to_is_refused(pair, capsys):
    a, b = pair
    _reshard(b, 1, lambda t: t.__setitem__("param/extra", np.zeros(3, np.float32)))
    code, err = _compare_verify(a, b, capsys)
    assert code == 2
    assert "tensors/step-000001.safetensors holds tensor 'param/extra', which no record of steps.jsonl stores" \
        in _one_line(err)


def test_an_incomplete_trace_verifies_what_it_holds(tmp_path):
    p = _write(tmp_path / "t", close=False)
    (p / "tensors" / ".step-000002.safetensors.tmp999").write_bytes(b"x")  # a killed writer's temp file
    assert verify_trace(p, allow_incomplete=True).stored_tensors == 8
    (p / "notes.txt").write_text("x")
    with pytest.raises(TraceError, match=r"holds 'notes.txt', which is not part of a trace"):
        verify_trace(p, allow_incomplete=True)
    (p / "notes.txt").unlink()
    tensors = load_file(str(p / shard_name(1)))
    tensors["param/extra"] = np.zeros(2, np.float32)
    save_file(tensors, str(p / shard_name(1)))
    with pytest.raises(TraceError, match=r"holds tensor 'param/extra', which no record"):
        verify_trace(p, allow_incomplete=True)


def _ranked(path: Path) -> Path:
    for r in range(2):
        _write(rank_dir(path, r), extra={"distributed": {"rank": r, "local_rank": r, "world_size": 2,
                                                         "backend": "gloo", "device": "cpu"}})
        (rank_dir(path, r) / "output.log").unlink()
    assemble(path, command=["torchrun", "train.py"], outcome={"status": "ok", "detail": "done"})
    (path / "output.log").write_text("done\n")
    return path


def test_every_rank_of_a_multi_rank_trace_is_verified(tmp_path, capsys):
    a, b = _ranked(tmp_path / "a"), _ranked(tmp_path / "b")
    assert len(open_ranks(b, verify=True)) == 2
    code, err = _compare_verify(a, b, capsys)
    assert code == 0, err
    _reshard(rank_dir(b, 1), 1, lambda t: t.__setitem__("param/extra", np.zeros(3, np.float32)))
    _reseal(b, "ranks/rank-1/manifest.json")  # and the top manifest's checksum of the shard's
    assert main(["compare", str(a), str(b)]) == 0
    code, err = _compare_verify(a, b, capsys)
    assert code == 2 and "rank-1': tensors/step-000001.safetensors holds tensor 'param/extra'" in _one_line(err)


@pytest.mark.parametrize("rel, said", [
    ("notes.txt", "b' holds 'notes.txt', which is not part of a multi-rank trace"),
    ("ranks/rank-7", "b' holds 'ranks/rank-7', which is not a rank's shard"),
    ("ranks/rank-1/notes.txt", "rank-1' holds 'notes.txt', which its manifest does not list"),
])
def test_a_multi_rank_trace_holding_an_unlisted_file_is_refused(tmp_path, capsys, rel, said):
    a, b = _ranked(tmp_path / "a"), _ranked(tmp_path / "b")
    (b / rel).write_text("x")
    code, err = _compare_verify(a, b, capsys)
    assert code == 2 and said in _one_line(err)


def test_a_multi_rank_manifest_naming_a_file_outside_is_refused(tmp_path, capsys):
    a, b = _ranked(tmp_path / "a"), _ranked(tmp_path / "b")
    m = json.loads((b / "manifest.json").read_text())
    m["files"]["../a/manifest.json"] = m["files"].pop("ranks/rank-1/manifest.json")
    (b / "manifest.json").write_text(json.dumps(m))
    assert main(["compare", str(a), str(b)]) == 2
    assert "not a plain relative path inside the trace" in _one_line(capsys.readouterr().err)


def test_probe_verifies_its_reference_before_probing(pair, tmp_path):
    """A tampered --reference stops git bisect run (128) before the command runs at all."""
    _, ref = pair
    _reshard(ref, 1, lambda t: t.__setitem__("param/extra", np.zeros(3, np.float32)))
    marker = tmp_path / "ran"
    (tmp_path / "train.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    r = subprocess.run([str(ROOT / ".venv" / "bin" / "bisect"), "probe", "--reference", str(ref), "--",
                        sys.executable, "train.py"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 128, (r.stdout, r.stderr)
    assert "holds tensor 'param/extra', which no record" in _one_line(r.stderr)
    assert not marker.exists()


@pytest.mark.slow
def test_a_real_capture_with_full_tensors_verifies(tmp_path):
    """What a real capture leaves (output.log beside the listed files, torch's own
    fingerprints of every stored tensor) verifies; the same trace with one shard grown by a
    tensor does not."""
    bisect = str(ROOT / ".venv" / "bin" / "bisect")
    t = tmp_path / "t"
    r = subprocess.run([bisect, "capture", "-q", "-o", str(t), "--steps", "2", "--full-steps", "0,1",
                        "--state-steps", "1", "--", sys.executable, str(ROOT / "examples" / "mlp.py"), "--seed", "0"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (t / "output.log").is_file()
    assert verify_trace(t).stored_tensors == sum(rec.stored for s in read_trace(t) for rec in s.records) > 0
    r = subprocess.run([bisect, "compare", "--verify", str(t), str(t)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    _reshard(t, 0, lambda ts: ts.__setitem__("param/extra", np.zeros(3, np.float32)))
    r = subprocess.run([bisect, "compare", "--verify", str(t), str(t)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "holds tensor 'param/extra'" in _one_line(r.stderr)
