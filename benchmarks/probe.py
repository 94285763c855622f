"""The probe's choice against the exhaustively measured largest micro-batch,
and its trial count against PyTorch Lightning's batch-size finder
(`scale_batch_size(mode="binsearch")`: start at 2, double until a failure,
then bisect), simulated on the same measured memory curve.

Three models and budgets on this CPU. "Truly fits" is decided by real trial
steps: the reference is the largest size such that it and every smaller
size fit (see `largest_truly_fitting`). The peak of a real trial can differ
by some percent from another run of the same size, so the reference itself
is a measurement. Each case runs in a fresh process, as a user's probe
would: in one process for all three, the memory an earlier case kept alive
counted in the later cases' peaks.

Run: `make install && .venv/bin/python benchmarks/probe.py`
"""

import functools
import multiprocessing
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kadapt  # noqa: E402
from kadapt.batching import probe  # noqa: E402
from kadapt.batching.memory_budget import device_budget  # noqa: E402

CAP = 1024
SWEEP_STEP = 32
FINE_STEP = 8


def wide_mlp():
    return keras.Sequential([
        keras.Input((784,)),
        keras.layers.Dense(2048, activation="relu"), keras.layers.Dense(2048, activation="relu"),
        keras.layers.Dense(10),
    ], name="wide_mlp")


def conv_bn():
    layers = [keras.Input((32, 32, 3))]
    for width in (32, 64, 128):
        layers += [keras.layers.Conv2D(width, 3, padding="same", use_bias=False),
                   keras.layers.BatchNormalization(), keras.layers.ReLU(), keras.layers.MaxPooling2D()]
    layers += [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)]
    return keras.Sequential(layers, name="conv_bn")


CASES = [(kadapt.models.small_cnn, "64MiB"), (wide_mlp, "256MiB"), (conv_bn, "128MiB")]


def compiled(build):
    keras.utils.set_random_seed(0)
    model = build()
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return kadapt.accumulate(model, 1)


def data_for(model):
    rng = np.random.default_rng(0)
    x = rng.random((2 * CAP, *model.model.inputs[0].shape[1:]), dtype=np.float32)
    return x, rng.integers(0, 10, 2 * CAP), None


def largest_truly_fitting(fits):
    """The largest m such that m and every smaller size fit: an accumulating
    step also runs a ragged last micro-batch of any size below m, so a size
    that fits while a smaller one does not (the peak is not monotone in the
    rows here; oneDNN picks kernels per shape) is no answer. A sweep every
    SWEEP_STEP rows up to the first failure, a sweep every FINE_STEP rows
    over the last 25% below it, then bisection below the first fine failure."""
    low = 0
    for size in range(SWEEP_STEP, CAP + 1, SWEEP_STEP):
        if not fits(size):
            break
        low = size
    else:
        return CAP
    high = low + SWEEP_STEP  # the first failing sweep size
    start = max(SWEEP_STEP, (3 * high // 4) // SWEEP_STEP * SWEEP_STEP)  # a sweep size that fit
    for size in range(start, high, FINE_STEP):
        if not fits(size):
            high = size
            break
    low = high - FINE_STEP if start < high else 0  # a size that fit
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def lightning_binsearch(fits, initial=2):
    """Trial count and result of Lightning's power-then-binary-search finder."""
    trials, size, low = 0, initial, 0
    while size <= CAP:
        trials += 1
        if not fits(size):
            break
        low, size = size, size * 2
    else:
        return CAP, trials
    high = size
    while high - low > 1:
        middle = (low + high) // 2
        trials += 1
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low, trials


def measure_case(build, budget_text):
    model = compiled(build)
    sample = data_for(model)
    budget = device_budget(budget_text)

    @functools.cache
    def fits(size):
        with probe.leaves_no_trace(model, sample):
            return probe.run_trial(model, sample, size, budget).fits

    start = time.perf_counter()
    result = kadapt.probe_micro_batch(model, sample[:2], memory_budget=budget_text, max_micro_batch_size=CAP)
    probe_seconds = time.perf_counter() - start
    truth = largest_truly_fitting(fits)
    lightning_size, lightning_trials = lightning_binsearch(fits)
    return {
        "model": model.model.name, "budget": budget_text, "truth": truth,
        "chosen": result.micro_batch_size, "trials": len(result.trials),
        "probe_s": probe_seconds, "lightning": lightning_size, "lightning_trials": lightning_trials,
        "sequence": " ".join(f"{t.micro_batch_size}{'+' if t.fits else 'x'}" for t in result.trials),
    }


def main():
    print(f"{'model':10s} {'budget':>7s} {'largest':>8s} {'kadapt':>7s} {'ratio':>6s} {'trials':>7s} "
          f"{'probe s':>8s} {'Lightning':>10s} {'trials':>7s}   kadapt's trials (+ fits, x not)")
    # Each case in a fresh process: the peak is the process's, and the
    # variables and traced steps of an earlier case would count in it.
    context = multiprocessing.get_context("spawn")
    for index in range(len(CASES)):
        with context.Pool(1) as pool:
            row = pool.apply(measure_index, (index,))
        print(f"{row['model']:10s} {row['budget']:>7s} {row['truth']:8d} {row['chosen']:7d} "
              f"{row['chosen'] / row['truth']:6.2f} {row['trials']:7d} {row['probe_s']:8.1f} "
              f"{row['lightning']:10d} {row['lightning_trials']:7d}   {row['sequence']}", flush=True)


def measure_index(index):
    return measure_case(*CASES[index])


if __name__ == "__main__":
    main()
