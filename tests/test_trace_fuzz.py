"""Fuzz the trace reader: every mutant of a real trace reads as before or is one TraceError.

One small real trace is written once (``TraceWriter`` with NumPy arrays: no torch), with
full tensors stored at step 0 and one state checkpoint, so every parser is reached: the
manifest, ``steps.jsonl`` and the safetensors shard headers. Each mutant is the trace
with one change: a flipped byte, a truncation, a header/manifest/step field swapped for
a value of each JSON type, a file name pointing outside, a symlink out of the trace.

A mutant is read the way ``compare`` reads it (``read_trace``, then every stored tensor,
then ``verify``, then ``compare_traces`` against the original, rendered as text and
JSON), also with ``allow_incomplete`` where that matters, under a time limit. The only
acceptable outcomes:

* a ``TraceError`` with a one-line message, or
* a successful read; when the change hit a checksummed file and the mutant was not
  re-sealed (sizes and digests recomputed), the records and tensors must be identical.

The corpus is deterministic (``random.Random(0)``) and the Hypothesis part is
derandomized, so CI sees the same mutants every run.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import shutil
import signal
import struct
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reprobisect.core.compare import compare_traces
from reprobisect.errors import TraceError
from reprobisect.trace import TraceWriter, read_trace, record_array
from reprobisect.trace.format import shard_name

SHARD = shard_name(0)
STATE = "state/step-1/model.safetensors"
TIME_LIMIT_S = 5.0
# replacement values, by JSON type: each mutated field gets one of every type
TYPES: list[list[Any]] = [
    [None],
    [True, False],
    [-1, 0, 3, 2**62, 2**64],
    [1.5, -0.0, 1e308],
    ["", "x", "nan", "NaN", "F99", "../x"],
    [[], [1, 2, 3], [-4, 4], [[1]], [1.5, 2.5], [0, 1, 2]],
    [{}, {"a": 1}, {"nan": "inf"}],
]
POOL: list[Any] = [v for vs in TYPES for v in vs]


class Hang(BaseException):
    """A read that ran past the time limit (a BaseException: no ``except`` in the reader catches it)."""


def _alarm(signum, frame):
    raise Hang()


# -- the trace and its copies ----------------------------------------------------------


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("fuzz") / "base"
    rng = np.random.default_rng(0)
    with TraceWriter(p, command=["python", "train.py"], environment={"device": "cpu", "python": "3.x"}, seed=0) as w:
        for k in range(2):
            keep = k == 0  # full tensors at step 0 only (one shard): fewer files per read
            w.begin_step(k)
            x = rng.standard_normal((3, 4)).astype(np.float32)
            h = rng.standard_normal((3, 2)).astype(np.float16)
            ids = np.arange(3, dtype=np.int64) + 3 * k
            z = np.zeros(0, np.float32)
            w.record(record_array("x", "input", x), x if keep else None)
            w.record(record_array("fc", "activation", h, module="Linear", inputs=("f0",)), h if keep else None)
            w.record(record_array("ids", "batch", ids), ids if keep else None)
            w.record(record_array("loss", "loss", np.float32(0.5)))
            w.record(record_array("fc.bias", "grad", z), z if keep else None)
            w.end_step({"loss": 0.5, "lr": "nan"}, batch_ids=ids.tolist())
        w.write_state(1, "model", {"w": np.arange(4.0)}, {"kind": "model"})
    return p


@pytest.fixture(scope="module")
def expected(base):
    return _snapshot(read_trace(base), base)


@pytest.fixture
def work(tmp_path) -> Callable[[Path], Path]:
    """A fresh copy of a trace per call (for mutants that replace folders or file types)."""
    n = [0]

    def copy_of(src: Path) -> Path:
        n[0] += 1
        dst = tmp_path / f"m{n[0]}" / "t"
        shutil.copytree(src, dst, symlinks=True)
        return dst

    return copy_of


def _put(path: Path, data: bytes) -> None:
    """Overwrite ``path`` in place (r+b, then truncate): on ext4, reopening a file with
    truncation costs milliseconds per write, which a thousand mutants would feel."""
    try:
        with open(path, "r+b") as f:
            f.write(data)
            f.truncate()
    except FileNotFoundError:
        path.write_bytes(data)


class Scratch:
    """One copy of the trace; ``mutate`` puts it back as it was, then changes one file
    (cheaper than a copy per mutant on a slow disk)."""

    def __init__(self, base: Path, root: Path) -> None:
        self.path = root / "t"
        shutil.copytree(base, self.path)
        self.original = {rel: (base / rel).read_bytes() for rel in _files(base)}
        self.dirty: set[str] = set()

    def mutate(self, rel: str, data: bytes, *, reseal: bool) -> Path:
        for d in self.dirty:
            _put(self.path / d, self.original[d])
        _put(self.path / rel, data)
        self.dirty = {rel, "manifest.json"}
        if reseal:
            _reseal(self.path)
        return self.path


@pytest.fixture
def scratch(base, tmp_path) -> Scratch:
    return Scratch(base, tmp_path)


def _reseal(p: Path) -> None:
    """Recompute the manifest's sizes and digests, as a forger would."""
    try:
        m = json.loads((p / "manifest.json").read_text())
        files = m["files"]
        for rel, info in files.items():
            f = p / rel
            if f.is_file() and isinstance(info, dict):
                data = f.read_bytes()
                info["size"] = len(data)
                info["sha256"] = hashlib.sha256(data).hexdigest()
    except (ValueError, KeyError, TypeError, AttributeError, OSError, UnicodeDecodeError):
        return  # the manifest itself is the mutant: leave it as it is
    _put(p / "manifest.json", json.dumps(m).encode())


# -- reading a mutant ------------------------------------------------------------------


def _snapshot(t, path: Path):
    steps = [s.to_json() for s in t.steps]
    tensors = {}
    for s in t.steps:
        for r in s.records:
            a = t.tensor(s.step, r)
            if a is not None:
                tensors[(s.step, r.kind, r.name)] = (str(a.dtype), a.shape, a.tobytes())
    return steps, tensors


def _outcome(path: Path, original) -> list[tuple[str, Any]]:
    """Read ``path`` both ways; each result is ('error', message) or ('ok', snapshot)."""
    results: list[tuple[str, Any]] = []
    for allow in (False, True):
        if allow and not (results[0][0] == "error" and ("incomplete" in results[0][1] or "failed run" in results[0][1])):
            break  # allow_incomplete changes nothing else
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, TIME_LIMIT_S)
        try:
            t = read_trace(path, allow_incomplete=allow)
            snap = _snapshot(t, path)
            t.verify()
            result = compare_traces(original, t)
            str(result), json.dumps(result.to_json())  # what `bisect compare` prints
            results.append(("ok", snap))
        except TraceError as e:
            msg = str(e)
            assert msg and "\n" not in msg, f"not one line: {msg!r}"
            results.append(("error", msg))
        except Hang:
            pytest.fail(f"reading {path} took over {TIME_LIMIT_S} s", pytrace=False)
        except Exception as e:  # the failure this test exists for
            raise AssertionError(f"{type(e).__name__} escaped the reader for {path}: {e}") from e
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
    return results


def _check(path: Path, original, expected, *, identical: bool, refused: bool = False, label: str = "") -> None:
    for kind, value in _outcome(path, original):
        if refused:
            assert kind == "error", f"{label}: read although it must be refused"
        elif kind == "ok" and identical:
            assert value == expected, f"{label}: read without error but differently"


# -- the mutations ---------------------------------------------------------------------


def _files(base: Path) -> list[str]:
    return sorted(q.relative_to(base).as_posix() for q in base.rglob("*") if q.is_file())


def _byte_mutants(base: Path, rng: random.Random) -> list[tuple[str, str, Callable[[bytes], bytes]]]:
    out = []
    for rel in _files(base):
        size = (base / rel).stat().st_size
        positions = sorted({0, 1, 7, 8, 9, size // 2, size - 1} | {rng.randrange(size) for _ in range(6)})
        for i in positions:
            if 0 <= i < size:
                bit = 1 << rng.randrange(8)
                out.append((rel, f"flip {rel}[{i}]^{bit}", lambda d, i=i, bit=bit: d[:i] + bytes([d[i] ^ bit]) + d[i + 1:]))
        for n in sorted({0, 1, 7, 8, 9, size // 3, size - 1}):
            out.append((rel, f"truncate {rel} to {n}", lambda d, n=n: d[:n]))
        out.append((rel, f"append to {rel}", lambda d: d + b"\n{}\n"))
    return out


def _split_shard(data: bytes) -> tuple[dict, bytes]:
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def _join_shard(header: Any, body: bytes, raw: bytes | None = None) -> bytes:
    head = raw if raw is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(head)) + head + body


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value inside ``obj`` (dict keys and list indices)."""
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:3]):
            out += _paths(v, prefix + (i,))
    return out


def _set(obj: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    obj = copy.deepcopy(obj)
    cur = obj
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = value
    return obj


def _drop(obj: Any, path: tuple) -> Any:
    obj = copy.deepcopy(obj)
    cur = obj
    for k in path[:-1]:
        cur = cur[k]
    del cur[path[-1]]
    return obj


def _json_mutants(doc: Any, rng: random.Random) -> list[tuple[str, Any]]:
    """For every value inside ``doc``: ``doc`` with it replaced by one value of each JSON
    type, and ``doc`` without it."""
    out = []
    for path in _paths(doc):
        for v in (rng.choice(vs) for vs in TYPES):
            out.append((f"{'/'.join(map(str, path))}={v!r}", _set(doc, path, v)))
        if path:
            out.append((f"drop {'/'.join(map(str, path))}", _drop(doc, path)))
    return out


# -- the tests -------------------------------------------------------------------------


def test_byte_flips_and_truncations(base, expected, scratch):
    """Unsealed: a checksummed file must read identically or be refused. Re-sealed: the
    parsers see the damage and must refuse it or read something valid."""
    original = read_trace(base)
    rng = random.Random(0)
    n = 0
    for rel, label, mutate in _byte_mutants(base, rng):
        for reseal in (False, True):
            p = scratch.mutate(rel, mutate(scratch.original[rel]), reseal=reseal)
            _check(p, original, expected, identical=not reseal and rel != "manifest.json", label=label)
            n += 1
    assert n > 150


def test_shard_header_fields_of_every_type(base, expected, scratch):
    original = read_trace(base)
    rng = random.Random(1)
    header, body = _split_shard((base / SHARD).read_bytes())
    mutants = _json_mutants(header, rng)
    mutants += [("header " + repr(v), v) for v in POOL]
    raw = [b"", b"{", b"{}", b"[" * 10_000, b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}", b"\xff" * 16,
           json.dumps(header).encode() + b"garbage", json.dumps(header).encode().replace(b'"F32"', b'"f32"')]
    for label, h in mutants + [(f"raw {r[:12]!r}", r) for r in raw]:
        p = scratch.mutate(SHARD, _join_shard(h, body, raw=h if isinstance(h, bytes) else None), reseal=True)
        _check(p, original, expected, identical=False, label=label)
    # a header length that points anywhere
    for n in (0, 1, 2**63, 2**64 - 1, len(body) + 10**6):
        p = scratch.mutate(SHARD, struct.pack("<Q", n) + scratch.original[SHARD][8:], reseal=True)
        _check(p, original, expected, identical=False, refused=True, label=f"header length {n}")


def test_manifest_fields_of_every_type(base, expected, scratch):
    original = read_trace(base)
    rng = random.Random(2)
    manifest = json.loads((base / "manifest.json").read_text())
    mutants = _json_mutants(manifest, rng)
    for name in ("../outside", "/etc/passwd", "tensors/../steps.jsonl", "./steps.jsonl", "tensors//x", "", "a\\b", "\u00e9"):
        m = copy.deepcopy(manifest)
        m["files"][name] = dict(m["files"]["steps.jsonl"])
        mutants.append((f"file name {name!r}", m))
    for label, m in mutants:
        p = scratch.mutate("manifest.json", json.dumps(m).encode(), reseal=False)
        _check(p, original, expected, identical=False, label=label)
    deep = '{"format": "reprobisect-trace", "version": 1, "status": "complete", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    p = scratch.mutate("manifest.json", deep.encode(), reseal=False)
    _check(p, original, expected, identical=False, refused=True, label="manifest nested 100000 deep")


def test_step_line_fields_of_every_type(base, expected, scratch):
    original = read_trace(base)
    rng = random.Random(3)
    lines = (base / "steps.jsonl").read_text().splitlines()
    doc = json.loads(lines[0])  # the step with stored tensors
    for label, d in _json_mutants(doc, rng):
        p = scratch.mutate("steps.jsonl", ("\n".join([json.dumps(d), lines[1]]) + "\n").encode(), reseal=True)
        _check(p, original, expected, identical=False, label=label)


def test_symlinks_out_of_the_trace_are_refused(base, expected, work, tmp_path):
    original = read_trace(base)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for rel in ("steps.jsonl", SHARD, "tensors", "manifest.json", STATE):
        for target in ("copy", "/dev/zero", str(fifo), "/"):
            p = work(base)
            if target == "copy":  # the same bytes, outside the trace: still refused
                dst = p.parent / f"outside-{rel.replace('/', '_')}"
                os.replace(p / rel, dst)
                target = str(dst)
            elif (p / rel).is_dir():
                shutil.rmtree(p / rel)
            else:
                (p / rel).unlink()
            (p / rel).symlink_to(target)
            _check(p, original, expected, identical=False, refused=True, label=f"{rel} -> {target}")


def test_special_files_in_place_of_trace_files(base, expected, work):
    original = read_trace(base)
    for rel in ("steps.jsonl", SHARD, "manifest.json"):
        for kind in ("fifo", "dir"):
            p = work(base)
            (p / rel).unlink()
            if kind == "fifo":
                os.mkfifo(p / rel)
            else:
                (p / rel).mkdir()
            _check(p, original, expected, identical=False, refused=True, label=f"{rel} is a {kind}")


@pytest.fixture(scope="module")
def hyp(base, expected, tmp_path_factory):
    """One scratch copy shared by the Hypothesis examples (restored before each)."""
    scratch = Scratch(base, tmp_path_factory.mktemp("hyp"))
    return scratch, read_trace(base), expected


def _hyp(n: int) -> settings:
    """Fixed: derandomized (same examples every run), no example database, no deadline."""
    return settings(max_examples=n, derandomize=True, deadline=None, database=None, print_blob=False,
                    suppress_health_check=[HealthCheck.too_slow])


@_hyp(60)
@given(
    which=st.sampled_from(["steps.jsonl", SHARD, "manifest.json"]),
    edits=st.lists(st.tuples(st.integers(0, 2**16), st.integers(0, 255)), min_size=1, max_size=4),
    cut=st.one_of(st.none(), st.integers(0, 2**16)),
    reseal=st.booleans(),
)
def test_hypothesis_byte_edits(hyp, which, edits, cut, reseal):
    scratch, original, expected = hyp
    data = bytearray(scratch.original[which])
    if which == SHARD:  # aim at the header, where the parser is
        (n,) = struct.unpack("<Q", bytes(data[:8]))
        span = 8 + n
    else:
        span = len(data)
    for pos, val in edits:
        data[pos % span] = val
    if cut is not None:
        data = data[: cut % (len(data) + 1)]
    p = scratch.mutate(which, bytes(data), reseal=reseal)
    _check(p, original, expected, identical=not reseal and which != "manifest.json", label=f"{which} {edits} cut {cut}")


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=8)
    | st.sampled_from(["F32", "I64", "F99", "float32", "nan", "inf", "../x", "/etc/passwd", "input/x"]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=8,
)


@_hyp(100)
@given(which=st.sampled_from(["header", "step", "manifest"]), where=st.integers(0, 10**6), value=_JSON,
       drop=st.booleans())
def test_hypothesis_json_edits(hyp, which, where, value, drop):
    """A value anywhere in a shard header, a step line or the manifest replaced by any JSON."""
    scratch, original, expected = hyp
    if which == "header":
        doc, body = _split_shard(scratch.original[SHARD])
    elif which == "step":
        lines = scratch.original["steps.jsonl"].decode().splitlines()
        doc = json.loads(lines[0])
    else:
        doc = json.loads(scratch.original["manifest.json"])
    paths = _paths(doc)
    path = paths[where % len(paths)]
    doc = _drop(doc, path) if drop and path else _set(doc, path, value)
    if which == "header":
        p = scratch.mutate(SHARD, _join_shard(doc, body), reseal=True)
    elif which == "step":
        p = scratch.mutate("steps.jsonl", ("\n".join([json.dumps(doc), lines[1]]) + "\n").encode(), reseal=True)
    else:
        p = scratch.mutate("manifest.json", json.dumps(doc).encode(), reseal=False)
    _check(p, original, expected, identical=False, label=f"{which} {path} -> {value!r}")


def _nesting(x: Any) -> int:
    if isinstance(x, dict):
        return 1 + max((_nesting(v) for v in x.values()), default=0)
    if isinstance(x, list):
        return 1 + max((_nesting(v) for v in x), default=0)
    return 0


_BRACKETY = st.text(alphabet='[]{}"\\\\aé', max_size=6)


@_hyp(150)
@given(value=st.recursive(st.none() | st.integers() | _BRACKETY,
                          lambda c: st.lists(c, max_size=3) | st.dictionaries(_BRACKETY, c, max_size=3), max_leaves=12),
       ascii_only=st.booleans())
def test_depth_prescan_is_exact_for_valid_json(value, ascii_only):
    """The pre-parse depth scan ignores brackets, quotes and backslashes inside strings."""
    from reprobisect.trace.jsonsafe import depth

    assert depth(json.dumps(value, ensure_ascii=ascii_only).encode()) == _nesting(value)
