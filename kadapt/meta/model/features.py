"""The meta-model's input: one fixed, normalized feature vector per observation.

This module is the single owner of the features. The record collector and the
`MetaAdjuster` both build windows with `FeatureHistory`, so a meta-model is
always fed exactly what it was trained on; `FEATURE_SPEC` travels inside every
saved meta-model and is checked when one is loaded.

An observation is taken every few optimizer steps (or at an epoch end). Each
row of a window is, for observation t with training loss L_t, validation loss
V_t (L_t when there is none) and the run's first observation's L_0, V_0:

| # | name                | value                                               |
|---|---------------------|-----------------------------------------------------|
| 0 | `train_loss`        | log(L_t / L_0), clipped to [-10, 10]                |
| 1 | `val_loss`          | log(V_t / V_0), clipped to [-10, 10]                |
| 2 | `train_slope`       | least-squares slope of log L over the last 4 obs.   |
| 3 | `train_variability` | std of log L over the last 4 observations           |
| 4 | `val_slope`         | least-squares slope of log V over the last 4 obs.   |
| 5 | `log_learning_rate` | log10(applied learning rate) / 4                    |
| 6 | `momentum`          | momentum (SGD) or beta_1 (Adam); 0 when absent      |
| 7 | `update_size`       | log10(|w_t - w_prev| / |w_t|) / 4                   |
| 8 | `update_cosine`     | cosine of the last two weight updates               |
| 9 | `budget_used`       | fraction of the planned steps done                  |
| 10| `nonfinite`         | 1 when the loss or the weights are NaN/Inf          |
| 11| `above_best`        | log(V_t / min V so far), clipped to [0, 10]         |
| 12| `schedule_ahead`    | log10(scheduled rate a quarter budget ahead / now)/4|
| 13| `range_test_gap`    | log10(range test's suggestion / applied rate)/4     |
| 14| `range_test_known`  | 1 when a range test gave a suggestion, else 0       |

`schedule_ahead` is 0 for a constant rate, negative while a schedule decays
(a cosine near its end reaches -1, the clip) and positive in a warm-up; with
`budget_used` it lets the meta-model tell a schedule's slowdown from a stall.
Slopes are per observation and clipped to [-5, 5]. The update features stand
in for the gradient norm and the consecutive-gradient cosine: they come from
the weights the callback can read, with no extra backward pass. Non-finite
values become 0 with the `nonfinite` flag set. A window holds the last
`WINDOW` observations; a short history is padded at the front with its first
row.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from kadapt._compat import learning_rate_as_set

FEATURE_VERSION = 3
WINDOW = 8
SLOPE_SPAN = 4
FEATURE_NAMES = (
    "train_loss",
    "val_loss",
    "train_slope",
    "train_variability",
    "val_slope",
    "log_learning_rate",
    "momentum",
    "update_size",
    "update_cosine",
    "budget_used",
    "nonfinite",
    "above_best",
    "schedule_ahead",
    "range_test_gap",
    "range_test_known",
)
FEATURE_SPEC = {"version": FEATURE_VERSION, "window": WINDOW, "names": list(FEATURE_NAMES)}
_LOG_CLIP = 10.0
_SLOPE_CLIP = 5.0


@dataclasses.dataclass(frozen=True)
class Observation:
    """What the run looked like at one step.

    Args:
        step: Int. Optimizer steps done.
        loss: Float. Training loss (recent mean).
        val_loss: Float or `None`. Validation loss, when measured.
        learning_rate: Float. The learning rate the optimizer applies now.
        momentum: Float. Momentum or Adam's `beta_1`; `0.0` when absent.
        weights: 1-D float array or `None`. The trainable weights, flattened;
            `None` where `update_sums` were taken beside them.
        budget_used: Float in [0, 1]. Fraction of the planned steps done.
        schedule_ahead: Float >= 0. The scheduled learning rate a quarter of
            the budget ahead over the scheduled rate now (`schedule_ratio`);
            `1.0` for a constant rate. Defaults to `1.0`.
        range_test_rate: Float or `None`. The rate a learning-rate range
            test suggested for this run (`kadapt.find_learning_rate`);
            `None` when none ran. Defaults to `None`.
        update_sums: `UpdateSums` or `None`. The update features' sums,
            where the weights are not read (`kadapt.meta.observe.device_observer`):
            then the history keeps no weights of its own. Defaults to `None`.
    """

    step: int
    loss: float
    val_loss: float | None
    learning_rate: float
    momentum: float
    weights: np.ndarray | None
    budget_used: float
    schedule_ahead: float = 1.0
    range_test_rate: float | None = None
    update_sums: UpdateSums | None = None


@dataclasses.dataclass(frozen=True)
class UpdateSums:
    """The sums `update_size` and `update_cosine` are made of, over the trainable weights w.

    Args:
        square: Float. sum(w ** 2).
        finite: Bool. Whether every weight is finite.
        update_square: Float or `None`. sum((w - w_prev) ** 2), w_prev the
            weights of the last finite observation; `None` before one.
        update_dot: Float or `None`. sum((w - w_prev) * previous update),
            the previous update that of the last finite observation; `None`
            where it had none.
    """

    square: float
    finite: bool
    update_square: float | None
    update_dot: float | None


class FeatureHistory:
    """Turns a run's observations into `(WINDOW, len(FEATURE_NAMES))` windows.

    After each `observe`, `weights_finite` says whether that observation's
    weights were all finite (the update features check it anyway; callers need
    not pass over every weight again).

    Example:

    ```python
    history = FeatureHistory()
    history.observe(Observation(step=10, loss=2.3, val_loss=2.2, learning_rate=0.1,
                                momentum=0.9, weights=flat_weights, budget_used=0.1))
    window = history.window()  # float32, shape (8, 15)
    ```
    """

    def __init__(self):
        self._rows = []
        self._train = []
        self._val = []
        self._previous_weights = None
        self._previous_update = None
        self._previous_update_norm = 0.0
        self.weights_finite = True  # whether the last observation's weights were all finite
        self._buffers = {}  # (size, dtype) -> preallocated arrays by name (`_buffer`)
        self._first = None
        self.last_loss = float("nan")
        self.last_val_loss = float("nan")

    def __len__(self):
        return len(self._rows)

    def observe(self, observation: Observation) -> None:
        """Adds one observation's feature row."""
        val_loss = observation.loss if observation.val_loss is None else observation.val_loss
        self.last_loss, self.last_val_loss = float(observation.loss), float(val_loss)
        finite_losses = _finite(observation.loss) and _finite(val_loss)
        if self._first is None and finite_losses:
            self._first = (float(observation.loss), float(val_loss))
        first_train, first_val = self._first or (1.0, 1.0)
        self._train.append(_log_ratio(observation.loss, first_train))
        self._val.append(_log_ratio(val_loss, first_val))
        sums = observation.update_sums
        size, cosine, finite_weights = self._update_features(
            self._update_sums(observation.weights) if sums is None else sums)
        self.weights_finite = finite_weights
        train_recent, val_recent = _recent_finite(self._train), _recent_finite(self._val)
        row = [
            self._train[-1],
            self._val[-1],
            _slope(train_recent),
            _variability(train_recent),
            _slope(val_recent),
            _log10(observation.learning_rate) / 4.0,
            observation.momentum,
            size,
            cosine,
            observation.budget_used,
            0.0 if finite_losses and finite_weights else 1.0,
            _above_best(self._val),
            _clip(_log10(observation.schedule_ahead) / 4.0, -1.0, 1.0),
            *_range_test_columns(observation.range_test_rate, observation.learning_rate),
        ]
        row = np.array(row, "float32")
        row[~np.isfinite(row)] = 0.0
        self._rows.append(row)

    def window(self) -> np.ndarray:
        """The last `WINDOW` rows, front-padded with the first row."""
        if not self._rows:
            raise ValueError("FeatureHistory.window() needs at least one observation.")
        rows = self._rows[-WINDOW:]
        rows = [rows[0]] * (WINDOW - len(rows)) + rows
        return np.stack(rows).astype("float32")

    def get_state(self) -> dict:
        """The rows and what the next row is computed from: arrays and floats (for a resume)."""
        return {"rows": np.stack(self._rows) if self._rows else np.zeros((0, len(FEATURE_NAMES)), "float32"),
                "train": np.asarray(self._train, "float64"), "val": np.asarray(self._val, "float64"),
                "previous_weights": _copy(self._previous_weights), "previous_update": _copy(self._previous_update),
                "first": None if self._first is None else list(self._first),
                "last_loss": self.last_loss, "last_val_loss": self.last_val_loss}

    def set_state(self, state: dict) -> None:
        """Restores what `get_state` returned."""
        self._rows = [np.asarray(row, "float32") for row in state["rows"]]
        self._train, self._val = [float(v) for v in state["train"]], [float(v) for v in state["val"]]
        self._previous_weights, self._previous_update = state["previous_weights"], state["previous_update"]
        if self._previous_update is not None:
            self._previous_update_norm = _norm(np.asarray(self._previous_update).ravel())
        self._first = None if state["first"] is None else tuple(float(v) for v in state["first"])
        self.last_loss, self.last_val_loss = float(state["last_loss"]), float(state["last_val_loss"])

    def pop_previous(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The weights of the last finite observation and its update (`None` where none), handed
        over to whoever reduces the next update (`kadapt.meta.observe.device_observer`); the history
        keeps none of them after."""
        previous = (self._previous_weights, self._previous_update)
        self._previous_weights = self._previous_update = None
        return previous

    def _update_sums(self, weights):
        # In the weights' own float32 (differences exact to a rounding), the update into one of two
        # preallocated arrays: no float64 copy and no fresh array of every weight at each
        # observation (a 5.8M-weight MLP: ~90 ms of host arithmetic an observation before).
        weights = np.asarray(weights).ravel()
        if weights.dtype not in (np.float32, np.float64):
            weights = weights.astype("float64")
        square = _dot(weights, weights)
        # A finite sum of squares means every weight is finite; else look (it may have overflowed).
        finite = math.isfinite(square) or bool(np.isfinite(weights).all())
        update_square = update_dot = None
        previous = self._previous_weights
        if finite and previous is not None:
            if np.shape(previous) == weights.shape and np.asarray(previous).dtype == weights.dtype:
                # Two update arrays in turn: the one not holding the previous update takes this one.
                update = self._update_array(weights)
                np.subtract(weights, previous, out=update)
            else:  # a state restored from another precision
                update = weights - previous
            update_square = _dot(update, update)
            if self._previous_update is not None:
                update_dot = _dot(update, self._previous_update)
            self._previous_update = update
        if finite:
            kept = self._buffer(weights, "previous")
            np.copyto(kept, weights)  # a copy: the caller may reuse its array for the next observation
            self._previous_weights = kept
        return UpdateSums(square, finite, update_square, update_dot)

    def _update_features(self, sums):
        """`(update_size, update_cosine, finite)` from `sums`; keeps the update's norm for the
        next cosine."""
        size, cosine = -3.0, 0.0  # no update seen yet: "tiny", "unrelated"
        if sums.finite and sums.update_square is not None:
            update_norm = math.sqrt(max(sums.update_square, 0.0))
            size = _log10(update_norm / max(math.sqrt(sums.square), 1e-12)) / 4.0
            if sums.update_dot is not None:
                denominator = update_norm * self._previous_update_norm
                cosine = sums.update_dot / denominator if denominator > 0 else 0.0
            self._previous_update_norm = update_norm
        return size, cosine, sums.finite

    def _update_array(self, like):
        """The preallocated update array not holding the previous update (still needed for the
        cosine): two of `like`'s size and dtype, in turn."""
        first, second = self._buffer(like, "update"), self._buffer(like, "second update")
        return second if self._previous_update is first else first

    def _buffer(self, like, name):
        """The preallocated array `name` of `like`'s size and dtype (all of them made anew when
        those change)."""
        key = (like.size, like.dtype.str)
        if key not in self._buffers:
            self._buffers = {key: {}}
        buffers = self._buffers[key]
        if name not in buffers:
            buffers[name] = np.empty_like(like)
        return buffers[name]


def schedule_ratio(optimizer: Any, step: int, total_steps: int | None) -> float:
    """The scheduled rate a quarter of `total_steps` after `step` over the rate at `step`.

    `1.0` for a float learning rate or an unknown budget. The live multiplier
    (the adjuster's own changes) is left out: it scales both alike.
    """
    import keras

    schedule = learning_rate_as_set(optimizer)
    if not total_steps or not isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
        return 1.0
    ahead = min(step + max(total_steps // 4, 1), total_steps)
    now = float(keras.ops.convert_to_numpy(schedule(step)))
    later = float(keras.ops.convert_to_numpy(schedule(ahead)))
    return later / now if now > 0 and math.isfinite(later) else 1.0


def _range_test_columns(suggestion, learning_rate):
    """`range_test_gap` and `range_test_known`: (0, 0) without a usable suggestion or rate."""
    if not (_finite(suggestion) and suggestion > 0 and _finite(learning_rate) and learning_rate > 0):
        return 0.0, 0.0
    return _clip(math.log10(suggestion / learning_rate) / 4.0, -1.0, 1.0), 1.0


# The row is computed in plain Python floats: an observation is taken every few steps inside
# `fit`, and NumPy's per-call cost on a 4-value list (np.polyfit, np.clip, np.std) made these
# columns ~0.4 ms of it on a 2-core CPU; the closed forms below take a few microseconds.
def _clip(value, low, high):
    return value if math.isnan(value) else min(max(value, low), high)


def _finite(value):
    return value is not None and math.isfinite(float(value))


def _log_ratio(value, reference):
    if not _finite(value) or value <= 0 or reference <= 0:
        return float("nan")
    return _clip(math.log(value / reference), -_LOG_CLIP, _LOG_CLIP)


def _log10(value):
    return math.log10(value) if _finite(value) and value > 0 else -3.0 * 4.0


def _recent_finite(values):
    return [value for value in values[-SLOPE_SPAN:] if math.isfinite(value)]


def _slope(recent):
    """The least-squares slope of `recent` over 0, 1, ..., n-1 (as `np.polyfit(..., 1)[0]`)."""
    count = len(recent)
    if count < 2:
        return 0.0
    mean_step, mean_value = (count - 1) / 2.0, math.fsum(recent) / count
    covariance = math.fsum((step - mean_step) * (value - mean_value) for step, value in enumerate(recent))
    spread = count * (count * count - 1) / 12.0  # sum of (step - mean_step)**2
    return _clip(covariance / spread, -_SLOPE_CLIP, _SLOPE_CLIP)


def _variability(recent):
    """The population standard deviation of `recent` (as `np.std`)."""
    if not recent:
        return 0.0
    mean = math.fsum(recent) / len(recent)
    return _clip(math.sqrt(math.fsum((value - mean) ** 2 for value in recent) / len(recent)), 0.0, _SLOPE_CLIP)


def _above_best(values):
    finite = [value for value in values if math.isfinite(value)]
    if not finite or not math.isfinite(values[-1]):
        return _LOG_CLIP
    return _clip(values[-1] - min(finite), 0.0, _LOG_CLIP)


# `einsum` sums the products in one pass without BLAS and without a temporary array: beside
# TensorFlow's threads a threaded BLAS call on a vector of 50k weights took ~20 ms here, and
# `np.add.reduce(a * b)` writes and reads a product array (5.8M float32 weights: 4.2 + 1.5 ms against
# 1.3 ms). In float32 its rounding stays far below what a feature resolves: against a float64 sum,
# 9e-8 of it at 50k weights, 6e-7 at 5.8M, 1.6e-6 at 50M. A float32 sum of squares overflows for
# weights near 1e19: the row's value is then not finite and becomes 0, as for a diverged run.
def _dot(a, b):
    with np.errstate(over="ignore", invalid="ignore"):
        return float(np.einsum("i,i->", a, b))


def _norm(a):
    return math.sqrt(_dot(a, a))


def _copy(array):
    return None if array is None else np.array(array)
