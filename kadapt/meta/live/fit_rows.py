"""`FitRows`: a uniform sample of the rows `model.fit` trains on, for a callback Keras shows no data.

Keras gives a callback the model and `fit`'s parameters, never its data. But
both trainers build `model.train_function` (`make_train_function`, a public
attribute) before `on_train_begin`, and call it with each step's batches: on
TensorFlow with an iterator over the `tf.data` pipeline, on JAX with the state
and a Python iterator of batches. `tap` wraps that function for one epoch:

- on JAX the iterator is passed on through a generator that copies each
  batch as the compiled step reads it;
- on TensorFlow the wrapper reads the step's batches itself (`next`, eagerly,
  `steps_per_execution` of them) and passes them on as a list, which Keras'
  train function steps through one at a time with the same compiled step
  (`jit_compile` included; it is traced once more for that path).

The model's step, its data and the order of its batches are untouched. The
rows go into a reservoir (Vitter's algorithm R: every row of the epoch is
kept with the same probability), at most `max_rows` rows and `max_bytes`
bytes, so a generator sorted by class is sampled as well as a shuffled array.
`untap` puts the original function back at the epoch's end: later epochs run
exactly as without it. Rows a reservoir cannot hold (strings, ragged tensors,
a multi-replica strategy's per-replica values, no targets) leave it empty
with the `reason` said.
"""

from __future__ import annotations

import itertools
from typing import Any

import keras
import numpy as np

SAMPLE_ROWS = 4096  # enough for a chance level, a restart branch's batches and 256 held rows
SAMPLE_BYTES = 64 * 2**20  # images: 4096 rows of 224x224x3 float32 would be 2.4 GB


class FitRows:
    """A reservoir of the `(x, y)` rows of one epoch of `model.fit` (see the module's docstring).

    Args:
        max_rows: Positive int. The most rows kept. Defaults to `SAMPLE_ROWS` (4096).
        max_bytes: Positive int. The most bytes the rows take. Defaults to 64 MiB.
        seed: Int or `None`. The reservoir's draws. Defaults to `None`.

    Example:

    ```python
    rows = FitRows(seed=0)
    # in a callback: on_train_begin -> rows.tap(self.model); on_epoch_end -> rows.untap()
    x, y = rows.arrays()
    ```
    """

    def __init__(self, max_rows: int = SAMPLE_ROWS, max_bytes: int = SAMPLE_BYTES, seed: int | None = None) -> None:
        self.max_rows, self.max_bytes = int(max_rows), int(max_bytes)
        self._rng = np.random.default_rng(seed)
        self._model = self._original = None
        self._leaves = self._structure = None
        self.seen, self.batch_size, self.reason = 0, None, None

    def tap(self, model: keras.Model) -> None:
        """Samples the batches `model.train_function` trains on until `untap`; call it after
        `make_train_function` (from `on_train_begin` on)."""
        self.untap()
        if _is_tensorflow() and model.distribute_strategy.num_replicas_in_sync > 1:
            self.reason = "a multi-replica strategy's batches are split across its replicas"
            return
        self._model, self._original = model, model.train_function
        model.train_function = self._tensorflow_step if _is_tensorflow() else self._jax_step

    def untap(self) -> None:
        """Puts the model's train function back."""
        if self._model is not None:
            self._model.train_function = self._original
        self._model = self._original = None

    @property
    def rows(self) -> int:
        """How many rows the reservoir holds."""
        return 0 if self._leaves is None else min(self.seen, len(self._leaves[0]))

    def arrays(self) -> tuple[Any, Any] | None:
        """`(x, y)` as NumPy arrays (structured as fit's), or `None` where there are no rows."""
        if not self.rows:
            return None
        x, y = keras.tree.pack_sequence_as(self._structure, [leaf[:self.rows] for leaf in self._leaves])
        return x, y

    def _jax_step(self, state, iterator):
        def copied():
            for data in iterator:
                self._add(data)
                yield data

        return self._original(state, copied())

    def _tensorflow_step(self, iterator):
        steps = self._model.steps_per_execution
        data = list(itertools.islice(iterator, steps))
        if not data:
            raise StopIteration
        for batch in data:
            self._add(batch)
        return self._original(data)

    def _add(self, data):
        if self.reason is not None:
            return
        x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
        if y is None:
            self.reason = "fit's batches hold no targets"
            return
        try:
            leaves = [np.asarray(keras.ops.convert_to_numpy(leaf)) for leaf in keras.tree.flatten((x, y))]
        except Exception as error:  # noqa: BLE001  (a sample is optional: its reason is said, fit goes on)
            self.reason = f"fit's batches cannot be read to the host ({type(error).__name__}: {error})"
            return
        if any(leaf.dtype.kind not in "biuf" or not leaf.ndim for leaf in leaves):
            self.reason = "fit's batches hold values other than numbers in rows"
            return
        if self._leaves is None:
            self._start(x, y, leaves)
        self._keep(leaves)

    def _start(self, x, y, leaves):
        self._structure = (x, y)
        self.batch_size = len(leaves[0])
        row_bytes = sum(leaf[:1].nbytes for leaf in leaves)
        capacity = max(2, min(self.max_rows, self.max_bytes // max(row_bytes, 1)))
        self._leaves = [np.empty((capacity, *leaf.shape[1:]), leaf.dtype) for leaf in leaves]

    def _keep(self, leaves):
        """Algorithm R over the batch's rows: row n (counted from the epoch's first) replaces a
        uniformly drawn slot of `capacity` with probability capacity / (n + 1)."""
        capacity, rows = len(self._leaves[0]), len(leaves[0])
        numbers = np.arange(self.seen, self.seen + rows)
        slots = np.where(numbers < capacity, numbers, self._rng.integers(0, numbers + 1))
        kept = slots < capacity
        for store, leaf in zip(self._leaves, leaves):
            store[slots[kept]] = leaf[kept]
        self.seen += rows


def _is_tensorflow():
    return keras.backend.backend() == "tensorflow"
