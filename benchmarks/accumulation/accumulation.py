"""Samples/s of kadapt's in-step accumulation against the Keras baselines.

A small CNN on Fashion-MNIST-shaped random data, four trainers timed in
alternation (A B C D A B C D ...) in one process, so drift in the machine's
speed hits all of them alike. Prints median samples/s, the ratios, and how
exactly kadapt's weights match one full batch of 512.

Beside the wall-clock samples/s it prints samples per CPU-second of this
process (all its threads): the work a trainer needs per sample, which other
processes on a shared machine change far less than its wall time. The load
average is printed before and after.

On Keras' JAX backend (`KERAS_BACKEND=jax`) the same four trainers run
jitted by JAX; the backend is fixed per process, so each backend is one run.

Run: `make install && .venv/bin/python benchmarks/accumulation/accumulation.py`
     `KERAS_BACKEND=jax .venv/bin/python benchmarks/accumulation/accumulation.py`
     (ROWS=4096 ROUNDS=3 in the environment for a shorter run)
"""

import os
import statistics
import time

from kadapt import environment  # noqa: E402

if os.environ.get("KERAS_BACKEND", "tensorflow") == "tensorflow":
    environment.load_tensorflow()  # oneDNN on before TensorFlow loads, its C++ start-up lines held back

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kadapt  # noqa: E402

ROWS = int(os.environ.get("ROWS", 16_384))  # per timed epoch
ROUNDS = int(os.environ.get("ROUNDS", 9))
LOGICAL = 512
MICRO = 128


def small_cnn():
    keras.utils.set_random_seed(0)
    return kadapt.models.small_cnn()


def compiled(model, **kwargs):
    model.compile(
        optimizer=keras.optimizers.SGD(0.01, momentum=0.9, **kwargs),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def trainers():
    """name -> (model, fit batch size)"""
    return {
        "plain fit, batch 128": (compiled(small_cnn()), MICRO),
        "Keras gradient_accumulation_steps=4, batch 128": (
            compiled(small_cnn(), gradient_accumulation_steps=LOGICAL // MICRO),
            MICRO,
        ),
        "plain fit, batch 512": (compiled(small_cnn()), LOGICAL),
        "kadapt.accumulate, B=512, m=128": (
            compiled(kadapt.accumulate(small_cnn(), MICRO)),
            LOGICAL,
        ),
    }


def samples_per_second(model, batch_size, x, y):
    """(samples per second, samples per CPU-second of this process) of one epoch."""
    cpu, start = time.process_time(), time.perf_counter()
    model.fit(x, y, batch_size=batch_size, epochs=1, verbose=0, shuffle=False)
    return len(x) / (time.perf_counter() - start), len(x) / (time.process_time() - cpu)


def max_relative_difference(model_a, model_b):
    return max(
        float(np.max(np.abs(a - b)) / np.max(np.abs(a)))
        for a, b in zip(model_a.get_weights(), model_b.get_weights())
    )


def exactness(x, y, steps):
    """Max per-tensor relative weight difference from one batch of 512 after
    `steps` steps, for kadapt (m=128) and for Keras' own accumulation (the
    float32 summation-order noise floor of a 4 x 128 split)."""
    rows = x[: steps * LOGICAL], y[: steps * LOGICAL]
    plain = compiled(small_cnn())
    plain.fit(*rows, batch_size=LOGICAL, epochs=1, verbose=0, shuffle=False)
    accumulated = compiled(kadapt.accumulate(small_cnn(), MICRO))
    accumulated.fit(*rows, batch_size=LOGICAL, epochs=1, verbose=0, shuffle=False)
    native = compiled(small_cnn(), gradient_accumulation_steps=LOGICAL // MICRO)
    native.fit(*rows, batch_size=MICRO, epochs=1, verbose=0, shuffle=False)
    return max_relative_difference(plain, accumulated), max_relative_difference(plain, native)


def load_average():
    return "/".join(f"{value:.1f}" for value in os.getloadavg())


def main():
    rng = np.random.default_rng(0)
    x = rng.random((ROWS, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, ROWS)
    runs = trainers()
    for model, batch_size in runs.values():  # trace and warm up
        model.fit(x[:2048], y[:2048], batch_size=batch_size, epochs=1, verbose=0)
    load_before = load_average()
    speeds = {name: [] for name in runs}
    for _ in range(ROUNDS):
        for name, (model, batch_size) in runs.items():
            speeds[name].append(samples_per_second(model, batch_size, x, y))
    wall = {name: statistics.median(s for s, _ in values) for name, values in speeds.items()}
    cpu = {name: statistics.median(c for _, c in values) for name, values in speeds.items()}
    print(f"backend: {keras.backend.backend()}, load average (1/5/15 min) {load_before} before, "
          f"{load_average()} after")
    native = "Keras gradient_accumulation_steps=4, batch 128"
    print(f"{'trainer':50s} {'samples/s':>10s} {'vs plain-128':>13s} {'vs Keras native':>16s} "
          f"{'samples/CPU-s':>14s} {'vs Keras native':>16s}")
    for name in runs:
        print(f"{name:50s} {wall[name]:10.0f} {wall[name] / wall['plain fit, batch 128']:12.2f}x "
              f"{wall[name] / wall[native]:15.2f}x {cpu[name]:14.0f} {cpu[name] / cpu[native]:15.2f}x")
    for steps in (1, 20):
        ours, keras_native = exactness(x, y, steps)
        print(
            f"after {steps:2d} steps, max relative weight difference from one batch of 512: "
            f"kadapt {ours:.1e}, Keras native {keras_native:.1e}"
        )


if __name__ == "__main__":
    main()
