"""The ``hint:`` lines reprobisect prints, decided in one place from the evidence at hand.

A hint names a likely cause and the fix; a wrong hint sends the user the wrong way, so
each one is given only when the evidence makes its cause plausible:

``missing_link_hint``  a probe failed on a file that the user's checkout has and the
                       probe's worktree lacks (ignored data, an untracked config): pass
                       ``--link PATH``.
``divergence_hints``   why two runs of one command differ: no seed was set (initial
                       parameters differ at step 0 and the manifest says ``seed: null``),
                       or string hashing (``PYTHONHASHSEED`` unset or different, and the
                       first divergence is in data order while the parameters agree).
``evaluation_hint``    evaluation that drew from the global RNG moved the training after it
                       (the evaluation in the step of the first differing record of a
                       training forward, or in the step before it when a batch was fetched
                       ahead, differed; everything before agreed).
``cause_candidates``   the causes a re-run can test for two runs of one command that differ
                       (string hashing, the loader's generator, one thread, deterministic
                       algorithms, TF op determinism, the generators ``torch.manual_seed``
                       leaves alone: ``core.rng_candidates``), each with what to hold fixed; the
                       re-runs are ``reprobisect.workflows.confirm``'s.
``lr_note``            a learning-rate / scheduler / optimizer-hyperparameter difference
                       (betas, eps, weight decay, momentum, ... per param group) next to a
                       ``param`` divergence whose gradients agreed (shown under the divergence).

``compare_traces`` stores ``lr_note`` and ``divergence_hints`` on the ``Comparison``
(``explanation``, ``hints``); ``render`` prints them, so ``compare``, ``repro``, ``probe``
and ``runs`` say the same thing. ``missing_link_hint`` runs in ``executors.process.run_in_dir``.
Pure: no framework import; reads only the traces' manifests and step scalars.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

from reprobisect.core.rng_candidates import (HOLD_VAR, ORDER_KINDS as _ORDER_KINDS, OUTSIDE_MATH as _OUTSIDE_MATH,
                                             OUTSIDE_ORDER as _OUTSIDE_ORDER,
                                             OUTSIDE_VALUES as _OUTSIDE_VALUES,
                                             CauseCandidate, rng_sources, same_ids, step_of as _step,
                                             with_global_rngs)

__all__ = [
    "missing_link_hint",
    "missing_paths",
    "divergence_hints",
    "seed_hint",
    "hashseed_hint",
    "lr_note",
    "evaluation_hint",
    "SEED_FIX",
    "HOLD_VAR",
    "CauseCandidate",
    "cause_candidates",
    "with_global_rngs",
    "rng_sources",
]

SEED_FIX = ("seed before building the model (torch.manual_seed(N) / lightning.seed_everything(N) / "
            "keras.utils.set_random_seed(N))")

# --------------------------------------------------------------------------- missing files

# "No such file or directory: 'data/x.csv'", "FileNotFoundError: [Errno 2] ... 'x'",
# "can't open file '/w/train.py'", "[Errno 2] No such file or directory: b'x'", and paths
# in double quotes ("File \"data/x\" does not exist", pandas/numpy/torchvision wording)
_QUOTED = re.compile(r"""b?(['"])(?P<path>[^'"\n]{1,400})\1""")
_MISSING_LINE = re.compile(
    r"No such file|FileNotFoundError|can't open file|cannot open file|does not exist|not found|cannot find|can not find",
    re.IGNORECASE,
)


def missing_paths(text: str) -> list[str]:
    """Quoted paths on the lines of ``text`` that say a file is missing, in order, unique."""
    out: list[str] = []
    for line in (text or "").splitlines():
        if not _MISSING_LINE.search(line):
            continue
        for m in _QUOTED.finditer(line):
            p = m.group("path").strip()
            if p and p not in out and ("/" in p or "." in p or os.sep in p or p.isidentifier()):
                out.append(p)
    return out


def missing_link_hint(
    text: str, worktree: str | os.PathLike[str], source_root: str | os.PathLike[str], subdir: str = "."
) -> str | None:
    """A hint naming the ``--link`` that would give the probe a file it could not find.

    ``text``: the probe's error output (outcome detail, traceback, stderr tail).
    ``worktree``: the probe's worktree root; ``source_root``: the user's checkout of the
    same repository; ``subdir``: the folder (relative to the root) the command ran from.
    A path counts when it is absent from the worktree, present in the user's checkout and
    not tracked by git there (a file a newer commit added is code, not data to link);
    the ``--link`` suggested is its first component the worktree lacks (``data`` when the
    worktree has no ``data`` folder at all, ``data/raw`` when the commit tracks ``data/``).
    None when no such path is named.
    """
    wt = Path(worktree).resolve()
    src = Path(source_root).resolve()
    cwd = (wt / subdir).resolve()
    for p in missing_paths(text):
        full = Path(p) if os.path.isabs(p) else cwd / p
        full = Path(os.path.normpath(full))
        rel = None
        for base in (wt, src):  # an absolute path may name either copy
            try:
                rel = full.relative_to(base)
                break
            except ValueError:
                continue
        if rel is None or str(rel) in ("", ".") or rel.parts[0] == ".git":
            continue
        if os.path.lexists(wt / rel) or not os.path.lexists(src / rel):
            continue
        if _tracked(src, rel.as_posix()):
            continue  # git tracks it in the user's checkout: this commit lacks it (code, not data)
        # the first component of rel the worktree lacks: what --link should name
        parts = rel.parts
        k = next((i for i in range(1, len(parts) + 1) if not os.path.lexists(wt.joinpath(*parts[:i]))), len(parts))
        link = Path(*parts[:k]).as_posix()
        return (f"'{rel.as_posix()}' is in your checkout but not in the probe's worktree (git does not track it): "
                f"pass --link {link} to symlink it into every probe")
    return None


def _tracked(root: Path, rel: str) -> bool:
    """True when git tracks ``rel`` (or files under it) in the checkout at ``root``."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")}
    try:
        r = subprocess.run(["git", "ls-files", "--", rel], cwd=root, capture_output=True, text=True, timeout=30, env=env)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0 and bool(r.stdout.strip())


# --------------------------------------------------------------------------- why runs differ


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or x is None:
        return None
    if isinstance(x, (int, float)):
        return float(x)
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def _lr_values(scalars: dict[str, Any] | None) -> dict[str, Any]:
    """Learning-rate / scheduler scalars of one step: ``{'lr': 1e-3}``, or per param group
    ``{'lr (group 0)': .., 'lr (group 1)': ..}`` (the recorder keeps ``lr`` as one value per group)."""
    out: dict[str, Any] = {}
    for k, v in (scalars or {}).items():
        key = str(k)
        if not (key == "lr" or key.startswith(("lr_", "lr/", "lr.", "learning_rate", "sched", "scheduler"))):
            continue
        if isinstance(v, list) and len(v) == 1:
            out[key] = v[0]
        elif isinstance(v, list):
            for i, x in enumerate(v):
                out[f"{key} (group {i})"] = x
        else:
            out[key] = v
    return out


def _same(a: Any, b: Any) -> bool:
    fa, fb = _num(a), _num(b)
    if fa is not None and fb is not None:
        return fa == fb or (math.isnan(fa) and math.isnan(fb))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _show(v: Any) -> str:
    f = _num(v)
    if f is not None:
        return f"{f:g}"
    if isinstance(v, list):
        return "[" + ", ".join(_show(x) for x in v) + "]"
    return str(v)


def lr_note(trace_a: Any, trace_b: Any, comp: Any) -> str | None:
    """``lr differs: 1e-3 vs 2e-3 at step 0`` (or ``the optimizer's weight_decay differs: 0 vs
    0.01 (param group 0) at step 0``) when the learning rate, the scheduler state or another
    hyperparameter of the update (``scalars.hyperparams``: betas, eps, weight decay,
    momentum, ...) differs at or before the first divergence and that divergence is a
    ``param`` record whose step's gradients agreed (or were not recorded): the update rule,
    not the gradients, changed. A trace that recorded no hyperparameters (older ones) has
    nothing to say about them. None otherwise."""
    first = getattr(comp, "first", None)
    if first is None or trace_a is None or trace_b is None:
        return None
    if first.kind not in ("param", "optim_state"):
        return None
    if _grads_differ(comp, first.step):
        return None
    by_a = {s.step: s for s in trace_a.steps}
    by_b = {s.step: s for s in trace_b.steps}
    for k in sorted(set(by_a) & set(by_b)):
        if k > first.step:
            break
        sa, sb = by_a[k].scalars, by_b[k].scalars
        la, lb = _lr_values(sa), _lr_values(sb)
        said = [f"{key} differs: {_show(la.get(key, '(absent)'))} vs {_show(lb.get(key, '(absent)'))}"
                for key in sorted(set(la) | set(lb)) if not _same(la.get(key), lb.get(key))]
        n_lr = len(said)
        said += _hyperparam_diffs(sa, sb)
        if said:
            if n_lr == len(said) and n_lr > 1:  # learning rates only: as before
                return f"{said[0]} at step {k} (and {n_lr - 1} more scalar(s))"
            more = f" (and {len(said) - 1} more: {'; '.join(said[1:4])}{'; ...' if len(said) > 4 else ''})" \
                if len(said) > 1 else ""
            return f"{said[0]} at step {k}{more}"
    return None


def _hyperparams(scalars: dict[str, Any] | None) -> list[dict[str, Any]] | None:
    """``scalars.hyperparams``: one dict per param group, or None when not recorded."""
    groups = (scalars or {}).get("hyperparams")
    if not isinstance(groups, list):
        return None
    return [g if isinstance(g, dict) else {} for g in groups]


def _hyperparam_diffs(a: dict[str, Any] | None, b: dict[str, Any] | None) -> list[str]:
    """``the optimizer's eps differs: 1e-08 vs 1e-06 (param group 0)`` for each hyperparameter
    that differs between two steps' scalars; nothing when either side did not record them."""
    ga, gb = _hyperparams(a), _hyperparams(b)
    if ga is None or gb is None:
        return []
    groups: dict[str, list[int]] = {}  # one line per key and pair of values, naming its groups
    for g in range(min(len(ga), len(gb))):
        da, db = ga[g], gb[g]
        for key in list(da) + [k for k in db if k not in da]:
            va, vb = da.get(key, "(absent)"), db.get(key, "(absent)")
            if not _same(va, vb):
                groups.setdefault(f"the optimizer's {key} differs: {_show(va)} vs {_show(vb)}", []).append(g)
    return [f"{said} (param group{'s' if len(gs) > 1 else ''} {', '.join(map(str, gs))})"
            for said, gs in groups.items()]


def _grads_differ(comp: Any, step: int) -> bool:
    for d in ((comp.first,) if comp.first is not None else ()) + tuple(comp.next or ()):
        if d.step == step and d.kind == "grad":
            return True
    return False


def _env_var(trace: Any, name: str) -> str | None:
    env = getattr(getattr(trace, "manifest", None), "environment", None) or {}
    ev = env.get("env_vars") if isinstance(env, dict) else None
    return ev.get(name) if isinstance(ev, dict) else None


def _seed_of(trace: Any) -> Any:
    return getattr(getattr(trace, "manifest", None), "seed", None)


def _init_differs(comp: Any, trace_a: Any = None, trace_b: Any = None) -> bool:
    """The runs started from different parameters.

    Strong evidence: ``init`` records (parameters before the first step, recorded in step
    0) differ, or the first divergence is one. Without ``init`` records (older traces),
    weaker evidence: the first divergence is in step 0's forward (batch, input,
    activation, output, loss) and most step-0 ``param`` records differ by more than one
    update could move them (norms apart by over 1 %), which neither a nondeterministic
    kernel (a few ULPs) nor another batch order (one step of another batch) does. An
    unseeded script usually shuffles differently too, so the batch ids may differ as
    well: that does not make the seed less likely. When step 0's forward agreed and the
    first divergence is a gradient or parameter, the forward ran on the same parameters:
    not an init difference (a learning rate, say), whatever the magnitudes.
    """
    first = getattr(comp, "first", None)
    if first is None or first.step != 0:
        return False
    if first.kind == "init":
        return True
    sa, sb = _step(trace_a, 0), _step(trace_b, 0)
    if sa is None or sb is None:
        return False  # only the comparison at hand: cannot tell
    init_a = {r.name: r for r in sa.records if _is_init(r)}
    init_b = {r.name: r for r in sb.records if _is_init(r)}
    if init_a and init_b:
        return any(init_b.get(n) is not None and init_b[n].fingerprint != r.fingerprint for n, r in init_a.items())
    if first.kind in ("grad", "param", "optim_state"):
        # the forward of step 0 (activations, loss) agreed: it ran on the same parameters
        return False
    pb = {r.name: r for r in sb.records if r.kind == "param" and not _is_init(r)}
    pairs = [(r, pb[r.name]) for r in sa.records if r.kind == "param" and not _is_init(r) and r.name in pb]
    if not pairs:
        return False
    far = 0
    for ra, rb in pairs:
        na, nb = _num(ra.stat("norm")), _num(rb.stat("norm"))
        if ra.fingerprint != rb.fingerprint and na is not None and nb is not None and math.isfinite(na) and math.isfinite(nb):
            if abs(na - nb) > 0.01 * max(abs(na), abs(nb), 1e-30):
                far += 1
    return far * 2 > len(pairs)


def _is_init(r: Any) -> bool:
    """An ``init`` record, or a ``param`` recorded before the first update (``meta.phase``)."""
    return r.kind == "init" or (r.kind == "param" and (getattr(r, "meta", None) or {}).get("phase") in ("init", "before"))


def _all(comp: Any) -> tuple[Any, ...]:
    return ((comp.first,) if comp.first is not None else ()) + tuple(comp.next or ())


def seed_hint(trace_a: Any, trace_b: Any, comp: Any) -> str | None:
    """``initial parameters differ: no seed was set; seed before building the model (...)``
    when the first divergence is in the initial parameters and neither run recorded a seed."""
    if not _init_differs(comp, trace_a, trace_b):
        return None
    sa, sb = _seed_of(trace_a), _seed_of(trace_b)
    if sa is None and sb is None:
        return f"initial parameters differ: no seed was set; {SEED_FIX}"
    if sa != sb:
        return f"initial parameters differ: the runs were seeded differently ({sa} vs {sb})"
    return None


def hashseed_hint(trace_a: Any, trace_b: Any, comp: Any, *, given: tuple[str | None, ...] = ()) -> str | None:
    """The ``PYTHONHASHSEED`` hint, only when string hashing can explain the difference.

    Plausible when the runs hashed strings differently (``PYTHONHASHSEED`` unset on either
    side, or set to different values) AND the first divergence is in what set/dict order
    feeds: the data order (``batch`` ids, ``input``) or a ``missing`` record (a different
    set of tensors or modules), while the initial parameters do not differ. A divergence
    in the initial parameters (no seed) or in the math of an op is not explained by it.
    ``given`` is accepted for callers that know what they set; the manifests decide.
    """
    first = getattr(comp, "first", None)
    if first is None:
        return None
    ha, hb = _env_var(trace_a, "PYTHONHASHSEED"), _env_var(trace_b, "PYTHONHASHSEED")
    randomised = ha is None or hb is None or ha == "random" or hb == "random" or ha != hb
    if not randomised:
        return None
    if _init_differs(comp, trace_a, trace_b):
        return None
    if first.kind in _ORDER_KINDS or first.verdict == "missing":
        where = "data order" if first.kind in _ORDER_KINDS else "which tensors were recorded"
        what = "the data order" if first.kind in _ORDER_KINDS else "which tensors were recorded"
        if ha is None or hb is None or "random" in (ha, hb):
            return (f"does string hashing decide {what}? PYTHONHASHSEED was unset, so each run hashed strings "
                    f"with a seed of its own, and the first difference is in {where}; check: export PYTHONHASHSEED=0 "
                    "and run again (bisect repro tries this by itself unless --no-confirm)")
        return (f"does string hashing decide {what}? the runs had different PYTHONHASHSEED ({ha} vs {hb}) and "
                f"the first difference is in {where}; check: run both with the same PYTHONHASHSEED; if they then "
                "agree, iterate in a fixed order (e.g. sorted())")
    return None


_FORWARD_KINDS = ("batch", "input", "activation", "output", "loss")
_EVAL_KEYS = ("phase", "forwards", "batches", "samples", "ids_fingerprint")


_EVAL_REACH = 1
"""How many steps after an evaluation its draws from the global RNG can first show in training:
the same step (training draws after it) or the next one (a batch drawn before it and used one
step later: nanoGPT fetches the next batch ahead, then evaluates at the top of the next
iteration). An evaluation further back that moved the RNG would have moved the steps between."""


def _evaluation_near(trace: Any, k: int) -> dict[int, list[tuple[Any, ...]]]:
    """The evaluation runs recorded in steps ``k - _EVAL_REACH .. k`` (``scalars.eval``), by
    step, without timing: what could have moved the global RNG before step ``k``'s draws."""
    out: dict[int, list[tuple[Any, ...]]] = {}
    for s in getattr(trace, "steps", ()):
        if s.step > k:
            break
        if s.step < k - _EVAL_REACH:
            continue
        runs = [tuple(run.get(key) for key in _EVAL_KEYS) for run in (s.scalars or {}).get("eval") or ()
                if isinstance(run, dict)]
        if runs:
            out[s.step] = runs
    return out


def _evaluation_said(ra: list[tuple[Any, ...]], rb: list[tuple[Any, ...]]) -> str:
    """What differed in one step's evaluation: who ran it, or how much it ran."""
    if not ra or not rb:
        return f"{'A' if ra else 'B'} evaluated there, {'B' if ra else 'A'} did not"
    fa, fb = sum(r[1] or 0 for r in ra), sum(r[1] or 0 for r in rb)
    if fa != fb:
        return f"{fa} vs {fb} evaluation forwards"
    ba, bb = sum(r[2] or 0 for r in ra), sum(r[2] or 0 for r in rb)
    if ba != bb:
        return f"{ba} vs {bb} evaluation batches"
    return "other evaluation batches or phases"


def evaluation_hint(trace_a: Any, trace_b: Any, comp: Any) -> str | None:
    """Evaluation that changed the training after it: the first divergence is in a training
    step's forward (its data, an activation, the output, the loss) from parameters that
    agreed, and the evaluation recorded in that step or the one before (``_EVAL_REACH``)
    differed in whether or what it ran (forwards, batches, samples). Evaluation that draws
    from the global RNG moves every random draw of training after it: ``torch.randint``
    batches, a shuffled sampler, dropout masks, and each new DataLoader iterator, which
    takes its base seed from the global RNG unless the loader has its own generator. A
    batch drawn before the evaluation (fetched ahead) shows the move one step later. No
    evaluation difference near the divergence: no hint (an older one would have moved the
    steps between)."""
    first = getattr(comp, "first", None)
    if first is None or first.kind not in _FORWARD_KINDS or trace_a is None or trace_b is None:
        return None
    if _init_differs(comp, trace_a, trace_b):
        return None
    ea, eb = _evaluation_near(trace_a, first.step), _evaluation_near(trace_b, first.step)
    where = next((k for k in sorted(set(ea) | set(eb)) if ea.get(k, []) != eb.get(k, [])), None)
    if where is None:
        return None
    said = _evaluation_said(ea.get(where, []), eb.get(where, []))
    what = "training data" if first.kind in ("batch", "input") else "forward"
    late = ("" if where == first.step else
            ", one step after that evaluation (as when the next batch is drawn before evaluating and used in the "
            "step after it, like nanoGPT's loop)")
    return (f"the evaluation before step {first.step} differed between the runs (in step {where}'s evaluation: "
            f"{said}) and the {what} of step {first.step} is the first difference{late}; evaluation that draws "
            "from the global RNG moves every random draw of training after it (torch.randint batches, shuffling, "
            "dropout masks; each new DataLoader iterator takes a seed from it unless the loader has a generator=); "
            "give evaluation its own torch.Generator to keep training independent of it")


def layers_hidden(trace: Any) -> str | None:
    """Why a trace holds no layer outputs (a TensorFlow graph-mode or XLA ``fit``), or None."""
    extra = getattr(getattr(trace, "manifest", None), "extra", None) or {}
    why = (extra.get("tensorflow") or {}).get("layer_outputs") if isinstance(extra, dict) else None
    return why if isinstance(why, str) and why.startswith("not recorded") else None


def hidden_layers_hint(trace_a: Any, trace_b: Any, comp: Any) -> str | None:
    """The first divergence is the model's output (or after it) because the layers between
    input and output were not recorded: say so, and how to name the layer."""
    first = getattr(comp, "first", None)
    if first is None or first.kind not in ("output", "loss", "grad", "param", "optim_state"):
        return None
    why = layers_hidden(trace_a) or layers_hidden(trace_b)
    if why is None:
        return None
    return (f"layer outputs were {why}, so the first difference can only show at the model's {first.kind}; to name "
            "the layer, re-run both sides eagerly: export REPROBISECT_TF_EAGER=1 (fit runs with run_eagerly=True "
            "and every layer's output is recorded; both sides change mode alike)")


def divergence_hints(trace_a: Any, trace_b: Any, comp: Any, *, given_hashseeds: tuple[str | None, ...] = ()) -> list[str]:
    """Every hint the evidence supports for a comparison of two runs (``hint: `` not included).

    ``trace_a``/``trace_b``: the ``Trace`` objects (or None when not at hand: then only
    what ``comp`` alone shows is said). Order: seed, then evaluation that moved the data
    (else string hashing). The learning-rate note is ``lr_note`` (shown under the
    divergence itself, not as a hint).
    """
    if comp is None or getattr(comp, "first", None) is None:
        return []
    out: list[str] = []
    seed = seed_hint(trace_a, trace_b, comp)
    if seed:
        out.append(seed)
    # evaluation that moved the data explains a data-order difference better than hashing
    data = evaluation_hint(trace_a, trace_b, comp) or hashseed_hint(trace_a, trace_b, comp, given=given_hashseeds)
    if data:
        out.append(data)
    hidden = hidden_layers_hint(trace_a, trace_b, comp)
    if hidden:
        out.append(hidden)
    return out


# --------------------------------------------------------------------------- causes to test by re-running

_MATH_KINDS = ("activation", "output", "loss", "grad", "param", "optim_state", "collective")


def _hashseed_candidate(hint: str | None) -> CauseCandidate:
    return CauseCandidate(
        name="hashseed", held="PYTHONHASHSEED=0", env={"PYTHONHASHSEED": "0"},
        question="does string hashing (set/dict order, PYTHONHASHSEED) decide the data order?",
        cause="string hashing (set/dict iteration order) decides the data order",
        fix="iterate in a fixed order (e.g. sorted()), or export PYTHONHASHSEED=0", outside=_OUTSIDE_ORDER, hint=hint)


def _hashed_seed_candidate() -> CauseCandidate:
    return CauseCandidate(
        name="hashseed", held="PYTHONHASHSEED=0", env={"PYTHONHASHSEED": "0"},
        question="does the seed come from string hashing (hash() of a str, PYTHONHASHSEED)?",
        cause="the seed comes from string hashing (hash() of a str), which PYTHONHASHSEED randomises",
        fix="derive the seed from a fixed number (or zlib.crc32 of the string), not hash()",
        outside="something outside the seeds chooses the seed (the time, the pid, the environment?)")


def _loader_candidate(*, values: bool = False) -> CauseCandidate:
    """The DataLoader's generator; with ``values`` (the runs fetched the same sample ids, so its
    shuffle agreed) only its workers' seeds, which seed what the workers draw for each sample."""
    if values:
        return CauseCandidate(
            name="loader_seed", held="a seeded DataLoader generator", env={HOLD_VAR: "loader_seed"},
            question=("do the DataLoader workers' seeds (from an unseeded base seed) decide what the workers draw "
                      "for each sample? the sample ids agree, so its shuffle does not differ"),
            cause="the DataLoader workers' seeds come from an unseeded generator, and the workers draw from them",
            fix="give the DataLoader generator=torch.Generator().manual_seed(N) (and a worker_init_fn seeding workers)",
            outside=_OUTSIDE_VALUES)
    return CauseCandidate(
        name="loader_seed", held="a seeded DataLoader generator", env={HOLD_VAR: "loader_seed"},
        question="does an unseeded DataLoader (its shuffle or its workers' seeds) decide the data order?",
        cause="the DataLoader's shuffle/worker seeds come from an unseeded generator",
        fix="give the DataLoader generator=torch.Generator().manual_seed(N) (and a worker_init_fn seeding workers)",
        outside=_OUTSIDE_ORDER)


def _thread_candidate() -> CauseCandidate:
    one = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1",
           "TF_NUM_INTEROP_THREADS": "1", HOLD_VAR: "one_thread"}
    return CauseCandidate(
        name="one_thread", held="one thread (OMP_NUM_THREADS=1, MKL_NUM_THREADS=1)", env=one,
        question="does the thread count change how an op sums (parallel reductions)?",
        cause="parallel reductions over several threads sum in a varying order",
        fix="run with one thread (OMP_NUM_THREADS=1, torch.set_num_threads(1)) where bits must repeat",
        outside=_OUTSIDE_MATH)


def _deterministic_candidate() -> CauseCandidate:
    return CauseCandidate(
        name="deterministic", held="torch.use_deterministic_algorithms(True) (CUBLAS_WORKSPACE_CONFIG=:4096:8)",
        env={"CUBLAS_WORKSPACE_CONFIG": ":4096:8", HOLD_VAR: "deterministic"},
        question="does a nondeterministic kernel (atomics, a benchmarked algorithm) compute the difference?",
        cause="a nondeterministic kernel computes differently from run to run",
        fix="torch.use_deterministic_algorithms(True) and CUBLAS_WORKSPACE_CONFIG=:4096:8 on CUDA",
        outside=_OUTSIDE_MATH)


def _tf_candidate() -> CauseCandidate:
    return CauseCandidate(
        name="tf_determinism", held="TF op determinism (TF_DETERMINISTIC_OPS=1)",
        env={"TF_DETERMINISTIC_OPS": "1", HOLD_VAR: "tf_determinism"},
        question="does a nondeterministic TensorFlow op compute the difference?",
        cause="a nondeterministic TensorFlow op computes differently from run to run",
        fix="tf.config.experimental.enable_op_determinism() (or TF_DETERMINISTIC_OPS=1)", outside=_OUTSIDE_MATH)


def cause_candidates(trace_a: Any, trace_b: Any, comp: Any, *, same_command: bool = False) -> list[CauseCandidate]:
    """The causes worth a re-run with each held fixed, most likely (and cheapest) first.

    None when the records already name the cause (the initial parameters differ and no
    seed was set; evaluation before the step differed). Two runs of one command that
    recorded different seeds with string hashing randomised: does the seed come from
    ``hash()``? The data order (``batch``/``input`` first, or a
    ``missing`` record): string hashing when it was randomised, then the DataLoader's
    generator when a loader's index stream was recorded (when both runs fetched the same
    sample ids its shuffle agreed: only its workers' seeds, and only while torch was not
    seeded). The initial parameters differ although both runs recorded one seed: a private
    generator built without a seed, when the recorder saw one. The math of an op, only for two
    runs of one command (``same_command``: between commits it is the code): TF op
    determinism for a TensorFlow trace; else deterministic algorithms first on CUDA and one
    thread first on the CPU. A setting the trace shows in force already is not tried again.
    Both lists also get the unseeded global RNGs and, first, the private generators built
    without a seed (``with_global_rngs``, ``reprobisect.core.rng_candidates``).
    """
    first = getattr(comp, "first", None)
    if first is None or trace_a is None or trace_b is None:
        return []
    if _init_differs(comp, trace_a, trace_b):
        seeded = _seed_candidates(trace_a, trace_b)
        if seeded or _seed_of(trace_a) is None or _seed_of(trace_b) is None or not rng_sources(trace_a, trace_b):
            return seeded
        return with_global_rngs([], trace_a, trace_b, first)[:1]  # one seed, other parameters: a private generator?
    if evaluation_hint(trace_a, trace_b, comp):
        return []
    if first.kind in _ORDER_KINDS or first.verdict == "missing":
        out: list[CauseCandidate] = []
        hint = hashseed_hint(trace_a, trace_b, comp)
        if hint:
            out.append(_hashseed_candidate(hint))
        if first.kind in _ORDER_KINDS and _loader_recorded(trace_a, trace_b, first.step):
            if not same_ids(trace_a, trace_b, first):
                out.append(_loader_candidate())
            elif _seed_of(trace_a) is None or _seed_of(trace_b) is None:  # torch unseeded: the workers' seeds are too
                out.append(_loader_candidate(values=True))
        return with_global_rngs(out, trace_a, trace_b, first)
    if not same_command or first.kind not in _MATH_KINDS:
        return []
    env = getattr(getattr(trace_a, "manifest", None), "environment", None) or {}
    if isinstance(env.get("tensorflow"), dict):
        order = [_tf_candidate(), _thread_candidate()]
    elif _on_cuda(env):
        order = [_deterministic_candidate(), _thread_candidate()]
    else:
        order = [_thread_candidate(), _deterministic_candidate()]
    return [c for c in with_global_rngs(order, trace_a, trace_b, first) if not _in_force(c.name, env)]


def _seed_candidates(trace_a: Any, trace_b: Any) -> list[CauseCandidate]:
    """The initial parameters differ: the seeds the runs recorded differ, and string hashing
    was randomised, so ``hash()`` may have chosen them; else the records say it all."""
    sa, sb = _seed_of(trace_a), _seed_of(trace_b)
    if sa is None or sb is None or sa == sb:
        return []
    ha, hb = _env_var(trace_a, "PYTHONHASHSEED"), _env_var(trace_b, "PYTHONHASHSEED")
    if ha is None or hb is None or "random" in (ha, hb) or ha != hb:
        return [_hashed_seed_candidate()]
    return []


def _loader_recorded(trace_a: Any, trace_b: Any, k: int) -> bool:
    """Both runs recorded a DataLoader's index stream (batch ids) at step ``k``."""
    sa, sb = _step(trace_a, k), _step(trace_b, k)
    return sa is not None and sb is not None and sa.batch_ids is not None and sb.batch_ids is not None


def _on_cuda(env: dict[str, Any]) -> bool:
    th = env.get("torch") if isinstance(env.get("torch"), dict) else {}
    return bool(th.get("devices")) or "cuda" in str((env.get("probe") or {}).get("device", ""))


def _in_force(name: str, env: dict[str, Any]) -> bool:
    """The trace's environment shows the setting ``name`` holds fixed already."""
    det = env.get("determinism") if isinstance(env.get("determinism"), dict) else {}
    th = env.get("torch") if isinstance(env.get("torch"), dict) else {}
    ev = env.get("env_vars") if isinstance(env.get("env_vars"), dict) else {}
    if name == "deterministic":
        return det.get("deterministic_algorithms") is True
    if name == "one_thread":
        return th.get("num_threads") == 1 or (not th and ev.get("OMP_NUM_THREADS") == "1")
    if name == "tf_determinism":
        return ev.get("TF_DETERMINISTIC_OPS") in ("1", "true", "True")
    return False
