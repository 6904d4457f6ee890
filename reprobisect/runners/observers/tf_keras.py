"""The TensorFlow recorder's Keras wraps: layers, optimizers, ``fit``, ``evaluate``, ``predict``.

``install_keras`` wraps ``Layer.__call__`` (``tf_layers``), the optimizers' ``apply``
(``tf_optimizer``), and the ``Trainer``'s ``fit`` / ``evaluate`` / ``predict``
(``tf_evaluation``); once Keras is imported, on the TensorFlow backend only. ``fit`` notes
its mode (eager, graph, XLA; ``REPROBISECT_TF_EAGER=1`` forces eager), indexes ``x`` by row
for sample IDs, and wraps the model's ``train_step`` for the batches (``tf_batches``);
under XLA a callback records each step's variables instead (no tap runs in the compiled step).
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Callable

import tensorflow as tf

from reprobisect.runners.chain import Observer, register_observer, unique
from reprobisect.runners.observers.tf_batches import _RowIndex
from reprobisect.runners.observers.tf_common import (_GRAPH_LAYERS, _XLA_LAYERS, _Apply, _fit_position, _read,
                                                     _var_name)

__all__ = ["KerasObserver", "install_keras"]

_XLA_CALLBACK: Any = None  # the Keras callback class of an XLA fit (made when Keras is wrapped)


class KerasObserver(Observer):
    """Keras ``fit``: its mode, its batches' row index, its XLA steps."""

    def __init__(self, rec: Any) -> None:
        super().__init__(rec)
        self.fit_position: dict[str, Any] | None = None  # for tf_state.capture_state

    def before_fit(self, model: Any, args: tuple, kwargs: dict) -> None:
        """Note the mode, wrap ``train_step`` on the instance, index a NumPy ``x`` by row."""
        rec = self.rec
        rec.model_ref = weakref.ref(model)
        if os.environ.get("REPROBISECT_TF_EAGER") == "1" and not model.run_eagerly:
            model.run_eagerly = True
            rec.info["forced_eager"] = "REPROBISECT_TF_EAGER=1: fit ran eagerly (run_eagerly=True) for full detail"
        rec.info["run_eagerly"] = bool(model.run_eagerly)
        jit = bool(getattr(model, "jit_compile", False)) and not model.run_eagerly
        rec.info["jit_compile"] = jit
        if not model.run_eagerly:
            rec.info["layer_outputs"] = _GRAPH_LAYERS + " recorded"
        x = args[0] if args else kwargs.get("x")
        batches = rec.observers["batches"]
        batches.ids = _RowIndex.of(x)
        self.fit_position = _fit_position(x, args, kwargs)
        prev, why = rec.info.get("batch_ids"), batches.ids.why
        rec.info["batch_ids"] = why if prev is None or why in prev else f"{prev}; a later fit: {why}"
        if jit:
            self._xla_fit(model, args, kwargs)
        ts = model.__dict__.get("train_step")
        if ts is None or not getattr(ts, "_reprobisect", False):
            inner = model.train_step

            def train_step(data: Any) -> Any:
                if rec.active:
                    rec.guarded("batch", batches.fit_batch, data)
                return inner(data)

            train_step._reprobisect = True  # type: ignore[attr-defined]
            object.__setattr__(model, "train_step", train_step)

    def _xla_fit(self, model: Any, args: tuple, kwargs: dict) -> None:
        """``fit`` under XLA: no tap can run inside the compiled step; a callback records the
        variables after each step, the optimizer variables and the learning rate instead."""
        info = self.rec.info
        info["layer_outputs"] = _XLA_LAYERS
        info["batch_ids"] = "not recorded: XLA (jit_compile=True)"
        info["xla"] = ("jit_compile=True: batch, input, output, loss and gradients are not recorded (no tap runs "
                       "inside an XLA-compiled step); the variables before the first step and after each step, "
                       "optimizer variables and the learning rate (as after the step) are, from a callback")
        if len(args) > 5:  # callbacks given by position: leave the call alone
            info["xla"] = "jit_compile=True and callbacks given by position: steps are not recorded"
            return
        callbacks = list(kwargs.get("callbacks") or [])
        callbacks.append(_XLA_CALLBACK(self.rec, model))
        kwargs["callbacks"] = callbacks

    def xla_batch_end(self, model: Any) -> None:
        """A training batch of an XLA ``fit`` ended (``_XLA_CALLBACK``): record it as a step."""
        rec = self.rec
        if not rec.active:
            return
        opt = model.optimizer
        variables = list(model.trainable_variables)
        occ: dict[tuple[str, str], int] = {}
        names = [unique(occ, "param", _var_name(v)) for v in variables]
        opt_vars = list(getattr(opt, "variables", []))
        occ = {}
        opt_names = [unique(occ, "optim_state", _var_name(v)) for v in opt_vars]
        rec._modes.add("xla")
        rec.info["mode"] = "+".join(sorted(rec._modes))
        pre = _Apply(opt, variables, names, [], tf.convert_to_tensor(opt.learning_rate), False)
        rec._end_step(pre, [_read(v) for v in variables], opt_names, [_read(v) for v in opt_vars], pre.lr)


register_observer("tensorflow", "keras", KerasObserver, rank=50)


def _xla_callback(rec: Any) -> type:
    """The Keras callback class of an XLA ``fit`` (made once Keras is imported)."""
    from keras.src.callbacks.callback import Callback

    class _XlaSteps(Callback):
        def __init__(self, recorder: Any, model: Any) -> None:
            super().__init__()
            self.recorder, self.fit_model = recorder, model

        def on_train_begin(self, logs: Any = None) -> None:
            rec, model = self.recorder, self.fit_model
            if rec.active and rec.step == 0:
                vs = list(model.trainable_variables)
                rec.guarded("xla init", rec._tap, "init", [_var_name(v) for v in vs], [_read(v) for v in vs],
                            named=True)

        def on_train_batch_begin(self, batch: Any, logs: Any = None) -> None:
            self.recorder.raise_if_stopped(begin=True)  # a deferred stop (bisect resume): the next step begins

        def on_train_batch_end(self, batch: Any, logs: Any = None) -> None:
            keras_obs = self.recorder.observers["keras"]
            self.recorder.guarded("xla step", keras_obs.xla_batch_end, self.fit_model)
            self.recorder.raise_if_stopped()

    return _XlaSteps


def install_keras(rec: Any) -> None:
    """Wrap Keras (``Layer.__call__``, the optimizers' ``apply``, ``fit``) for ``rec``; once."""
    if rec._keras:
        return
    from keras.src import backend as kbackend

    if kbackend.backend() != "tensorflow":
        rec.info["keras"] = (f"Keras backend '{kbackend.backend()}': Keras layers and optimizers are not recorded "
                             "(only the TensorFlow backend is)")
        rec._keras = True
        return
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer
    from keras.src.layers.layer import Layer
    from keras.src.optimizers.base_optimizer import BaseOptimizer
    from keras.src.optimizers.loss_scale_optimizer import LossScaleOptimizer

    rec._keras = True
    global _XLA_CALLBACK
    _XLA_CALLBACK = _xla_callback(rec)
    layers, optimizer, keras_obs = rec.observers["layers"], rec.observers["optimizer"], rec.observers["keras"]

    def layer_call(orig: Callable) -> Callable:
        def __call__(layer: Any, *args: Any, **kwargs: Any) -> Any:
            return layers.call(orig, layer, args, kwargs)
        return __call__

    def apply(orig: Callable) -> Callable:
        def wrapped(opt: Any, grads: Any, trainable_variables: Any = None) -> Any:
            return optimizer.apply(orig, opt, grads, trainable_variables)
        return wrapped

    def fit(orig: Callable) -> Callable:
        def wrapped(model: Any, *args: Any, **kwargs: Any) -> Any:
            if rec.active:
                rec.guarded("fit", keras_obs.before_fit, model, args, kwargs)
            rec._in_fit += 1
            try:
                return orig(model, *args, **kwargs)
            finally:
                rec._in_fit -= 1
        return wrapped

    rec._patch(Layer, "__call__", layer_call)
    rec._patch(BaseOptimizer, "apply", apply)
    rec._patch(LossScaleOptimizer, "apply", apply)
    rec._patch(TensorFlowTrainer, "fit", fit)
    rec._patch(TensorFlowTrainer, "evaluate", _evaluation(rec, "evaluate"))
    rec._patch(TensorFlowTrainer, "predict", _evaluation(rec, "predict"))


def _evaluation(rec: Any, phase: str) -> Callable[[Callable], Callable]:
    """The wrap of Keras ``evaluate`` (``validation`` when ``fit`` calls it) or ``predict``."""
    evaluation = rec.observers["evaluation"]

    def make(orig: Callable) -> Callable:
        def wrapped(model: Any, *args: Any, **kwargs: Any) -> Any:
            prev = rec._phase
            now = "validation" if phase == "evaluate" and rec._in_fit else phase
            if rec.active:
                rec.guarded("eval", evaluation.before_eval, model, now, args[0] if args else kwargs.get("x"))
            rec._phase = now
            try:
                return orig(model, *args, **kwargs)
            finally:
                rec._phase = prev
        return wrapped
    return make
