"""The range test's batches, from what `fit` takes: arrays, a `tf.data.Dataset`,
a `keras.utils.PyDataset`, or a generator / iterator of batches."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import keras
import numpy as np

DEFAULT_BATCH_SIZE = 32  # fit's


def batches(x: Any, y: Any = None, batch_size: int | None = None,
            shuffle: bool = True) -> tuple[Iterator[tuple], int | None]:
    """An iterator of `(x, y, sample_weight)` batches and how many it holds.

    Args:
        x: Arrays (a NumPy array, or a list / dict of them), a `tf.data.Dataset`,
            a `keras.utils.PyDataset`, or a generator / iterator of batches.
        y: Targets, with arrays only.
        batch_size: Positive int, with arrays only. Defaults to 32.
        shuffle: Bool. Whether array rows are drawn in a random order.

    Returns:
        Tuple `(iterator, count)`; `count` is `None` where unknown (a
        generator, a dataset of unknown cardinality) and `math.inf` for an
        endless dataset.
    """
    if _is_arrays(x):
        return _array_batches(x, y, batch_size, shuffle)
    for name, value in (("y", y), ("batch_size", batch_size)):
        if value is not None:
            raise ValueError(
                f"Argument `{name}` must be None when `x` is a dataset or generator (it yields "
                f"whole batches, targets included). Received: {name}={value!r} with x of type {type(x).__name__}"
            )
    if hasattr(x, "as_numpy_iterator") and hasattr(x, "cardinality"):
        return _unpacked(x.as_numpy_iterator()), _cardinality(int(x.cardinality()))
    if isinstance(x, keras.utils.PyDataset):
        return _unpacked(x[i] for i in range(len(x))), len(x)
    if isinstance(x, Iterator):
        return _unpacked(x), None
    raise TypeError(
        "Argument `x` must be arrays, a `tf.data.Dataset`, a `keras.utils.PyDataset` or a "
        f"generator of batches, as `fit` takes them. Received: x of type {type(x).__name__}"
    )


def _is_arrays(x):
    leaves = keras.tree.flatten(x) if isinstance(x, (list, tuple, dict)) else [x]
    return bool(leaves) and all(hasattr(leaf, "shape") and hasattr(leaf, "__array__") for leaf in leaves)


def _array_batches(x, y, batch_size, shuffle):
    batch_size = DEFAULT_BATCH_SIZE if batch_size is None else batch_size
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"Argument `batch_size` must be a positive int. Received: batch_size={batch_size!r}")
    rows = len(keras.tree.flatten(x)[0])
    order = np.random.default_rng().permutation(rows) if shuffle else np.arange(rows)

    def take(data, index):
        return None if data is None else keras.tree.map_structure(lambda a: np.asarray(a)[index], data)

    slices = (order[start:start + batch_size] for start in range(0, rows, batch_size))
    return ((take(x, index), take(y, index), None) for index in slices), math.ceil(rows / batch_size)


def _cardinality(value):
    infinite, unknown = -1, -2  # tf.data.INFINITE_CARDINALITY, tf.data.UNKNOWN_CARDINALITY
    return math.inf if value == infinite else None if value == unknown else value


def _unpacked(elements):
    return (keras.utils.unpack_x_y_sample_weight(element) for element in elements)
