"""The TensorFlow recorder's forward records: ``input``, ``activation``, ``output``.

``keras.layers.Layer.__call__`` is wrapped (``tf_keras``). A layer called with no layer on
the call stack while a ``GradientTape`` is recording is the training root: its tensor
arguments are ``input``, its result ``output``; every layer it calls is an ``activation``
named by its path of layer names (``block.dense_1``), ``#k`` for the k-th repeat call in the
step, ``[i]`` for the i-th tensor of a structured result, ``module`` = the layer's class,
``inputs`` = its inputs' fingerprints (eager only: in graph mode layer outputs are not
tapped). A root call with no tape recording is evaluation (``tf_evaluation``).

At the first training call the model's random layers built without ``seed=`` are listed
(``info["unseeded_random_layers"]``, with ``info["global_seed"]``: TensorFlow's global seed,
None when unset): in graph mode no layer output is tapped, so when two runs first differ at
the model's output this list is what can name a Dropout layer drawing its own mask per run.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import tensorflow as tf
from tensorflow.python.eager import record as tape_record

from reprobisect.runners.chain import Observer, register_observer
from reprobisect.runners.observers.tf_common import _GRAPH_LAYERS, _XLA_LAYERS, _in_xla, _tensors

__all__ = ["TFLayersObserver"]


class TFLayersObserver(Observer):
    """The call stack of Keras layers, and the records of training calls."""

    def __init__(self, rec: Any) -> None:
        super().__init__(rec)
        self.stack: list[tuple[Any, bool]] = []

    def call(self, orig: Callable, layer: Any, args: tuple, kwargs: dict) -> Any:
        """``layer(*args, **kwargs)``, observed."""
        rec = self.rec
        if not rec.active:
            return orig(layer, *args, **kwargs)
        rec.raise_if_stopped()
        batches = rec.observers["batches"]
        top = not self.stack
        training = tape_record.could_possibly_record() if top else self.stack[-1][1]
        if top and tf.executing_eagerly() and batches.pending and not training:
            batches.pending.clear()  # drawn for an evaluation forward
        if not training:
            self.stack.append((layer, False))
            try:
                out = orig(layer, *args, **kwargs)
            finally:
                self.stack.pop()
            if top:  # evaluation (validation, evaluate, predict, a forward with no tape): summarised
                rec.guarded("eval", rec.observers["evaluation"].forward, _tensors(out))
            return out
        name = ".".join([str(lay.name) for lay, _ in self.stack[1:]] + [str(layer.name)])
        eager = tf.executing_eagerly()
        ins: list[Any] = _tensors((args, kwargs)) if (top or eager) else []
        if top:
            self._root(layer, eager)
            if eager and batches.pending:
                rec.guarded("batch", batches.claim)
            rec.guarded("input", rec._tap, "input", "input", ins)
        self.stack.append((layer, True))
        try:
            out = orig(layer, *args, **kwargs)
        finally:
            self.stack.pop()
        outs = _tensors(out)
        if top:
            rec.guarded("output", rec._tap, "output", "output", outs, module=type(layer).__name__)
        elif eager:
            rec.guarded("activation", self._activation, name, layer, ins, outs)
        return out

    def _root(self, layer: Any, eager: bool) -> None:
        rec = self.rec
        if rec.model_ref is None or rec.model_ref() is None:
            rec.model_ref = weakref.ref(layer)
        if "unseeded_random_layers" not in rec.info:
            rec.info["unseeded_random_layers"] = _unseeded_random_layers(layer)
            rec.info["global_seed"] = _global_seed()
        mode = "eager" if eager else ("xla" if _in_xla() else "graph")
        rec._modes.add(mode)
        rec.info["mode"] = "+".join(sorted(rec._modes))
        if mode == "xla":
            rec.info["layer_outputs"] = _XLA_LAYERS
        elif not eager:
            rec.info["layer_outputs"] = _GRAPH_LAYERS + " recorded"
        elif "layer_outputs" not in rec.info:
            rec.info["layer_outputs"] = "recorded (eager)"

    def _activation(self, name: str, layer: Any, ins: list[Any], outs: list[Any]) -> None:
        rec = self.rec
        if rec.policy.sentinel or not outs:
            return
        call = rec._unique(rec._occ, "activation", name)
        inputs = tuple(self._cached_fp(t) for t in ins)
        cls = type(layer).__name__
        for i, t in enumerate(outs):
            rec._add_now("activation", call if len(outs) == 1 else f"{call}[{i}]", t, module=cls, inputs=inputs)

    def _cached_fp(self, t: Any) -> str:
        """``t``'s fingerprint, from this step's cache when it was recorded already."""
        rec = self.rec
        hit = rec._fp_cache.get(id(t))
        if hit is not None and hit[0] is t:
            return hit[1]
        fp, _, _ = rec._fp(t)
        rec._fp_cache[id(t)] = (t, fp)
        return fp


def _unseeded_random_layers(model: Any) -> list[str]:
    """``name (Class)`` of each layer under ``model`` that draws random numbers (a Keras seed
    generator: Dropout, GaussianNoise, the random augmentation layers) and got no ``seed=``."""
    flatten = getattr(model, "_flatten_layers", None)
    layers = list(flatten(include_self=True, recursive=True)) if callable(flatten) else [model]
    return [f"{lay.name} ({type(lay).__name__})" for lay in layers
            if (hasattr(lay, "seed_generator") or hasattr(lay, "_random_generator"))
            and getattr(lay, "seed", 0) is None]


def _global_seed() -> int | None:
    """TensorFlow's global seed (``tf.random.set_seed``), read without drawing an op seed."""
    from tensorflow.python.eager import context

    seed = context.global_seed()
    return None if seed is None else int(seed)


register_observer("tensorflow", "layers", TFLayersObserver, rank=30)
