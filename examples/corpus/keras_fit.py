"""A Keras 3 ``model.fit`` script in the style of the Keras guides (Sequential/functional).

A ``Normalization`` layer adapted to the data, a hidden Dense with ReLU, ``LayerNormalization``, dropout, a Dense
head; Adam; ``fit`` on NumPy arrays with ``shuffle`` and a ``validation_split``, seeded with
``keras.utils.set_random_seed``. Flags let tests change one thing at a time:
``--seed none`` (no global seed: the shuffle order is unseeded; initializers and dropout
keep their own seeds), ``--dropout-seed none`` (dropout draws from the global generator),
``--epsilon`` (the LayerNormalization's), ``--eager 1`` (``run_eagerly=True``),
``--functional 1`` (the same model, functional API), ``--shuffle 0``, ``--jit 1`` (XLA), ``--steps`` (batches per epoch).
"""

import argparse
import sys

import numpy as np

import keras


def build(args: argparse.Namespace, x: np.ndarray) -> keras.Model:
    init = keras.initializers.GlorotUniform(seed=args.init_seed)
    dseed = None if args.dropout_seed == "none" else int(args.dropout_seed)
    norm = keras.layers.Normalization(name="standardize")
    norm.adapt(x)
    layers = [
        norm,
        keras.layers.Dense(16, activation="relu", kernel_initializer=init, name="hidden"),
        keras.layers.LayerNormalization(epsilon=args.epsilon, name="layer_norm"),
        keras.layers.Dropout(0.25, seed=dseed, name="dropout"),
        keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(seed=args.init_seed + 1), name="head"),
    ]
    if not args.functional:
        return keras.Sequential([keras.Input((x.shape[1],)), *layers], name="mlp")
    inp = keras.Input((x.shape[1],), name="features")
    h = inp
    for layer in layers:
        h = layer(h)
    return keras.Model(inp, h, name="mlp")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seed", default="0")
    p.add_argument("--init-seed", type=int, default=0)
    p.add_argument("--dropout-seed", default="0")
    p.add_argument("--epsilon", type=float, default=1e-3)
    p.add_argument("--eager", type=int, default=0)
    p.add_argument("--functional", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--shuffle", type=int, default=1)
    p.add_argument("--jit", type=int, default=0)
    args = p.parse_args()
    if args.seed != "none":
        keras.utils.set_random_seed(int(args.seed))
    data = np.random.default_rng(1234)  # fixed data, whatever the seed
    n = args.steps * args.batch_size * 5 // 4  # 20% held out by validation_split
    x = data.normal(size=(n, 6)).astype("float32") * 3 + 1
    y = (x @ data.normal(size=(6, 1)) + 0.1 * data.normal(size=(n, 1))).astype("float32")
    model = build(args, x)
    model.compile(optimizer=keras.optimizers.Adam(args.lr), loss="mse", run_eagerly=bool(args.eager),
                  jit_compile=bool(args.jit) if args.jit else "auto")
    hist = model.fit(x, y, batch_size=args.batch_size, epochs=2, shuffle=bool(args.shuffle), validation_split=0.2, verbose=0)
    print("loss", hist.history["loss"][-1])
    print("frameworks loaded:", ",".join(m for m in ("tensorflow", "keras", "torch") if m in sys.modules))


if __name__ == "__main__":
    main()
