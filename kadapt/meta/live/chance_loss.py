"""The constant predictor's loss: what a network that learned nothing scores.

A network that outputs one constant does best with the training targets'
distribution. For classes under the cross-entropy with label smoothing e,
that is the smoothed frequencies q = (1 - e) f + e / C (f: the training label
frequencies, C: the classes), and its loss is their entropy
H(q) = -sum_c q_c log q_c (ln C for balanced classes). For a regression under
the mean squared error it is the targets' mean, and its loss their variance.

Judged on other rows (a validation set) the same constant scores the
cross-entropy of q against those rows' smoothed frequencies, or the mean
squared distance of their targets from the training mean: `scored`.
"""

import numpy as np

from kadapt.validation import check_range


def chance_loss(labels, num_classes: int, label_smoothing: float = 0.0, scored=None) -> float:
    """The cross-entropy of the best constant prediction of integer `labels`.

    Args:
        labels: Int array (N,). The training labels.
        num_classes: Int >= 2. The classes the network outputs.
        label_smoothing: Float in [0, 1]. The loss's. Defaults to `0.0`.
        scored: Int array (M,) or `None`. The labels the constant is scored
            on (a validation set's); `None`: `labels` themselves. A
            probability below Keras' epsilon (1e-7) counts as it, as Keras'
            cross-entropy clips.

    Example:

    >>> round(chance_loss([0, 1, 2], 3), 4)  # ln 3
    1.0986
    """
    check_range("num_classes", num_classes, low=2, integer=True)
    check_range("label_smoothing", label_smoothing, low=0.0, high=1.0)
    predicted = _smoothed(labels, num_classes, label_smoothing)
    if scored is None:
        return _entropy(predicted)
    return float(-(_smoothed(scored, num_classes, label_smoothing) * np.log(np.maximum(predicted, 1e-7))).sum())


def _entropy(probabilities):
    """-sum p log p over the classes of nonzero probability."""
    present = probabilities[probabilities > 0]
    return float(-(present * np.log(present)).sum())


def _smoothed(labels, num_classes, label_smoothing):
    labels = np.asarray(labels).astype(int)
    frequencies = np.bincount(labels, minlength=num_classes)[:num_classes] / len(labels)
    return (1.0 - label_smoothing) * frequencies + label_smoothing / num_classes


def regression_chance_loss(targets, scored=None) -> float:
    """The mean squared error of the best constant prediction (the targets' mean): their variance.

    With several outputs per row (targets of shape `(N, ...)`: a multi-output
    regression, an autoencoder's images) the best constant is each output's
    own mean, and the loss (Keras' MSE, the mean over outputs) the mean of
    their variances, not the variance of all values together.

    Example:

    >>> regression_chance_loss([1.0, 3.0])
    1.0
    >>> regression_chance_loss([[0.0, 10.0], [2.0, 10.0]])  # variances 1 and 0
    0.5
    >>> regression_chance_loss([1.0, 3.0], scored=[4.0])  # the training mean 2, scored on 4
    4.0
    """
    targets = np.asarray(targets, "float64").reshape(len(targets), -1)
    scored = targets if scored is None else np.asarray(scored, "float64").reshape(len(scored), -1)
    return float(np.square(scored - targets.mean(axis=0)).mean(axis=0).mean())


def binary_chance_loss(targets, label_smoothing: float = 0.0) -> float:
    """The binary cross-entropy of the best constant prediction: each output's (smoothed) mean
    target p, scoring -(p log p + (1 - p) log(1 - p)), averaged over the outputs as Keras averages.

    Example:

    >>> round(binary_chance_loss([[0.0], [1.0]]), 4)  # ln 2
    0.6931
    """
    targets = np.asarray(targets, "float64")
    targets = targets.reshape(-1, targets.shape[-1] if targets.ndim > 1 else 1)
    mean = np.clip((1.0 - label_smoothing) * targets.mean(axis=0) + 0.5 * label_smoothing, 1e-7, 1 - 1e-7)
    return float(-(mean * np.log(mean) + (1.0 - mean) * np.log(1.0 - mean)).mean())


def absolute_chance_loss(targets) -> float:
    """The mean absolute error of the best constant prediction: each output's median, scoring
    the targets' mean distance from it.

    Example:

    >>> absolute_chance_loss([1.0, 2.0, 6.0])  # the median 2: (1 + 0 + 4) / 3
    1.6666666666666667
    """
    targets = np.asarray(targets, "float64").reshape(len(targets), -1)
    return float(np.abs(targets - np.median(targets, axis=0)).mean())


def compiled_chance_loss(loss, targets) -> float | None:
    """The chance level of a model compiled with `loss` (`model.loss`), on `targets`: the loss
    of the best constant prediction, or `None` where `loss` is not one of Keras' losses this
    knows (the cross-entropies, sparse, categorical or binary, with their label smoothing; the
    mean squared and mean absolute errors), by name, function or `keras.losses` object.

    Whether the network outputs logits or probabilities does not matter: either can output
    the best constant. Soft (or smoothed) categorical targets are scored as their mean
    distribution, which the constant's cross-entropy against each row averages to.

    Example:

    >>> round(compiled_chance_loss("sparse_categorical_crossentropy", np.array([0, 1, 2])), 4)  # ln 3
    1.0986
    >>> compiled_chance_loss(lambda y, p: (y - p) ** 2, np.array([0.0, 1.0])) is None
    True
    """
    kind, smoothing = _loss_kind(loss)
    if kind == "sparse_categorical_crossentropy":
        labels = np.asarray(targets).reshape(-1)
        if labels.dtype.kind == "f" and not np.array_equal(labels, np.round(labels)):
            return None
        return chance_loss(labels, max(2, int(labels.max()) + 1))
    if kind == "categorical_crossentropy":
        targets = np.asarray(targets, "float64")
        mean = targets.reshape(-1, targets.shape[-1]).mean(axis=0)
        return _entropy((1.0 - smoothing) * mean + smoothing / len(mean))
    if kind == "binary_crossentropy":
        return binary_chance_loss(targets, smoothing)
    if kind == "mean_squared_error":
        return regression_chance_loss(targets)
    if kind == "mean_absolute_error":
        return absolute_chance_loss(targets)
    return None


_NAMES = {"sparse_categorical_crossentropy": "sparse_categorical_crossentropy",
          "categorical_crossentropy": "categorical_crossentropy", "binary_crossentropy": "binary_crossentropy",
          "mse": "mean_squared_error", "mean_squared_error": "mean_squared_error",
          "mae": "mean_absolute_error", "mean_absolute_error": "mean_absolute_error"}


def _loss_kind(loss):
    """`(kind, label_smoothing)`: the kind is a key of `_NAMES`' values, or `None`."""
    import keras

    classes = {keras.losses.SparseCategoricalCrossentropy: "sparse_categorical_crossentropy",
               keras.losses.CategoricalCrossentropy: "categorical_crossentropy",
               keras.losses.BinaryCrossentropy: "binary_crossentropy",
               keras.losses.MeanSquaredError: "mean_squared_error",
               keras.losses.MeanAbsoluteError: "mean_absolute_error"}
    functions = {getattr(keras.losses, name): kind for name, kind in _NAMES.items() if hasattr(keras.losses, name)}
    if isinstance(loss, str):
        return _NAMES.get(loss), 0.0
    if type(loss) in classes:
        return classes[type(loss)], float(loss.get_config().get("label_smoothing", 0.0) or 0.0)
    if callable(loss) and loss in functions:
        return functions[loss], 0.0
    return None, 0.0
