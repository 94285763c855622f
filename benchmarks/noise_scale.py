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
slower than the better fixed batch. Medians over 5 seeds; a seed that never
reached a target counts as the slowest.

Run: `make install && .venv/bin/python benchmarks/noise_scale.py`
"""

import math
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import kadapt  # noqa: E402

TARGETS = (0.36, 0.34, 0.33)  # validation losses; a run stops at the last
PASS_ROWS = 54_000  # training rows; the last 6 000 validate
MAX_EPOCHS = 12
MICRO = 32
BASE_LR, BASE_BATCH = 1e-3, 64
SEEDS = (0, 1, 2, 3, 4)
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
        self.started, self.rows, self.evaluated = time.perf_counter(), 0, 0
        self.reached = {}  # target -> (seconds, steps, passes)
        self.step_seconds = []

    def on_train_batch_begin(self, batch, logs=None):
        self._step_started = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.step_seconds.append(time.perf_counter() - self._step_started)
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


def run(data, batch_size=None, adaptive=None, seed=0):
    """{target: (seconds, steps, passes)} for the targets reached, and the
    median ms per step."""
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
                  callbacks=[adaptive, clock])
    return clock.reached, 1000 * statistics.median(clock.step_seconds[1:])


def main():
    (x, y), _ = kadapt.datasets.fashion_mnist()
    x = x.astype("float32") / 255.0
    data = ((x[:PASS_ROWS], y[:PASS_ROWS]), (x[PASS_ROWS:], y[PASS_ROWS:]))
    results = {"fixed 64": [], "fixed 1024": [], "adaptive 64..1024": []}
    adaptive_runs = []  # (decisions, step times) per seed
    for seed in SEEDS:  # alternate configurations within each seed
        results["fixed 64"].append(run(data, batch_size=64, seed=seed))
        results["fixed 1024"].append(run(data, batch_size=1024, seed=seed))
        adaptive = kadapt.AdaptiveBatchSize(64, 1024, initial_batch_size=64)
        results["adaptive 64..1024"].append(run(data, adaptive=adaptive, seed=seed))
        adaptive_runs.append((adaptive.choices, adaptive.step_times))
        print(f"seed {seed} done", flush=True)
    print(f"medians over seeds {SEEDS}; ms/step is the median step of the whole run")
    for target in TARGETS:
        print(f"\nval_loss <= {target}")
        print(f"{'run':20s} {'seconds':>8s} {'steps':>7s} {'passes':>7s} {'ms/step':>8s}   per seed (s)")
        medians = {}
        for name, rows in results.items():
            reached = [(r[target], ms) for r, ms in rows if target in r]
            if len(reached) < len(rows):
                print(f"{name:20s} reached it in {len(reached)}/{len(rows)} seeds")
            if 2 * len(reached) <= len(rows):
                continue
            seconds = [r[target][0] if target in r else math.inf for r, _ in rows]
            medians[name] = statistics.median(seconds)
            print(f"{name:20s} {medians[name]:8.1f} "
                  f"{statistics.median(r[1] for r, _ in reached):7.0f} "
                  f"{statistics.median(r[2] for r, _ in reached):7.2f} "
                  f"{statistics.median(ms for _, ms in reached):8.1f}   "
                  + " ".join(f"{r[0]:.1f}" for r, _ in reached))
        if len(medians) == 3:
            better = min(medians["fixed 64"], medians["fixed 1024"])
            print(f"adaptive / better fixed batch: {medians['adaptive 64..1024'] / better:.2f}x (target <= 1)")
    print()
    for seed, (made, timed) in zip(SEEDS, adaptive_runs):
        firsts = [(phi if math.isinf(phi) else round(phi), b) for _, phi, b in made[:6]]
        steps = {b: sum(1 for size, _ in timed if size == b) for b in sorted({b for b, _ in timed})}
        milliseconds = {b: round(1000 * statistics.median(s for size, s in timed if size == b), 1) for b in steps}
        print(f"adaptive seed {seed}: first decisions (noise scale, batch) {firsts}")
        print(f"  steps per size {steps}; median ms per step {milliseconds}")


if __name__ == "__main__":
    main()
