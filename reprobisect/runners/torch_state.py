"""Complete training state capture and restore for PyTorch: safetensors + JSON, never pickle.

What is captured at step K (``capture_state``): the state *after* step K's optimizer
update, i.e. what step K+1 starts from.

- every object that is ``Stateful`` (has ``state_dict``/``load_state_dict``): model,
  optimizer (state + param_groups), LR scheduler, GradScaler, anything else — through one
  Protocol, not a list of known classes;
- RNG, keyed by source like Lightning Fabric's seed utilities: ``python`` (``random``),
  ``numpy`` (global ``RandomState``), ``torch`` (CPU), ``torch.cuda`` (every device, only
  when CUDA is initialised), and the DataLoader's generators (``loader.generator``,
  ``loader.sampler.generator``, ``loader.batch_sampler.sampler.generator``);
- data order: epoch, batches consumed in it, worker base seed, and the RNG states the
  loader's iterator started the epoch from (needs ``track_data_order()`` installed before
  the loader was iterated; the launcher installs it); and when the data order holds its own
  state — a ``Stateful`` loader (torchdata's ``StatefulDataLoader``) or sampler — that state,
  which ``restore_state`` loads back instead of replaying the epoch's start.

Each object becomes two files through ``TraceWriter.write_state``: ``NAME.safetensors``
(every tensor, keyed by its path in the state dict) and ``NAME.json`` (the skeleton:
ints, floats, strings, None, lists, dicts; tuples, non-string dict keys, non-finite floats
and tensors as small tagged objects). Anything else is an error naming the key. Files are
read back with plain ``json`` and the safetensors layout reader: nothing is unpickled.

Restore (``restore_state``) loads each captured object into a freshly built one, sets every
RNG (missing sources are left alone), and arms the loader so that its next iteration
replays the epoch's start and skips the batches already consumed — so a fresh process
continues with bitwise the same batches, dropout masks and updates. Objects passed to
``restore_state`` that were not captured are an error (a silent skip would break the
bitwise promise); captured objects not passed are ignored.
"""

from __future__ import annotations

import json
import math
import random
import re
import sys
import weakref
from pathlib import Path
from typing import Any, Mapping, Protocol, runtime_checkable

import numpy as np
import torch

from reprobisect.errors import TraceError, UsageError

__all__ = [
    "Stateful",
    "capture_state",
    "load_state",
    "restore_state",
    "capture_rng",
    "restore_rng",
    "track_data_order",
    "load_rng_at_step_end",
    "encode_state",
    "decode_state",
]

_RESERVED = ("rng", "data")
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


@runtime_checkable
class Stateful(Protocol):
    """Anything with ``state_dict``/``load_state_dict`` (model, optimizer, scheduler, scaler...)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> Any: ...


# -- tensors <-> NumPy --------------------------------------------------------------

def _ml_views() -> dict[torch.dtype, tuple[torch.dtype, Any]]:
    import ml_dtypes

    views = {torch.bfloat16: (torch.int16, ml_dtypes.bfloat16)}
    for tname, mname in (("float8_e4m3fn", "float8_e4m3fn"), ("float8_e5m2", "float8_e5m2")):
        if hasattr(torch, tname):
            views[getattr(torch, tname)] = (torch.uint8, getattr(ml_dtypes, mname))
    return views


def _to_numpy(t: torch.Tensor, key: str) -> np.ndarray:
    """``t`` as an array: a view of a contiguous CPU tensor's memory (the writer copies what it
    keeps past the step), else one copy into memory NumPy owns (a device or strided tensor:
    the writer then hands it to its background thread as it is, not copying it again)."""
    if t.layout != torch.strided or t.is_quantized:
        raise UsageError(f"cannot capture state '{key}': {t.layout} tensors are not supported; convert it to a dense tensor")
    if t.dtype == torch.complex128:
        raise UsageError(f"cannot capture state '{key}': complex128 tensors are not supported")
    t = t.detach()
    view = _ml_views().get(t.dtype)
    if t.device.type == "cpu" and t.is_contiguous() and not (t.is_conj() or t.is_neg()):
        return t.view(view[0]).numpy().view(view[1]) if view is not None else t.numpy()
    if view is not None:
        out = np.empty(tuple(t.shape), dtype=view[1])
        torch.from_numpy(out.view(torch.empty(0, dtype=view[0]).numpy().dtype)).view(t.dtype).copy_(t)
    else:
        out = np.empty(tuple(t.shape), dtype=torch.empty(0, dtype=t.dtype).numpy().dtype)
        torch.from_numpy(out).copy_(t)
    return out


def _to_torch(a: np.ndarray, dtype_name: str) -> torch.Tensor:
    target = getattr(torch, dtype_name, None)
    view = _ml_views().get(target) if isinstance(target, torch.dtype) else None
    if view is not None:
        int_np = np.int16 if view[0] == torch.int16 else np.uint8
        return torch.from_numpy(np.array(a.view(int_np), copy=True)).view(target)
    return torch.from_numpy(np.array(a, copy=True))


# -- the JSON skeleton --------------------------------------------------------------

def encode_state(obj: Any, tensors: dict[str, np.ndarray], path: str = "") -> Any:
    """Turn a nested state into JSON, moving every tensor/array into ``tensors``."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else {"__float__": repr(obj)}
    if isinstance(obj, torch.Tensor):
        key = _unique(path or "tensor", tensors)
        tensors[key] = _to_numpy(obj, path)
        return {
            "__tensor__": key,
            "dtype": str(obj.dtype).replace("torch.", ""),
            "device": str(obj.device),
            "requires_grad": bool(obj.requires_grad),
        }
    if isinstance(obj, np.ndarray):
        key = _unique(path or "array", tensors)
        tensors[key] = np.ascontiguousarray(obj)
        return {"__ndarray__": key}
    if isinstance(obj, np.generic):
        return encode_state(obj.item(), tensors, path)
    if isinstance(obj, torch.dtype):
        return {"__dtype__": str(obj).replace("torch.", "")}
    if isinstance(obj, torch.device):
        return {"__device__": str(obj)}
    if isinstance(obj, torch.Size):
        obj = tuple(obj)
    if isinstance(obj, Mapping):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: encode_state(v, tensors, _join(path, k)) for k, v in obj.items()}
        return {"__dict__": [[encode_state(k, tensors, _join(path, "key")), encode_state(v, tensors, _join(path, str(k)))] for k, v in obj.items()]}
    if isinstance(obj, (tuple, list)) and all(type(v) is int for v in obj):  # an RNG state: no call per number
        return {"__tuple__": list(obj)} if isinstance(obj, tuple) else list(obj)
    if isinstance(obj, tuple):
        return {"__tuple__": [encode_state(v, tensors, _join(path, str(i))) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [encode_state(v, tensors, _join(path, str(i))) for i, v in enumerate(obj)]
    raise UsageError(
        f"cannot capture state '{path}': a {type(obj).__name__} is not a tensor, number, string, None, "
        "list, tuple or dict; make the object's state_dict() return plain data (reprobisect never pickles)"
    )


def decode_state(obj: Any, tensors: Mapping[str, np.ndarray], where: str = "state") -> Any:
    """Inverse of ``encode_state``: tensors come back as CPU torch tensors, arrays as NumPy."""
    if isinstance(obj, list):
        return [decode_state(v, tensors, where) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "__tensor__" in obj:
        a = _tensor(tensors, obj["__tensor__"], where)
        t = _to_torch(a, obj.get("dtype", "float32"))
        if obj.get("requires_grad") and (t.is_floating_point() or t.is_complex()):
            t.requires_grad_(True)
        return t
    if "__ndarray__" in obj:
        return np.array(_tensor(tensors, obj["__ndarray__"], where), copy=True)
    if "__float__" in obj:
        return float(obj["__float__"])
    if "__dtype__" in obj:
        return getattr(torch, obj["__dtype__"])
    if "__device__" in obj:
        return torch.device(obj["__device__"])
    if "__tuple__" in obj:
        return tuple(decode_state(v, tensors, where) for v in obj["__tuple__"])
    if "__dict__" in obj:
        return {decode_state(k, tensors, where): decode_state(v, tensors, where) for k, v in obj["__dict__"]}
    return {k: decode_state(v, tensors, where) for k, v in obj.items()}


def _tensor(tensors: Mapping[str, np.ndarray], key: str, where: str) -> np.ndarray:
    if key not in tensors:
        raise TraceError(f"{where}: tensor '{key}' is missing from its safetensors file; re-capture the state")
    return tensors[key]


def _join(path: str, key: str) -> str:
    return f"{path}/{key}" if path else key


def _unique(key: str, taken: Mapping[str, Any]) -> str:
    if key not in taken:
        return key
    i = 1
    while f"{key}#{i}" in taken:
        i += 1
    return f"{key}#{i}"


# -- RNG ----------------------------------------------------------------------------

def _loader_generators(loader: Any) -> dict[str, torch.Generator]:
    found: dict[str, torch.Generator] = {}
    seen: set[int] = set()
    sampler = getattr(loader, "sampler", None)
    batch_sampler = getattr(loader, "batch_sampler", None)
    for name, owner, attr in (
        ("loader.generator", loader, "generator"),
        ("loader.sampler.generator", sampler, "generator"),
        ("loader.batch_sampler.generator", batch_sampler, "generator"),
        ("loader.batch_sampler.sampler.generator", getattr(batch_sampler, "sampler", None), "generator"),
    ):
        g = getattr(owner, attr, None) if owner is not None else None
        if isinstance(g, torch.Generator) and id(g) not in seen:
            seen.add(id(g))
            found[name] = g
    return found


def _rng_now(loader: Any = None, cuda: bool = True) -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if "numpy" in sys.modules:
        state["numpy"] = np.random.get_state(legacy=True)
    if cuda and torch.cuda.is_available() and torch.cuda.is_initialized():
        state["torch.cuda"] = torch.cuda.get_rng_state_all()
    if loader is not None:
        for name, g in _loader_generators(loader).items():
            state[name] = g.get_state()
    return state


def capture_rng(loader: Any = None) -> dict[str, Any]:
    """RNG state keyed by source: ``python``, ``numpy``, ``torch``, ``torch.cuda``, loader generators."""
    return _rng_now(loader)


def restore_rng(state: Mapping[str, Any], loader: Any = None) -> None:
    """Set the RNGs from a ``capture_rng`` dict; sources missing from ``state`` are left alone."""
    if "python" in state:
        s = state["python"]
        random.setstate((s[0], tuple(s[1]), s[2]))
    if "numpy" in state:
        s = state["numpy"]
        np.random.set_state((s[0], np.asarray(s[1], dtype=np.uint32), int(s[2]), int(s[3]), float(s[4])))
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "torch.cuda" in state and torch.cuda.is_available():
        states = list(state["torch.cuda"])[: torch.cuda.device_count()]
        torch.cuda.set_rng_state_all(states)
    if loader is not None:
        gens = _loader_generators(loader)
        for name, s in state.items():
            if name.startswith("loader.") and name in gens:
                gens[name].set_state(s)


# -- data order -----------------------------------------------------------------------

_ORIGINAL_ITER = None


class _SkipSampler:
    """Stands in for a loader's (batch) sampler while a resumed iterator is created.

    Its first iteration advances the real sampler past the batches already consumed —
    indices only, nothing is loaded — and then calls ``on_done`` (which puts the RNGs
    back to their captured values, after the sampler made its epoch-start draws).
    Lazy like a generator, so it draws exactly when the real sampler would.
    """

    def __init__(self, inner: Any, skip: int, on_done: Any) -> None:
        self.inner, self.skip, self.on_done, self.pending = inner, skip, on_done, True

    def __len__(self) -> int:
        return len(self.inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __iter__(self):
        it = iter(self.inner)
        if self.pending:
            self.pending = False
            buf = []
            try:
                for _ in range(self.skip):
                    next(it)
                if self.skip == 0:
                    buf.append(next(it))  # make the epoch-start draws happen now
            except StopIteration:
                pass
            finally:
                self.on_done()
            yield from buf
        yield from it


def track_data_order() -> None:
    """Make every ``DataLoader`` remember where its epoch started (idempotent).

    Wraps ``DataLoader.__iter__`` so that each new iterator notes the epoch number and
    the RNG states it started from; ``capture_state`` reads them, ``restore_state`` arms
    the loader so that its next iterator replays the epoch's start and skips the batches
    already consumed (by advancing the sampler's indices: skipped batches are not
    loaded, and observers of the loader see only the batches training gets).
    It only reads RNG states: it never changes what the loader yields.
    """
    global _ORIGINAL_ITER
    from torch.utils.data import DataLoader, IterableDataset

    if _ORIGINAL_ITER is not None:
        return
    original = DataLoader.__iter__
    _ORIGINAL_ITER = original

    def __iter__(self):  # noqa: N807 - replaces DataLoader.__iter__
        d = self.__dict__
        resume = d.pop("_reprobisect_resume", None)
        offset = 0
        if resume is not None and not isinstance(getattr(self, "dataset", None), IterableDataset):
            # The loader's own generators replay the epoch from its start (their later
            # draws, e.g. a sampler's at the end of the epoch, then happen again as they
            # did); shared sources (torch, python, numpy) go back to their captured values
            # once the sampler has made its epoch-start draws.
            now = {k: v for k, v in _rng_now(self, cuda=False).items() if not k.startswith("loader.")}
            restore_rng(resume["start"], self)
            start, epoch, offset = resume["start"], resume["epoch"], int(resume["skip"])
            key = "batch_sampler" if getattr(self, "_auto_collation", True) else "sampler"
            real = d[key]
            d[key] = _SkipSampler(real, offset, lambda: restore_rng(now, self))
            try:
                it = original(self)
            finally:
                d[key] = real
        else:
            start = _rng_now(self, cuda=False)
            epoch = d.get("_reprobisect_epoch", -1) + 1
            it = original(self)
        d["_reprobisect_epoch"] = epoch
        d["_reprobisect_start"] = start
        d["_reprobisect_offset"] = offset
        try:
            d["_reprobisect_iter"] = weakref.ref(it)
        except TypeError:
            d["_reprobisect_iter"] = lambda it=it: it
        return it

    __iter__.__wrapped__ = original  # type: ignore[attr-defined]
    DataLoader.__iter__ = __iter__

    from torch.utils.data.dataloader import _BaseDataLoaderIter

    original_next = _BaseDataLoaderIter.__next__

    def __next__(self):  # noqa: N807 - runs deferred state captures before the fetch
        if _NEXT_BATCH:
            for fn in list(_NEXT_BATCH):
                fn()
        return original_next(self)

    __next__.__wrapped__ = original_next  # type: ignore[attr-defined]
    _BaseDataLoaderIter.__next__ = __next__


def _data_position(loader: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(meta, epoch-start RNG states or None) of ``loader`` now."""
    d = getattr(loader, "__dict__", {})
    meta: dict[str, Any] = {
        "num_workers": getattr(loader, "num_workers", None),
        "batch_size": getattr(loader, "batch_size", None),
        "drop_last": getattr(loader, "drop_last", None),
        "sampler": type(getattr(loader, "sampler", None)).__name__,
        "initial_seed": torch.initial_seed(),
    }
    try:
        meta["epoch_length"] = len(loader)
    except TypeError:
        meta["epoch_length"] = None
    ref = d.get("_reprobisect_iter")
    it = ref() if ref is not None else None
    if it is None or "_reprobisect_start" not in d:
        meta.update(epoch=None, batches=None, exact=False,
                    note="the loader was not iterated under track_data_order(); data position unknown")
        return meta, None
    meta.update(
        epoch=d["_reprobisect_epoch"],
        batches=int(getattr(it, "_num_yielded", 0)) + int(d.get("_reprobisect_offset", 0)),
        base_seed=getattr(it, "_base_seed", None),
        exact=True,
    )
    return meta, d["_reprobisect_start"]


def _arm_loader(loader: Any, meta: Mapping[str, Any], start: Mapping[str, Any] | None) -> None:
    track_data_order()
    if meta.get("epoch") is None:
        return  # position unknown: the RNGs as restored are all there is
    batches, length = int(meta.get("batches") or 0), meta.get("epoch_length")
    if start is None or (length is not None and batches >= length):
        # the epoch was finished: the next iteration starts the next epoch from the RNGs as set
        loader.__dict__["_reprobisect_epoch"] = meta["epoch"]
        return
    loader.__dict__["_reprobisect_resume"] = {"start": dict(start), "skip": batches, "epoch": meta["epoch"]}


# -- capture / load / restore -----------------------------------------------------------

def capture_state(writer: Any, step: int, objects: Mapping[str, Any], loader: Any = None, *, when: str = "auto") -> None:
    """Write the state of every Stateful object, the RNGs and the data position at ``step``.

    ``writer`` is a ``TraceWriter``; the state is the one after step ``step``'s update,
    at the iteration boundary (what step ``step + 1`` starts from). Names must be
    file-safe and not ``rng``/``data``; non-Stateful objects are skipped.

    ``when``: ``"now"`` captures immediately. ``"auto"`` (default) does too, except when
    called from inside ``optimizer.step()`` (a step hook, as the per-step recorder does):
    there the rest of the iteration (``scheduler.step()``, ``scaler.update()``) has not
    run yet, so the capture waits for the start of the next iteration — the next batch
    any DataLoader hands out (before it is fetched), or else the next module forward —
    and at the latest happens when the writer is closed (a run stopped right after the
    step: then the state is the one inside the step). Without a DataLoader, data drawn
    from an RNG before the first forward is already consumed in the captured RNG state.
    """
    for name, obj in objects.items():
        if name in _RESERVED or not _NAME.match(name):
            raise UsageError(
                f"state object name '{name}' is not usable; use letters, digits, '_', '-', '.' and not {', '.join(_RESERVED)}"
            )
    if when not in ("auto", "now"):
        raise UsageError(f"capture_state(when={when!r}): use 'auto' or 'now'")
    if when == "auto" and _inside_optimizer_step():
        # the RNG as the step ends (before anything of the next iteration draws): a replay
        # that cannot restore at the boundary restores this at its own step's end instead
        at_step_end = capture_rng(loader)
        _defer(lambda: _capture_now(writer, step, objects, loader, at_step_end), writer)
        return
    _capture_now(writer, step, objects, loader)


def _capture_now(writer: Any, step: int, objects: Mapping[str, Any], loader: Any,
                 at_step_end: Mapping[str, Any] | None = None) -> None:
    captured = []
    for name, obj in objects.items():
        if not isinstance(obj, Stateful):
            continue
        tensors: dict[str, np.ndarray] = {}
        skeleton = encode_state(obj.state_dict(), tensors, name)
        writer.write_state(step, name, tensors, {"class": type(obj).__qualname__, "state": skeleton})
        captured.append(name)
    tensors = {}
    rng = encode_state(capture_rng(loader), tensors, "rng")
    meta: dict[str, Any] = {"state": rng, "objects": captured,
                            "classes": {n: type(objects[n]).__qualname__ for n in captured}}
    if at_step_end is not None:
        meta["at_step_end"] = encode_state(dict(at_step_end), tensors, "at_step_end")
    writer.write_state(step, "rng", tensors, meta)
    if loader is not None:
        meta, start = _data_position(loader)
        tensors = {}
        start_json = encode_state(start, tensors, "start") if start is not None else None
        extra = {name: encode_state(obj.state_dict(), tensors, f"stateful.{name}")
                 for name, obj in _stateful_data(loader).items()}
        writer.write_state(step, "data", tensors, {"position": meta, "start": start_json,
                                                   **({"stateful": extra} if extra else {})})


def _stateful_data(loader: Any) -> dict[str, Any]:
    """The data order's own ``Stateful`` holders: the loader itself (torchdata's
    ``StatefulDataLoader``), else its sampler or batch sampler when they have
    ``state_dict``/``load_state_dict`` (checked through the ``Stateful`` protocol)."""
    if isinstance(loader, Stateful):
        return {"loader": loader}
    out = {}
    for name in ("sampler", "batch_sampler"):
        obj = getattr(loader, name, None)
        if obj is not None and isinstance(obj, Stateful):
            out[name] = obj
    return out


_NEXT_BATCH: list[Any] = []  # one-shot callbacks run before a DataLoader iterator fetches a batch


def _inside_optimizer_step() -> bool:
    f = sys._getframe(2)
    while f is not None:
        if f.f_code.co_filename.replace("\\", "/").endswith("torch/optim/optimizer.py"):
            return True
        f = f.f_back
    return False


def _defer(fn: Any, writer: Any) -> None:
    """Run ``fn`` once, at the next iteration's start (batch fetch or forward) or on close."""
    from torch.nn.modules import module as nn_module

    track_data_order()
    fired = [False]
    handle: list[Any] = []
    close = writer.close

    def fire(*_: Any, **__: Any) -> None:
        if fired[0]:
            return
        fired[0] = True
        for h in handle:
            h.remove()
        if fire in _NEXT_BATCH:
            _NEXT_BATCH.remove(fire)
        if writer.__dict__.get("close") is closing:
            del writer.__dict__["close"]
        fn()

    def closing(*args: Any, **kwargs: Any) -> Any:
        try:
            fire()
        except BaseException:
            close(*args, **kwargs)  # the trace is sealed all the same
            raise
        return close(*args, **kwargs)

    handle.append(nn_module.register_module_forward_pre_hook(fire))
    _NEXT_BATCH.append(fire)
    writer.close = closing


def _state_folder(trace_or_path: Any, step: int) -> tuple[Path, dict[str, Any]]:
    from reprobisect.trace.reader import Trace, read_trace

    trace = trace_or_path if isinstance(trace_or_path, Trace) else read_trace(trace_or_path, allow_incomplete=True)
    folder = trace.path / "state" / f"step-{step}"
    if not (folder / "rng.json").is_file():
        have = sorted(p.name for p in (trace.path / "state").glob("step-*")) if (trace.path / "state").is_dir() else []
        raise TraceError(
            f"trace '{trace.path}' holds no state at step {step} "
            f"({'states at: ' + ', '.join(have) if have else 'no state was captured'}); capture with --state-steps {step}"
        )
    return folder, trace.manifest.files


def _read_one(folder: Path, name: str, files: Mapping[str, Any]) -> Any:
    from reprobisect.trace import shards
    from reprobisect.trace.reader import _check_digest

    root = folder.parent.parent
    for ext in (".json", ".safetensors"):
        rel = f"state/{folder.name}/{name}{ext}"
        if rel in files:
            _check_digest(root, rel, files[rel])
    try:
        meta = json.loads((folder / f"{name}.json").read_text())
    except (OSError, ValueError) as e:
        raise TraceError(f"state '{name}' in '{folder}' cannot be read ({e}); re-capture it") from None
    st = folder / f"{name}.safetensors"
    tensors = shards.load(st) if st.is_file() else {}
    return meta, tensors


def load_state(trace_or_path: Any, step: int) -> dict[str, Any]:
    """Read the state captured at ``step`` back into nested dicts (tensors as CPU torch tensors).

    Keys: each captured object's name, ``rng`` (``capture_rng``'s dict) and ``data``
    (``{"position": {...}, "start": {...} | None}``) when a loader was given.
    Uses JSON and the safetensors layout only: nothing is unpickled.
    """
    folder, files = _state_folder(trace_or_path, step)
    out: dict[str, Any] = {}
    for p in sorted(folder.glob("*.json")):
        name = p.name[: -len(".json")]
        meta, tensors = _read_one(folder, name, files)
        where = f"state '{name}' at step {step}"
        if name == "data":
            out["data"] = {
                "position": meta.get("position", {}),
                "start": decode_state(meta["start"], tensors, where) if meta.get("start") is not None else None,
                **({"stateful": decode_state(meta["stateful"], tensors, where)} if meta.get("stateful") else {}),
            }
        else:
            out[name] = decode_state(meta.get("state"), tensors, where)
    return out


def load_rng_at_step_end(trace_or_path: Any, step: int) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """(the RNG as step ``step`` ended, before the deferred capture; None when the state was
    captured outside a step) and the captured objects' class names, by name."""
    folder, files = _state_folder(trace_or_path, step)
    meta, tensors = _read_one(folder, "rng", files)
    classes = dict(meta.get("classes") or {})
    for name in meta.get("objects") or ():
        if name not in classes:
            try:
                classes[name] = json.loads((folder / f"{name}.json").read_text()).get("class", "")
            except (OSError, ValueError):
                classes[name] = ""
    early = meta.get("at_step_end")
    return (decode_state(early, tensors, f"rng at step {step}") if early is not None else None), classes


def restore_state(trace_or_path: Any, step: int, objects: Mapping[str, Any], loader: Any = None) -> dict[str, Any]:
    """Load the state captured at ``step`` into freshly built objects and set every RNG.

    Call it after building the objects and before training resumes; with ``loader``, the
    loader's next iteration continues the captured epoch where it stopped. Returns what
    ``load_state`` returned (``["data"]["position"]`` holds epoch and batches consumed).
    """
    state = load_state(trace_or_path, step)
    missing = [n for n, o in objects.items() if isinstance(o, Stateful) and n not in state]
    if missing:
        have = [n for n in state if n not in _RESERVED]
        raise TraceError(
            f"no captured state for {', '.join(repr(n) for n in missing)} at step {step} "
            f"(captured: {', '.join(have) or 'none'}); pass the names used at capture"
        )
    for name, obj in objects.items():
        if not isinstance(obj, Stateful):
            continue
        sd = state[name]
        if isinstance(sd, dict) and not sd and not obj.state_dict():
            continue  # e.g. a disabled GradScaler: nothing to load, and it refuses an empty dict
        obj.load_state_dict(sd)
    restore_rng(state.get("rng", {}), loader)
    if loader is not None and "data" in state:
        own = _stateful_data(loader)
        saved = state["data"].get("stateful") or {}
        if own and set(own) <= set(saved):  # the data order's own state: it resumes itself
            for name, obj in own.items():
                obj.load_state_dict(saved[name])
        else:
            _arm_loader(loader, state["data"]["position"], state["data"]["start"])
    return state
