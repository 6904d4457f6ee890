"""Trace format v1: the writer and the validating reader, against real files and a killed writer."""

from __future__ import annotations

import errno
import hashlib
import json
import os
from dataclasses import replace
import subprocess
import sys
import textwrap
import threading
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


def _direct_allowed(folder: Path) -> bool:
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    try:
        os.close(os.open(folder / "probe", os.O_WRONLY | os.O_CREAT | flag, 0o644))
    except OSError:
        return False
    os.unlink(folder / "probe")
    return True


# sizes in bytes of uint8 tensors: over a 4 MiB stage, a whole number of blocks, one byte
# past a block, an empty tensor between two others
@pytest.mark.parametrize("sizes", [[9 << 20], [(1 << 20) + 3, 7, 4096], [(2 << 20) - 24, 0, (2 << 20) + 1]],
                         ids=["over-stage", "ragged", "empty-inside"])
def test_a_direct_write_gives_the_bytes_of_an_ordinary_one(tmp_path, sizes):
    rng = np.random.default_rng(len(sizes))
    arrays = {f"t{i}": rng.integers(0, 256, n, dtype=np.uint8) for i, n in enumerate(sizes)}
    direct = shards.save(arrays, tmp_path / "direct.safetensors", direct=True, fsync=False)
    plain = shards.save(arrays, tmp_path / "plain.safetensors")
    data = (tmp_path / "direct.safetensors").read_bytes()
    assert direct == plain and data == (tmp_path / "plain.safetensors").read_bytes()
    assert direct == (len(data), hashlib.sha256(data).hexdigest())
    back = shards.load(tmp_path / "direct.safetensors")
    assert all(np.array_equal(back[k], v) for k, v in arrays.items())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["direct.safetensors", "plain.safetensors"]


def test_a_direct_write_bypasses_the_page_cache_where_the_file_system_allows_it(tmp_path):
    if not _direct_allowed(tmp_path):
        pytest.skip("this file system refuses O_DIRECT")
    pieces = [b"head", np.arange(300_000, dtype=np.float64)]
    digest = shards.write_direct(tmp_path / "f", pieces, fsync=True)
    assert digest is not None, "O_DIRECT is allowed here, yet the write fell back"
    want = b"head" + pieces[1].tobytes()
    assert (tmp_path / "f").read_bytes() == want and digest.hexdigest() == hashlib.sha256(want).hexdigest()


@pytest.mark.parametrize("where", ["platform", "open", "first write"])
def test_a_refused_direct_write_falls_back_to_an_ordinary_one(tmp_path, monkeypatch, where):
    """No O_DIRECT (macOS), a file system that refuses it at open, or at the first aligned
    write (EINVAL): the file is written through the page cache, whole, and nothing else is left."""
    arrays = {"w": np.arange(1 << 18, dtype=np.float64)}  # 2 MiB
    if where == "platform":
        monkeypatch.delattr(os, "O_DIRECT", raising=False)
    elif where == "open":
        real_open = os.open

        def refusing_open(path, flags, *args):
            if flags & os.O_DIRECT:
                raise OSError(errno.EINVAL, "Invalid argument")
            return real_open(path, flags, *args)

        monkeypatch.setattr(shards.os, "open", refusing_open)
    else:
        if not _direct_allowed(tmp_path):
            pytest.skip("this file system refuses O_DIRECT")

        def refusing_write(fd, data):
            raise OSError(errno.EINVAL, "Invalid argument")

        monkeypatch.setattr(shards.os, "write", refusing_write)
    size, digest = shards.save(arrays, tmp_path / "s.safetensors", direct=True)
    data = (tmp_path / "s.safetensors").read_bytes()
    assert (size, digest) == (len(data), hashlib.sha256(data).hexdigest())
    assert np.array_equal(shards.load(tmp_path / "s.safetensors")["w"], arrays["w"])
    assert [p.name for p in tmp_path.iterdir()] == ["s.safetensors"]


def test_a_full_disk_during_a_direct_write_is_an_error_not_a_fallback(tmp_path, monkeypatch):
    if not _direct_allowed(tmp_path):
        pytest.skip("this file system refuses O_DIRECT")
    calls = []

    def full(fd, data):
        calls.append(len(data))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shards.os, "write", full)
    with pytest.raises(OSError, match="No space left"):
        shards.save({"w": np.zeros(1 << 20, dtype=np.uint8)}, tmp_path / "s.safetensors", direct=True)
    assert len(calls) == 1 and list(tmp_path.iterdir()) == []


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


def test_a_nan_beside_a_null_is_not_written_as_null(tmp_path):
    """The step line's fast encoder writes NaN as null: a line that also holds real nulls
    (no batch ids, a record without stats) must still say "nan" where the value was NaN."""
    with TraceWriter(tmp_path / "t") as w:
        w.begin_step(0)
        w.record(replace(record_array("x", "input", np.zeros(2, np.float32)), stats=None))
        w.end_step({"loss": float("nan"), "clip": None, "norms": [1.5, float("-inf")]}, batch_ids=None)
        w.begin_step(1)
        w.record(replace(record_array("x", "input", np.zeros(2, np.float32)), stats=None))
        y = record_array("y", "output", np.array([1.0, 2.0], np.float32))
        w.record(replace(y, stats={**y.stats, "max": float("inf")}))  # a float, as a caller may give it
        w.end_step({"loss": 0.25}, batch_ids=None)
        w.begin_step(2)
        w.record(replace(record_array("x", "input", np.zeros(2, np.float32)), stats=None, meta={"scale": float("nan")}))
        w.end_step({"loss": 0.25, "clip": None}, batch_ids=None)
    s0, s1, s2 = read_trace(tmp_path / "t").steps
    assert s0.scalars == {"loss": "nan", "clip": None, "norms": [1.5, "-inf"]}
    assert s0.batch_ids is None and s0.records[0].stats is None
    assert s1.records[0].stats is None and s1.records[1].stats["max"] == "inf"
    assert s2.records[0].meta == {"scale": "nan"} and s2.scalars == {"loss": 0.25, "clip": None}


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


def _held_saves(monkeypatch) -> threading.Event:
    """Make the writer's state saves wait for the returned event (the background thread)."""
    from reprobisect.trace import writer as writer_mod

    go, real_save = threading.Event(), shards.save

    def save(*args, **kwargs):
        assert go.wait(30)
        return real_save(*args, **kwargs)

    monkeypatch.setattr(writer_mod.shards, "save", save)
    return go


def test_only_the_background_state_write_goes_past_the_page_cache(tmp_path, monkeypatch):
    """The background thread may wait for the disk; a write inside the step (full tensors,
    a capture too large to copy) may not."""
    from reprobisect.trace import writer as writer_mod

    real_save, direct = shards.save, {}

    def save(tensors, path, *args, **kwargs):
        direct[Path(path).name] = kwargs.get("direct", False)
        return real_save(tensors, path, *args, **kwargs)

    monkeypatch.setattr(writer_mod.shards, "save", save)
    monkeypatch.setattr(writer_mod, "_ASYNC_STATE_MAX", 1 << 16)
    with TraceWriter(tmp_path / "t") as w:
        w.begin_step(0)
        w.record(record_array("x", "input", np.arange(4.0)), np.arange(4.0))
        w.end_step()
        w.write_state(0, "small", {"w": np.arange(8.0)}, {})
        w.write_state(0, "large", {"w": np.arange(1 << 14, dtype=np.float64)}, {})
    assert direct == {shard_name(0).rsplit("/", 1)[-1]: False, "small.safetensors": True, "large.safetensors": False}


def test_a_large_state_copy_is_kept_out_of_the_training_allocator(tmp_path, monkeypatch):
    """The copies a capture hands to the background thread live in maps of their own: from
    malloc's heap, 48 MB of them held across the steps after a capture made every one of
    those steps slower (an MLP's sentinel run, capture at a chunk's first step: 1.26x against
    1.07x a plain step)."""
    import mmap

    from reprobisect.trace import writer as writer_mod

    real_save, handed = shards.save, {}

    def save(tensors, path, *args, **kwargs):
        handed.update(tensors)
        return real_save(tensors, path, *args, **kwargs)

    def owner(a):
        while isinstance(a, np.ndarray) and a.base is not None:
            a = a.base
        return a.obj if isinstance(a, memoryview) else a

    monkeypatch.setattr(writer_mod.shards, "save", save)
    live = np.arange(1 << 18, dtype=np.float64)  # 2 MiB
    half = live[:3].astype(ml_dtypes.bfloat16)
    with TraceWriter(tmp_path / "t") as w:
        w.write_state(0, "model", {"big": live[:], "small": live[:16], "empty": live[:0], "bf16": half[:]}, {})
        w.drain()
        copies = dict(handed)
        w.write_state(1, "rng", {"seed": live[:16]}, {})  # a few bytes in all
    # one map for all of an object's copies, however small each
    assert isinstance(owner(copies["big"]), mmap.mmap) and owner(copies["small"]) is owner(copies["big"])
    assert owner(copies["bf16"]) is owner(copies["big"]) and copies["bf16"].ctypes.data % 64 == 0
    assert handed["seed"].flags.owndata  # a small state: an ordinary array
    got = shards.load(tmp_path / "t/state/step-0/model.safetensors")
    assert np.array_equal(got["big"], live) and np.array_equal(got["small"], live[:16]) and got["empty"].shape == (0,)
    assert got["bf16"].dtype == half.dtype and _bits(got["bf16"]) == _bits(half)


def test_state_is_what_it_was_when_written_though_the_caller_changes_it(tmp_path, monkeypatch):
    """State is written in the background: what the caller hands over may be the memory of a
    live tensor (torch shares it with NumPy on CPU), which the next step changes in place."""
    go = _held_saves(monkeypatch)
    live = np.zeros(1 << 16)
    meta = {"lr": [0.1]}
    with TraceWriter(tmp_path / "t") as w:
        w.begin_step(0)
        w.end_step()
        w.write_state(0, "model", {"w": live[:], "b": live.reshape(256, 256)}, meta)
        live += 1  # the next training step
        meta["lr"][0] = 0.5
        go.set()
    state = shards.load(tmp_path / "t/state/step-0/model.safetensors")
    assert not state["w"].any() and not state["b"].any()
    assert json.loads((tmp_path / "t/state/step-0/model.json").read_text()) == {"lr": [0.1]}
    assert read_trace(tmp_path / "t").manifest.status == "complete"


def test_a_later_capture_waits_for_the_last_and_sealing_waits_for_all(tmp_path, monkeypatch):
    go = _held_saves(monkeypatch)
    trace = tmp_path / "t"
    with TraceWriter(trace) as w:
        w.write_state(0, "model", {"w": np.arange(3.0)}, {})
        assert not (trace / "state/step-0/model.json").exists()  # still in the background
        later = threading.Thread(target=w.write_state, args=(1, "model", {"w": np.arange(4.0)}, {}))
        later.start()
        later.join(0.3)
        assert later.is_alive()  # a new step's capture waits: one capture in memory at a time
        go.set()
        later.join(30)
    files = read_trace(trace).manifest.files
    assert {f"state/step-{k}/model.{ext}" for k in (0, 1) for ext in ("json", "safetensors")} <= set(files)


def test_each_capture_holds_its_own_step_though_the_copies_reuse_one_buffer(tmp_path, monkeypatch):
    """A later capture copies into the buffers of the last one (no fresh pages per capture),
    only after the last one's files are written: every step's file holds that step's values."""
    from reprobisect.trace import writer as writer_mod

    go, real_save, handed = threading.Event(), shards.save, []

    def save(tensors, *args, **kwargs):
        handed.append(tensors["w"].ctypes.data)
        assert go.wait(30)
        return real_save(tensors, *args, **kwargs)

    monkeypatch.setattr(writer_mod.shards, "save", save)
    live = np.zeros(1 << 16)
    trace = tmp_path / "t"
    with TraceWriter(trace) as w:
        w.write_state(0, "model", {"w": live[:]}, {})
        live += 1
        later = threading.Thread(target=w.write_state, args=(1, "model", {"w": live[:]}, {}))
        later.start()
        later.join(0.3)
        go.set()
        later.join(30)
        live += 1
        w.write_state(2, "model", {"w": live.reshape(256, 256)}, {})  # another shape: its own buffer
    for k in (0, 1, 2):
        got = shards.load(trace / f"state/step-{k}/model.safetensors")["w"]
        assert np.all(got == k), k
    assert handed[0] == handed[1] != live.ctypes.data  # step 1 wrote from step 0's copy, not the live array


def test_the_copies_of_a_state_too_large_to_hold_are_let_go_once_written(tmp_path, monkeypatch):
    """Copies are kept for the next capture only while they are small beside the memory
    available (a quarter of the background-write limit): a large state's copy must not sit
    beside the training's own peak between captures."""
    import gc
    import weakref

    from reprobisect.trace import writer as writer_mod

    real_save, handed = shards.save, []

    def save(tensors, *args, **kwargs):
        handed.append(weakref.ref(tensors["w"]))
        return real_save(tensors, *args, **kwargs)

    monkeypatch.setattr(writer_mod.shards, "save", save)
    live = np.zeros(1 << 16)  # 512 KiB
    with TraceWriter(tmp_path / "t") as w:
        w.write_state(0, "model", {"w": live[:]}, {})
        w.drain()
        gc.collect()
        assert handed[-1]() is not None  # small: kept for the next capture
        monkeypatch.setattr(writer_mod, "_ASYNC_STATE_MAX", 1 << 20)  # still written in the background...
        w.write_state(1, "model", {"w": live[:]}, {})
        w.drain()
        gc.collect()
        assert handed[-1]() is None  # ... but over a quarter of that limit: let go
    assert np.all(shards.load(tmp_path / "t/state/step-1/model.safetensors")["w"] == 0)


def test_a_failed_state_write_stops_the_next_step_and_seals_the_trace_failed(tmp_path, monkeypatch):
    from reprobisect.trace import writer as writer_mod

    def full(path, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer_mod.shards, "save", full)
    trace = tmp_path / "t"
    w = TraceWriter(trace)
    w.begin_step(0)
    w.end_step()
    w.write_state(0, "model", {"w": np.arange(3.0)}, {})  # fails in the background
    with pytest.raises(TraceError, match="captured state could not be written .*No space left"):
        w.drain()
    with pytest.raises(TraceError, match="No space left"):
        w.write_state(0, "rng", {}, {"state": {}})
    with pytest.raises(TraceError, match="No space left"):
        w.begin_step(1)
    w.close()
    m = read_trace(trace, allow_incomplete=True).manifest
    assert m.status == "failed" and "No space left" in m.error
    assert not (trace / "state/step-0/rng.json").exists()  # a capture that failed never looks whole


def test_a_capture_too_large_to_copy_is_written_in_the_step(tmp_path, monkeypatch):
    from reprobisect.trace import writer as writer_mod

    monkeypatch.setattr(writer_mod, "_ASYNC_STATE_MAX", 100)
    with TraceWriter(tmp_path / "t") as w:
        w.write_state(0, "small", {"w": np.arange(3.0)}, {})
        w.write_state(0, "large", {"w": np.arange(64.0)}, {})
        assert (tmp_path / "t/state/step-0/large.json").is_file()  # no copy, no thread: written now
    assert "state/step-0/small.safetensors" in read_trace(tmp_path / "t").manifest.files


def test_sealing_makes_every_file_durable_before_the_manifest_says_complete(tmp_path, monkeypatch):
    """Tensor shards and state are written without fsync inside the step (it cost a state
    capture ~70 ms of training time); sealing fsyncs each of them, and the folders holding
    their renames, before the complete manifest replaces the incomplete one."""
    synced: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_fsync(fd)

    def replace(src, dst):
        if Path(dst).name == "manifest.json" and json.loads(Path(src).read_text())["status"] == "complete":
            synced.append("MANIFEST")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    trace = tmp_path / "t"
    with TraceWriter(trace) as w:
        for k in range(2):
            w.begin_step(k)
            a = _array(np.float32, (4, 4), seed=k)
            w.record(record_array("fc", "activation", a), a)
            w.end_step()
            w.write_state(k, "model", {"w": np.arange(3.0) + k}, {"kind": "model"})
        assert not any(s.endswith((".safetensors", "model.json")) for s in synced)  # none inside the steps
    files = read_trace(trace).manifest.files
    assert len(files) == 7  # steps.jsonl, 2 shards, 2 x (state safetensors + json)
    done = synced.index("MANIFEST")
    for rel in files:
        assert str((trace / rel).resolve()) in synced[:done], rel
    for folder in ("tensors", "state/step-0", "state/step-1"):
        assert str((trace / folder).resolve()) in synced[:done], folder


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


# -- malformed traces (issue 10): every refusal is one TraceError line ----------------
#
# A manifest's SHA-256 is not a signature: anyone who edits a file can re-seal it. So the
# mutations below are re-sealed (sizes and digests recomputed) and must be refused by the
# parser itself, not only by the checksum.


def _reseal(p: Path, manifest: dict | None = None, edit=None) -> None:
    """Recompute the size and SHA-256 of every listed file, apply ``edit``, write the manifest."""
    import hashlib

    m = manifest if manifest is not None else json.loads((p / "manifest.json").read_text())
    for rel, info in m.get("files", {}).items():
        f = p / rel
        if isinstance(info, dict) and f.is_file():
            info["size"] = f.stat().st_size
            info["sha256"] = hashlib.sha256(f.read_bytes()).hexdigest()
    if edit is not None:
        edit(m)
    (p / "manifest.json").write_text(json.dumps(m))


def _edit_manifest(p: Path, edit) -> None:
    _reseal(p, edit=edit)


def _edit_step_line(p: Path, edit, line: int = 0) -> None:
    lines = (p / "steps.jsonl").read_text().splitlines()
    d = json.loads(lines[line])
    edit(d)
    lines[line] = json.dumps(d)
    (p / "steps.jsonl").write_text("\n".join(lines) + "\n")
    _reseal(p)


def _one_line_error(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg
    return msg


def test_manifest_nested_100000_deep_is_refused_before_parsing(tmp_path):
    d = tmp_path / "t"
    d.mkdir()
    (d / "manifest.json").write_text(
        '{"format": "reprobisect-trace", "version": 1, "status": "complete", "extra": '
        + "[" * 100_000 + "]" * 100_000 + "}"
    )
    (d / "steps.jsonl").write_text("")
    with pytest.raises(TraceError, match=r"manifest.json is nested 100001 deep, more than 64") as e:
        read_trace(d)
    _one_line_error(e)


def test_oversized_manifest_is_refused_before_reading(tmp_path, monkeypatch):
    from reprobisect.trace import reader

    p = write_trace(tmp_path / "t", steps=1)
    monkeypatch.setattr(reader, "MAX_MANIFEST_BYTES", 100)
    with pytest.raises(TraceError, match=r"manifest.json is \d+ bytes, more than a trace's 100"):
        read_trace(p)


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda m: m["files"].__setitem__("steps.jsonl", "abc"), r"files entry 'steps.jsonl' is a JSON string, not an object"),
        (lambda m: m["files"].__setitem__("steps.jsonl", None), r"files entry 'steps.jsonl' is a JSON null, not an object"),
        (lambda m: m.__setitem__("files", ["steps.jsonl"]), r"'files' is a JSON array, not an object"),
        (lambda m: m["files"]["steps.jsonl"].__setitem__("size", "12"), r"files entry 'steps.jsonl' has size '12', not a non-negative integer"),
        (lambda m: m["files"]["steps.jsonl"].__setitem__("size", True), r"files entry 'steps.jsonl' has size True, not a non-negative integer"),
        (lambda m: m["files"]["steps.jsonl"].__setitem__("sha256", 7), r"files entry 'steps.jsonl' has sha256 7, not 64 hex digits"),
        (lambda m: m.__setitem__("command", "python train.py"), r"'command' is a JSON string, not an array"),
        (lambda m: m.__setitem__("outcome", ["ok"]), r"'outcome' is a JSON array, not an object"),
        (lambda m: m.__setitem__("steps", True), r"'steps' is a JSON boolean, not an integer"),
        (lambda m: m.__setitem__("environment", "cpu"), r"'environment' is a JSON string, not an object"),
    ],
)
def test_manifest_fields_of_the_wrong_type_are_refused(tmp_path, edit, match):
    p = write_trace(tmp_path / "t", steps=1)
    _edit_manifest(p, edit)
    with pytest.raises(TraceError, match=r"malformed manifest \(" + match) as e:
        read_trace(p)
    _one_line_error(e)


@pytest.mark.parametrize("name", ["../outside.bin", "tensors/../../outside.bin", "ABS", "tensors//x", "./steps.jsonl", "a\\b"])
def test_manifest_file_names_outside_the_trace_are_refused(tmp_path, name):
    import hashlib

    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"secret")
    name = str(outside) if name == "ABS" else name
    p = write_trace(tmp_path / "t", steps=1)
    _edit_manifest(p, lambda m: m["files"].__setitem__(
        name, {"size": 6, "sha256": hashlib.sha256(b"secret").hexdigest()}))
    with pytest.raises(TraceError, match=r"is not a plain relative path inside the trace"):
        read_trace(p)


def test_steps_file_symlinked_outside_the_trace_is_refused(tmp_path):
    p = write_trace(tmp_path / "t", steps=1)
    (p / "steps.jsonl").rename(tmp_path / "elsewhere.jsonl")
    (p / "steps.jsonl").symlink_to(tmp_path / "elsewhere.jsonl")
    with pytest.raises(TraceError, match=r"steps.jsonl is a link to '.*elsewhere.jsonl', outside the trace"):
        read_trace(p)


def test_shard_folder_symlinked_outside_the_trace_is_refused(tmp_path):
    p = write_trace(tmp_path / "t", steps=1)
    (p / "tensors").rename(tmp_path / "elsewhere")
    (p / "tensors").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(TraceError, match=r"tensors/step-000000.safetensors is a link to .*outside the trace"):
        read_trace(p)


def test_a_symlink_that_stays_inside_the_trace_still_reads(tmp_path):
    p = write_trace(tmp_path / "t", steps=1)
    (p / "steps.jsonl").rename(p / "steps.real")
    (p / "steps.jsonl").symlink_to("steps.real")
    assert [s.step for s in read_trace(p).steps] == [0]


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda d: d.__setitem__("batch_ids", 5), r"'batch_ids' is a JSON number, not an array or null"),
        (lambda d: d.__setitem__("batch_ids", "0-99"), r"'batch_ids' is a JSON string, not an array or null"),
        (lambda d: d.__setitem__("scalars", [1.0]), r"'scalars' is a JSON array, not an object"),
        (lambda d: d.__setitem__("step", True), r"'step' is True, not a non-negative integer"),
        (lambda d: d.__setitem__("step", -1), r"'step' is -1, not a non-negative integer"),
        (lambda d: d.__setitem__("step", 0.0), r"'step' is 0.0, not a non-negative integer"),
        (lambda d: d["records"][0]["stats"].__setitem__("mean", "NaN"), r"stat 'mean' is 'NaN', not a number"),
        (lambda d: d["records"][0]["stats"].__setitem__("nan", None), r"stat 'nan' is None, not a number"),
        (lambda d: d["records"][0]["stats"].__setitem__("nan", True), r"stat 'nan' is True, not a number"),
        (lambda d: d["records"][0].__setitem__("stats", "none"), r"'stats' is a JSON string, not an object"),
        (lambda d: d["records"][0].__setitem__("shape", [4.0, 4.0]), r"'shape' holds 4.0, not a non-negative integer"),
        (lambda d: d["records"][0].__setitem__("shape", [-4, -4]), r"'shape' holds -4, not a non-negative integer"),
        (lambda d: d["records"][0].__setitem__("shape", [True]), r"'shape' holds True, not a non-negative integer"),
        (lambda d: d["records"][0].__setitem__("shape", [2**62, 4]), r"has 18446744073709551616 elements, more than any real tensor"),
        (lambda d: d["records"][0].__setitem__("shape", [1] * 33), r"'shape' has 33 dimensions, more than 32"),
        (lambda d: d["records"][0].__setitem__("dtype", "float99"), r"unknown dtype 'float99'"),
        (lambda d: d["records"][0].__setitem__("order", False), r"'order' is a JSON boolean, not an integer"),
        (lambda d: d["records"][0].__setitem__("stored", "yes"), r"'stored' is a JSON string, not true/false"),
        (lambda d: d["records"][0].__setitem__("inputs", [1, 2]), r"'inputs' holds something other than fingerprint strings"),
        (lambda d: d["records"][0].__setitem__("meta", [1]), r"'meta' is a JSON array, not an object"),
        (lambda d: d["records"][0].pop("fingerprint"), r"no 'fingerprint' field"),
        (lambda d: d["records"].__setitem__(0, None), r"a record is a JSON null, not an object"),
    ],
)
def test_step_lines_of_the_wrong_type_are_refused(tmp_path, edit, match):
    p = write_trace(tmp_path / "t", steps=2)
    _edit_step_line(p, edit)
    with pytest.raises(TraceError, match=r"steps.jsonl line 1.*" + match) as e:
        read_trace(p)
    _one_line_error(e)


def test_a_bool_is_not_a_step_number(tmp_path):
    p = write_trace(tmp_path / "t", steps=2)
    _edit_step_line(p, lambda d: d.__setitem__("step", True), line=0)  # True == 1 in Python
    with pytest.raises(TraceError, match=r"'step' is True, not a non-negative integer"):
        read_trace(p)


def test_step_line_nested_too_deep_is_refused(tmp_path):
    p = write_trace(tmp_path / "t", steps=1)
    lines = (p / "steps.jsonl").read_text().splitlines()
    d = json.loads(lines[0])
    d["scalars"]["deep"] = "@"
    lines[0] = json.dumps(d).replace('"@"', "[" * 5000 + "]" * 5000)
    (p / "steps.jsonl").write_text("\n".join(lines) + "\n")
    _reseal(p)
    with pytest.raises(TraceError, match=r"steps.jsonl line 1 is nested 5002 deep, more than 64"):
        read_trace(p)


def test_non_standard_json_constants_are_refused(tmp_path):
    p = write_trace(tmp_path / "t", steps=1)
    text = (p / "steps.jsonl").read_text().replace('"loss":1.0', '"loss":NaN')
    (p / "steps.jsonl").write_text(text)
    _reseal(p)
    with pytest.raises(TraceError, match=r"steps.jsonl line 1 is not JSON"):
        read_trace(p)


# shard headers: what the safetensors library itself refuses


def _rewrite_shard(p: Path, step: int, header, data: bytes | None = None) -> None:
    shard = p / shard_name(step)
    raw = shard.read_bytes()
    (n,) = np.frombuffer(raw[:8], "<u8")
    body = raw[8 + int(n):] if data is None else data
    head = header if isinstance(header, bytes) else json.dumps(header).encode()
    shard.write_bytes(len(head).to_bytes(8, "little") + head + body)
    _reseal(p)


def _shard_header(p: Path, step: int) -> dict:
    raw = (p / shard_name(step)).read_bytes()
    (n,) = np.frombuffer(raw[:8], "<u8")
    return json.loads(raw[8 : 8 + int(n)])


def _header_edit(fn):
    def edit(h):
        fn(h)
        return h
    return edit


_X = "input/x"  # the first record's tensor key in write_trace


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda h: [], r"its header is a JSON list, not an object"),
        (lambda h: "tensors", r"its header is a JSON str, not an object"),
        (lambda h: None, r"its header is a JSON NoneType, not an object"),
        (_header_edit(lambda h: h[_X]["data_offsets"].append(64)), r"tensor 'input/x' has data_offsets \[0, 64, 64\], not two ints"),
        (_header_edit(lambda h: h[_X].__setitem__("data_offsets", [0.0, 64.0])), r"data_offsets \[0.0, 64.0\], not two ints"),
        (_header_edit(lambda h: h[_X].__setitem__("data_offsets", [64, 0])), r"data_offsets \[64, 0\], not 0 <= begin <= end"),
        (_header_edit(lambda h: h[_X].__setitem__("shape", [4.0, 4.0])), r"shape \[4.0, 4.0\], not a list of at most 32 non-negative ints"),
        (_header_edit(lambda h: h[_X].__setitem__("shape", [-4, -4])), r"shape \[-4, -4\], not a list"),
        (_header_edit(lambda h: h[_X].__setitem__("shape", [2**62, 4])), r"has 64 bytes of data but shape \[4611686018427387904, 4\] of F32 needs"),
        (_header_edit(lambda h: h[_X].__setitem__("shape", "4x4")), r"shape \"4x4\", not a list"),
        (_header_edit(lambda h: h[_X].__setitem__("dtype", "F99")), r"tensor 'input/x' has unknown dtype 'F99'"),
        (_header_edit(lambda h: h[_X].__setitem__("dtype", None)), r"tensor 'input/x' has unknown dtype None"),
        (_header_edit(lambda h: h[_X].pop("dtype")), r"tensor 'input/x' lacks dtype"),
        (_header_edit(lambda h: h[_X].__setitem__("extra", 1)), r"tensor 'input/x' has unknown field extra"),
        (_header_edit(lambda h: h.__setitem__(_X, [1])), r"tensor 'input/x' is a JSON list, not an object"),
        (_header_edit(lambda h: h.__setitem__("__metadata__", {"a": 1})), r"__metadata__ is not an object of strings"),
        # overlapping ranges: activation/fc reads half of input/x's bytes
        (_header_edit(lambda h: h["activation/fc"].update(shape=[16], data_offsets=[32, 96])), r"tensor 'activation/fc' overlaps the tensor before it"),
        (_header_edit(lambda h: h[_X].__setitem__("data_offsets", [64, 128])), r"leaves a gap of 64 bytes before it"),
        (_header_edit(lambda h: h.pop("param/fc.weight")), r"64 bytes after the last tensor belong to none"),
        (lambda h: b'{"input/x": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 64]}, "input/x": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 64]}}',
         r"key 'input/x' appears twice"),
        (lambda h: b"\xff\xfe{}", r"its header is not JSON"),
        (lambda h: b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}", r"its header is nested 100001 deep, more than 3"),
    ],
)
def test_malformed_shard_headers_are_refused(tmp_path, make, match):
    p = write_trace(tmp_path / "t", steps=1)
    _rewrite_shard(p, 0, make(_shard_header(p, 0)))
    t = read_trace(p)
    with pytest.raises(TraceError, match=r"^tensor shard '.*step-000000.safetensors' is malformed: .*" + match) as e:
        t.tensor(0, t.steps[0].records[0])
    _one_line_error(e)
    with pytest.raises(TraceError, match=match):
        t.verify()


def test_shard_data_cut_short_after_a_valid_header_is_refused(tmp_path):
    p = write_trace(tmp_path / "t", steps=1)
    _rewrite_shard(p, 0, _shard_header(p, 0), data=b"\0" * 100)
    t = read_trace(p)
    with pytest.raises(TraceError, match=r"points past the end of the file \(truncated\?\)"):
        t.tensor(0, t.steps[0].records[0])


def test_a_shard_tensor_that_disagrees_with_its_record_is_refused(tmp_path):
    p = write_trace(tmp_path / "t", steps=1)
    h = _shard_header(p, 0)
    h[_X].update(dtype="I32")  # same bytes, read as int32: a different tensor than recorded
    _rewrite_shard(p, 0, h)
    t = read_trace(p)
    with pytest.raises(TraceError, match=r"tensor 'input/x' in tensors/step-000000.safetensors is int32 \(4, 4\) but steps.jsonl records float32 \(4, 4\)"):
        t.tensor(0, t.steps[0].records[0])


def test_a_sealed_trace_shard_missing_from_its_manifest_is_refused(tmp_path):
    p = write_trace(tmp_path / "t", steps=1)
    _edit_manifest(p, lambda m: m["files"].pop(shard_name(0)))
    t = read_trace(p)
    with pytest.raises(TraceError, match=r"modified after it was sealed \(tensors/step-000000.safetensors is not in its manifest\)"):
        t.tensor(0, t.steps[0].records[0])


def test_verify_trace_finds_a_corrupt_shard_that_fingerprint_compare_never_reads(tmp_path):
    from reprobisect.core.compare import compare_paths
    from reprobisect.trace.reader import verify_trace

    a = write_trace(tmp_path / "a", steps=2)
    b = write_trace(tmp_path / "b", steps=2)
    shard = b / shard_name(1)
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0x01
    shard.write_bytes(bytes(data))
    assert compare_paths(a, b)  # matching fingerprints: no shard is read, documented
    v = verify_trace(a)
    assert v.files == 3 and v.stored_tensors == 8 and v.bytes == sum(int(i["size"]) for i in read_trace(a).manifest.files.values())
    with pytest.raises(TraceError, match=r"modified after it was sealed \(tensors/step-000001.safetensors does not match its checksum\)"):
        verify_trace(b)
    with pytest.raises(TraceError, match="does not match its checksum"):
        read_trace(b, verify=True)
    with pytest.raises(TraceError, match="does not match its checksum"):
        compare_paths(a, b, verify=True)
    from reprobisect.cli import main

    assert main(["compare", str(a), str(b)]) == 0
    assert main(["compare", "--verify", str(a), str(b)]) == 2


def test_every_dtype_name_a_recorder_gives_is_accepted():
    import ml_dtypes as mld

    from reprobisect.trace.fingerprint import dtype_name
    from reprobisect.trace.format import DTYPES

    names = {dtype_name(np.dtype(d)) for d in DTYPES_NP} | {
        dtype_name(np.dtype(getattr(mld, n))) for n in dir(mld)
        if isinstance(getattr(mld, n), type) and issubclass(getattr(mld, n), np.generic)
    }
    torch = pytest.importorskip("torch")
    names |= {dtype_name(getattr(torch, n)) for n in dir(torch) if isinstance(getattr(torch, n), torch.dtype)}
    assert names <= DTYPES, sorted(names - DTYPES)


DTYPES_NP = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
             np.float16, np.float32, np.float64, np.longdouble, np.complex64, np.complex128, np.clongdouble]


def test_compare_cli_on_a_malformed_trace_exits_2_with_one_line(tmp_path):
    a = write_trace(tmp_path / "a", steps=1)
    b = write_trace(tmp_path / "b", steps=1)
    _edit_step_line(b, lambda d: d.__setitem__("batch_ids", 5))
    r = subprocess.run([sys.executable, "-m", "reprobisect", "compare", str(a), str(b)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "'batch_ids' is a JSON number, not an array or null" in lines[0], r.stderr


def test_a_trace_reached_through_a_symlinked_folder_reads(tmp_path):
    p = write_trace(tmp_path / "t", steps=1)
    (tmp_path / "link").symlink_to(p)
    t = read_trace(tmp_path / "link", verify=True)
    assert t.tensor(0, t.steps[0].records[0]) is not None


def test_new_record_makes_the_record_the_dataclass_makes():
    """``format.new_record`` sets a frozen ``Record``'s fields itself (the recorder's fast
    path): it must set every field the dataclass has, or a field added to ``Record`` later
    would be missing from every recorded record."""
    import dataclasses

    from reprobisect.trace.format import Record, new_record

    args = dict(name="fc.weight", kind="grad", dtype="float32", shape=(3, 4), fingerprint="ab" * 16, order=5,
                stats={"norm": 1.0}, module="Linear", inputs=("cd" * 16,), meta={"k": 1})
    made, fast = Record(**args), new_record(**args)
    assert fast == made
    assert list(vars(fast)) == [f.name for f in dataclasses.fields(Record)]
    assert vars(fast) == vars(made)
    assert new_record("x", "param", "float32", (), "ef" * 16) == Record("x", "param", "float32", (), "ef" * 16)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.order = 6  # type: ignore[misc]
    assert replace(fast, order=6).order == 6 and fast.order == 5
