"""GradientTape loop that applies gradients only to the variables whose name says "kernel".

Adapted from tensorflow/tensorflow#26404: gradients were taken for a variable list that did not
match the trainable variables (model.variables vs model.trainable_variables), and part of the
model was never trained. Here the loop filters the list before apply_gradients, so every bias
keeps its initial value.
"""

import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(0)
xs = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
ys = (xs @ np.array([[1.0], [0.5], [-1.0], [2.0]], dtype="float32") + 3.0).astype("float32")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
opt = keras.optimizers.SGD(0.01)
data = tf.data.Dataset.from_tensor_slices((xs, ys)).batch(8).repeat()
for step, (x, y) in enumerate(data.take(60)):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
    variables = model.trainable_variables
    grads = tape.gradient(loss, variables)
    pairs = [(g, v) for g, v in zip(grads, variables) if "kernel" in v.path]  # biases dropped
    opt.apply_gradients(pairs)
