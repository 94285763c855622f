"""The probe's choice against the largest micro-batch that fits, on this CPU.

The rule for "fits", the same for the reference and for judging the probe:
in a fresh process, one traced step of the accumulating step (two
micro-batches of m rows), then MEASURED_STEPS (3) measured steps; m fits when
each measured step's peak is within the budget. The reference is the largest
m that fits by that rule, found by bisection with a fresh process per size
(peaks vary from run to run, so a size near the edge can fit in one process
and not in the next; the reference is itself a measurement). The process
holds the budget as one allocator region first, as every kadapt process that
trains with a budget does (`kadapt.batching.allocator_region`). Then REPEATS
probes per model, each in a fresh process as a user's would run, and each
chosen size checked by the rule twice: in the probe's own process with a
fresh trace (where `micro_batch_size="auto"` trains after probing), and in a
fresh process of its own (where a size cached by `kadapt probe` is reused).

Target, judged on the fresh process: the chosen size fits in every probe, is
>= 0.85x the reference in at least 4 of 5 probes, in <= 5 trials.

Run: `make install && .venv/bin/python benchmarks/probe.py`
"""

import multiprocessing
import time

from kadapt import environment  # noqa: E402

environment.load_tensorflow()  # oneDNN on before TensorFlow loads, its C++ start-up lines held back

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kadapt  # noqa: E402
from kadapt.batching import probe  # noqa: E402
from kadapt.batching.allocator_region import reserve_region  # noqa: E402
from kadapt.batching.memory_budget import device_budget  # noqa: E402
from benchmark_models import conv_bn  # noqa: E402

CAP = 1024
REPEATS = 5
TARGET_RATIO = 0.85


def wide_mlp():
    return keras.Sequential([
        keras.Input((784,)),
        keras.layers.Dense(2048, activation="relu"), keras.layers.Dense(2048, activation="relu"),
        keras.layers.Dense(10),
    ], name="wide_mlp")


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


def in_fresh_process(function, *args):
    """`function(*args)` in a new interpreter (spawned: nothing of this one)."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(function, args)


def fits_by_rule(index, size, measured_steps=3):
    """Whether `size` fits by the rule in this process, run fresh by the
    caller: the model built anew, the budget held as one region as a process
    that trains with kadapt and a budget holds it, then `fits_here`."""
    build, budget_text = CASES[index]
    model = compiled(build)
    sample = data_for(model)
    budget = device_budget(budget_text)
    reserve_region(budget)
    return fits_here(model, sample, budget, size, measured_steps)


def fits_here(model, sample, budget, size, measured_steps=3):
    """Whether `size` fits by the rule: one fresh trace (a warm-up step), then
    every one of `measured_steps` steps' peaks within the budget. Written out
    here, apart from the probe's own trials."""
    import tensorflow as tf

    with probe.leaves_no_trace(model, sample):
        model.micro_batch_size = size
        model.train_function = None  # a fresh trace even where this size was traced before
        x, y, _ = probe.repeat_rows(sample, 2 * size)
        try:
            peaks = measured_peaks(model, x, y, budget.device, measured_steps)
        except tf.errors.ResourceExhaustedError:
            return False
    return max(max(peaks), probe.resident_bytes(model)) <= budget.bytes


def measured_peaks(model, x, y, device, steps, before_each_step=lambda: None):
    """One warm-up step (the trace), then each of `steps` steps' peak bytes on `device`."""
    import tensorflow as tf

    before_each_step()
    model.train_on_batch(x, y)
    peaks = []
    for _ in range(steps):
        before_each_step()
        tf.config.experimental.reset_memory_stats(device)
        model.train_on_batch(x, y)
        peaks.append(tf.config.experimental.get_memory_info(device)["peak"])
    return peaks


def probe_once(index):
    build, budget_text = CASES[index]
    model = compiled(build)
    sample = data_for(model)
    start = time.perf_counter()
    result = kadapt.probe_micro_batch(model, sample[:2], memory_budget=budget_text, max_micro_batch_size=CAP)
    seconds = time.perf_counter() - start
    # Where the user trains after probing: this process, a fresh trace.
    here = fits_here(model, sample, result.budget, result.micro_batch_size)
    return {"chosen": result.micro_batch_size, "trials": len(result.trials), "seconds": seconds,
            "fits_here": here,
            "sequence": " ".join(f"{t.micro_batch_size}{'+' if t.fits else 'x'}" for t in result.trials),
            "noise": search_noise(result)}


def search_noise(result):
    """The pooled relative standard deviation the probe ended with."""
    search = probe.MicroBatchSearch(None, result.budget.bytes)
    search.trials = list(result.trials)
    return search.noise()


def reference(index):
    """The largest size that fits by the rule, by bisection over [1, CAP]."""
    low, high = 0, CAP + 1  # low fits (0 trivially), high does not
    if in_fresh_process(fits_by_rule, index, CAP):
        return CAP
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if in_fresh_process(fits_by_rule, index, middle) else (low, middle)
    return low


def main():
    print(f"{'model':10s} {'budget':>7s} {'reference':>9s}   probes: chosen/reference (trials, fits in the "
          f"probe's process and in a fresh one), kadapt's trials (+ fits, x not)")
    for index, (build, budget_text) in enumerate(CASES):
        truth = reference(index)
        probes = [in_fresh_process(probe_once, index) for _ in range(REPEATS)]
        for row in probes:
            row["fits"] = in_fresh_process(fits_by_rule, index, row["chosen"])
        report(build().name, budget_text, truth, probes)


def report(name, budget_text, truth, probes):
    print(f"{name:10s} {budget_text:>7s} {truth:9d}")
    for row in probes:
        print(f"{'':28s} {row['chosen']:5d} = {row['chosen'] / truth:4.2f}x ({row['trials']} trials, "
              f"{row['seconds']:.1f} s, noise {row['noise']:.1%}, {'fits' if row['fits_here'] else 'DOES NOT FIT'} "
              f"in its process, {'fits' if row['fits'] else 'DOES NOT FIT'} in a fresh one)  "
              f"{row['sequence']}")
    near = sum(row["chosen"] >= TARGET_RATIO * truth for row in probes)
    every_fits = all(row["fits"] for row in probes)
    most_trials = max(row["trials"] for row in probes)
    met = every_fits and near >= REPEATS - 1 and most_trials <= 5
    print(f"{'':28s} fits in its process {sum(r['fits_here'] for r in probes)}/{REPEATS}, in a fresh one "
          f"{sum(r['fits'] for r in probes)}/{REPEATS}, >= {TARGET_RATIO}x in "
          f"{near}/{REPEATS}, at most {most_trials} trials: target {'met' if met else 'NOT met'}", flush=True)


if __name__ == "__main__":
    main()
