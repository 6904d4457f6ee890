"""``torch.compile`` and the recorder: hooks that stay out of dynamo's way, user-facing names.

The recorder observes a model through PyTorch's *global* module forward hooks. Dynamo
inlines ``Module._call_impl`` with those hooks when it traces a compiled module, so the
hooks run symbolically inside the compiled region, where the recorder's bookkeeping
(lists, weak references, fingerprints brought to the host) cannot run and would break the
trace (``... is already tracked for mutation``) or force graph breaks. So:

- The forward hooks installed here return at once while ``torch.compiler.is_compiling()``
  (a constant to dynamo: the hook traces to nothing, no graph break, the same graph as
  without the recorder). Module outputs inside a compiled region are therefore not
  recorded; everything outside it is (batches, the compiled module's own inputs and
  outputs, loss, gradients, parameters, optimizer state).
- ``torch.compile(module)`` returns an ``OptimizedModule`` wrapper whose ``_orig_mod`` is
  the user's module. Its own call runs eagerly, so its hooks fire outside the compiled
  region: they are reported as the wrapped module's (``transformer.h.0``, class
  ``Block``), and the wrapped module's own hooks, when it runs eagerly too
  (``TORCH_COMPILE_DISABLE=1``), are not counted twice. ``_orig_mod`` never appears in a
  record name (``user_path``), so an eager and a compiled trace of the same code pair up.
- ``torch.compile`` itself is wrapped, only to note what was compiled, with which backend
  and mode (arguments pass through unchanged).

Whether a region actually ran compiled is observed, not assumed: a wrapper whose module's
own hooks fired eagerly (compile disabled, or dynamo fell back to eager) ran eager.
``execution()`` summarizes it for the environment record (``torch.compile``), with the
module names whose activations were not recorded (``unobserved``), which ``compare`` reads
so that activations missing from a compiled run are not reported as a structural
divergence.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
import weakref
from typing import Any, Callable

import torch

from reprobisect.runners.policy import StopRun

__all__ = ["NOTE", "ForwardHooks", "execution", "first_cause", "install_compile_watch", "unwrap", "user_path"]

NOTE = "activations inside compiled regions are not recorded"


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    first = text.splitlines()[0].strip() if text else ""
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def first_cause(e: BaseException) -> str:
    """``Type: first line`` of the exception that started ``e``'s chain (the one ``e`` was
    raised from or while handling), then ``e`` itself when it differs: a cleanup path's
    secondary error (a hook called with the wrong arguments while the forward was already
    failing) must not hide the original one. The recorder's own ``StopRun`` is no cause."""
    chain: list[BaseException] = []
    cur: BaseException | None = e
    while cur is not None and all(cur is not c for c in chain) and len(chain) < 20:
        if not isinstance(cur, StopRun):
            chain.append(cur)
        cur = cur.__cause__ if cur.__cause__ is not None else (None if cur.__suppress_context__ else cur.__context__)
    if not chain:
        return _one_line(e)
    root = chain[-1]
    if root is e:
        return _one_line(e)
    return f"{_one_line(root)} (then {_one_line(e)})"


_OPT_TYPE: type | None = None


def _optimized_module_type() -> type | None:
    """torch.compile's module wrapper class, once dynamo is imported (never imported here)."""
    global _OPT_TYPE
    if _OPT_TYPE is None:
        mod = sys.modules.get("torch._dynamo.eval_frame")
        _OPT_TYPE = getattr(mod, "OptimizedModule", None) if mod is not None else None
    return _OPT_TYPE


def unwrap(module: Any) -> Any:
    """The user's module inside ``torch.compile(module)``'s wrapper (itself otherwise)."""
    opt = _optimized_module_type()
    while opt is not None and isinstance(module, opt):
        inner = module.__dict__.get("_modules", {}).get("_orig_mod") or getattr(module, "_orig_mod", None)
        if inner is None:
            break
        module = inner
    return module


def user_path(path: str) -> str:
    """A module/parameter path without the ``_orig_mod`` segments compile wrappers add."""
    if "_orig_mod" not in path:
        return path
    return ".".join(p for p in path.split(".") if p != "_orig_mod")


class _Compiles:
    """What ``torch.compile`` was asked to compile in this process (weakly held)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.modules: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()
        self.methods = 0  # module.compile() calls
        self.functions: list[weakref.ref] = []  # torch.compile(function)

    def function_modules(self) -> list[torch.nn.Module]:
        """The modules compiled functions reach by name: the globals their code names and
        their closure cells (``train_step`` using the global ``model``)."""
        out: list[torch.nn.Module] = []
        for ref in self.functions:
            fn = ref()
            fn = getattr(fn, "__wrapped__", fn)
            code = getattr(fn, "__code__", None)
            if code is None:
                continue
            values = [getattr(fn, "__globals__", {}).get(n) for n in code.co_names]
            for cell in getattr(fn, "__closure__", None) or ():
                try:
                    values.append(cell.cell_contents)
                except ValueError:
                    pass
            out += [unwrap(v) for v in values if isinstance(v, torch.nn.Module)]
        return out

    def note(self, target: Any, kwargs: dict[str, Any]) -> None:
        if str(getattr(target, "__module__", "")).startswith("reprobisect."):
            return  # the recorder's own (REPROBISECT_FP_COMPILE's row reduction), not the program's
        backend = kwargs.get("backend", "inductor")
        if not isinstance(backend, str):
            backend = getattr(backend, "__name__", type(backend).__name__)
        info = {"backend": backend}
        for key in ("mode", "fullgraph", "dynamic"):
            if kwargs.get(key) is not None:
                info[key] = kwargs[key]
        module = target if isinstance(target, torch.nn.Module) else getattr(target, "__self__", None)
        if isinstance(module, torch.nn.Module):  # torch.compile(module) or module.compile()
            info["target"] = type(module).__name__
            info["how"] = "torch.compile(module)" if module is target else "module.compile()"
            self.methods += module is not target
            try:
                self.modules[module] = info
            except TypeError:
                pass
        elif target is not None:
            info["target"] = getattr(target, "__qualname__", type(target).__name__)
            info["how"] = "torch.compile(function)"
            try:
                self.functions.append(weakref.ref(target))
            except TypeError:
                pass
        else:
            return  # torch.compile(**options) returning a decorator: noted when it is applied
        if len(self.calls) < 100:
            self.calls.append(info)


COMPILES = _Compiles()

_LAST: "weakref.ref | None" = None  # the ForwardHooks of the last recorder installed (sealing reads it)

_HOOK_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks on modules"


def install_compile_watch(on_compile: Callable[[], None]) -> Callable[[], None]:
    """Wrap ``torch.compile`` to note its calls and call ``on_compile`` (the recorder keeps
    its step hooks out of dynamo from then on); returns the undo."""
    orig = torch.__dict__["compile"]
    if getattr(orig, "_reprobisect_watch", False):
        return lambda: None

    @functools.wraps(orig)
    def compile(model: Any = None, **kwargs: Any) -> Any:
        try:
            COMPILES.note(model, kwargs)
            on_compile()
        except Exception:  # noting must never stand in the way of the user's compile
            pass
        if model is None:
            return orig(**kwargs)
        return orig(model, **kwargs)

    compile._reprobisect_watch = True  # type: ignore[attr-defined]
    torch.compile = compile  # type: ignore[assignment]
    if "torch._dynamo" in sys.modules:  # compiled before the recorder was installed (record() API)
        try:
            on_compile()
        except Exception:
            pass
    # OptimizedModule warns on every call that global hooks (the recorder's) fire for it
    # too: that is what the recorder relies on, and the user's run would not print it
    warnings.filterwarnings("ignore", message=_HOOK_WARNING, category=UserWarning)
    added = warnings.filters[0]

    def undo() -> None:
        if torch.__dict__.get("compile") is compile:
            torch.compile = orig  # type: ignore[assignment]
        try:
            warnings.filters.remove(added)
            warnings._filters_mutated()  # type: ignore[attr-defined]
        except (ValueError, AttributeError):
            pass

    return undo


class ForwardHooks:
    """The global module forward pre-hook and hook the recorder registers.

    ``pre(module, args)`` and ``post(module, args, kwargs, output)`` call the recorder's
    ``_fwd_pre``/``_fwd`` outside compiled regions only, with a compile wrapper replaced
    by the module it wraps. ``post`` also accepts PyTorch's ``(module, args, result)``
    call, which ``always_call`` hooks get when the forward raised: the recorder then only
    unwinds its module stack (nothing of a failed forward is recorded).
    """

    def __init__(self, recorder: Any) -> None:
        self.rec = recorder
        # per OptimizedModule call in flight: [wrapped module, its own hooks fired eagerly]
        self.wrapped: list[list[Any]] = []
        self.regions: dict[int, dict[str, Any]] = {}  # id(user module) -> what was seen
        self._region_refs: dict[int, weakref.ref] = {}
        self.eager_seen: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()  # (only once module.compile() is used)
        self.any_seen = False  # a module forward hook fired eagerly
        self.pre = self._make_pre()
        self.post = self._make_post()
        self.noted: str | None = None
        global _LAST
        _LAST = weakref.ref(self)

    def _make_pre(self) -> Callable:
        is_compiling = torch.compiler.is_compiling
        hooks = self

        def pre(module: torch.nn.Module, args: tuple) -> None:
            if is_compiling():  # traced by dynamo: nothing to trace, no graph break
                return None
            return hooks._pre(module, args)

        return pre

    def _make_post(self) -> Callable:
        is_compiling = torch.compiler.is_compiling
        hooks = self

        def post(module: torch.nn.Module, args: tuple, *rest: Any) -> None:
            if is_compiling():
                return None
            return hooks._post(module, args, *rest)

        return post

    def _pre(self, module: torch.nn.Module, args: tuple) -> None:
        opt = _OPT_TYPE or _optimized_module_type()
        if opt is not None and isinstance(module, opt):
            inner = unwrap(module)
            self.wrapped.append([inner, False])
            self._region(inner, module)
            return self.rec._fwd_pre(inner, args)
        if self.wrapped and self.wrapped[-1][0] is module and not self.wrapped[-1][1]:
            self.wrapped[-1][1] = True  # the wrapped module ran eagerly: already recorded as the wrapper
            return None
        self.any_seen = True
        if COMPILES.methods:  # module.compile() used: note which modules ran eagerly
            if getattr(module, "_compiled_call_impl", None) is not None:
                self._region(module, None)  # its hooks firing means it ran eagerly
            self.eager_seen.add(module)
        return self.rec._fwd_pre(module, args)

    def _post(self, module: torch.nn.Module, args: tuple, *rest: Any) -> None:
        if len(rest) == 2:
            kwargs, output = rest
        else:  # (module, args, result): PyTorch's always_call path after the forward raised
            kwargs, output = {}, None
        opt = _OPT_TYPE or _optimized_module_type()
        if opt is not None and isinstance(module, opt):
            inner = unwrap(module)
            if self.wrapped and self.wrapped[-1][0] is inner:
                _, ran_eager = self.wrapped.pop()
                region = self.regions.get(id(inner))
                if region is not None and output is not None:
                    region["eager" if ran_eager else "compiled"] += 1
                    if not ran_eager:
                        self._note()
            return self.rec._fwd(inner, args, kwargs, output)
        if self.wrapped and self.wrapped[-1][0] is module and self.wrapped[-1][1] is True:
            self.wrapped[-1][1] = "done"  # the wrapped module's own exit: its wrapper records it
            return None
        out = self.rec._fwd(module, args, kwargs, output)
        if not self.noted and not self.rec._stack and COMPILES.methods and compiled_modules_unseen(self.rec):
            self._note()  # a root's forward ended and module.compile() modules in it never ran eagerly
        return out

    def root_from_compiled(self, p: torch.Tensor) -> bool:
        """Register as a root the outermost module holding parameter ``p`` among those
        ``model.compile()`` compiled or a compiled function uses (a model called only
        compiled fires no forward hook eagerly, so it is never seen as a root); True if
        one was added."""
        if not COMPILES.methods and not COMPILES.functions:
            return False
        candidates = [m for m, info in list(COMPILES.modules.items()) if info.get("how") == "module.compile()"]
        candidates += COMPILES.function_modules()
        holders = [m for m in candidates if any(q is p for q in m.parameters())]
        if not holders:
            return False
        inner = {id(sub) for m in holders for sub in m.modules() if sub is not m}
        outer = [m for m in holders if id(m) not in inner]
        self.rec.add_root(outer[0])
        return True

    def _note(self, text: str | None = None) -> None:
        """Say in the trace's notes that activations inside compiled regions are missing
        (once; ``text``, the summary of ``execution()``, replaces the first wording)."""
        text = text or (f"{NOTE} (torch.compile; see environment torch.compile.regions): batches, model inputs "
                        "and outputs, loss, gradients, parameters and optimizer state are recorded")
        notes = self.rec.notes
        if self.noted and self.noted in notes:
            notes[notes.index(self.noted)] = text
        elif not self.noted:
            notes.append(text)
        self.noted = text

    def _region(self, module: torch.nn.Module, wrapper: torch.nn.Module | None) -> None:
        key = id(module)
        ref = self._region_refs.get(key)
        if ref is not None and ref() is module:
            return
        self._region_refs[key] = weakref.ref(module)
        info = COMPILES.modules.get(module, {})
        self.regions[key] = {
            "how": info.get("how", "torch.compile(module)" if wrapper is not None else "module.compile()"),
            "backend": info.get("backend"),
            "mode": info.get("mode"),
            "compiled": 0,
            "eager": 0,
        }

    def region_summary(self) -> list[dict[str, Any]]:
        """Every compiled module met: its name, how it was compiled, how it ran."""
        out = []
        for key, region in self.regions.items():
            ref = self._region_refs.get(key)
            module = ref() if ref is not None else None
            if module is None:
                continue
            name = self.rec._names.get(id(module))
            if name is None:
                name = f"<{type(module).__name__}>"
            if region["how"] == "module.compile()":
                ran = "eager" if module in self.eager_seen else "compiled"
            elif region["compiled"] or region["eager"]:
                ran = "compiled" if region["compiled"] and not region["eager"] else (
                    "eager" if not region["compiled"] else "mixed")
            else:
                ran = "not called"
            entry = {"module": name, "class": type(module).__name__, "how": region["how"], "ran": ran}
            if region.get("backend"):
                entry["backend"] = region["backend"]
            if region.get("mode"):
                entry["mode"] = region["mode"]
            out.append(entry)
        return out


def compiled_modules_unseen(rec: Any) -> list[torch.nn.Module]:
    """Modules of the recorded model set up with ``module.compile()`` whose hooks never fired."""
    hooks = getattr(rec, "_fwd_hooks", None)
    out = []
    for ref, _ in list(getattr(rec, "_roots", {}).values()):
        root = ref()
        if root is None:
            continue
        for m in root.modules():
            if getattr(m, "_compiled_call_impl", None) is not None and (hooks is None or m not in hooks.eager_seen):
                out.append(m)
    return out


def execution(rec: Any = None) -> dict[str, Any]:
    """How the recorded code ran: ``eager`` or ``compiled``, what was compiled and how.

    ``unobserved`` lists the module names inside which module outputs were not recorded
    because they ran compiled (``*``: every module; ``NAME.*``: those below NAME; ``NAME``:
    NAME and those below; ``<input>``/``<output>``: the model's own inputs and outputs,
    when ``model.compile()`` compiled the model as a whole); ``note`` says so in words.
    """
    out: dict[str, Any] = {}
    disabled = _disabled_by()
    if disabled:
        out["disabled_by"] = disabled
    if COMPILES.calls:
        out["compile_calls"] = list(COMPILES.calls)
        backends = sorted({c["backend"] for c in COMPILES.calls if c.get("backend")})
        if backends:
            out["backend"] = backends[0] if len(backends) == 1 else backends
    if rec is None and _LAST is not None:
        last = _LAST()
        rec = last.rec if last is not None else None
    hooks = getattr(rec, "_fwd_hooks", None) if rec is not None else None
    regions = _regions(rec, hooks, disabled)
    if regions:
        out["regions"] = regions
    ran = [r for r in regions if r["ran"] in ("compiled", "mixed")]
    if ran:
        out.update(_compiled_summary(ran))
        if hooks is not None:
            hooks._note(out["note"])  # in the trace's notes too (sealing reads them after the environment)
    elif COMPILES.calls or regions:
        out["mode"] = "eager"
        if disabled:
            out["note"] = f"torch.compile was called but disabled ({', '.join(disabled)}): everything ran eagerly"
        elif regions:
            out["note"] = "torch.compile was called but the compiled modules ran eagerly"
    return out


def _disabled_by() -> list[str]:
    """What turned torch.compile off in this process (environment variables, dynamo's config)."""
    disabled = []
    if os.environ.get("TORCH_COMPILE_DISABLE", "0") == "1":
        disabled.append("TORCH_COMPILE_DISABLE=1")
    if os.environ.get("TORCHDYNAMO_DISABLE", "") == "1":
        disabled.append("TORCHDYNAMO_DISABLE=1")
    cfg = sys.modules.get("torch._dynamo.config")
    if cfg is not None and getattr(cfg, "disable", False) and "TORCH_COMPILE_DISABLE=1" not in disabled:
        disabled.append("torch._dynamo.config.disable")
    return disabled


def _regions(rec: Any, hooks: Any, disabled: list[str]) -> list[dict[str, Any]]:
    """The compiled regions: modules (seen by the hooks, or set up compiled and never seen) and functions."""
    regions: list[dict[str, Any]] = []
    if hooks is not None:
        regions = hooks.region_summary()
        seen = {r["module"] for r in regions}
        for m in compiled_modules_unseen(rec):
            name = rec._names.get(id(m))
            if name is not None and name not in seen:
                info = COMPILES.modules.get(m, {})
                regions.append({"module": name, "class": type(m).__name__, "how": "module.compile()",
                                "ran": "compiled", **({"backend": info["backend"]} if info.get("backend") else {})})
    functions = [c for c in COMPILES.calls if c.get("how") == "torch.compile(function)"]
    dyn = sys.modules.get("torch._dynamo.utils")
    frames_ok = int(dyn.counters.get("frames", {}).get("ok", 0)) if dyn is not None else 0
    if functions and frames_ok and not disabled:
        # the modules a compiled function calls are not known by name: when no module was
        # seen eagerly at all, the model itself was only called inside it
        seen_any = hooks is not None and bool(hooks.any_seen or hooks.regions)
        for c in functions:
            regions.append({"module": None if seen_any else "", "function": c.get("target"),
                            "how": "torch.compile(function)", "ran": "compiled",
                            **({"backend": c["backend"]} if c.get("backend") else {})})
    return regions


def _compiled_summary(ran: list[dict[str, Any]]) -> dict[str, Any]:
    """``mode``, ``unobserved`` and ``note`` for regions that ran compiled."""
    unobserved = []
    for r in ran:
        # a torch.compile(module) wrapper's own output is recorded (outside the region);
        # a module.compile() module (or a compiled function's) is called compiled, its
        # own output included
        name = r["module"]
        if name is not None:
            unobserved.append(name + ".*" if r["how"] == "torch.compile(module)" and name else name or "*")
    whole = [r for r in ran if r["how"] != "torch.compile(module)" and r["module"] == ""]
    if whole:
        unobserved += ["<input>", "<output>"]  # the model itself is only called compiled
    seen = ("batches, loss, gradients, parameters and optimizer state are recorded (the model is only called "
            "compiled: its inputs and outputs are not recorded either)") if whole else (
            "batches, model inputs and outputs, loss, gradients, parameters and optimizer state are recorded")
    what = ", ".join(f"function {r['function']}" if r["how"] == "torch.compile(function)" else repr(r["module"])
                     for r in ran)
    note = f"{NOTE} ({what} ran compiled); {seen}"
    if any(r["how"] == "torch.compile(function)" for r in ran):
        note += "; modules called inside a compiled function are not recorded either"
    return {"mode": "compiled", "unobserved": sorted(set(unobserved)), "note": note}
