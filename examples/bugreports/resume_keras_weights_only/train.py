"""Keras loop that checkpoints weights only and compiles a fresh Adam on restart.

Adapted from keras-team/keras#12891: after save/load the first epochs of the resumed training
got worse although the weights were the same: the optimizer (Adam's iteration count and
moments) started over.
"""

import argparse
import json
import os

import keras
import numpy as np

cli = argparse.ArgumentParser()
cli.add_argument("--resume", default=None)
cli.add_argument("--total", type=int, default=10)
opts = cli.parse_args()

keras.utils.set_random_seed(21)
xs = np.random.default_rng(21).normal(size=(40, 4)).astype("float32")
ys = (xs @ np.array([[1.0], [-1.0], [0.5], [0.0]], dtype="float32")).astype("float32")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
step = 0
if opts.resume and os.path.exists(opts.resume):
    model.load_weights(opts.resume)  # the weights only: the new Adam starts at iteration 0
    with open("progress.json") as f:
        step = json.load(f)["step"]

while step < opts.total:
    lo = (step * 5) % 40
    model.train_on_batch(xs[lo:lo + 5], ys[lo:lo + 5])
    step += 1
    model.save_weights("ckpt.weights.h5")
    with open("progress.json", "w") as f:
        json.dump({"step": step}, f)
