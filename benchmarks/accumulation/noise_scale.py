"""Adaptive logical batch (gradient noise scale) against fixed small and large
batches: wall time and optimizer steps to target validation losses on
Fashion-MNIST, side by side in one process, on this CPU.

All three train an MLP through `kadapt.accumulate` with micro-batches of 32
and Adam (whose noise scale is the preconditioned one). Learning rates follow
the sqrt rule from 1e-3 at batch 64 (fixed 1024 gets 4e-3; the adaptive run
rescales as it changes size). Each run is one `fit` that checks the
validation loss every quarter pass (by rows trained, the same for every run)
and stops at the last target; the clock runs from the start of `fit`, and
each target's time is that of the first check at or under it. The fixed
batches are `fit(x, y, batch_size=B, shuffle=True)`, Keras' own vectorized
array path; the adaptive run reads `AdaptiveBatchSize.dataset`, which
re-batches live, deciding every 50 steps. Target (issue 6): adaptive no
slower than the better fixed batch. Medians over 10 seeds; a seed that never
reached a target counts as the slowest.

Run: `make install && .venv/bin/python benchmarks/accumulation/noise_scale.py`; with
`--controls` it also runs fixed 256 (the size the policy mostly picks) on
Keras' array path and on the live path held at 256, which separates the cost
of the live path from the policy's choices.
"""

import math
import statistics
import sys
import time

from kadapt import environment  # noqa: E402

environment.load_tensorflow()  # oneDNN on before TensorFlow loads, its C++ start-up lines held back

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import kadapt  # noqa: E402

TARGETS = (0.36, 0.34, 0.33)  # validation losses; a run stops at the last
PASS_ROWS = 54_000  # training rows; the last 6 000 validate
MAX_EPOCHS = 12
MICRO = 32
BASE_LR, BASE_BATCH = 1e-3, 64
SEEDS = tuple(range(10))
EVAL_ROWS = 13_500  # a quarter of a pass: the validation loss is checked this often


def mlp():
    return keras.Sequential([
        keras.Input((28, 28)), keras.layers.Flatten(),
        keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10),
    ])


def trainer(batch_size, seed):
    keras.utils.set_random_seed(seed)
    model = kadapt.accumulate(mlp(), MICRO, measure_noise=True)
    lr = BASE_LR * math.sqrt(batch_size / BASE_BATCH)
    model.compile(optimizer=kadapt.optimizers.Adam(lr),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


class TimeToTargets(keras.callbacks.Callback):
    """Evaluates the validation loss every EVAL_ROWS rows trained; keeps the
    (seconds, steps, passes) at which it first reached each target, and
    stops at the last. `rows_of_step(batch)` gives the rows of the step just
    trained."""

    def __init__(self, validation, rows_of_step):
        super().__init__()
        self.validation, self.rows_of_step = validation, rows_of_step

    def on_train_begin(self, logs=None):
        x, y = self.validation
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        self.validation_loss = tf.function(lambda: loss(y, self.model(x, training=False)))
        # Traced before the clock starts: its first call took 0.5-1.4 s, the
        # more while a data-pipeline thread competed for the GIL.
        self.validation_loss()
        self.started, self.rows, self.evaluated = time.perf_counter(), 0, 0
        self.reached = {}  # target -> (seconds, steps, passes)
        self.step_seconds, self.gap_seconds, self._step_ended = [], 0.0, None
        self.first_step_seconds = None  # from the start of fit: tracing, pipeline start

    def on_train_batch_begin(self, batch, logs=None):
        self._step_started = time.perf_counter()
        if self._step_ended is not None:  # Keras, callbacks, the next batch's wait
            self.gap_seconds += self._step_started - self._step_ended

    def on_train_batch_end(self, batch, logs=None):
        self._step_ended = time.perf_counter()
        self.step_seconds.append(self._step_ended - self._step_started)
        if self.first_step_seconds is None:
            self.first_step_seconds = self._step_ended - self.started
        self.rows += self.rows_of_step(batch)
        if self.rows // EVAL_ROWS == self.evaluated:
            return
        self.evaluated = self.rows // EVAL_ROWS
        value = float(self.validation_loss())
        for target in TARGETS:
            if value <= target and target not in self.reached:
                self.reached[target] = (time.perf_counter() - self.started,
                                        int(self.model.optimizer.iterations), self.rows / PASS_ROWS)
        self.model.stop_training = min(TARGETS) in self.reached


def run(data, batch_size=None, adaptive=None, seed=0, callbacks=()):
    """{target: (seconds, steps, passes)} for the targets reached, the median
    ms per step, and the time breakdown (first step s, mean ms per later
    step, s between steps). `callbacks` watch an adaptive run."""
    (x, y), validation = data
    model = trainer(batch_size or adaptive.batch_size, seed)
    # Keras' fit(shuffle=True) repeats one order every epoch while a global
    # seed is set: the seed made the weights, now it goes.
    tf.random.set_seed(None)
    if adaptive is None:  # Keras' own (vectorized) array path
        clock = TimeToTargets(validation, lambda batch: min(batch_size, len(x) - batch * batch_size))
        model.fit(x, y, batch_size=batch_size, epochs=MAX_EPOCHS, verbose=0, shuffle=True, callbacks=[clock])
    else:
        before = adaptive.rows_trained
        clock = TimeToTargets(validation, lambda batch: adaptive.rows_trained - before - clock.rows)
        model.fit(adaptive.dataset(x, y, seed=seed), epochs=MAX_EPOCHS, verbose=0, shuffle=False,
                  callbacks=[adaptive, *callbacks, clock])
    later = clock.step_seconds[1:]
    breakdown = (clock.first_step_seconds, 1000 * statistics.fmean(later), clock.gap_seconds)
    return clock.reached, 1000 * statistics.median(later), breakdown


class Resolution(keras.callbacks.Callback):
    """At each of `adaptive`'s decisions (one step after those at epoch
    ends), the EMA of |G|^2 in standard errors
    (`NoiseScale.squared_norm_error`): how well the noise scale it read was
    resolved."""

    def __init__(self, adaptive):
        super().__init__()
        self.adaptive, self.errors = adaptive, []

    def on_train_batch_end(self, batch, logs=None):
        if len(self.errors) < len(self.adaptive.choices):
            metric = self.model.noise_scale
            error = float(metric.squared_norm_error())
            self.errors.append(float(metric.squared_norm) / error if error else math.nan)


class ConstantSize(kadapt.AdaptiveBatchSize):
    """The live data path at one size: separates its cost from the policy's."""

    def candidates(self):
        return [self.batch_size]


def main():
    controls = "--controls" in sys.argv[1:]
    (x, y), _ = kadapt.datasets.fashion_mnist()
    x = x.astype("float32") / 255.0
    data = ((x[:PASS_ROWS], y[:PASS_ROWS]), (x[PASS_ROWS:], y[PASS_ROWS:]))
    results = {"fixed 64": [], "fixed 1024": [], "adaptive 64..1024": []}
    adaptive_runs = []  # (decisions, step times) per seed
    for seed in SEEDS:  # alternate configurations within each seed
        results["fixed 64"].append(run(data, batch_size=64, seed=seed))
        results["fixed 1024"].append(run(data, batch_size=1024, seed=seed))
        adaptive = kadapt.AdaptiveBatchSize(64, 1024, initial_batch_size=64)
        resolution = Resolution(adaptive)
        results["adaptive 64..1024"].append(run(data, adaptive=adaptive, seed=seed, callbacks=[resolution]))
        adaptive_runs.append((adaptive.choices, resolution.errors, adaptive.step_times))
        if controls:
            results.setdefault("fixed 256", []).append(run(data, batch_size=256, seed=seed))
            constant = ConstantSize(128, 256, initial_batch_size=256)
            results.setdefault("live, constant 256", []).append(run(data, adaptive=constant, seed=seed))
        print(f"seed {seed} done", flush=True)
    print(f"medians over seeds {SEEDS}; ms/step is the median step of the whole run")
    for target in TARGETS:
        print_time_to(target, results)
    print_breakdown(results)
    print_decisions(adaptive_runs)


def print_time_to(target, results):
    print(f"\nval_loss <= {target}")
    print(f"{'run':20s} {'seconds':>8s} {'steps':>7s} {'passes':>7s} {'ms/step':>8s}   per seed (s)")
    medians, times = {}, {}
    for name, rows in results.items():
        reached = [(r[target], ms) for r, ms, _ in rows if target in r]
        if len(reached) < len(rows):
            print(f"{name:20s} reached it in {len(reached)}/{len(rows)} seeds")
        if 2 * len(reached) <= len(rows):
            continue
        times[name] = [r[target][0] if target in r else math.inf for r, _, _ in rows]
        medians[name] = statistics.median(times[name])
        print(f"{name:20s} {medians[name]:8.1f} "
              f"{statistics.median(r[1] for r, _ in reached):7.0f} "
              f"{statistics.median(r[2] for r, _ in reached):7.2f} "
              f"{statistics.median(ms for _, ms in reached):8.1f}   "
              + " ".join(f"{r[0]:.1f}" for r, _ in reached))
    if {"fixed 64", "fixed 1024", "adaptive 64..1024"} <= medians.keys():
        better = min(("fixed 64", "fixed 1024"), key=medians.get)
        print(f"adaptive / better fixed batch: {medians['adaptive 64..1024'] / medians[better]:.2f}x (target <= 1)")
        paired = [a / f for a, f in zip(times["adaptive 64..1024"], times[better])
                  if not math.isinf(a) or not math.isinf(f)]
        print(f"per seed, adaptive / {better}: median {statistics.median(paired):.2f}x, "
              f"adaptive faster in {sum(p < 1 for p in paired)} of {len(paired)} seeds")


def print_breakdown(results):
    print("\nwhere the time of a whole run goes (medians over seeds)")
    print(f"{'run':20s} {'first step s':>12s} {'mean ms/step':>13s} {'median':>7s} {'between steps s':>16s}")
    for name, rows in results.items():
        first, mean, gaps = (statistics.median(b[i] for _, _, b in rows) for i in range(3))
        print(f"{name:20s} {first:12.2f} {mean:13.1f} {statistics.median(ms for _, ms, _ in rows):7.1f} {gaps:16.2f}")


def print_decisions(adaptive_runs):
    print()
    print("(a |G|^2 average within ~2 standard errors of 0: the noise scale read was not resolved)")
    for seed, (made, errors, timed) in zip(SEEDS, adaptive_runs):
        firsts = [(phi if math.isinf(phi) else round(phi), b) for _, phi, b in made[:6]]
        steps = {b: sum(1 for size, _ in timed if size == b) for b in sorted({b for b, _ in timed})}
        milliseconds = {b: round(1000 * statistics.median(s for size, s in timed if size == b), 1) for b in steps}
        print(f"adaptive seed {seed}: first decisions (noise scale, batch) {firsts}")
        print(f"  |G|^2 in standard errors at the decisions: min {min(errors):.1f}, "
              f"median {statistics.median(errors):.1f}, max {max(errors):.1f}")
        print(f"  steps per size {steps}; median ms per step {milliseconds}")


if __name__ == "__main__":
    main()
