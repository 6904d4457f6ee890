"""Op-level zoom for PyTorch: every aten op inside one module's forward, at one step.

When compare names a module as the origin of a divergence (its inputs agree, its output
does not), the zoom re-runs the command and records each aten op that module's forward
executes at that step, to name the op. Used by the launcher as
``--zoom-module NAME --zoom-step K``; the recorder (``reprobisect.runners.torch``) calls::

    zoom = install_zoom(NAME, K, current_step=lambda: recorder.step)
    ...                                    # at the end of each step, inside the step:
    for rec in zoom.take() + zoom.take_calls(): writer.record(rec)
    zoom.remove()

What it records. A ``TorchDispatchMode`` is active while module ``NAME`` runs forward at
step ``K`` (every call of it in that step; ``NAME#k`` zooms into its k-th call only).
Each aten op that produces a tensor becomes one ``Record`` of kind ``activation``, named
``NAME::aten.mul.Tensor#i`` (``i``: occurrence of that op in the zoomed calls, from 0),
written after the step's other records so chain order is untouched. Its fingerprint,
stats, dtype and shape are those of the op's first tensor output; ``inputs`` holds the
fingerprints of its tensor arguments taken *before* the op ran (so in-place ops compare
right); ``module`` the innermost module the op ran in; ``meta`` the op, its occurrence,
the call, non-tensor arguments (``args``: ``x * 2`` vs ``x * 2.0000002`` shows there),
input shapes/dtypes and the fingerprints of further outputs. After each zoomed call, a
marker record ``NAME@zoom-call#k`` (empty tensor, ``meta`` ``{"zoom": true, "ran": true,
"ops": n}``) says the module ran, and ``NAME@zoom-not-run`` (``ran`` false) ends a zoom step
in which it never ran, so a module that ran without issuing an op (``Identity``,
``Dropout(p=0)``) is told from one that did not run. Ops are seen below autograd
(what actually runs), backward is not recorded (it runs outside the forward).

Observers stay out of the record: global forward hooks of other observers (the per-step
recorder fingerprinting module outputs) run while the mode is paused — the zoom puts a
pause hook at the front of PyTorch's global hook lists and a resume hook at the end.
Module-specific hooks of the user's own (weight norm, parametrizations) are part of the
computation and are recorded.

Module names follow the recorder's rule unless ``name_of`` is given: the first module
called with no module on the stack and grad enabled is the model, named ``""``
(submodules by their ``named_modules`` path); later roots are prefixed with their class
name. (``reprobisect.torch.record(model)`` names its model first explicitly; pass
``name_of`` there if another module trains before it.)
"""

from __future__ import annotations

import re
import weakref
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from reprobisect.runners import fingerprint_torch as fpt
from reprobisect.trace.format import Record

__all__ = ["ZoomRecorder", "install_zoom", "SEPARATOR", "op_record_name", "call_record_name"]

SEPARATOR = "::"
_CALL = re.compile(r"^(.*)#(\d+)$")


_CALL_MARK = object()


CALL_MARK = "@zoom-call"
"""Marker records are named ``NAME@zoom-call#k`` (and ``NAME@zoom-not-run``): no ``::``, so
they are never taken for an op."""


def call_record_name(module: str, call: int | None) -> str:
    """``NAME@zoom-call#0``: the marker that the zoomed module ran (its call ``call``);
    ``call`` None: ``NAME@zoom-not-run``, it did not run at the zoom step."""
    return f"{module}{CALL_MARK}#{call}" if call is not None else f"{module}@zoom-not-run"


def op_record_name(module: str, op: str, occurrence: int) -> str:
    """``NAME::aten.mul.Tensor#0``: the record name of one op inside a zoomed module."""
    return f"{module}{SEPARATOR}{op}#{occurrence}"


def _arg_repr(x: Any) -> Any:
    if isinstance(x, (bool, int, str)) or x is None:
        return x
    if isinstance(x, float):
        return repr(x)  # exact, and JSON-safe for nan/inf
    if isinstance(x, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return str(x)
    if isinstance(x, (list, tuple)):
        return [_arg_repr(v) for v in x]
    return type(x).__name__


class _Mode(TorchDispatchMode):
    def __init__(self, zoom: "ZoomRecorder") -> None:
        super().__init__()
        self.zoom = zoom

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        z = self.zoom
        if z._paused:
            return func(*args, **kwargs)
        leaves = tree_leaves((args, kwargs))
        ins = [t for t in leaves if isinstance(t, torch.Tensor)]
        pending_in = [fpt.begin(t, with_stats=False) for t in ins if _ok(t)]
        out = func(*args, **kwargs)
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and _ok(t)]
        if outs:
            z._add(func, ins, pending_in, outs, [_arg_repr(a) for a in leaves if not isinstance(a, torch.Tensor)])
        return out


def _ok(t: torch.Tensor) -> bool:
    return t.layout == torch.strided and not t.is_quantized and t.device.type != "meta"


class ZoomRecorder:
    """Records aten ops inside module ``module_name`` during step ``step``.

    ``take()`` returns the ``Record``s collected so far, in execution order, and clears
    them; the caller writes them into the current step.
    """

    def __init__(
        self,
        module_name: str,
        step: int,
        *,
        current_step: Callable[[], int] | None = None,
        name_of: Callable[[torch.nn.Module], str | None] | None = None,
    ) -> None:
        m = _CALL.match(module_name)
        self.module_name = module_name
        self.base_name = m.group(1) if m else module_name
        self.call: int | None = int(m.group(2)) if m else None
        self.step = step
        self._current_step = current_step
        self._name_of = name_of
        self._own_step = 0
        self._handles: list[Any] = []
        self._names: dict[int, str] = {}
        self._roots: list[weakref.ref] = []
        self._stack: list[torch.nn.Module] = []
        self._paused = 0
        self._mode: _Mode | None = None
        self._target: torch.nn.Module | None = None
        self._depth = 0
        self._calls_seen = 0
        self._counted_step: int | None = None
        self._occ: dict[str, int] = {}
        self._pending: list[tuple[Any, ...]] = []
        self.ops_recorded = 0
        self.calls_recorded = 0
        self._told = False  # the "did not run" marker was written
        self._marks: list[Record] = []  # call markers waiting for take_calls()

    # -- step and names -----------------------------------------------------------

    def current_step(self) -> int:
        return self._current_step() if self._current_step is not None else self._own_step

    def _name(self, module: torch.nn.Module) -> str | None:
        if self._name_of is not None:
            return self._name_of(module)
        name = self._names.get(id(module))
        if name is not None:
            return name
        if len(self._stack) == 1 and torch.is_grad_enabled():  # a root: the first training one is the model
            prefix = "" if not self._roots else type(module).__name__
            taken = set(self._names.values())
            base, k = prefix, 1
            while self._roots and prefix in taken:
                prefix = f"{base}@{k}"
                k += 1
            self._roots.append(weakref.ref(module))
            for path, m in module.named_modules():
                full = prefix + ("." if prefix and path else "") + path
                self._names.setdefault(id(m), full)
            return self._names[id(module)]
        return None

    # -- hooks --------------------------------------------------------------------

    def _pause(self, *args: Any) -> None:
        self._paused += 1

    def _pre(self, module: torch.nn.Module, args: tuple) -> None:
        self._stack.append(module)
        self._paused = max(0, self._paused - 1)
        if self._target is not None:
            return
        step = self.current_step()
        if step != self.step:
            return
        if self._counted_step != step:
            self._counted_step, self._calls_seen = step, 0
        if self._name(module) != self.base_name:
            return
        k = self._calls_seen
        self._calls_seen += 1
        if self.call is not None and k != self.call:
            return
        self._target = module
        self._depth = len(self._stack)
        self._call_index = k
        self._ops_at_call = self.ops_recorded
        self.calls_recorded += 1
        self._mode = _Mode(self)
        self._mode.__enter__()

    def _post_first(self, module: torch.nn.Module, *args: Any) -> None:
        if self._target is module and len(self._stack) == self._depth and self._mode is not None:
            mode, self._mode, self._target = self._mode, None, None
            mode.__exit__(None, None, None)
            # the call ran: say so even when it issued no op (Identity, Dropout(p=0), eval-mode dropout)
            self._pending.append((_CALL_MARK, self._call_index, self.ops_recorded - self._ops_at_call))
        self._paused += 1

    def _post_last(self, module: torch.nn.Module, *args: Any) -> None:
        self._paused = max(0, self._paused - 1)
        if self._stack and self._stack[-1] is module:
            self._stack.pop()
        else:
            for k in range(len(self._stack) - 1, -1, -1):
                if self._stack[k] is module:
                    del self._stack[k:]
                    break

    def _opt_post(self, *args: Any) -> None:
        self._own_step += 1

    # -- records --------------------------------------------------------------------

    def _add(self, func: Any, ins: list, pending_in: list, outs: list, scalars: list) -> None:
        op = str(func)
        i = self._occ.get(op, 0)
        self._occ[op] = i + 1
        inner = self._names.get(id(self._stack[-1])) if self._stack else None
        if self._name_of is not None and self._stack:
            inner = self._name_of(self._stack[-1])
        first = outs[0]
        self._pending.append(
            (
                op_record_name(self.module_name, op, i),
                op,
                i,
                self._call_index,
                inner,
                pending_in,
                [(tuple(t.shape), fpt.dtype_name(t.dtype)) for t in ins],
                fpt.begin(first),
                [fpt.begin(t, with_stats=False) for t in outs[1:]],
                scalars,
            )
        )
        self.ops_recorded += 1

    def take(self) -> list[Record]:
        """The op records collected since the last call, in execution order."""
        out = []
        for entry in self._pending:
            if entry[0] is _CALL_MARK:
                self._marks.append(self._call_record(entry[1], entry[2]))
                continue
            name, op, i, call, inner, p_in, in_meta, p_out, p_more, scalars = entry
            fp, st = fpt.finish(p_out)
            meta = {
                "zoom": True,
                "op": op,
                "occurrence": i,
                "call": call,
                "args": scalars,
                "input_shapes": [list(s) for s, _ in in_meta],
                "input_dtypes": [d for _, d in in_meta],
            }
            if p_more:
                meta["more_outputs"] = [fpt.finish(p)[0] for p in p_more]
            out.append(
                Record(
                    name=name,
                    kind="activation",
                    dtype=p_out.dtype,
                    shape=p_out.shape,
                    fingerprint=fp,
                    stats=st,
                    module=inner,
                    inputs=tuple(fpt.finish(p)[0] for p in p_in),
                    meta=meta,
                )
            )
        self._pending = []
        self._occ = {}
        return out

    def take_calls(self) -> list[Record]:
        """The call markers since the last call (after ``take()``): one ``NAME@zoom-call#k`` per
        zoomed call (``meta.ops``: ops it issued, 0 for ``Identity``/``Dropout(p=0)``), or at the
        end of the zoom step ``NAME@zoom-not-run`` when the module never ran in it. The
        recorder writes them after the op records, so "ran without ops" and "did not run"
        can be told apart."""
        for entry in self._pending:  # take() not called since the last ops: keep order anyway
            if entry[0] is _CALL_MARK:
                self._marks.append(self._call_record(entry[1], entry[2]))
        self._pending = [e for e in self._pending if e[0] is not _CALL_MARK]
        out, self._marks = self._marks, []
        if not out and not self._told and self.calls_recorded == 0 and self.current_step() == self.step:
            self._told = True  # the zoom step ends and the module never ran in it
            out.append(self._call_record(None, 0))
        return out

    def _call_record(self, call: int | None, ops: int) -> Record:
        """The marker of one zoomed call (``meta.ran`` with its op count), or with ``call``
        None of a zoom step in which the module did not run (``call_record_name``)."""
        empty = torch.empty(0)
        fp, _ = fpt.finish(fpt.begin(empty, with_stats=False))
        return Record(
            name=call_record_name(self.module_name, call),
            kind="activation",
            dtype="float32",
            shape=(0,),
            fingerprint=fp,
            module=self.base_name,
            meta={"zoom": True, "ran": call is not None, "call": call, "ops": ops},
        )

    # -- install / remove -------------------------------------------------------------

    def install(self) -> "ZoomRecorder":
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim_module

        first_pre = nn_module.register_module_forward_pre_hook(self._pause)
        last_pre = nn_module.register_module_forward_pre_hook(self._pre)
        first_post = nn_module.register_module_forward_hook(self._post_first, always_call=True)
        last_post = nn_module.register_module_forward_hook(self._post_last, always_call=True)
        for table, h in ((getattr(nn_module, "_global_forward_pre_hooks", None), first_pre),
                         (getattr(nn_module, "_global_forward_hooks", None), first_post)):
            if hasattr(table, "move_to_end") and h.id in table:
                table.move_to_end(h.id, last=False)  # run before every other observer's hook
        self._handles = [first_pre, last_pre, first_post, last_post]
        if self._current_step is None:
            self._handles.append(optim_module.register_optimizer_step_post_hook(self._opt_post))
        return self

    def remove(self) -> None:
        if self._mode is not None:
            mode, self._mode, self._target = self._mode, None, None
            try:
                mode.__exit__(None, None, None)
            except Exception:
                pass
        for h in self._handles:
            h.remove()
        self._handles = []


def install_zoom(
    module_name: str,
    step: int,
    *,
    current_step: Callable[[], int] | None = None,
    name_of: Callable[[torch.nn.Module], str | None] | None = None,
) -> ZoomRecorder:
    """Install a ``ZoomRecorder`` (global module hooks) for ``module_name`` at ``step``.

    ``current_step`` tells the step being run (the recorder's counter, from 0); without
    it the zoom counts ``optimizer.step()`` calls itself. ``name_of`` maps a module to
    the name compare uses; without it the recorder's naming rule is applied.
    """
    return ZoomRecorder(module_name, step, current_step=current_step, name_of=name_of).install()
