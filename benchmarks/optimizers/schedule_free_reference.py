"""Schedule-Free AdamW three ways: kadapt's, Keras' own and the PyTorch reference (schedulefree 1.4.1).

Each trains the same network from the same initial weights for 20 full-batch steps of a
64-row regression (mean squared error): a 5-8-1 MLP (tanh), and the same with a
BatchNormalization after the first layer (Keras momentum 0.9, epsilon 1e-5: PyTorch's
defaults), whose Dense has no bias: a bias before BatchNorm has a zero gradient, which Adam's
g / sqrt(v) turns from float32 rounding into steps of the full rate (4e-3 apart at the
defaults). The reference runs in float64, kadapt and Keras in float32. For each pair it prints
the largest weight difference at y (the point gradients are taken at) and at x (the average,
the point to evaluate), of the BatchNorm moving statistics each evaluates with, and each one's
inference-mode loss on the training rows, as each library leaves the model:

- the reference: `optimizer.eval()` (x), then its README's recompute of the BatchNorm
  statistics at x (one training-mode pass of the full batch with momentum 1, the exact mean
  that its 50 passes approach);
- kadapt: x after `fit`, the statistics recomputed at x (`ScheduleFreeEvaluation(batches=...)`);
- Keras: y after `fit` (it has no evaluation point), the statistics its training passes at y
  gathered. Keras' x is computed here from its `momentum` slot (z): x = (y - (1 - beta_1) z) / beta_1.
  Arm "keras built first" builds the optimizer before `fit`: its z copies the weights at build,
  which on TensorFlow does not happen when `fit` builds it inside the traced train step.

PyTorch's running variance is the unbiased one: it is compared here as the biased one
(times 63/64), which Keras keeps. Not run by the tests. Needs torch and schedulefree 1.4.1
beside kadapt's environment:

    PYTHONPATH=. python benchmarks/optimizers/schedule_free_reference.py   # ~35 s on 2 cores
    KERAS_BACKEND=jax PYTHONPATH=. python benchmarks/optimizers/schedule_free_reference.py
"""

from __future__ import annotations

import os
import sys

from kadapt import environment

if os.environ.get("KERAS_BACKEND", "tensorflow") == "tensorflow":
    environment.load_tensorflow()  # oneDNN on before TensorFlow loads, its C++ start-up lines held back

try:
    import schedulefree
    import torch
except ImportError:
    sys.exit("This comparison needs PyTorch and the reference: "
             "pip install torch --index-url https://download.pytorch.org/whl/cpu schedulefree==1.4.1")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kadapt  # noqa: E402

ROWS, INPUTS, HIDDEN, STEPS = 64, 5, 8, 20
BETA_1 = 0.9
BATCH_NORM = dict(momentum=0.9, epsilon=1e-5)  # PyTorch's momentum 0.1, in Keras' convention
CONFIGS = {
    "defaults (rate 0.0025)": {},
    "rate 0.02": dict(learning_rate=0.02),
    "rate 0.02, warmup 5": dict(learning_rate=0.02, warmup_steps=5),
    "rate 0.02, decay 0.01": dict(learning_rate=0.02, weight_decay=0.01),
}


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, INPUTS))
    y = np.sin(x @ rng.normal(size=(INPUTS, 1))) + 0.1 * rng.normal(size=(ROWS, 1))
    return x.astype("float32"), y.astype("float32")


def initial_weights(batch_norm):
    """The trainable weights in Keras' order: kernel, bias (gamma, beta with BatchNorm), kernel, bias."""
    rng = np.random.default_rng(1)
    first = [rng.normal(size=(INPUTS, HIDDEN)) / np.sqrt(INPUTS), 0.1 * rng.normal(size=HIDDEN)]
    first = first[:1] if batch_norm else first
    last = [rng.normal(size=(HIDDEN, 1)) / np.sqrt(HIDDEN), np.zeros(1)]
    norm = [1 + 0.1 * rng.normal(size=HIDDEN), 0.1 * rng.normal(size=HIDDEN)] if batch_norm else []
    return [w.astype("float32") for w in first + norm + last]


def keras_model(batch_norm, optimizer):
    layers = [keras.Input((INPUTS,)), keras.layers.Dense(HIDDEN, use_bias=not batch_norm)]
    if batch_norm:
        layers.append(keras.layers.BatchNormalization(**BATCH_NORM))
    layers += [keras.layers.Activation("tanh"), keras.layers.Dense(1)]
    model = keras.Sequential(layers)
    model.compile(optimizer=optimizer, loss="mse")
    for variable, value in zip(model.trainable_variables, initial_weights(batch_norm)):
        variable.assign(value)
    return model


def fit(model, callbacks=()):
    x, y = data()
    model.fit(np.concatenate([x] * STEPS), np.concatenate([y] * STEPS), batch_size=ROWS, epochs=1,
              shuffle=False, verbose=0, callbacks=list(callbacks))


def keras_outcome(model):
    x, y = data()
    norms = [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]
    stats = [keras.ops.convert_to_numpy(v) for n in norms for v in (n.moving_mean, n.moving_variance)]
    return stats, float(model.evaluate(x, y, batch_size=ROWS, verbose=0))


def run_kadapt(batch_norm, config):
    optimizer = kadapt.optimizers.ScheduleFreeAdamW(beta_1=BETA_1, **config)
    model = keras_model(batch_norm, optimizer)
    fit(model, [kadapt.callbacks.ScheduleFreeEvaluation(batches=[data()[0]])])
    at_x = [keras.ops.convert_to_numpy(v) for v in model.trainable_variables]
    optimizer.move_to_gradient_point(model.trainable_variables)
    at_y = [keras.ops.convert_to_numpy(v) for v in model.trainable_variables]
    optimizer.move_to_evaluation_point(model.trainable_variables)
    return (at_y, at_x, *keras_outcome(model))


def run_keras(batch_norm, config, built_first=False):
    optimizer = keras.optimizers.ScheduleFreeAdamW(beta_1=BETA_1, **config)
    model = keras_model(batch_norm, optimizer)
    if built_first:  # its z copies the weights at build: on TensorFlow, not inside fit's traced step
        optimizer.build(model.trainable_variables)
    fit(model)
    at_y = [keras.ops.convert_to_numpy(v) for v in model.trainable_variables]
    z = [keras.ops.convert_to_numpy(v) for v in optimizer.variables if v.name.endswith("_momentum")]
    assert [a.shape for a in z] == [a.shape for a in at_y]
    at_x = [(y - (1 - BETA_1) * zi) / BETA_1 for y, zi in zip(at_y, z)]
    return (at_y, at_x, *keras_outcome(model))


def forward(params, x, stats, training, momentum=0.1):
    if not stats:
        hidden = x @ params[0] + params[1]
    else:
        hidden = torch.nn.functional.batch_norm(x @ params[0], stats[0], stats[1], params[1], params[2],
                                                training=training, momentum=momentum,
                                                eps=BATCH_NORM["epsilon"])
    return torch.tanh(hidden) @ params[-2] + params[-1]


def run_reference(batch_norm, config):
    x, y = (torch.tensor(a, dtype=torch.float64) for a in data())
    params = [torch.tensor(w, dtype=torch.float64, requires_grad=True) for w in initial_weights(batch_norm)]
    stats = [torch.zeros(HIDDEN, dtype=torch.float64), torch.ones(HIDDEN, dtype=torch.float64)]
    stats = stats if batch_norm else []
    optimizer = schedulefree.AdamWScheduleFree(
        params, lr=config.get("learning_rate", 0.0025), betas=(BETA_1, 0.999),
        warmup_steps=config.get("warmup_steps", 0), weight_decay=config.get("weight_decay", 0.0))
    optimizer.train()
    for _ in range(STEPS):
        optimizer.zero_grad()
        torch.mean((forward(params, x, stats, training=True) - y) ** 2).backward()
        optimizer.step()
    at_y = [p.detach().numpy().copy() for p in params]
    optimizer.eval()
    at_x = [p.detach().numpy().copy() for p in params]
    with torch.no_grad():
        if batch_norm:
            forward(params, x, stats, training=True, momentum=1.0)  # the README's recompute at x
        loss = float(torch.mean((forward(params, x, stats, training=False) - y) ** 2))
    biased = [stats[0].numpy(), stats[1].numpy() * (ROWS - 1) / ROWS] if batch_norm else []
    return at_y, at_x, biased, loss


def largest(a, b):
    return max(float(np.max(np.abs(np.asarray(u, np.float64) - v))) for u, v in zip(a, b)) if a else 0.0


def main():
    print(f"backend {keras.backend.backend()}, Keras {keras.__version__}, torch {torch.__version__}, "
          f"{STEPS} full-batch steps of {ROWS} rows; largest |difference|")
    print("network | config | moved | pair | at y | at x | BN statistics | eval loss (first, second)")
    for batch_norm in (False, True):
        for name, config in CONFIGS.items():
            runs = {"kadapt": run_kadapt(batch_norm, config), "keras": run_keras(batch_norm, config),
                    "keras built first": run_keras(batch_norm, config, built_first=True),
                    "reference": run_reference(batch_norm, config)}
            moved = largest(runs["reference"][0], initial_weights(batch_norm))  # at y
            for first, second in (("kadapt", "reference"), ("keras", "reference"),
                                  ("keras built first", "reference"), ("kadapt", "keras")):
                a, b = runs[first], runs[second]
                print(f"{'batch_norm' if batch_norm else 'mlp'} | {name} | {moved:.3g} | {first}-{second} | "
                      f"{largest(a[0], b[0]):.2g} | {largest(a[1], b[1]):.2g} | {largest(a[2], b[2]):.2g} | "
                      f"{a[3]:.4f}, {b[3]:.4f}")


if __name__ == "__main__":
    main()
