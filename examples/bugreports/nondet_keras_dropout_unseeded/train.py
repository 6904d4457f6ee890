"""Keras model whose initializers are seeded but whose Dropout layer is not.

Adapted from keras-team/keras#7937: results changed between runs until the Dropout layer got
a seed too (the thread's suggestion that resolved it on CPU).
"""

import keras
import numpy as np

xs = np.linspace(-1, 1, 64, dtype="float32").reshape(16, 4)
ys = xs.sum(1, keepdims=True)
model = keras.Sequential([
    keras.Input((4,)),
    keras.layers.Dense(16, activation="relu", kernel_initializer=keras.initializers.GlorotUniform(seed=3)),
    keras.layers.Dropout(0.3),  # no seed, and no keras.utils.set_random_seed anywhere
    keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(seed=4)),
])
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
for step in range(6):
    lo = (step * 4) % 16
    model.train_on_batch(xs[lo:lo + 4], ys[lo:lo + 4])
