"""Tensor helpers the TensorFlow recorder and its observers share.

Variables' names, the tensors of a nested structure, reading a variable's value, whether
the graph being built is compiled by XLA, and what an optimizer's ``apply`` was given.
Never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import ops as tf_ops
from tensorflow.python.ops import control_flow_util

from reprobisect.trace.format import Record

__all__: list[str] = []

_XLA_LAYERS = "not recorded: XLA (jit_compile=True)"
_GRAPH_LAYERS = "not recorded: graph mode (run_eagerly=False); the model's input and output are"


@dataclass
class _Item:
    rec: Record
    seq: int
    array: np.ndarray | None = None


@dataclass
class _Apply:
    """What the optimizer's ``apply`` was given (before the update)."""

    opt: Any
    variables: list[Any]
    names: list[str]
    none_names: list[str]
    lr: Any
    graph: bool
    gnorm: Any = None  # sentinel detail: the gradients' total norm (no per-gradient records)


def _var_name(v: Any) -> str:
    path = getattr(v, "path", None)
    if isinstance(path, str) and path:
        return path
    name = str(getattr(v, "name", "variable"))
    return name[:-2] if name.endswith(":0") else name


def _is_tensor(x: Any) -> bool:
    return isinstance(x, (tf.Tensor, tf.Variable)) and x.dtype != tf.string and x.dtype != tf.resource \
        and x.dtype != tf.variant


def _tensors(obj: Any) -> list[Any]:
    try:
        flat = tf.nest.flatten(obj)
    except Exception:
        return []
    return [t for t in flat if _is_tensor(t)]


def _in_xla() -> bool:
    try:
        return bool(control_flow_util.GraphOrParentsInXlaContext(tf_ops.get_default_graph()))
    except Exception:
        return False


def _fit_position(x: Any, args: tuple, kwargs: dict) -> dict[str, Any] | None:
    """What only ``fit``'s arguments tell of the data position (steps per epoch, shuffle) for
    ``tf_state.capture_state``; None when ``x`` has no length (a dataset, a generator)."""
    n = kwargs.get("steps_per_epoch")
    if n is None:
        try:
            rows = len(x)
        except TypeError:
            return None
        rows = int(int(rows) * (1.0 - float(kwargs.get("validation_split") or 0.0)))  # Keras' split point
        batch = kwargs.get("batch_size", args[2] if len(args) > 2 else None) or 32  # Keras' default batch size
        n = -(-int(rows) // int(batch))
    return {"steps_per_epoch": int(n), "shuffle": bool(kwargs.get("shuffle", True))}


def _read(v: Any) -> Any:
    value = getattr(v, "value", None)
    if value is not None and not callable(value) and hasattr(value, "read_value"):
        return value.read_value()
    if hasattr(v, "read_value"):
        return v.read_value()
    return tf.convert_to_tensor(v)


def _total_norm(grads: list[Any]) -> Any:
    """The gradients' total 2-norm, accumulated in float64."""
    return tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(tf.cast(g, tf.float64))) for g in grads]))


def _dense(g: Any) -> Any:
    if isinstance(g, tf.IndexedSlices):
        return tf.convert_to_tensor(g)
    return g
