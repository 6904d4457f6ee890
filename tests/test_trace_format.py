"""Trace format v1: the writer and the validating reader, against real files and a killed writer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from reprobisect.errors import TraceError
from reprobisect.trace import VERSION, TraceWriter, fingerprint, read_trace, record_array
from reprobisect.trace import shards
from reprobisect.trace.format import shard_name

DTYPES = [
    np.float16,
    ml_dtypes.bfloat16,
    ml_dtypes.float8_e4m3fn,
    ml_dtypes.float8_e5m2,
    np.float32,
    np.float64,
    np.bool_,
    np.int8,
    np.uint8,
    np.int32,
    np.int64,
    np.complex64,
]


def _array(dtype, shape=(3, 5), seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, shape, dtype=dt, endpoint=True)
    if dt.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    return (rng.standard_normal(shape) * 4).astype(dt)


def write_trace(path: Path, steps: int = 3, *, store: bool = True, env: dict | None = None) -> Path:
    with TraceWriter(path, command=["python", "train.py"], environment=env or {"device": "cpu"}, seed=0) as w:
        for k in range(steps):
            w.begin_step(k)
            for kind, name in (("input", "x"), ("activation", "fc"), ("grad", "fc.weight"), ("param", "fc.weight")):
                a = _array(np.float32, (4, 4), seed=k * 10 + len(name))
                w.record(record_array(name, kind, a), a if store else None)
            w.end_step({"loss": 1.0 / (k + 1)}, batch_ids=[k, k + 100])
    return path


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


# -- round trips ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_dtype_round_trips_bit_exact(tmp_path, dtype):
    arrays = {"t": _array(dtype), "scalar": _array(dtype, ()), "empty": _array(dtype, (0, 3))}
    with TraceWriter(tmp_path / "t") as w:
        w.begin_step(0)
        for name, a in arrays.items():
            w.record(record_array(name, "activation", a), a)
        w.end_step()
    trace = read_trace(tmp_path / "t")
    for rec in trace.steps[0].records:
        got = trace.tensor(0, rec)
        want = arrays[rec.name]
        assert got.dtype == want.dtype and got.shape == want.shape
        assert _bits(got) == _bits(want)
        assert fingerprint(got) == rec.fingerprint
        assert rec.dtype == np.dtype(dtype).name


def test_shards_load_with_the_safetensors_library(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors import safe_open

    arrays = {np.dtype(d).name: _array(d) for d in DTYPES}
    shards.save(arrays, tmp_path / "s.safetensors")
    with safe_open(tmp_path / "s.safetensors", framework="pt") as f:
        assert set(f.keys()) == set(arrays)
        for name, want in arrays.items():
            t = f.get_tensor(name)
            assert tuple(t.shape) == want.shape
            assert t.contiguous().view(torch.uint8).numpy().tobytes() == _bits(want)


def test_non_finite_values_and_numpy_scalars_are_recorded(tmp_path):
    a = np.array([np.nan, np.inf, -np.inf, 1.0], np.float32)
    with TraceWriter(tmp_path / "t") as w:
        w.begin_step(0)
        w.record(record_array("loss", "loss", np.float32(np.nan)))
        w.record(record_array("y", "output", a), a)
        w.end_step({"loss": float("nan"), "lr": np.float32(0.5), "scale": np.inf}, batch_ids=list(np.arange(2)))
    s = read_trace(tmp_path / "t").steps[0]
    assert s.scalars == {"loss": "nan", "lr": 0.5, "scale": "inf"}
    assert s.batch_ids == [0, 1]
    y = s.records[1]
    assert y.stat("nan") == 1 and y.stat("inf") == 2
    assert np.isnan(s.records[0].stat("mean"))


def test_stored_tensor_is_the_value_at_record_time(tmp_path):
    a = np.ones(8, np.float32)
    with TraceWriter(tmp_path / "t") as w:
        w.begin_step(0)
        rec = w.record(record_array("w", "param", a), a)
        a += 1  # an optimizer updating the parameter in place before the step is written
        w.end_step()
    t = read_trace(tmp_path / "t")
    got = t.tensor(0, t.steps[0].records[0])
    assert np.array_equal(got, np.ones(8, np.float32))
    assert fingerprint(got) == rec.fingerprint


def test_records_keep_chain_order_module_and_inputs(tmp_path):
    with TraceWriter(tmp_path / "t") as w:
        w.begin_step(0)
        w.record(record_array("enc", "activation", np.zeros(2), module="Linear", inputs=("abc", "def")))
        w.record(record_array("loss", "loss", np.float32(1)))
        w.end_step()
    recs = read_trace(tmp_path / "t").steps[0].records
    assert [r.order for r in recs] == [0, 1]
    assert recs[0].module == "Linear" and recs[0].inputs == ("abc", "def")
    assert recs[1].inputs is None and not recs[1].stored


def test_state_is_written_and_listed(tmp_path):
    with TraceWriter(tmp_path / "t") as w:
        w.begin_step(0)
        w.end_step()
        w.write_state(0, "model", {"w": np.arange(3.0)}, {"kind": "model"})
    m = read_trace(tmp_path / "t").manifest
    assert "state/step-0/model.safetensors" in m.files and "state/step-0/model.json" in m.files
    assert np.array_equal(shards.load(tmp_path / "t/state/step-0/model.safetensors")["w"], np.arange(3.0))


# -- writer misuse -------------------------------------------------------------------


def test_writer_rejects_misuse(tmp_path):
    with TraceWriter(tmp_path / "t") as w:
        with pytest.raises(TraceError, match="outside begin_step"):
            w.record(record_array("x", "input", np.zeros(1)))
        w.begin_step(1)
        with pytest.raises(TraceError, match="unknown kind 'weights'"):
            w.record(record_array("x", "weights", np.zeros(1)))
        w.record(record_array("x", "input", np.zeros(1)))
        with pytest.raises(TraceError, match="written twice"):
            w.record(record_array("x", "input", np.zeros(1)))
        w.end_step()
        with pytest.raises(TraceError, match="steps must increase"):
            w.begin_step(1)


def test_exception_inside_writer_seals_failed(tmp_path):
    with pytest.raises(RuntimeError):
        with TraceWriter(tmp_path / "t") as w:
            w.begin_step(0)
            w.end_step()
            raise RuntimeError("loss exploded")
    with pytest.raises(TraceError, match=r"records a failed run \(RuntimeError: loss exploded; 1 step"):
        read_trace(tmp_path / "t")
    t = read_trace(tmp_path / "t", allow_incomplete=True)
    assert t.manifest.status == "failed" and len(t.steps) == 1


def test_reopening_replaces_the_previous_trace_whole(tmp_path):
    write_trace(tmp_path / "t", steps=5)
    (tmp_path / "t" / "stray.txt").write_text("from the first attempt")
    write_trace(tmp_path / "t", steps=2)
    t = read_trace(tmp_path / "t")
    assert [s.step for s in t.steps] == [0, 1]
    assert not (tmp_path / "t" / shard_name(4)).exists()
    assert not (tmp_path / "t" / "stray.txt").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["t"]  # no leftover temp folders


def test_refuses_to_clobber_a_folder_that_is_not_a_trace(tmp_path):
    d = tmp_path / "results"
    d.mkdir()
    (d / "important.csv").write_text("keep me")
    with pytest.raises(TraceError, match="not a reprobisect trace.*nothing was deleted"):
        TraceWriter(d)
    assert (d / "important.csv").read_text() == "keep me"
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(TraceError, match="is not a trace folder"):
        TraceWriter(f)
    assert f.read_text() == "x"


# -- reader validation ---------------------------------------------------------------


def test_missing_path_and_file(tmp_path):
    with pytest.raises(TraceError, match="no trace at"):
        read_trace(tmp_path / "nope")
    (tmp_path / "f").write_text("")
    with pytest.raises(TraceError, match="is a file, not a trace folder"):
        read_trace(tmp_path / "f")


def test_empty_folder(tmp_path):
    (tmp_path / "e").mkdir()
    with pytest.raises(TraceError, match=r"not a reprobisect trace \(no manifest.json\)"):
        read_trace(tmp_path / "e")


@pytest.mark.parametrize(
    "content, match",
    [
        ('{"name": "something else", "version": 1}', "not a reprobisect trace"),
        ("[1, 2, 3]", "not a reprobisect trace"),
        ("{not json", "corrupt manifest.json"),
        ('{"format": "reprobisect-trace", "version": "1", "status": "complete"}', "no valid format version"),
        ('{"format": "reprobisect-trace", "version": 1, "status": "weird"}', "malformed manifest"),
    ],
)
def test_foreign_or_corrupt_manifest(tmp_path, content, match):
    d = tmp_path / "t"
    d.mkdir()
    (d / "manifest.json").write_text(content)
    (d / "steps.jsonl").write_text("")
    with pytest.raises(TraceError, match=match):
        read_trace(d)


def test_newer_version_asks_for_an_upgrade(tmp_path):
    p = write_trace(tmp_path / "t", steps=1)
    m = json.loads((p / "manifest.json").read_text())
    m["version"] = VERSION + 1
    (p / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(TraceError, match=rf"format v{VERSION + 1}, newer .*pip install -U reprobisect"):
        read_trace(p)


def test_truncated_steps_file(tmp_path):
    p = write_trace(tmp_path / "t", steps=3)
    data = (p / "steps.jsonl").read_bytes()
    (p / "steps.jsonl").write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match=r"truncated or modified: steps.jsonl is \d+ bytes, the manifest says"):
        read_trace(p)


def test_missing_shard(tmp_path):
    p = write_trace(tmp_path / "t", steps=2)
    (p / shard_name(1)).unlink()
    with pytest.raises(TraceError, match=r"missing tensors/step-000001.safetensors"):
        read_trace(p)


def test_tampered_steps_same_size_fails_the_checksum(tmp_path):
    p = write_trace(tmp_path / "t", steps=2)
    data = (p / "steps.jsonl").read_bytes()
    i = data.index(b'"loss":1.0')
    (p / "steps.jsonl").write_bytes(data[:i] + b'"loss":2.0' + data[i + 10 :])
    with pytest.raises(TraceError, match="modified after it was sealed"):
        read_trace(p)


def test_tampered_shard_fails_when_read(tmp_path):
    p = write_trace(tmp_path / "t", steps=2)
    shard = p / shard_name(1)
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0x01  # one bit of a tensor, same size
    shard.write_bytes(bytes(data))
    t = read_trace(p)  # opening checks sizes only: fingerprint work stays cheap
    rec = t.steps[1].records[0]
    with pytest.raises(TraceError, match=r"modified after it was sealed \(tensors/step-000001.safetensors"):
        t.tensor(1, rec)
    assert t.tensor(0, t.steps[0].records[0]) is not None  # the intact shard still reads


def test_manifest_step_count_must_match(tmp_path):
    p = write_trace(tmp_path / "t", steps=2)
    m = json.loads((p / "manifest.json").read_text())
    m["steps"] = 3
    (p / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(TraceError, match="holds 2 steps but its manifest says 3"):
        read_trace(p)


def test_malformed_record_names_the_line(tmp_path):
    p = tmp_path / "t"
    with TraceWriter(p) as w:
        w.begin_step(0)
        w.end_step()
    # an incomplete trace is not checksummed, so a bad line must be caught by the schema
    m = json.loads((p / "manifest.json").read_text())
    m["status"] = "incomplete"
    (p / "manifest.json").write_text(json.dumps(m))
    (p / "steps.jsonl").write_text('{"step": 0, "records": [{"name": "x"}]}\n')
    with pytest.raises(TraceError, match=r"steps.jsonl line 1, record 0: malformed record"):
        read_trace(p, allow_incomplete=True)


# -- incomplete traces ---------------------------------------------------------------

_KILLED_WRITER = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    from reprobisect.trace import TraceWriter, record_array

    w = TraceWriter(sys.argv[1], command=["train.py"])
    for k in range(2):
        w.begin_step(k)
        a = np.full((4, 4), k, np.float32)
        w.record(record_array("p", "param", a), a)
        w.end_step({"loss": 1.0})
    w.begin_step(2)  # killed in the middle of step 2
    w.record(record_array("p", "param", np.zeros(3)))
    os._exit(int(sys.argv[2]))
    """
)


def test_killed_writer_leaves_an_incomplete_trace(tmp_path):
    p = tmp_path / "t"
    r = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(p), "0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads((p / "manifest.json").read_text())["status"] == "incomplete"
    with pytest.raises(TraceError, match=r"is incomplete \(the probe was stopped after step 1\).*--allow-incomplete"):
        read_trace(p)
    t = read_trace(p, allow_incomplete=True)
    assert not t.complete
    assert [s.step for s in t.steps] == [0, 1]
    assert float(t.tensor(1, t.steps[1].records[0])[0, 0]) == 1.0


def test_torn_last_line_is_dropped_with_allow_incomplete(tmp_path):
    p = tmp_path / "t"
    subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(p), "0"], check=True, timeout=60)
    with open(p / "steps.jsonl", "ab") as f:
        f.write(b'{"step": 2, "records": [{"name": "p", "ki')  # a write cut short
    t = read_trace(p, allow_incomplete=True)
    assert [s.step for s in t.steps] == [0, 1]


def test_a_sealed_trace_with_a_torn_line_is_refused(tmp_path):
    p = write_trace(tmp_path / "t", steps=1)
    m = json.loads((p / "manifest.json").read_text())
    with open(p / "steps.jsonl", "ab") as f:
        f.write(b'{"step": 1, "rec')
    size = (p / "steps.jsonl").stat().st_size
    import hashlib

    m["files"]["steps.jsonl"] = {"size": size, "sha256": hashlib.sha256((p / "steps.jsonl").read_bytes()).hexdigest()}
    (p / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(TraceError, match="torn last line"):
        read_trace(p)


def test_incomplete_before_the_first_step(tmp_path):
    p = tmp_path / "t"
    TraceWriter(p)  # never closed: what a probe killed at start-up leaves
    with pytest.raises(TraceError, match="stopped before the first step"):
        read_trace(p)
    assert read_trace(p, allow_incomplete=True).steps == []


def test_no_temp_files_left_after_sealing(tmp_path):
    p = write_trace(tmp_path / "t", steps=2)
    names = [q.name for q in p.rglob("*")]
    assert not [n for n in names if ".tmp" in n], names
    assert sorted(os.listdir(p / "tensors")) == ["step-000000.safetensors", "step-000001.safetensors"]
