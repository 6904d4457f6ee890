"""Planted bug (TensorFlow): a custom ``GradientTape`` loop filters the ``(gradient,
variable)`` pairs before ``apply_gradients`` (``if 'bias' not in v.name``), so the biases are
trainable, get gradients, and never change. Expected: ``bisect capture`` names them in the
manifest (``extra.tensorflow.unapplied_variables``) and ``update`` says "trainable variables
not passed to apply_gradients: ...", not "every parameter has a gradient and changes".

    bisect doctor --check update -- python examples/doctor/tf_filtered_vars.py
"""

import numpy as np
import tensorflow as tf

tf.keras.utils.set_random_seed(0)
rng = np.random.default_rng(7)
x = rng.normal(size=(64, 5)).astype("float32")
y = (x.sum(axis=1, keepdims=True) > 0).astype("float32")
ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
model = tf.keras.Sequential([tf.keras.Input((5,)), tf.keras.layers.Dense(8, activation="tanh", name="hidden"),
                             tf.keras.layers.Dense(1, name="logit")], name="mlp")
opt = tf.keras.optimizers.SGD(0.05)
loss_fn = tf.keras.losses.BinaryCrossentropy(from_logits=True)

for epoch in range(3):
    for xb, yb in ds:
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        pairs = [(g, v) for g, v in zip(grads, model.trainable_variables) if "bias" not in v.name]  # BUG
        opt.apply_gradients(pairs)
