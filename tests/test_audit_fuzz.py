"""Fuzz the audit's inputs: every mutant config is a valid config or one ``UsageError`` line, and
every mutant golden (its ``noise.json`` or its seal ``golden.json``) loads or is one ``UsageError``.

A valid config and a real golden (``save_golden`` of two real traces written with
``TraceWriter``) are mutated: a key set to a value of each YAML/JSON type (NaN, infinities,
huge integers, odd unicode, NUL, nested structures, path tricks), keys removed or unknown
ones added, the YAML text's bytes flipped, cut and spliced; the band's figures, keys and
structure replaced; the seal's fields replaced; both with and without re-sealing. No other
exception may escape, a message is always one line, and an unsealed change to ``noise.json``
is always refused (the seal). Deterministic: ``random.Random(0)`` and derandomized Hypothesis.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reprobisect.errors import UsageError
from reprobisect.workflows.audit import golden as goldens
from reprobisect.workflows.audit.config import AuditConfig, load_audit_config, parse_audit_config
from test_audit_reliability import write_trace

BASE: dict[str, Any] = {
    "name": "nightly", "steps": 2, "timeout": 60, "command": "python train.py --steps 4", "env": {"A": "1"},
    "checks": [
        {"name": "det", "check": "repro", "runs": 2},
        {"name": "gold", "check": "golden", "golden": "goldens/gold", "noise_runs": 2},
        {"name": "seeds", "check": "seeds", "seeds": [0, 1], "command": ["python", "train.py", "--seed", "{seed}"]},
        {"name": "threads", "check": "envs", "a": "env.OMP_NUM_THREADS=1", "b": "env.OMP_NUM_THREADS=2",
         "tolerance": {"atol": 1e-6, "rtol": 0}},
        {"name": "resume", "check": "resume", "steps": 4, "at": 2, "resume_args": "--resume ckpt.pt"},
    ],
}
VALUES: list[Any] = [
    None, True, False, 0, -1, 1, 2, 10**30, -(10**30), 10**5000, 0.5, -0.0, 1e308, math.nan, math.inf, -math.inf,
    "", " ", "x", "../..", "/", "/etc", "/dev/null", ".", "..", "a\x00b", "é", "🙂", "\u202e", "{seed}", "1e-3",
    "bitwise", "default", "repro", "golden", "nope", "--resume", "env.X=1", "python=", "a" * 5000,
    [], [1], ["python", 5], [[1]], [None], ["a", "b"], {}, {"a": 1}, {"atol": "x"}, {"atol": math.nan},
    {"X": {"y": 1}}, {"X": [1]}, {1: 2}, {"atol": 1e-3, "override": {"*": "x"}}, {"atol": 10**400},
]
KEYS = ["name", "check", "command", "env", "steps", "timeout", "detail", "tolerance", "runs", "seeds", "golden",
        "noise_runs", "a", "b", "at", "resume_args", "repo", "last_good", "golden_remote", "history", "checks",
        "colour", 7]


def _deep(n: int) -> Any:
    v: Any = 1
    for _ in range(n):
        v = [v]
    return v


def _mutate_config(rng: random.Random) -> dict[str, Any]:
    d = copy.deepcopy(BASE)
    for _ in range(rng.choice((1, 1, 2, 3))):
        where = d if rng.random() < 0.4 else rng.choice(d["checks"]) if isinstance(d.get("checks"), list) and d["checks"] and isinstance(d["checks"][0], dict) else d
        key = rng.choice(KEYS)
        op = rng.random()
        if op < 0.15 and key in where:
            del where[key]
        elif op < 0.2:
            where[key] = _deep(rng.choice((5, 50)))
        else:
            where[key] = copy.deepcopy(rng.choice(VALUES))
    return d


def _label(x: Any) -> str:
    try:
        return str(x)[:300]
    except ValueError:  # holds an integer too long to print
        return "(a mutant holding a huge integer)"


def _outcome(fn, label: str) -> Any:
    """``fn()``'s value, or the UsageError it raised (one line); anything else fails the test."""
    try:
        return fn()
    except UsageError as e:
        assert "\n" not in str(e) and str(e).strip(), f"{label}: not one line: {e!r}"
        return e
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"{label}: {type(e).__name__} escaped: {e}"[:500])


def test_mutated_config_mappings_are_valid_or_one_usage_error(tmp_path):
    path = tmp_path / "proj" / "a.yaml"
    path.parent.mkdir()
    rng = random.Random(0)
    kinds: dict[str, int] = {"ok": 0, "refused": 0}
    for i in range(400):
        data = _mutate_config(rng)
        got = _outcome(lambda: parse_audit_config(data, path), f"mutant {i}: {_label(data)}")
        kinds["ok" if isinstance(got, AuditConfig) else "refused"] += 1
        if isinstance(got, AuditConfig):
            for c in got.checks:  # what a valid config hands on is what the probes need
                assert all(isinstance(a, str) and "\x00" not in a for a in c.command)
                assert all(isinstance(k, str) and isinstance(v, str) for k, v in c.env.items())
                assert c.timeout is None or math.isfinite(c.timeout)
                assert c.golden is None or path.parent in c.golden.parents
    assert kinds["ok"] > 10 and kinds["refused"] > 200, kinds  # both sides of the line are reached
    assert sorted(p.name for p in path.parent.iterdir()) == []  # checking wrote nothing


def test_mutated_config_text_is_valid_or_one_usage_error(tmp_path):
    path = tmp_path / "a.yaml"
    text = yaml.safe_dump(BASE, sort_keys=False).encode()
    rng = random.Random(1)
    for i in range(250):
        b = bytearray(text)
        for _ in range(rng.randint(1, 4)):
            op, at = rng.random(), rng.randrange(len(b) + 1)
            if op < 0.4 and at < len(b):
                b[at] = rng.randrange(256)
            elif op < 0.6:
                del b[at:at + rng.randint(1, 40)]
            elif op < 0.8:
                b[at:at] = rng.choice([b"{", b"[", b"\xff", b": ", b"\n- ", b"&a ", b"*a", b"!!python/object ", b"\t", b".nan"])
            else:
                b = b[:at]
        path.write_bytes(bytes(b))
        _outcome(lambda: load_audit_config(path), f"text mutant {i}: {bytes(b)[:200]!r}")


# --------------------------------------------------------------------------- goldens


@pytest.fixture(scope="module")
def golden(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("golden")
    runs = [write_trace(d / f"run{i}", shift=i * 1e-6) for i in range(2)]
    g = d / "goldens" / "g"
    goldens.save_golden(g, runs)
    return g


def _seal(g: Path, seal: Any = None) -> None:
    seal = json.loads((g / "golden.json").read_text()) if seal is None else seal
    if isinstance(seal, dict):
        seal["noise_sha256"] = hashlib.sha256((g / "noise.json").read_bytes()).hexdigest()
    (g / "golden.json").write_text(json.dumps(seal))


def _replace_somewhere(rng: random.Random, doc: Any, value: Any) -> Any:
    """``doc`` with one value (or key) somewhere inside replaced by ``value``."""
    if not isinstance(doc, (dict, list)) or not doc or rng.random() < 0.2:
        return value
    if isinstance(doc, dict):
        k = rng.choice(list(doc))
        if rng.random() < 0.15:
            doc = dict(doc)
            doc[str(value)[:20] if not isinstance(value, str) else value] = doc.pop(k)
            return doc
        return {**doc, k: _replace_somewhere(rng, doc[k], value)}
    i = rng.randrange(len(doc))
    return doc[:i] + [_replace_somewhere(rng, doc[i], value)] + doc[i + 1:]


def _load(g: Path, label: str) -> Any:
    got = _outcome(lambda: goldens.load_golden(g, verify=False), label)
    if not isinstance(got, UsageError):
        band = got[1]
        goldens.band_tolerance(band)  # what a loaded band is used for
        assert all(a >= 0 and r >= 0 for a, r in band.tensors.values()), label
    return got


def test_mutated_noise_bands_and_seals_load_or_are_one_usage_error(golden):
    noise, seal = (golden / "noise.json").read_bytes(), (golden / "golden.json").read_bytes()
    band, seal_doc = json.loads(noise), json.loads(seal)
    rng = random.Random(2)
    pool = [v for v in VALUES if not (isinstance(v, int) and abs(v) > 10**300)] + [1e9, 1e-300, -1e-9, "Infinity"]
    try:
        for i in range(200):
            value = copy.deepcopy(rng.choice(pool))
            which = rng.random()
            if which < 0.6:  # the band, re-sealed: parsed and judged on its own merits
                doc = _replace_somewhere(rng, band, value)
                (golden / "noise.json").write_text(json.dumps(doc, allow_nan=True))
                _seal(golden)
                _load(golden, f"band mutant {i}: {_label(doc)}")
            elif which < 0.8:  # the band's bytes, not re-sealed: always refused by the seal
                b = bytearray(noise)
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
                (golden / "noise.json").write_bytes(bytes(b))
                got = _load(golden, f"unsealed byte mutant {i}")
                assert isinstance(got, UsageError) and "does not match its seal" in str(got), got
            else:  # the seal itself
                doc = _replace_somewhere(rng, seal_doc, value)
                (golden / "golden.json").write_text(json.dumps(doc, allow_nan=True))
                got = _load(golden, f"seal mutant {i}: {_label(doc)}")
                if doc != seal_doc:
                    assert isinstance(got, UsageError), f"seal mutant {i} loaded: {doc}"
            (golden / "noise.json").write_bytes(noise)
            (golden / "golden.json").write_bytes(seal)
    finally:
        (golden / "noise.json").write_bytes(noise)
        (golden / "golden.json").write_bytes(seal)
    assert not isinstance(_load(golden, "restored"), UsageError)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@settings(derandomize=True, max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(tensors=st.dictionaries(st.sampled_from(["param/w", "scalar/lr", "grad/w", "x"]) | st.text(max_size=6),
                               JSON, max_size=3),
       runs=JSON)
def test_hypothesis_bands_load_or_are_one_usage_error(golden, tensors, runs):
    noise, seal = (golden / "noise.json").read_bytes(), (golden / "golden.json").read_bytes()
    try:
        (golden / "noise.json").write_text(json.dumps({"runs": runs, "tensors": tensors}, allow_nan=True))
        _seal(golden)
        got = _load(golden, f"hypothesis band runs={runs!r} tensors={tensors!r}"[:400])
        if not isinstance(got, UsageError):
            assert all(k in ("param/w", "scalar/lr") for k in got[1].tensors)  # only tensors the trace holds
    finally:
        (golden / "noise.json").write_bytes(noise)
        (golden / "golden.json").write_bytes(seal)
