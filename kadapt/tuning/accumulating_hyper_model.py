"""A KerasTuner `HyperModel` that searches logical batch sizes beyond memory."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import keras

from kadapt.batching.accumulate import accumulate
from kadapt.extras import require
from kadapt.validation import check_micro_batch_size

keras_tuner = require("keras_tuner", extra="tuner")
require("tensorboard", extra="tuner")  # KerasTuner imports it in every trial on the TensorFlow backend


class AccumulatingHyperModel(keras_tuner.HyperModel):
    """Searches the logical batch size while the micro-batch stays fixed.

    Every trial trains with `kadapt.accumulate`, so a logical batch size far
    larger than what fits in memory is searched like any other value: the
    micro-batch bounds memory, the hyperparameter `"batch_size"` sets the
    logical batch (one optimizer step).

    Args:
        build_model: Callable `hp -> keras.Model`, returning a compiled model.
        micro_batch_size: Positive int. Rows per forward/backward pass.
        batch_sizes: Sequence of positive ints. Logical batch sizes to try.
        **kwargs: Passed to `keras_tuner.HyperModel` (`name`, `tunable`).

    Example:

    ```python
    hyper_model = kadapt.tuning.AccumulatingHyperModel(
        build_model, micro_batch_size=64, batch_sizes=[64, 256, 1024])
    tuner = keras_tuner.RandomSearch(hyper_model, objective="val_loss",
                                     max_trials=6)
    tuner.search(x, y, epochs=2, validation_split=0.2)
    ```

    Across processes, with KerasTuner's distributed mode: run the same script
    in a chief and in workers that share `directory`, each with its own
    `KERASTUNER_TUNER_ID` (`chief`, `tuner0`, `tuner1`, ...) and the chief's
    `KERASTUNER_ORACLE_IP` and `KERASTUNER_ORACLE_PORT`. A worker must not
    overwrite (that deletes the other processes' trials), and only the chief
    asks for the best model: a worker's `search` returns when no trial is
    left, possibly after the chief has gone. See
    `kadapt.tuning.DistributedSearch`.

    ```python
    search = kadapt.tuning.distributed_search()  # None in one process
    worker = search is not None and not search.is_chief
    tuner = keras_tuner.RandomSearch(hyper_model, objective="val_loss",
                                     max_trials=6, directory="/shared/search",
                                     project_name="batch_size",
                                     overwrite=not worker)
    tuner.search(x, y, epochs=2, validation_split=0.2)  # chief: until all end
    if not worker:
        tuner.get_best_models(1)[0].save("best.keras")
    ```
    """

    def __init__(self, build_model: Callable[[keras_tuner.HyperParameters], keras.Model], micro_batch_size: int,
                 batch_sizes: Sequence[int], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not callable(build_model):
            raise TypeError(
                "Argument `build_model` must be a callable `hp -> keras.Model`. "
                f"Received: build_model={build_model!r}"
            )
        self.build_model = build_model
        self.micro_batch_size = check_micro_batch_size(micro_batch_size)
        self.batch_sizes = _check_batch_sizes(batch_sizes)

    def build(self, hp: keras_tuner.HyperParameters) -> keras.Model:
        model = self.build_model(hp)
        if not model.compiled:
            raise ValueError(
                "Argument `build_model` must return a compiled model: call "
                f"`model.compile(...)` inside it. Received: an uncompiled model {model.name!r}"
            )
        return accumulate(model, self.micro_batch_size)

    def declare_hyperparameters(self, hp: keras_tuner.HyperParameters) -> None:
        # Declared before the first trial so that the oracle draws it for every
        # trial: otherwise the trials started before one ended (one per worker
        # in a distributed search) would all run the first batch size.
        hp.Choice("batch_size", self.batch_sizes)

    def fit(self, hp: keras_tuner.HyperParameters, model: keras.Model, *args: Any,
            **kwargs: Any) -> keras.callbacks.History:
        if "batch_size" in kwargs:
            raise ValueError(
                "`batch_size` is searched by `AccumulatingHyperModel`; pass the "
                "candidates as `batch_sizes=` instead. "
                f"Received: batch_size={kwargs['batch_size']!r}"
            )
        batch_size = hp.Choice("batch_size", self.batch_sizes)
        return model.fit(*args, batch_size=batch_size, **kwargs)


def _check_batch_sizes(batch_sizes):
    values = list(batch_sizes) if isinstance(batch_sizes, (list, tuple)) else None
    if not values:
        raise ValueError(
            "Argument `batch_sizes` must be a non-empty list of positive ints, "
            f"e.g. [64, 256, 1024]. Received: batch_sizes={batch_sizes!r}"
        )
    return [check_micro_batch_size(v, name="batch_sizes") for v in values]
