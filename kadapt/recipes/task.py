"""`Task`: what a network predicts (classes or a value) and how it is trained and scored.

Classification: one logit per class, trained on one-hot (smoothed)
cross-entropy, scored by accuracy. Regression: one output, trained with the
mean squared error on the target standardized with the training rows' mean
and standard deviation, z = (y - mean) / std, so a target in the thousands
meets the recipe's rates as a target near 1 does; it is scored in the
target's own units (the network's output times std plus mean): MSE, MAE,
RMSE and R² = 1 - SSE / SST.

Imports no Keras until a loss or metric is asked for (the command line's
parser and `kadapt report` read tasks).
"""

import dataclasses

import numpy as np

CLASSIFICATION = "classification"
REGRESSION = "regression"
KINDS = (CLASSIFICATION, REGRESSION)


@dataclasses.dataclass(frozen=True)
class Task:
    """The kind of prediction, its output width and (regression) the target's scaling.

    Args:
        kind: String. `"classification"` or `"regression"`. Defaults to
            `"classification"`.
        outputs: Int or `None`. The network's output width: the classes, or 1
            for regression. Defaults to `None` (classification: from the labels).
        target_mean: Float. Regression: the training targets' mean. Defaults to `0.0`.
        target_std: Positive float. Regression: their standard deviation.
            Defaults to `1.0`.

    Example:

    ```python
    task = Task.regression(np.array([1000.0, 3000.0]))
    task.targets(np.array([3000.0]))  # [[1.]]
    ```
    """

    kind: str = CLASSIFICATION
    outputs: int | None = None
    target_mean: float = 0.0
    target_std: float = 1.0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Argument `kind` must be one of {', '.join(KINDS)}. Received: kind={self.kind!r}")
        if not self.target_std > 0:
            raise ValueError(f"Argument `target_std` must be positive. Received: target_std={self.target_std}")

    @classmethod
    def regression(cls, y_train):
        """The regression task of the training targets `y_train` (N,), standardized with their mean and std."""
        y = np.asarray(y_train, "float64")
        return cls(REGRESSION, 1, float(y.mean()), float(y.std()))

    @property
    def is_regression(self):
        return self.kind == REGRESSION

    def targets(self, y, num_classes=None):
        """Float32 training targets of labels `y` (N,): one-hot rows (N, classes),
        or the standardized target (N, 1). One-hot (N, C) labels pass through."""
        y = np.asarray(y)
        if self.is_regression:
            return ((y.astype("float64") - self.target_mean) / self.target_std).astype("float32").reshape(-1, 1)
        if y.ndim == 2:
            return y.astype("float32")
        return np.eye(num_classes or self.outputs, dtype="float32")[y.astype(int)]

    def values(self, outputs):
        """The network's regression outputs (N, 1) in the target's units (N,)."""
        return np.asarray(outputs, "float64").reshape(-1) * self.target_std + self.target_mean

    def loss(self, label_smoothing=0.0):
        """The Keras loss: smoothed cross-entropy from logits, or the mean squared error."""
        import keras

        if self.is_regression:
            return keras.losses.MeanSquaredError()
        return keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=label_smoothing)

    def metrics(self):
        """The Keras metrics logged while training: accuracy, or none beyond
        the loss for regression (its scores are in the target's units, at the end)."""
        import keras

        return [] if self.is_regression else [keras.metrics.CategoricalAccuracy(name="accuracy")]

    def scores(self, outputs, y):
        """The test scores of network `outputs` on labels `y`: `{"loss",
        "accuracy"}` (unsmoothed cross-entropy), or `{"loss", "mse", "mae",
        "rmse", "r2"}` in the target's units (`loss` is the MSE)."""
        if self.is_regression:
            return regression_scores(self.values(outputs), y)
        import keras

        labels = np.asarray(y).astype(int)
        outputs = np.asarray(outputs, "float32")  # a mixed-precision network's bfloat16 would be averaged in bfloat16
        loss = keras.losses.sparse_categorical_crossentropy(labels, outputs, from_logits=True)
        return {"loss": float(np.mean(keras.ops.convert_to_numpy(loss))),
                "accuracy": float(np.mean(np.asarray(outputs).argmax(-1) == labels))}

    def chance_loss(self, y_train, label_smoothing=0.0, y_scored=None):
        """The loss of the best constant predictor on `y_train`: what a run
        that learned nothing sits at, on `y_train` or, given, on `y_scored`
        (the labels of the rows a monitored loss is taken on).

        Classification: the entropy -sum_c q_c ln q_c of the smoothed label
        frequencies q = (1 - s) p + s / C (p the classes' frequencies, s the
        label smoothing, C the classes): the best constant logits predict q,
        the mean smoothed target. Regression: the variance of the
        standardized targets (1 on the rows they were standardized with).
        """
        from kadapt.meta.live.chance_loss import chance_loss
        from kadapt.meta.live.chance_loss import regression_chance_loss

        y = np.asarray(y_train)
        scored = None if y_scored is None else np.asarray(y_scored)
        if self.is_regression:
            return regression_chance_loss(self.targets(y), None if scored is None else self.targets(scored))
        return chance_loss(y, max(self.outputs or 0, int(y.max()) + 1, 2), label_smoothing, scored)

    def to_dict(self):
        return dataclasses.asdict(self)


def regression_scores(predicted, y):
    """`{"loss", "mse", "mae", "rmse", "r2"}` of `predicted` against `y` (both (N,));
    R² = 1 - sum (y - predicted)² / sum (y - mean y)²."""
    sums = RegressionSums()
    sums.add(predicted, y)
    return sums.scores()


class RegressionSums:
    """`regression_scores` of predictions given a batch at a time: the errors'
    sums and the labels' mean and squared deviations, merged batch by batch
    (Chan et al.'s parallel variance)."""

    def __init__(self):
        self.rows, self.squared, self.absolute, self.mean, self.deviations = 0, 0.0, 0.0, 0.0, 0.0

    def add(self, predicted, y):
        y = np.asarray(y, "float64").reshape(-1)
        error = np.asarray(predicted, "float64").reshape(-1) - y
        if not len(y):
            return
        rows, mean = len(y), float(y.mean())
        deviations = float(np.sum((y - mean) ** 2))
        total = self.rows + rows
        self.deviations += deviations + (mean - self.mean) ** 2 * self.rows * rows / total
        self.mean += (mean - self.mean) * rows / total
        self.rows, self.squared, self.absolute = total, self.squared + float(np.sum(error**2)), \
            self.absolute + float(np.sum(np.abs(error)))

    def scores(self):
        if not self.rows:
            return dict.fromkeys(("loss", "mse", "mae", "rmse", "r2"), float("nan"))
        mse = self.squared / self.rows
        r2 = 1.0 - self.squared / self.deviations if self.deviations > 0 else float("nan")
        return {"loss": mse, "mse": mse, "mae": self.absolute / self.rows, "rmse": mse**0.5, "r2": r2}