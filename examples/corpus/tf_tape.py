"""A custom ``tf.GradientTape`` training loop on ``tf.data``, in the style of the TensorFlow guides.

``tf.data.Dataset.from_tensor_slices`` -> ``shuffle(seed=...)`` -> ``batch``; a small Keras
model called inside the tape; ``optimizer.apply_gradients(zip(grads, variables))``.
Flags: ``--function 1`` (the step under ``tf.function``), ``--sever 1`` (an extra
``tf.Variable`` scale whose value takes a NumPy round trip before it reaches the loss: its
gradient is ``None``, which TensorFlow does not report as an error), ``--deterministic 1``
(``tf.config.experimental.enable_op_determinism``), ``--seed``, ``--steps``.
"""

import argparse
import sys

import numpy as np
import tensorflow as tf


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--function", type=int, default=0)
    p.add_argument("--sever", type=int, default=0)
    p.add_argument("--deterministic", type=int, default=0)
    p.add_argument("--lr", type=float, default=0.05)
    args = p.parse_args()
    tf.keras.utils.set_random_seed(args.seed)
    if args.deterministic:
        tf.config.experimental.enable_op_determinism()
    rng = np.random.default_rng(7)
    x = rng.normal(size=(64, 5)).astype("float32")
    y = (x.sum(axis=1, keepdims=True) > 0).astype("float32")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(64, seed=args.seed).batch(16)
    model = tf.keras.Sequential([tf.keras.Input((5,)), tf.keras.layers.Dense(8, activation="tanh", name="dense_in"),
                                 tf.keras.layers.Dense(1, name="logit")], name="tape_mlp")
    scale = tf.Variable(1.0, name="severed_scale")
    variables = model.trainable_variables + ([scale] if args.sever else [])
    opt = tf.keras.optimizers.SGD(args.lr, momentum=0.9)
    loss_fn = tf.keras.losses.BinaryCrossentropy(from_logits=True)

    def step(xb, yb):
        with tf.GradientTape() as tape:
            logits = model(xb, training=True)
            if args.sever:  # the scale leaves the tape through NumPy: no gradient reaches it
                logits = logits * tf.constant(scale.numpy() if tf.executing_eagerly() else 1.0)
            loss = loss_fn(yb, logits)
        grads = tape.gradient(loss, variables)
        opt.apply_gradients(zip(grads, variables))
        return loss

    if args.function:
        step = tf.function(step)
    done = 0
    while done < args.steps:
        for xb, yb in ds:
            loss = step(xb, yb)
            done += 1
            if done >= args.steps:
                break
    print("loss", float(loss))
    print("frameworks loaded:", ",".join(m for m in ("tensorflow", "keras", "torch") if m in sys.modules))


if __name__ == "__main__":
    main()
