"""`AdaptiveBatchSize`: the logical batch that maximizes goodput, live or between epochs.

Goodput (AdaptDL / Pollux) = throughput(B) x statistical efficiency(B):

    throughput(B) = B / (alpha + beta * B)     (seconds per step, fitted)
    efficiency(B) = (phi + B0) / (phi + B)      (phi: the gradient noise scale)

alpha is what a step costs whatever its size (the optimizer update, Python,
callbacks), beta the cost per row. Clean data (small phi) wants small batches,
noisy data larger ones; the optimum is near sqrt(alpha * phi / beta).
"""

from __future__ import annotations

import collections
import math
import time
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import keras
import numpy as np

from kadapt.extras import require
from kadapt.optimizers.live_rate import learning_rate_multiplier
from kadapt.optimizers.live_rate import live_rate_of
from kadapt.optimizers.live_rate import set_learning_rate_multiplier
from kadapt.validation import check_micro_batch_size
from kadapt.validation import check_range

if TYPE_CHECKING:
    import tensorflow as tf

LR_SCALING = ("sqrt", "linear", "none")


def goodput(batch_size: float, alpha: float, beta: float, noise_scale: float, reference: float) -> float:
    """Samples of progress per second at `batch_size` (see the module
    docstring); an infinite noise scale makes every size equally efficient."""
    throughput = batch_size / (alpha + beta * batch_size)
    if math.isinf(noise_scale):
        return throughput
    return throughput * (noise_scale + reference) / (noise_scale + batch_size)


def choose_batch_size(candidates: Sequence[int], alpha: float, beta: float, noise_scale: float,
                      reference: float) -> int:
    """The candidate with the largest goodput."""
    return max(candidates, key=lambda b: goodput(b, alpha, beta, max(noise_scale, 0.0), reference))


class AdaptiveBatchSize(keras.callbacks.Callback):
    """Chooses the logical batch size from the noise scale, live or between epochs.

    Needs a model built with `measure_noise=True` (`kadapt.accumulate`): the
    micro-batch, and so the memory, stays as planned; only the number of
    micro-batches per step changes. It fits seconds per step = alpha + beta * B
    to the steps it timed, reads the noise scale (see `noise_scale()`: while
    the gradient is still below the noise the steps could resolve, every
    size counts as equally efficient, and the size grows at most 2x per
    decision), and sets `batch_size` to the
    power of two in [min, max] with the best goodput, rescaling the learning
    rate by `lr_scaling` ("sqrt": by sqrt(B_new / B_old), the default;
    "linear"; or "none") through the optimizer's `learning_rate_multiplier`
    (kadapt optimizers; on another optimizer under a schedule, the one
    `kadapt.optimizers.live_rate` installs at train begin) or its float
    learning rate.

    Two ways to feed it:

    - **Live** (the fast one): train on `adaptive.dataset(x, y)`, whose
      batches take the callback's size as they are drawn. It decides every
      `interval` steps and at epoch ends; each change reaches the very next
      batch, with its learning rate. Every row is trained once per pass. An
      epoch is one pass, except that Keras caps the steps of later epochs
      of a dataset of unknown length at those of the first: after the
      batch shrank below the first epoch's sizes, a pass cut short by the cap
      goes on in the next epoch.

      ```python
      adaptive = kadapt.AdaptiveBatchSize(64, 2048)
      model.fit(adaptive.dataset(x, y, seed=0), epochs=10, callbacks=[adaptive])
      ```

    - **Between epochs**: Keras fixes the batch size of a running `fit` for
      array inputs, so train one epoch per `fit` and pass the current size;
      it decides at epoch ends only.

      ```python
      adaptive = kadapt.AdaptiveBatchSize(64, 2048, initial_batch_size=128)
      for epoch in range(10):
          model.fit(x, y, batch_size=adaptive.batch_size, initial_epoch=epoch,
                    epochs=epoch + 1, callbacks=[adaptive])
      ```

    Args:
        min_batch_size: Positive int, above the model's micro-batch (the
            noise scale needs two micro-batches per step).
        max_batch_size: Int >= `min_batch_size`.
        initial_batch_size: Int in [min, max], the B0 of the efficiency
            formula. Defaults to `min_batch_size`.
        lr_scaling: One of "sqrt", "linear", "none". Defaults to "sqrt".
        interval: Positive int. Steps between live decisions. Defaults to
            `50`.
    """

    def __init__(self, min_batch_size: int, max_batch_size: int, initial_batch_size: int | None = None,
                 lr_scaling: str = "sqrt", interval: int = 50) -> None:
        super().__init__()
        low = check_micro_batch_size(min_batch_size, name="min_batch_size")
        high = check_micro_batch_size(max_batch_size, name="max_batch_size")
        if low > high:
            raise ValueError(
                "Argument `min_batch_size` must be <= `max_batch_size`. "
                f"Received: min_batch_size={low}, max_batch_size={high}"
            )
        initial = low if initial_batch_size is None else check_micro_batch_size(
            initial_batch_size, name="initial_batch_size")
        if not low <= initial <= high:
            raise ValueError(
                f"Argument `initial_batch_size` must be in [{low}, {high}]. "
                f"Received: initial_batch_size={initial}"
            )
        if lr_scaling not in LR_SCALING:
            raise ValueError(f"Argument `lr_scaling` must be one of {LR_SCALING}. Received: lr_scaling={lr_scaling!r}")
        self.min_batch_size, self.max_batch_size = low, high
        self.reference = self.batch_size = initial
        self.lr_scaling = lr_scaling
        check_range("interval", interval, low=1, integer=True)
        self.interval = int(interval)
        self.rows_trained = 0  # live mode: rows of every step trained so far
        self.step_times = collections.deque(maxlen=10_000)  # the last (batch size, seconds per step)
        self._seconds_by_size = collections.defaultdict(lambda: collections.deque(maxlen=100))
        self.choices = []  # (epoch, noise scale, batch size chosen)
        self._lr_batch_size = initial  # the size the learning rate is scaled for
        self._live_size = None  # live mode: the variable each draw reads its size from
        self._next_size = None  # live mode: rows of the batch the coming step draws
        self._drawn_to = None  # live mode: the position in the pass after that draw

    def dataset(self, x: Any, y: Any, shuffle: bool = True, seed: int | None = None) -> tf.data.Dataset:
        """A `tf.data.Dataset` of `(x, y)` batches of `self.batch_size` rows,
        read as each batch is drawn; a new order every pass when `shuffle`.

        Each batch is drawn in the graph when Keras asks for it (no Python
        generator, no prefetch), which keeps its size and its learning rate
        in step with the callback: feed it to `fit` as it is. A dataset read
        ahead (`prefetch`, `cache`), `steps_per_epoch` or
        `steps_per_execution > 1` raises `ValueError`.

        Args:
            x: NumPy array (or anything `np.asarray` takes) of inputs, rows first.
            y: Array of targets with as many rows.
            shuffle: Bool. Defaults to `True`.
            seed: Int or `None`. Seeds the order. Defaults to `None`.

        Raises:
            kadapt.extras.MissingExtraError: TensorFlow (tf.data, on any Keras
                backend) is not installed.
        """
        tf = require("tensorflow", extra="tensorflow")
        x, y = np.asarray(x), np.asarray(y)
        if not x.ndim or not y.ndim or len(x) != len(y) or not len(x):
            raise ValueError(
                "Arguments `x` and `y` must hold the same number (> 0) of rows. "
                f"Received: x.shape={x.shape}, y.shape={y.shape}"
            )
        rows = self._rows = len(x)
        seed = np.random.default_rng(seed).integers(2**62)
        # The live state: the size each draw reads, the next row of the pass
        # (`rows` once a pass is done) and the pass's order.
        self._live_size = tf.Variable(self.batch_size, dtype=tf.int64, trainable=False)
        self._position = tf.Variable(rows, dtype=tf.int64, trainable=False)
        passes = tf.Variable(-1, dtype=tf.int64, trainable=False)
        order = tf.Variable(tf.range(rows, dtype=tf.int64), trainable=False)

        def draw(step, data):
            # An iterator's first draw after a finished pass starts the next
            # one; a later draw after it ends the epoch (an empty batch).
            if step == 0 and self._position >= rows:
                passes.assign_add(1)
                if shuffle:
                    order.assign(tf.random.experimental.stateless_shuffle(
                        tf.range(rows, dtype=tf.int64), seed=tf.stack([seed, passes.read_value()])))
                self._position.assign(0)
            start = self._position.read_value()
            stop = tf.minimum(start + self._live_size, rows)
            self._position.assign(stop)  # after the read: stop is computed from it
            batch = order[start:stop]
            return tf.gather(data[0], batch), tf.gather(data[1], batch)

        # The rows are gathered in the graph, as Keras' own array adapter does
        # (a Python generator cost ~0.5 ms a step on this CPU).
        arrays = tf.data.Dataset.from_tensors((x, y)).repeat()
        batches = tf.data.Dataset.zip((tf.data.Dataset.range(2**62), arrays)).map(draw)
        batches = batches.take_while(lambda inputs, _: tf.shape(inputs)[0] > 0)
        options = tf.data.Options()  # nothing drawn ahead of the step that trains it
        options.experimental_optimization.inject_prefetch = False
        options.experimental_optimization.map_parallelization = False
        options.deterministic = True
        return batches.with_options(options)

    def candidates(self) -> list[int]:
        powers = [2**k for k in range(64) if self.min_batch_size <= 2**k <= self.max_batch_size]
        return sorted({self.min_batch_size, self.max_batch_size, *powers})

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if not getattr(self.model, "measure_noise", False):
            raise ValueError(
                "`AdaptiveBatchSize` reads the gradient noise scale: build the model with "
                "`kadapt.accumulate(model, micro_batch_size, measure_noise=True)`. "
                f"Received: model={self.model.name!r} without measure_noise"
            )
        micro = self.model.micro_batch_size
        if isinstance(micro, int) and self.min_batch_size <= micro:
            raise ValueError(
                "Argument `min_batch_size` must exceed the micro-batch (two micro-batches "
                f"per step). Received: min_batch_size={self.min_batch_size}, micro_batch_size={micro}"
            )
        steps = self.params.get("steps") if self.params else None
        if self._live_size is not None and steps is not None:
            raise ValueError(
                "`AdaptiveBatchSize.dataset` ends each epoch at the end of a pass: call `fit` "
                f"without `steps_per_epoch`. Received: steps_per_epoch={steps}"
            )
        per_execution = getattr(self.model, "steps_per_execution", 1)
        if self._live_size is not None and per_execution != 1:
            raise ValueError(
                "`AdaptiveBatchSize.dataset` sets each step's learning rate before the step, "
                "which needs one step per call: compile with `steps_per_execution=1`. "
                f"Received: steps_per_execution={per_execution}"
            )
        self._first_batch = True
        if self._live_size is not None:
            self._quiet_epoch_ends()
        if self.lr_scaling != "none" and not isinstance(self.model.optimizer.learning_rate, keras.Variable):
            live_rate_of(self.model)  # a schedule is scaled through the multiplier: installed before the first step

    def _quiet_epoch_ends(self):
        # The live dataset ends each epoch at the end of a pass, by design;
        # Keras warns "Your input ran out of data" whenever a dataset of
        # unknown length ends. Only that message, only during this `fit`.
        self._warning_filters = warnings.catch_warnings()
        self._warning_filters.__enter__()
        warnings.filterwarnings("ignore", message="Your input ran out of data", category=UserWarning)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if getattr(self, "_warning_filters", None) is not None:
            self._warning_filters.__exit__(None, None, None)
            self._warning_filters = None

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._live_size is not None:
            # The coming step draws its batch now, from the variables this
            # reads: its rows, and its learning rate set before it trains.
            position = int(self._position.numpy())
            if batch > 0 and position != self._drawn_to:
                raise ValueError(
                    "`AdaptiveBatchSize.dataset` was read ahead of training (a `prefetch`, "
                    "`cache` or other transformation after it), so its batches would train "
                    "at the wrong size and learning rate: pass it to `fit` as it is. Received: "
                    f"position {position} in the pass where the steps so far drew {self._drawn_to}"
                )
            if position >= self._rows and batch == 0:
                position = 0  # the draw starts a new pass
            self._next_size = min(self.batch_size, self._rows - position)
            self._drawn_to = position + self._next_size
            if self._next_size:  # else the pass is over: the epoch ends without a step
                self._sync_learning_rate(self._next_size)
        self._started = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        seconds = time.perf_counter() - self._started
        size = self.batch_size if self._live_size is None else self._next_size
        if self._first_batch:  # includes tracing
            self._first_batch = False
        else:
            self._record_step(size, seconds)
        if self._live_size is not None:
            self.rows_trained += size
            if (batch + 1) % self.interval == 0:
                self._decide(self._epoch)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch

    def _record_step(self, size, seconds):
        self.step_times.append((size, seconds))
        self._seconds_by_size[size].append(seconds)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._decide(epoch)

    def noise_scale(self) -> float | None:
        """The model's noise scale as the policy reads it: `None` before any
        measurement, `inf` while the EMA of |G|^2 is not positive (the true
        gradient is still below the noise the steps so far could resolve, so
        a larger batch loses nothing), never negative."""
        trace = float(self.model.noise_scale.trace.numpy())
        squared_norm = float(self.model.noise_scale.squared_norm.numpy())
        if squared_norm > 0.0:
            return max(trace / squared_norm, 0.0)
        return math.inf if trace > 0.0 else None

    def _decide(self, epoch):
        noise_scale = self.noise_scale()
        if noise_scale is not None:  # nothing measured yet: keep the size
            alpha, beta = self.step_cost()
            candidates = self.candidates()
            if math.isinf(noise_scale):
                # Unresolved says only that the sizes trained so far could not
                # resolve the gradient, not that any size can't: grow at most
                # 2x per decision. (Without the cap, one benchmark seed,
                # unresolved for 300+ steps, went from 64 to 1024 at once.)
                candidates = [b for b in candidates if b <= 2 * self.batch_size]
            chosen = choose_batch_size(candidates, alpha, beta, noise_scale, self.reference)
            self.choices.append((epoch, noise_scale, chosen))
            self.batch_size = chosen
            if self._live_size is not None:
                self._live_size.assign(chosen)
        if self._live_size is None:  # between epochs (live, each step syncs to the batch it draws)
            self._sync_learning_rate(self.batch_size)

    def _sync_learning_rate(self, batch_size):
        """Rescales the learning rate from the size it is scaled for to
        `batch_size`, that of the next step."""
        if batch_size != self._lr_batch_size:
            self._rescale_learning_rate(batch_size / self._lr_batch_size)
            self._lr_batch_size = batch_size

    def step_cost(self) -> tuple[float, float]:
        """(alpha, beta) of seconds per step = alpha + beta * B, fitted to the
        median of the last 100 timed steps of each size (a garbage collection
        moves a mean far, a median not), each weighted by sqrt(steps): a
        pass's ragged last batch is timed once."""
        timed = {size: seconds for size, seconds in self._seconds_by_size.items() if seconds}
        sizes = np.array(sorted(timed), dtype=float)
        medians = np.array([np.median(timed[size]) for size in sorted(timed)])
        counts = np.array([len(timed[size]) for size in sorted(timed)], dtype=float)
        if len(sizes) >= 2:
            beta, alpha = np.polyfit(sizes, medians, 1, w=np.sqrt(counts))
            if alpha > 0 and beta > 0:
                return float(alpha), float(beta)
        # One size seen (or a degenerate fit): split the time evenly between
        # the fixed and the per-row part until a second size is measured.
        if not len(sizes):
            return 0.5, 0.5 / self.batch_size
        most = int(np.argmax(counts))
        return medians[most] / 2, medians[most] / (2 * sizes[most])

    def _rescale_learning_rate(self, ratio):
        factor = {"sqrt": math.sqrt(ratio), "linear": ratio, "none": 1.0}[self.lr_scaling]
        if factor == 1.0:
            return
        optimizer = self.model.optimizer
        multiplier = learning_rate_multiplier(optimizer)
        if multiplier is not None:
            set_learning_rate_multiplier(optimizer, float(keras.ops.convert_to_numpy(multiplier)) * factor)
            return
        current = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
        optimizer.learning_rate = current * factor
