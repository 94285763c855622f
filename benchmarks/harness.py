"""The timing every side-by-side benchmark shares: arms alternated round by round in one process,
each arm's median step time, and its ratio to a base arm.

A script in a subfolder puts benchmarks/ on its path first:

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from harness import alternate, ratio_lines
"""

import time

import numpy as np


def step_seconds(model, x, y, steps):
    """Seconds per `train_on_batch` step of `model` on `(x, y)`, over `steps` steps."""
    start = time.perf_counter()
    for _ in range(steps):
        model.train_on_batch(x, y)
    return (time.perf_counter() - start) / steps


def alternate(models, x, y, rounds, steps, warmup_steps):
    """`{name: [seconds per step of each round]}`: every model warmed up (traced) first, then
    the models run in turn for `rounds` rounds of `steps` steps, so a machine's slow
    spell falls on every arm alike."""
    for model in models.values():
        step_seconds(model, x, y, warmup_steps)
    times = {name: [] for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            times[name].append(step_seconds(model, x, y, steps))
    return times


def ratio_lines(times, base):
    """`(name, median seconds, min, max, base median / median)` per arm: the ratio is how many
    times faster than arm `base` (above 1: faster)."""
    reference = np.median(times[base])
    return [(name, float(np.median(values)), min(values), max(values), reference / float(np.median(values)))
            for name, values in times.items()]
