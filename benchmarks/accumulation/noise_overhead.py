"""Overhead of measuring the gradient noise scale inside the accumulating step.

kadapt.accumulate(B=512, m=128) with and without `measure_noise=True`, on the
small CNN with Fashion-MNIST-shaped random data, timed in alternation in one
process (medians of 9 rounds of 16,384 rows). Target (issue 6): <= 3% of step
time.

Run: `make install && .venv/bin/python benchmarks/accumulation/noise_overhead.py`
"""

import statistics
import time

from kadapt import environment  # noqa: E402

environment.load_tensorflow()  # oneDNN on before TensorFlow loads, its C++ start-up lines held back

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kadapt  # noqa: E402
from accumulation import small_cnn  # noqa: E402

ROWS, ROUNDS, LOGICAL, MICRO = 16_384, 9, 512, 128


def trainer(measure_noise):
    model = kadapt.accumulate(small_cnn(), MICRO, measure_noise=measure_noise)
    model.compile(
        optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def main():
    rng = np.random.default_rng(0)
    x = rng.random((ROWS, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, ROWS)
    runs = {"without noise scale": trainer(False), "measure_noise=True": trainer(True)}
    for model in runs.values():
        model.fit(x[:2048], y[:2048], batch_size=LOGICAL, verbose=0)
    seconds = {name: [] for name in runs}
    for _ in range(ROUNDS):
        for name, model in runs.items():
            start = time.perf_counter()
            model.fit(x, y, batch_size=LOGICAL, epochs=1, verbose=0, shuffle=False)
            seconds[name].append(time.perf_counter() - start)
    base = statistics.median(seconds["without noise scale"])
    for name, values in seconds.items():
        median = statistics.median(values)
        print(f"{name:22s} {ROWS / median:8.0f} samples/s  step time x{median / base:.3f}")


if __name__ == "__main__":
    main()
