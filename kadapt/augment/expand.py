"""`expand`: the training set with generated (cut or mixed) samples appended."""

from __future__ import annotations

import numbers

import keras
import numpy as np

from kadapt.validation import check_range

_METHODS = {
    "mixup": lambda seed: keras.layers.MixUp(seed=seed),
    "cutmix": lambda seed: keras.layers.CutMix(seed=seed),
    "cutout": lambda seed: keras.layers.RandomErasing(factor=(1.0, 1.0), fill_value=0.0, seed=seed),
}


def expand(x: np.ndarray, y: np.ndarray, method: str = "mixup", factor: float = 0.5, num_classes: int | None = None,
           seed: int | None = None, batch_size: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Returns `(x, y)` with `round(factor * len(x))` generated samples appended.

    The new samples are made by Keras' layers from randomly drawn training
    samples, a batch at a time: `"mixup"` (`keras.layers.MixUp`, default
    alpha), `"cutmix"` (`keras.layers.CutMix`) or `"cutout"`
    (`keras.layers.RandomErasing`, always one patch, filled with 0). Mixed
    samples carry mixed (soft) labels, so labels come back one-hot/soft,
    float32, each row summing to 1.

    Args:
        x: Array (N, H, W) or (N, H, W, C) of images.
        y: Array (N,) of int labels or (N, num_classes) of one-hot/soft labels.
        method: One of `"mixup"`, `"cutmix"`, `"cutout"`. Defaults to `"mixup"`.
        factor: Positive float. New samples per original sample. Defaults to `0.5`.
        num_classes: Int or `None`. Classes of int labels; `None` takes
            max(y) + 1. Defaults to `None`.
        seed: Int or `None`. Seeds the draw and the layer. Defaults to `None`.
        batch_size: Positive int. Samples mixed together. Defaults to `256`.

    Returns:
        `(x_expanded, y_expanded)`: float32 arrays, the originals first.

    Example:

    ```python
    x2, y2 = kadapt.augment.expand(x_train, y_train, method="cutmix", factor=0.5, seed=0)
    ```
    """
    if method not in _METHODS:
        raise ValueError(
            f"Argument `method` must be one of {sorted(_METHODS)}. Received: method={method!r}"
        )
    check_range("factor", factor, low=0.0, low_open=True)
    check_range("batch_size", batch_size, low=1, integer=True)
    x = np.asarray(x, "float32")
    labels = _one_hot(x, y, num_classes)
    rng = np.random.default_rng(seed)
    chosen = rng.integers(0, len(x), size=int(round(factor * len(x))))
    new_x, new_y = _generate(_METHODS[method](seed), x[chosen], labels[chosen], batch_size)
    return np.concatenate([x, new_x]), np.concatenate([labels, new_y])


def _one_hot(x, y, num_classes):
    if x.ndim not in (3, 4):
        raise ValueError(
            f"Argument `x` must be images of shape (N, H, W) or (N, H, W, C). Received: x.shape={x.shape}"
        )
    y = np.asarray(y)
    if len(y) != len(x):
        raise ValueError(f"Arguments `x` and `y` must have the same length. Received: len(x)={len(x)}, len(y)={len(y)}")
    if y.ndim == 2:
        return y.astype("float32")
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise TypeError(
            "Argument `y` must be int labels (N,) or one-hot labels (N, num_classes). "
            f"Received: y.dtype={y.dtype}, y.shape={y.shape}"
        )
    if num_classes is None:
        num_classes = int(y.max()) + 1
    if not isinstance(num_classes, numbers.Integral) or num_classes <= int(y.max()):
        raise ValueError(
            f"Argument `num_classes` must be an int above the largest label {int(y.max())}. "
            f"Received: num_classes={num_classes!r}"
        )
    return np.eye(num_classes, dtype="float32")[y]


def _generate(layer, images, labels, batch_size):
    with_channels = images if images.ndim == 4 else images[..., None]
    out_x, out_y = [], []
    for start in range(0, len(images), batch_size):
        batch = {"images": with_channels[start:start + batch_size], "labels": labels[start:start + batch_size]}
        out = layer(batch, training=True)
        out_x.append(keras.ops.convert_to_numpy(out["images"]))
        out_y.append(keras.ops.convert_to_numpy(out["labels"]))
    new_x = np.concatenate(out_x) if out_x else with_channels[:0]
    new_y = np.concatenate(out_y) if out_y else labels[:0]
    return new_x.reshape((-1,) + images.shape[1:]).astype("float32"), new_y.astype("float32")
