"""Complete training state capture and bitwise restore for TensorFlow / Keras 3: safetensors + JSON.

The interface the TF recorder (``runners.tensorflow``) calls at the policy's state steps::

    capture_state(out, step, *, model=None, variables=None, optimizer=None, datasets=(),
                  position=None) -> dict
    restore_state(state_dir, *, model=None, variables=None, optimizer=None, datasets=(),
                  step=None) -> dict

``out`` is a ``TraceWriter`` (anything with ``write_state(step, name, tensors, meta)``) or a
folder: the files then go to ``out/state/step-<step>/`` (the trace layout). ``state_dir`` is
that ``state/step-K`` folder, or a trace folder together with ``step=K``. Both return a
small summary (what was captured / restored, the data position). Call them eagerly,
between steps (never inside a ``tf.function``): the state is the one after step K's
update, what step K+1 starts from.

What is captured (each group is ``NAME.safetensors`` + ``NAME.json`` in ``state/step-K/``,
tensors keyed by variable path; plain JSON beside them; nothing is ever pickled):

- ``model``: every variable of ``model.variables`` — trainable and not (BatchNorm moving
  statistics), and the state of every Keras ``SeedGenerator`` the model tracks (Keras 3's
  Dropout draws its masks from one), by path, in order;
- ``optimizer``: every optimizer variable (``iteration``, learning rate when it is a
  variable, slots such as Adam's momentum/velocity, loss-scale state), by path;
- ``variables``: further variables (a list, or a dict name -> variable; a ``SeedGenerator``
  stands for its state), e.g. those of a ``tf.GradientTape`` loop without a Keras model;
- ``rng``: Python ``random``, NumPy's global ``RandomState``, the TF global seed and the
  eager op-seed sequence derived from it (``tf.random.set_seed``), the global
  ``tf.random.Generator`` (only when the program created it), Keras's global
  ``SeedGenerator`` (``keras.random`` without a seed) and the seed of
  ``keras.utils.set_random_seed``. ``rng.json`` marks the folder as a state (``workflows.replay``);
- ``data``: the data position — optimizer iterations, epoch and step in epoch when
  ``position`` gives ``steps_per_epoch`` (the recorder knows it in ``fit``), and the exact
  state of every ``tf.data`` iterator passed in ``datasets`` (TF's own iterator
  serialization, a protobuf, stored as bytes: shuffle buffers and all).

Restore loads every group into freshly built objects (matched by path; by position when the
paths differ, e.g. a second model built in the same process got ``dense_2``; shapes and
dtypes must agree), builds an unbuilt Keras optimizer on ``model.trainable_variables`` first,
then sets the RNGs — Python and NumPy last, because creating a missing global generator
draws from them. Objects passed to ``restore_state`` that were not captured are an error.

Not capturable: the hidden per-kernel state of TF's stateful random ops — an eager op given
an explicit op ``seed`` (TF caches its kernel), and ``tf.random.uniform`` / ``tf.nn.dropout``
inside a ``tf.function`` (each call advances the op's kernel; a fresh process starts it
again). Keras 3 layers draw through ``SeedGenerator`` (stateless ops + a state variable),
which is captured. Also not capturable: ``np.random.default_rng`` generators the program
holds, Keras metric accumulators (they only change the logged running mean), and the
position inside a ``model.fit`` epoch over shuffled data (``fit`` builds its iterator
inside; resume at an epoch boundary with ``initial_epoch`` is exact). ``data.json``
says ``exact: false`` with the reason when the position is not exact.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from reprobisect.errors import TraceError, UsageError
from reprobisect.trace import shards

__all__ = ["capture_state", "restore_state", "load_state", "capture_rng", "restore_rng", "STATE_GROUPS"]

STATE_GROUPS = ("model", "optimizer", "variables", "rng", "data")
"""The file names (``NAME.json`` / ``NAME.safetensors``) a TF state folder can hold."""

FRAMEWORK = "tensorflow"


# -- variables ------------------------------------------------------------------------

def _dtype_name(v: Any) -> str:
    d = getattr(v, "dtype", None)
    return str(getattr(d, "name", d))


def _var_path(v: Any) -> str:
    p = getattr(v, "path", None)
    if not p:
        p = str(getattr(v, "name", "variable"))
        p = p[:-2] if p.endswith(":0") else p
    return str(p)


def _as_variable(v: Any) -> Any:
    state = getattr(v, "state", None)  # a keras SeedGenerator stands for its state variable
    return state if state is not None and not hasattr(v, "assign") else v


def _variables_of(obj: Any, what: str) -> list[tuple[str, Any]]:
    """(path, variable) pairs of a model/optimizer/module, a list, or a dict name -> variable."""
    if obj is None:
        return []
    if isinstance(obj, Mapping):
        return [(str(k), _as_variable(v)) for k, v in obj.items()]
    if isinstance(obj, (list, tuple)):
        return [(_var_path(_as_variable(v)), _as_variable(v)) for v in obj]
    vs = getattr(obj, "variables", None)
    if vs is None:
        raise UsageError(f"cannot capture {what}: a {type(obj).__name__} has no .variables; pass a Keras model/optimizer, a tf.Module or a list of variables")
    vs = vs() if callable(vs) else vs
    return [(_var_path(v), v) for v in vs]


def _read_var(v: Any, key: str) -> np.ndarray:
    try:
        a = v.numpy()
    except Exception as e:  # inside a tf.function, or a symbolic variable
        raise UsageError(f"cannot capture state '{key}': its value is not readable here ({type(e).__name__}); capture eagerly, between steps") from None
    return np.array(a, copy=True)


def _unique(key: str, taken: Mapping[str, Any]) -> str:
    if key not in taken:
        return key
    i = 1
    while f"{key}#{i}" in taken:
        i += 1
    return f"{key}#{i}"


def _encode_vars(pairs: list[tuple[str, Any]]) -> tuple[dict[str, np.ndarray], list[dict[str, Any]]]:
    tensors: dict[str, np.ndarray] = {}
    index: list[dict[str, Any]] = []
    for path, v in pairs:
        key = _unique(path, tensors)
        a = _read_var(v, key)
        tensors[key] = a
        index.append({"key": key, "path": path, "dtype": _dtype_name(v), "shape": list(a.shape),
                      "trainable": bool(getattr(v, "trainable", False))})
    return tensors, index


def _match(saved: list[dict[str, Any]], live: list[tuple[str, Any]], what: str) -> tuple[list[tuple[dict, Any]], str]:
    """Pair saved entries with live variables: by path when the paths agree, else by position."""
    saved_paths = [m["path"] for m in saved]
    live_paths = [p for p, _ in live]
    if sorted(saved_paths) == sorted(live_paths) and len(set(live_paths)) == len(live_paths):
        by = dict(live)
        return [(m, by[m["path"]]) for m in saved], "path"
    if len(saved) != len(live):
        raise TraceError(
            f"the captured {what} has {len(saved)} variables, the one given has {len(live)}; "
            "restore into an object built the same way (and built: call it on a batch first)"
        )
    return list(zip(saved, (v for _, v in live))), "position"


def _assign(pairs: list[tuple[dict, Any]], tensors: Mapping[str, np.ndarray], what: str) -> None:
    for m, v in pairs:
        a = tensors.get(m["key"])
        if a is None:
            raise TraceError(f"{what}: variable '{m['path']}' is missing from its safetensors file; re-capture the state")
        shape = tuple(int(d) for d in getattr(v, "shape", a.shape))
        if shape != tuple(a.shape) or _dtype_name(v) != m["dtype"]:
            raise TraceError(
                f"{what}: variable '{m['path']}' was captured as {m['dtype']}{list(a.shape)}, "
                f"the variable given ('{_var_path(v)}') is {_dtype_name(v)}{list(shape)}; build the same model"
            )
    for m, v in pairs:  # all checked first: a refused restore leaves nothing half-assigned
        v.assign(tensors[m["key"]])


# -- RNG ------------------------------------------------------------------------------

def _mt_state(state: tuple, key: str, tensors: dict[str, np.ndarray]) -> dict[str, Any]:
    version, internal, gauss = state
    tensors[key] = np.asarray(internal, dtype=np.uint32)
    return {"version": version, "gauss_next": gauss, "__tensor__": key}


def _mt_restore(meta: Mapping[str, Any], tensors: Mapping[str, np.ndarray]) -> tuple:
    internal = tuple(int(x) for x in tensors[meta["__tensor__"]].tolist())
    return (int(meta["version"]), internal, meta.get("gauss_next"))


def _tf_context() -> Any:
    ctx_mod = sys.modules.get("tensorflow.python.eager.context")
    return ctx_mod.context() if ctx_mod is not None else None


def _keras_globals() -> Any:
    return sys.modules.get("keras.src.backend.common.global_state")


def capture_rng(tensors: dict[str, np.ndarray] | None = None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(JSON, arrays) of every RNG source this process has: python, numpy, tf, keras."""
    tensors = {} if tensors is None else tensors
    out: dict[str, Any] = {"python": _mt_state(random.getstate(), "python", tensors)}
    if "numpy" in sys.modules:
        name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
        tensors["numpy"] = np.asarray(keys, dtype=np.uint32)
        out["numpy"] = {"name": name, "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
    ctx = _tf_context()
    if ctx is not None:
        seed = getattr(ctx, "_seed", None)
        tf_rng: dict[str, Any] = {"global_seed": None if seed is None else int(seed)}
        rng = getattr(ctx, "_rng", None) if seed is not None else None
        if isinstance(rng, random.Random):
            tf_rng["op_seeds"] = _mt_state(rng.getstate(), "tf.op_seeds", tensors)
        out["tf"] = tf_rng
    srops = sys.modules.get("tensorflow.python.ops.stateful_random_ops")
    gen = getattr(srops, "global_generator", None) if srops is not None else None
    if gen is not None:
        tensors["tf.global_generator"] = np.array(gen.state.numpy(), copy=True)
        out["tf.global_generator"] = {"algorithm": int(gen.algorithm)}
    gs = _keras_globals()
    if gs is not None:
        kg = gs.get_global_attribute("global_seed_generator")
        keras_rng: dict[str, Any] = {"random_seed": gs.get_global_attribute("global_random_seed")}
        if kg is not None:
            tensors["keras.global_seed_generator"] = _read_var(kg.state, "keras.global_seed_generator")
            keras_rng["global_seed_generator"] = True
        out["keras"] = keras_rng
    return out, tensors


def restore_rng(meta: Mapping[str, Any], tensors: Mapping[str, np.ndarray]) -> list[str]:
    """Set every RNG source found in ``meta`` (``capture_rng``'s JSON); returns the sources set."""
    done: list[str] = []
    if "keras" in meta:
        _restore_keras_rng(meta["keras"], tensors)
        done.append("keras")
    if "tf" in meta and meta["tf"].get("global_seed") is not None:
        import tensorflow as tf

        tf.random.set_seed(int(meta["tf"]["global_seed"]))
        if "op_seeds" in meta["tf"]:
            _tf_context()._rng.setstate(_mt_restore(meta["tf"]["op_seeds"], tensors))
        done.append("tf")
    if "tf.global_generator" in meta:
        _restore_global_generator(int(meta["tf.global_generator"]["algorithm"]), tensors["tf.global_generator"])
        done.append("tf.global_generator")
    if "numpy" in meta:  # python and numpy last: creating a missing generator above draws from them
        m = meta["numpy"]
        np.random.set_state((m["name"], np.asarray(tensors["numpy"], dtype=np.uint32), m["pos"], m["has_gauss"], m["cached_gaussian"]))
        done.append("numpy")
    if "python" in meta:
        random.setstate(_mt_restore(meta["python"], tensors))
        done.append("python")
    return done


def _restore_keras_rng(meta: Mapping[str, Any], tensors: Mapping[str, np.ndarray]) -> None:
    import keras  # noqa: F401 - the global state module comes with it
    from keras.src.backend.common import global_state
    from keras.src.random import seed_generator

    global_state.set_global_attribute("global_random_seed", meta.get("random_seed"))
    if meta.get("global_seed_generator"):
        seed_generator.global_seed_generator().state.assign(tensors["keras.global_seed_generator"])
    else:  # absent at capture: drop one made since, so the next unseeded draw makes it again (from python)
        global_state.set_global_attribute(seed_generator.GLOBAL_SEED_GENERATOR, None)


def _restore_global_generator(algorithm: int, state: np.ndarray) -> None:
    import tensorflow as tf

    gen = tf.random.get_global_generator()
    if int(gen.algorithm) == algorithm and tuple(gen.state.shape) == state.shape:
        gen.reset(state)
    else:
        tf.random.set_global_generator(tf.random.Generator.from_state(state, algorithm))


# -- data position --------------------------------------------------------------------

def _iterator_bytes(it: Any, i: int) -> np.ndarray:
    import tensorflow as tf
    from tensorflow.python.ops import gen_dataset_ops

    res = getattr(it, "_iterator_resource", None)
    if res is None:
        raise UsageError(
            f"datasets[{i}] is a {type(it).__name__}, not a tf.data iterator; pass iter(dataset), the one training draws from"
        )
    variant = gen_dataset_ops.serialize_iterator(res, external_state_policy=2)  # 2: fail on external state
    return np.frombuffer(tf.io.serialize_tensor(variant).numpy(), dtype=np.uint8).copy()


def _position(optimizer: Any, position: Mapping[str, Any] | None, n_iterators: int) -> dict[str, Any]:
    pos: dict[str, Any] = dict(position or {})
    iterations = getattr(optimizer, "iterations", None) if optimizer is not None else None
    if iterations is not None:
        pos["iterations"] = int(iterations.numpy() if hasattr(iterations, "numpy") else iterations)
    spe = pos.get("steps_per_epoch")
    if spe and "iterations" in pos and "epoch" not in pos:
        pos["epoch"], pos["step_in_epoch"] = divmod(int(pos["iterations"]), int(spe))
    pos["iterators"] = n_iterators
    if n_iterators:
        pos.setdefault("exact", True)
    elif "exact" not in pos:
        pos["exact"] = bool(spe) and pos.get("step_in_epoch") == 0 and not pos.get("shuffle", False)
        pos.setdefault("note", "no tf.data iterator was given: the position is the epoch/step count only, "
                               "exact at an epoch boundary over unshuffled data")
    return pos


# -- capture --------------------------------------------------------------------------

def _sink(out: Any, step: int) -> Any:
    if hasattr(out, "write_state"):
        return out.write_state
    folder = Path(out) / "state" / f"step-{int(step)}"

    def write(_step: int, name: str, tensors: Mapping[str, np.ndarray], meta: Any) -> None:
        from reprobisect.trace.writer import write_json_atomic

        folder.mkdir(parents=True, exist_ok=True)
        shards.save(dict(tensors), folder / f"{name}.safetensors")
        write_json_atomic(folder / f"{name}.json", meta)

    return write


def capture_state(out: Any, step: int, *, model: Any = None, variables: Any = None, optimizer: Any = None,
                  datasets: Iterable[Any] = (), position: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Write the complete state after step ``step`` (what step ``step + 1`` starts from).

    ``position`` (optional) is what only the caller knows of the data position, e.g.
    ``{"epoch": e, "step_in_epoch": s, "steps_per_epoch": n, "shuffle": bool}`` from ``fit``.
    Returns ``{"step", "groups", "rng", "position"}``.
    """
    write = _sink(out, step)
    groups: list[str] = []
    for name, obj in (("model", model), ("optimizer", optimizer), ("variables", variables)):
        if obj is None:
            continue
        tensors, index = _encode_vars(_variables_of(obj, name))
        meta = {"framework": FRAMEWORK, "class": type(obj).__qualname__, "variables": index}
        if name == "optimizer":
            meta["built"] = bool(getattr(obj, "built", True))
        write(step, name, tensors, meta)
        groups.append(name)
    rng, rng_tensors = capture_rng()
    write(step, "rng", rng_tensors, {"framework": FRAMEWORK, "state": rng, "objects": groups})
    data: dict[str, np.ndarray] = {f"iterator/{i}": _iterator_bytes(it, i) for i, it in enumerate(datasets)}
    pos = _position(optimizer, position, len(data))
    write(step, "data", data, {"framework": FRAMEWORK, "position": pos})
    return {"step": int(step), "groups": groups, "rng": sorted(rng), "position": pos}


# -- load / restore -------------------------------------------------------------------

def _folder(state_dir: Any, step: int | None) -> Path:
    folder = Path(state_dir)
    if step is not None:
        folder = folder / "state" / f"step-{int(step)}"
    if not (folder / "rng.json").is_file():
        states = folder.parent if step is not None else folder / "state"
        have = sorted(p.name for p in states.glob("step-*")) if states.is_dir() else []
        raise TraceError(
            f"'{folder}' holds no captured state ({'states at: ' + ', '.join(have) if have else 'no state was captured'}); "
            "pass a state/step-K folder, or the trace folder and step=K"
        )
    return folder


def _check_digests(folder: Path) -> None:
    """Where the folder is part of a sealed trace, check each file against the manifest."""
    root = folder.parent.parent
    if not (root / "manifest.json").is_file():
        return
    from reprobisect.trace.reader import _check_digest, read_trace

    files = read_trace(root, allow_incomplete=True).manifest.files
    for p in folder.iterdir():
        rel = f"state/{folder.name}/{p.name}"
        if rel in files:
            _check_digest(root, rel, files[rel])


def load_state(state_dir: Any, *, step: int | None = None) -> dict[str, tuple[dict[str, Any], dict[str, np.ndarray]]]:
    """Every group of a TF state folder as ``(meta, arrays)``; JSON and safetensors only."""
    folder = _folder(state_dir, step)
    _check_digests(folder)
    out = {}
    for name in STATE_GROUPS:
        p = folder / f"{name}.json"
        if not p.is_file():
            continue
        try:
            meta = json.loads(p.read_text())
        except (OSError, ValueError) as e:
            raise TraceError(f"state '{name}' in '{folder}' cannot be read ({e}); re-capture it") from None
        st = folder / f"{name}.safetensors"
        out[name] = (meta, shards.load(st) if st.is_file() else {})
    if out.get("rng", ({}, {}))[0].get("framework") != FRAMEWORK:
        raise TraceError(f"'{folder}' holds a state captured by another framework's recorder; restore it with that framework")
    return out


def restore_state(state_dir: Any, *, model: Any = None, variables: Any = None, optimizer: Any = None,
                  datasets: Iterable[Any] = (), step: int | None = None) -> dict[str, Any]:
    """Load a captured state into freshly built objects and set every RNG.

    Build the model (call it once, or ``model.build``) before; an unbuilt Keras optimizer is
    built on ``model.trainable_variables``. ``datasets``: fresh iterators over the same
    pipelines, in the order captured. Returns ``{"matched_by", "rng", "position"}``.
    """
    state = load_state(state_dir, step=step)
    given = {"model": model, "optimizer": optimizer, "variables": variables}
    missing = [n for n, o in given.items() if o is not None and n not in state]
    if missing:
        have = [n for n in ("model", "optimizer", "variables") if n in state]
        raise TraceError(f"no captured state for {', '.join(missing)} (captured: {', '.join(have) or 'none'}); pass what was captured")
    if optimizer is not None and not getattr(optimizer, "built", True) and model is not None:
        optimizer.build(model.trainable_variables)
    matched: dict[str, str] = {}
    for name, obj in given.items():
        if obj is None:
            continue
        meta, tensors = state[name]
        pairs, how = _match(meta["variables"], _variables_of(obj, name), name)
        _assign(pairs, tensors, f"restoring the {name}")
        matched[name] = how
    datasets = list(datasets)
    if datasets:
        _restore_iterators(datasets, state.get("data", ({}, {}))[1])
    rng_meta, rng_tensors = state["rng"]
    done = restore_rng(rng_meta.get("state", {}), rng_tensors)
    position = state.get("data", ({}, {}))[0].get("position", {})
    return {"matched_by": matched, "rng": done, "position": position}


def _restore_iterators(datasets: list[Any], tensors: Mapping[str, np.ndarray]) -> None:
    import tensorflow as tf
    from tensorflow.python.ops import gen_dataset_ops

    saved = sum(1 for k in tensors if k.startswith("iterator/"))
    if len(datasets) != saved:
        raise TraceError(f"{saved} tf.data iterators were captured, {len(datasets)} given; pass fresh iterators over the same pipelines, in order")
    for i, it in enumerate(datasets):
        res = getattr(it, "_iterator_resource", None)
        if res is None:
            raise UsageError(f"datasets[{i}] is a {type(it).__name__}, not a tf.data iterator; pass iter(dataset)")
        variant = tf.io.parse_tensor(tensors[f"iterator/{i}"].tobytes(), tf.variant)
        gen_dataset_ops.deserialize_iterator(res, variant)
