"""Which CPU configuration of TensorFlow the probe should measure under.

For each candidate (TensorFlow's default, oneDNN on, the BFC CPU allocator,
both, and oneDNN with the budget held as one allocator region, kadapt's
choice), in PROCESSES fresh processes per candidate and model: are allocator
statistics there at all, is the peak of one traced step repeatable (the same
step run REPEATS times after its trace, and from process to process), and how
does it compare with what a GPU's allocator would count? A GPU's BFC
allocator counts every live buffer (rounded to 256 bytes): the variables, the
optimizer slots, the float32 gradient sum and the activations the backward
pass keeps. `estimate` below is that sum,
with every layer's output of one micro-batch as the kept activations (fused
or in-place ops keep less, temporaries add more). The per-row slope between
two sizes is compared with the estimate's per-row activation bytes: an
allocator whose peak does not grow with the rows as the activations do would
mislead the probe. It also times the step (oneDNN's kernels are the fast ones
on the CPU).

Run: `make install && .venv/bin/python benchmarks/probe/cpu_allocator.py`
"""

import json
import math
import os
import statistics
import subprocess
import sys

CANDIDATES = {
    "default": {},
    "oneDNN": {"TF_ENABLE_ONEDNN_OPTS": "1"},
    "BFC": {"TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_ENABLE_ONEDNN_OPTS": "0"},
    "oneDNN+BFC": {"TF_ENABLE_ONEDNN_OPTS": "1", "TF_CPU_ALLOCATOR_USE_BFC": "true"},
    "oneDNN+region": {"TF_ENABLE_ONEDNN_OPTS": "1", "REGION": "256MiB"},
}
MODELS = ("small_cnn", "conv_bn")
SIZES = (32, 128)  # micro-batch rows; each step runs two micro-batches
REPEATS = 5
PROCESSES = 3
MiB = 2**20


def main():
    print(f"{'candidate':13s} {'model':10s} {'rows':>5s} {'stats':>6s} {'peaks of 5 runs (MiB)':>34s} "
          f"{'spread':>7s} {'est. MiB':>9s} {'ms/step':>8s}")
    for name, settings in CANDIDATES.items():
        for model_name in MODELS:
            runs = [measure_in_fresh_process(settings, model_name) for _ in range(PROCESSES)]
            for row in runs[0]:
                print_row(name, model_name, row)
            slope_line(name, model_name, runs[0])
            across_processes(model_name, runs)


def measure_in_fresh_process(settings, model_name):
    env = {k: v for k, v in os.environ.items()
           if k not in ("TF_ENABLE_ONEDNN_OPTS", "TF_CPU_ALLOCATOR_USE_BFC")}
    settings = dict(settings)
    region = settings.pop("REGION", "")
    env.update(settings, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, __file__, "--worker", model_name, region], env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def across_processes(model_name, runs):
    """The highest peak of each process's runs, per size: the level a fresh process lands on."""
    if runs[0][0]["peaks"] is None:
        return
    for index, row in enumerate(runs[0]):
        highs = [max(run[index]["peaks"]) for run in runs]
        print(f"{'':13s} {model_name:10s} {row['rows']:5d} highest peak per process (MiB): "
              f"{' '.join(f'{h / MiB:.1f}' for h in highs)}, spread {(max(highs) - min(highs)) / min(highs):.1%}")


def print_row(name, model_name, row):
    if row["peaks"] is None:
        print(f"{name:13s} {model_name:10s} {row['rows']:5d} {'no':>6s} {'-':>34s} {'-':>7s} "
              f"{row['estimate'] / MiB:9.1f} {row['ms']:8.1f}")
        return
    peaks = " ".join(f"{p / MiB:6.1f}" for p in row["peaks"])
    spread = (max(row["peaks"]) - min(row["peaks"])) / min(row["peaks"])
    print(f"{name:13s} {model_name:10s} {row['rows']:5d} {'yes':>6s} {peaks:>34s} {spread:7.1%} "
          f"{row['estimate'] / MiB:9.1f} {row['ms']:8.1f}")


def slope_line(name, model_name, rows):
    low, high = rows[0], rows[-1]
    estimate_slope = (high["estimate"] - low["estimate"]) / (high["rows"] - low["rows"])
    if low["peaks"] is None:
        print(f"{'':13s} {model_name:10s} per row: estimate {estimate_slope / 1024:.1f} KiB, measured -")
        return
    slope = (statistics.median(high["peaks"]) - statistics.median(low["peaks"])) / (high["rows"] - low["rows"])
    print(f"{'':13s} {model_name:10s} per row: estimate {estimate_slope / 1024:.1f} KiB, "
          f"measured {slope / 1024:.1f} KiB ({slope / estimate_slope:.2f}x); "
          f"at {high['rows']} rows measured/estimate {statistics.median(high['peaks']) / high['estimate']:.2f}x")


# ---- worker: one candidate configuration, one model, in its own process ----

def worker(model_name, region):
    import time

    import keras
    import numpy as np
    import tensorflow as tf

    import kadapt
    from kadapt.batching import device_budget
    from kadapt.batching.tensorflow.allocator_region import reserve_region

    if region:
        reserve_region(device_budget(region))
    rows = []
    for size in SIZES:
        keras.utils.set_random_seed(0)
        model = build(model_name)
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        trainer = kadapt.accumulate(model, size)
        rng = np.random.default_rng(0)
        x = rng.random((2 * size, *model.inputs[0].shape[1:]), dtype=np.float32)
        y = rng.integers(0, 10, 2 * size)
        trainer.train_on_batch(x, y)  # trace
        peaks, seconds = [], []
        for _ in range(REPEATS):
            try:
                tf.config.experimental.reset_memory_stats("CPU:0")
            except ValueError:
                peaks = None
            start = time.perf_counter()
            trainer.train_on_batch(x, y)
            seconds.append(time.perf_counter() - start)
            if peaks is not None:
                peaks.append(tf.config.experimental.get_memory_info("CPU:0")["peak"])
        rows.append({"rows": size, "peaks": peaks, "estimate": estimate_bytes(trainer, size),
                     "ms": 1000 * statistics.median(seconds)})
    print(json.dumps(rows))


def estimate_bytes(trainer, size):
    """Variables, slots and gradient sum, plus one micro-batch's layer outputs
    (the activations kept for the backward pass), in float32."""
    from kadapt.batching.tensorflow.probe import resident_bytes

    activations = sum(4 * math.prod(layer.output.shape[1:]) for layer in trainer.model.layers)
    return resident_bytes(trainer) + size * activations


def build(model_name):
    import kadapt
    from benchmark_models import conv_bn

    return kadapt.models.small_cnn() if model_name == "small_cnn" else conv_bn()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "")
    else:
        main()
