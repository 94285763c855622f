"""A trial that runs the step `fit` will run: Keras' own data path, each step's peak measured.

`train_on_batch` converts one batch and runs it; `fit` also feeds its data
through tf.data: given arrays it may copy them into the allocator (in three
of five fits of one process measured), it gathers each batch in a map and
holds batches ahead of the step. On the CPU all of it is in the
allocator's peak: in one process `fit` trials peaked 7-12 MiB above
`train_on_batch` at the same sizes (docs/probe.md). So a trial calls `fit`
on the data `fit` will get (the arrays as given when they hold enough full
batches or exactly one, a dataset repeated, else the sample rows repeated),
and reads the allocator's peak around each step.
"""

from __future__ import annotations

import time
from typing import Any

import keras
import tensorflow as tf


class StepPeaks(keras.callbacks.Callback):
    """Each step's peak bytes on `device` and its seconds, as `fit` trains.

    Args:
        device: String. The device whose allocator is read (`"CPU:0"`).
    """

    def __init__(self, device: str) -> None:
        super().__init__()
        self.device = device
        self.peaks, self.seconds = [], []
        self._start = None

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        tf.config.experimental.reset_memory_stats(self.device)
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.seconds.append(time.perf_counter() - self._start)
        self.peaks.append(tf.config.experimental.get_memory_info(self.device)["peak"])


def fit_steps(model: keras.Model, data: Any, sample: tuple, rows: int, steps: int, device: str,
              repeat_rows: Any) -> StepPeaks:
    """Runs `steps` steps of `rows` rows through `model.fit` and returns their
    `StepPeaks`. `data`: `(x, y, sample_weight)` arrays or a dataset, and
    `sample` its rows (the dataset's first batch); `repeat_rows(rows)` gives
    `(x, y, sample_weight)` of `rows` rows of the sample (cycled), for data
    that holds neither `steps` full batches nor exactly one."""
    measured = StepPeaks(device)
    model.fit(**feed(data, sample, rows, steps, repeat_rows), verbose=0, shuffle=False,
              callbacks=[measured])
    return measured


def feed(data: Any, sample: tuple, rows: int, steps: int, repeat_rows: Any) -> dict[str, Any]:
    """`fit`'s keyword arguments for `steps` steps of `rows` rows, the data
    as `fit` will be given it where it can be."""
    count = int(next(a for a in keras.tree.flatten(sample[0]) if a is not None).shape[0])
    if isinstance(data, tf.data.Dataset):
        if count == rows:
            return {"x": data.repeat(), "steps_per_epoch": steps}
        data, count = sample, 0  # another batch than the dataset's: cut from its rows
    x, y, sample_weight = data
    if count >= steps * rows:
        return {"x": x, "y": y, "sample_weight": sample_weight, "batch_size": rows,
                "steps_per_epoch": steps}
    if count == rows:  # one batch an epoch, as `fit` will see it
        return {"x": x, "y": y, "sample_weight": sample_weight, "batch_size": rows, "epochs": steps}
    x, y, sample_weight = repeat_rows(rows * steps)
    return {"x": x, "y": y, "sample_weight": sample_weight, "batch_size": rows,
            "steps_per_epoch": steps}
