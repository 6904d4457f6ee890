"""Private generators built without a seed, in ``bisect repro`` (issue 36, items 4 and 5).

``np.random.default_rng()`` (and ``Generator(PCG64())``, ``SeedSequence()``, ``random.Random()``)
built without a seed takes OS entropy and ignores ``np.random.seed`` / ``torch.manual_seed``:
the batch ids agree, the values differ, and the answer pointed at the DataLoader's shuffle.
Now the recorder lists such generators with their call site (``extra.rng_sources``:
``runners.observers.rng_sources``), ``repro`` holds them seeded (``runners.hold``'s
``private_rngs``) first, and with the same ids the loader's shuffle is never a candidate.
The cheap tests write traces through the writer API or run the observer and the hold in a
plain Python process; the end-to-end one runs real torch on CPU (slow).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from reprobisect.core.compare import compare_paths
from reprobisect.core.hints import HOLD_VAR, cause_candidates
from reprobisect.core.options import ProbeOptions
from reprobisect.render import render_repro, repro_json
from reprobisect.trace import TraceWriter, read_trace, record_array
from reprobisect.workflows.repro import run_repro

_SOURCE = {"kind": "numpy", "where": "train.py:16", "code": "rng = np.random.default_rng()", "count": 40}


def _trace(path: Path, *, ids=(0, 1), value=0.0, init=0, seed=0, sources=None) -> Path:
    """One step of a torch-like run: an ``init`` record, the batch's ids and data, a loss."""
    env = {"device": "cpu", "env_vars": {}, "determinism": {}, "torch": {"num_threads": 2, "devices": []}}
    w = np.random.default_rng(init).standard_normal((2, 2)).astype(np.float32)
    x = np.array([1.0, 2.0], dtype=np.float32) + np.float32(value)
    extra = {"rng_sources": sources} if sources else None
    with TraceWriter(path, command=["python", "train.py"], environment=env, seed=seed, extra=extra) as wr:
        wr.begin_step(0)
        for name, kind, a in (("0.weight", "init", w), ("data[0]", "batch", x), ("loss", "loss", np.float32(1 + value))):
            wr.record(record_array(name, kind, a), a)
        wr.end_step({"loss": 1.0}, batch_ids=list(ids))
    return path


def _candidates(a: Path, b: Path):
    return cause_candidates(read_trace(a), read_trace(b), compare_paths(a, b), same_command=True)


# --------------------------------------------------------------------------- candidates (item 1 and 3)


def test_same_ids_other_values_never_offer_the_loaders_shuffle(tmp_path):
    a, b = _trace(tmp_path / "a"), _trace(tmp_path / "b", value=0.01)
    found = _candidates(a, b)
    assert "loader_seed" not in [c.name for c in found]  # torch seeded, the ids agree: the order is not it
    assert all("orders the data" not in c.outside for c in found)
    hashseed = next(c for c in found if c.name == "hashseed")
    assert hashseed.outside.startswith("something outside the seeds makes the data's values (the ids agree")
    assert "private_rngs" not in [c.name for c in found]  # no record of a private generator: not offered


def test_same_ids_with_torch_unseeded_keep_only_the_workers_seeds(tmp_path):
    a, b = _trace(tmp_path / "a", seed=None), _trace(tmp_path / "b", value=0.01, seed=None)
    loader = next(c for c in _candidates(a, b) if c.name == "loader_seed")
    assert "workers' seeds" in loader.question and "shuffle does not differ" in loader.question
    assert "decide the data order" not in loader.question


def test_a_recorded_private_generator_is_held_first_and_named_by_its_call_site(tmp_path):
    a = _trace(tmp_path / "a", sources=[_SOURCE])
    b = _trace(tmp_path / "b", value=0.01, sources=[_SOURCE])
    found = _candidates(a, b)
    assert [c.name for c in found][:1] == ["private_rngs"]
    c = found[0]
    assert c.env == {HOLD_VAR: "private_rngs"}
    assert "rng = np.random.default_rng() at train.py:16" in c.held
    assert "fresh OS entropy" in c.cause and "np.random.default_rng(N)" in c.fix
    moved = _trace(tmp_path / "c", ids=(1, 0), value=0.01, sources=[_SOURCE])  # another order: still first
    assert [c.name for c in _candidates(a, moved)][:2] == ["private_rngs", "hashseed"]


def test_one_seed_other_initial_parameters_and_a_private_generator(tmp_path):
    a = _trace(tmp_path / "a", sources=[_SOURCE])
    b = _trace(tmp_path / "b", init=1, sources=[_SOURCE])
    assert [c.name for c in _candidates(a, b)] == ["private_rngs"]
    plain_a, plain_b = _trace(tmp_path / "c"), _trace(tmp_path / "d", init=1)
    assert _candidates(plain_a, plain_b) == []  # no record of one: the records say nothing more


# --------------------------------------------------------------------------- the observer and the hold (item 2, 3)

_OBSERVED = textwrap.dedent("""\
    import json, random, sys
    import numpy as np
    from reprobisect.runners.observers.rng_sources import RngSourcesObserver
    from reprobisect.trace import TraceWriter

    w = TraceWriter(sys.argv[1], command=["x"])
    class Rec:
        writer = w
    undo = RngSourcesObserver(Rec()).install()
    np.random.default_rng(3); np.random.Generator(np.random.PCG64(4)); random.Random(5)  # seeded: nothing
    for _ in range(3):
        np.random.default_rng()  # unseeded, three times from one line
    np.random.Generator(np.random.PCG64())
    random.Random()
    import tempfile; tempfile.mktemp()  # the standard library's own Random(): not the user's code
    undo()
    np.random.default_rng()  # after removal: not seen
    print(json.dumps(w.extra.get("rng_sources")))
""")


def test_the_observer_lists_unseeded_generators_by_call_site_only(tmp_path):
    (tmp_path / "train.py").write_text(_OBSERVED)
    p = subprocess.run([sys.executable, "train.py", str(tmp_path / "t")], capture_output=True, text=True,
                       cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert got == [
        {"kind": "numpy", "where": "train.py:12", "code": "np.random.default_rng()", "count": 3},
        {"kind": "numpy", "where": "train.py:13", "code": "np.random.Generator(np.random.PCG64())", "count": 1},
        {"kind": "random.Random", "where": "train.py:14", "code": "random.Random()", "count": 1},
    ]


_HELD = textwrap.dedent("""\
    import random
    import numpy as np
    from reprobisect.runners import hold
    hold.activate_torch(None)  # imports no torch for this hold
    a = np.random.default_rng().integers(1 << 30)
    b = np.random.Generator(np.random.PCG64()).integers(1 << 30)
    c = random.Random().randrange(1 << 30)
    d = np.random.default_rng(7).integers(1 << 30)  # a seeded one keeps its seed
    print(a, b, c, d, a != b)
""")


def _held(env_hold: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != HOLD_VAR}
    if env_hold:
        env[HOLD_VAR] = env_hold
    p = subprocess.run([sys.executable, "-c", _HELD], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def test_the_private_rngs_hold_makes_unseeded_generators_repeat():
    one, two = _held("private_rngs"), _held("private_rngs")
    assert one == two and one.endswith("True")  # the same in every run, two generators still distinct
    assert one.split()[3] == str(np.random.default_rng(7).integers(1 << 30))
    assert _held(None) != _held(None)  # without it: OS entropy


# --------------------------------------------------------------------------- end to end (real torch on CPU)

_DEFAULT_RNG = """\
import numpy as np
import torch


def draw():
    return np.random.default_rng().normal(size=4).astype("float32")


np.random.seed(0)
torch.manual_seed(0)
data = torch.from_numpy(np.stack([draw() for _ in range(8)]))
loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for batch in loader:
    opt.zero_grad()
    model(batch).sum().backward()
    opt.step()
"""


@pytest.mark.slow
def test_repro_confirms_the_unseeded_default_rng_at_its_call_site(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "blobs.py").write_text(_DEFAULT_RNG)
    r = run_repro([sys.executable, "blobs.py"], ProbeOptions(steps=1, jobs=2, quiet=True), runs=2, confirm=True)
    assert not r
    text, data = render_repro(r), repro_json(r)
    assert [(c["candidate"], c["agreed"]) for c in data["causes"]] == [("private_rngs", True)]
    assert ("confirmed: with the unseeded generators seeded (return np.random.default_rng().normal(size=4)"
            '.astype("float32") at blobs.py:6) the runs agree') in text
    assert "PYTHONHASHSEED was unset, so" not in text  # the confirmed cause answers the untried question
    assert "DataLoader" not in text
