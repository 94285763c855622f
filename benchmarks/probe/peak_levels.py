"""How a step's peak varies between fresh processes, and what does not change it.

The judge of `benchmarks/probe/probe.py` checks a size in a fresh process. This
script runs the same step (one of probe.py's models, two micro-batches of
ROWS rows: one traced step, then STEPS measured ones) in PROCESSES fresh
processes per variant and prints each process's peaks (MiB), and how many
processes had the highest of their first 3 steps over the budget (the judge's
rule). Variants, each a change to the judge's process:

- judge: as `benchmarks/probe/probe.py`'s `fits_by_rule` (the budget held as one
  region of 2 x the budget, the model's state snapshot, NumPy inputs);
- region+256MiB: the region 256 MiB larger (a free tail past the allocator's
  128 MiB limit on internal fragmentation, so the tail chunk is always split);
- gc: `gc.collect()` before every step;
- one-interop-thread: `TF_NUM_INTEROP_THREADS=1` (ops one at a time);
- plain: no snapshot, the inputs converted to tensors once, before the steps;
- prewarmed: probe.py's three models built and dropped first (the allocator's
  first regions grow to hold them and stay, free);
- side-region: a free region of half the budget held before the budget's;
- ladder: free regions of 2, 4, 8, ... MiB up to half the budget held before
  the budget's;
- region-last: the optimizer's slots and the model's snapshot allocated
  before the budget's region, not in it.

Run: `make install && .venv/bin/python benchmarks/probe/peak_levels.py small_cnn 175 24`
(about 3.5 minutes per variant on a 2-core host).
"""

import json
import os
import subprocess
import sys

VARIANTS = ("judge", "region+256MiB", "gc", "one-interop-thread", "plain", "prewarmed", "side-region",
            "ladder", "region-last")
STEPS = 5
JUDGED_STEPS = 3
MiB = 2**20

ONE_PROCESS = """
import contextlib, dataclasses, gc, json, sys
sys.path.insert(0, {here!r})
from kadapt import environment
environment.load_tensorflow()
import tensorflow as tf
from kadapt.batching import probe
from kadapt.batching.tensorflow import probe as trial_probe
from kadapt.batching.tensorflow.allocator_region import reserve_region
from kadapt.batching.memory_budget import device_budget
import probe as judge

variant, rows = {variant!r}, {rows}
build, budget_text = dict((b.__name__, (b, t)) for b, t in judge.CASES)[{model!r}]
model = judge.compiled(build)
sample = judge.data_for(model)
budget = device_budget(budget_text)
extra = 256 * 2**20 if variant == "region+256MiB" else 0
held_to_the_end = contextlib.ExitStack()  # the snapshot lives through the steps, as in the judge
if variant == "region-last":  # the optimizer's slots and the snapshot allocated before the region
    model.micro_batch_size = rows
    held_to_the_end.enter_context(trial_probe.leaves_no_trace(model, sample))
if variant == "prewarmed":  # the other models built and dropped: the allocator's first regions grow
    for other, _ in judge.CASES:
        other()
    gc.collect()
if variant == "ladder":  # free regions of 2, 4, 8, ... MiB up to half the budget, then the budget's
    held, size = [], 2**21
    while size <= budget.bytes // 2:
        held.append(tf.raw_ops.Empty(shape=[size], dtype=tf.uint8, init=False))
        size *= 2
    del held
if variant == "side-region":  # a free region of half the budget before the budget's
    tf.raw_ops.Empty(shape=[budget.bytes // 2], dtype=tf.uint8, init=False)
reserve_region(dataclasses.replace(budget, bytes=budget.bytes + extra // 2))
model.micro_batch_size = rows
x, y, _ = probe.repeat_rows(sample, 2 * rows)
if variant == "plain":
    x, y = tf.constant(x), tf.constant(y)
    model.optimizer.build(model.trainable_variables)
elif variant != "region-last":
    held_to_the_end.enter_context(trial_probe.leaves_no_trace(model, sample))
collect = gc.collect if variant == "gc" else (lambda: None)
peaks = judge.measured_peaks(model, x, y, "CPU:0", {steps}, collect)
print(json.dumps({{"peaks": peaks, "budget": budget.bytes}}))
"""


def one_process(model, rows, variant):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    if variant == "one-interop-thread":
        env["TF_NUM_INTEROP_THREADS"] = "1"
    here = os.path.dirname(os.path.abspath(__file__))
    code = ONE_PROCESS.format(here=here, variant=variant, rows=rows, model=model, steps=STEPS)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{variant}: the process failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(model="small_cnn", rows="175", processes="24", *variants):
    rows, processes = int(rows), int(processes)
    for variant in variants or VARIANTS:
        runs = [one_process(model, rows, variant) for _ in range(processes)]
        budget = runs[0]["budget"]
        judged = sorted(max(run["peaks"][:JUDGED_STEPS]) / MiB for run in runs)
        over = sum(peak > budget / MiB for peak in judged)
        print(f"{model} {rows} rows, {variant}: {over}/{processes} processes over {budget / MiB:.0f} MiB; "
              f"highest of the first {JUDGED_STEPS} steps per process (MiB): "
              f"{' '.join(f'{peak:.1f}' for peak in judged)}", flush=True)
        for run in runs:
            print("    " + " ".join(f"{peak / MiB:.1f}" for peak in run["peaks"]))


if __name__ == "__main__":
    main(*sys.argv[1:])
