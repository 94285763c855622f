"""The plan-based probe on Keras' JAX backend: XLA's plan against rows, and the probe's choices.

For each model: `step_plan` at SIZES rows (argument, temporary and peak MiB,
seconds to lower and compile), then `probe_micro_batch_jax` under each of
BUDGETS_MIB (the size chosen, the sizes planned, seconds, and whether the
chosen size's own plan is within the budget), for plain Keras models (a plain
model is planned at m rows); then the accumulating step at a logical batch of
256 per micro-batch size, beside plain Keras at 256. Prints a table and writes probe_plan_jax.json (or argv[1]).

Run: `KERAS_BACKEND=jax .venv/bin/python benchmarks/probe/probe_plan_jax.py` (about
three minutes on a shared 2-core host: each plan is one XLA compile, 2-15 s there).
"""

import json
import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import kadapt  # noqa: E402
from kadapt.batching.jax.memory_plan import step_plan  # noqa: E402
from kadapt.batching.jax.probe import probe_micro_batch_jax  # noqa: E402

SIZES = (16, 32, 64, 128, 256)
BUDGETS_MIB = (32, 64, 128, 256)
LOGICAL_BATCH = 1024  # the largest micro-batch worth having
MIB = 2**20


def fast_resnet():
    return kadapt.models.fast_resnet(widths=(16, 32, 64))


MODELS = {"small_cnn": kadapt.models.small_cnn, "fast_resnet_16_64": fast_resnet}


def compiled(build):
    keras.utils.set_random_seed(0)
    model = build()
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def data(rows):
    return (jax.ShapeDtypeStruct((rows, 28, 28, 1), "float32"), jax.ShapeDtypeStruct((rows,), "int32"))


def plans(model):
    rows = []
    for size in SIZES:
        start = time.perf_counter()
        plan = step_plan(model, data(size))
        rows.append({"rows": size, "seconds": time.perf_counter() - start,
                     "argument_mib": plan.argument_bytes / MIB,
                     "temporary_mib": plan.temporary_bytes / MIB, "peak_mib": plan.peak_bytes / MIB})
    return rows


def accumulating_plans(build, logical=256):
    """The accumulating step at a logical batch of `logical` rows, per micro-batch size: its
    plan must follow the micro-batch, not the logical batch (plain Keras at `logical` rows beside)."""
    rows = [{"micro_batch_size": None, "peak_mib": step_plan(compiled(build), data(logical)).peak_bytes / MIB}]
    for size in SIZES:
        model = compiled(lambda: kadapt.accumulate(build(), size))
        rows.append({"micro_batch_size": size, "peak_mib": step_plan(model, data(logical)).peak_bytes / MIB})
    return rows


def probes(model):
    sample = (np.zeros((LOGICAL_BATCH, 28, 28, 1), "float32"), np.zeros((LOGICAL_BATCH,), "int32"))
    rows = []
    for budget in BUDGETS_MIB:
        start = time.perf_counter()
        result = probe_micro_batch_jax(model, sample, memory_budget=budget * MIB)
        seconds = time.perf_counter() - start
        chosen = [t for t in result.trials if t.micro_batch_size == result.micro_batch_size][-1]
        rows.append({"budget_mib": budget, "micro_batch_size": result.micro_batch_size,
                     "planned_sizes": [t.micro_batch_size for t in result.trials], "seconds": seconds,
                     "chosen_peak_mib": chosen.peak_bytes / MIB,
                     "within_budget": chosen.peak_bytes <= budget * MIB})
    return rows


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "probe_plan_jax.json"
    report = {"jax": jax.__version__, "keras": keras.__version__, "device": str(jax.devices()[0]),
              "models": {}}
    for name, build in MODELS.items():
        model = compiled(build)
        report["models"][name] = {"plans": plans(model), "probes": probes(model),
                                   "accumulating_256": accumulating_plans(build)}
        for row in report["models"][name]["plans"]:
            print(f"{name:20s} rows {row['rows']:4d}: args {row['argument_mib']:7.2f} MiB, temps "
                  f"{row['temporary_mib']:8.2f} MiB, peak {row['peak_mib']:8.2f} MiB ({row['seconds']:.2f} s)")
        for row in report["models"][name]["probes"]:
            print(f"{name:20s} budget {row['budget_mib']:4d} MiB: m={row['micro_batch_size']:4d} "
                  f"(plan {row['chosen_peak_mib']:.2f} MiB, within={row['within_budget']}), planned "
                  f"{row['planned_sizes']} in {row['seconds']:.1f} s")
        for row in report["models"][name]["accumulating_256"]:
            label = "plain Keras" if row["micro_batch_size"] is None else f"kadapt m={row['micro_batch_size']}"
            print(f"{name:20s} B=256, {label:15s}: peak {row['peak_mib']:8.2f} MiB")
    with open(out, "w") as file:
        json.dump(report, file, indent=1)


if __name__ == "__main__":
    main()
