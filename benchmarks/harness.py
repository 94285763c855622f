"""The timing every side-by-side benchmark shares: arms alternated round by round in one process,
each arm's median step time, and its ratio to a base arm; wall and CPU seconds of a call.

A script in a subfolder puts benchmarks/ on its path first:

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from harness import alternate, ratio_lines
"""

import time

import numpy as np


def timed(run):
    """`(run(), wall seconds, CPU seconds)`: the CPU seconds of every thread of this process
    (`time.process_time`), which other processes on the host change far less than the wall time."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = run()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def step_seconds(model, x, y, steps):
    """Seconds per `train_on_batch` step of `model` on `(x, y)`, over `steps` steps."""
    start = time.perf_counter()
    for _ in range(steps):
        model.train_on_batch(x, y)
    return (time.perf_counter() - start) / steps


def alternate(models, x, y, rounds, steps, warmup_steps):
    """`{name: [seconds per step of each round]}`: every model warmed up (traced) first, then
    the models run in turn for `rounds` rounds of `steps` steps, the order reversed every other
    round, so a machine's slow spell falls on every arm alike (`kadapt.precision.alternated_rounds`,
    the measurement `choose_precision` decides by)."""
    from kadapt.precision import alternated_rounds

    return alternated_rounds(models, (x, y), rounds, steps, warmup_steps)


def ratio_lines(times, base):
    """`(name, median seconds, min, max, base median / median)` per arm: the ratio is how many
    times faster than arm `base` (above 1: faster)."""
    reference = np.median(times[base])
    return [(name, float(np.median(values)), min(values), max(values), reference / float(np.median(values)))
            for name, values in times.items()]
