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
        present = predicted[predicted > 0]
        return float(-(present * np.log(present)).sum())
    return float(-(_smoothed(scored, num_classes, label_smoothing) * np.log(np.maximum(predicted, 1e-7))).sum())


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
