"""The constant predictor's loss: what a network that learned nothing scores.

A network that outputs one constant does best with the training targets'
distribution. For classes under the cross-entropy with label smoothing e,
that is the smoothed frequencies q = (1 - e) f + e / C (f: the training label
frequencies, C: the classes), and its loss is their entropy
H(q) = -sum_c q_c log q_c (ln C for balanced classes). For a regression under
the mean squared error it is the targets' mean, and its loss their variance.
"""

import numpy as np

from kadapt.validation import check_range


def chance_loss(labels, num_classes: int, label_smoothing: float = 0.0) -> float:
    """The cross-entropy of the best constant prediction of integer `labels`.

    Args:
        labels: Int array (N,). The training labels.
        num_classes: Int >= 2. The classes the network outputs.
        label_smoothing: Float in [0, 1]. The loss's. Defaults to `0.0`.

    Example:

    >>> round(chance_loss([0, 1, 2], 3), 4)  # ln 3
    1.0986
    """
    check_range("num_classes", num_classes, low=2, integer=True)
    check_range("label_smoothing", label_smoothing, low=0.0, high=1.0)
    labels = np.asarray(labels).astype(int)
    frequencies = np.bincount(labels, minlength=num_classes) / len(labels)
    smoothed = (1.0 - label_smoothing) * frequencies + label_smoothing / num_classes
    present = smoothed[smoothed > 0]
    return float(-(present * np.log(present)).sum())


def regression_chance_loss(targets) -> float:
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
    """
    targets = np.asarray(targets, "float64")
    if targets.ndim <= 1:
        return float(np.var(targets))
    return float(np.var(targets.reshape(len(targets), -1), axis=0).mean())
