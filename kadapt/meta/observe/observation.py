"""The one place an `Observation` is read off a live model, for the adjuster and the collector alike.

The update features (`update_size`, `update_cosine`) stand in for the gradient
norm and the consecutive-gradient cosine, so they are taken over the
*trainable* weights: the variables a gradient moves. BatchNorm's moving
statistics follow the activations, not the loss, and a frozen layer never
moves; counted in, they would dilute the update's size and bend its cosine.
The record collector once flattened `model.get_weights()` (all weights); on the
task models the shipped meta-model was trained on (MLP, conv, GRU, autoencoder:
no non-trainable weights) the two are the same array, so its inputs do not
change, and the `MetaAdjuster` always read the trainable ones.
"""

from __future__ import annotations

import keras
import numpy as np

from kadapt.meta.model.features import Observation
from kadapt.meta.model.features import schedule_ratio
from kadapt.meta.observe.host_reads import ModelReading
from kadapt.meta.observe.host_reads import read_model
from kadapt.meta.observe.host_reads import read_to_host


def trainable_weights(model: keras.Model) -> np.ndarray:
    """The model's trainable weights, flattened into one float array (a host copy)."""
    arrays = [np.ravel(a) for a in read_to_host(model.trainable_variables)]
    return np.concatenate(arrays) if arrays else np.zeros(0, "float32")


def observe_model(model: keras.Model, step: int, loss: float, val_loss: float | None,
                  budget_used: float, total_steps: int | None,
                  range_test_rate: float | None = None, reading: ModelReading | None = None) -> Observation:
    """The `Observation` of `model` and its optimizer as they are now.

    Args:
        model: A compiled `keras.Model`.
        step: Int. Optimizer steps done.
        loss: Float. The training loss of the last interval.
        val_loss: Float or `None`. The validation loss, when measured.
        budget_used: Float in [0, 1]. Fraction of the planned steps done.
        total_steps: Int or `None`. The planned steps, for `schedule_ahead`.
        range_test_rate: Float or `None`. The range test's suggestion for
            this run, when one ran. Defaults to `None`.
        reading: `kadapt.meta.observe.host_reads.ModelReading` of `model` now, a
            `kadapt.meta.observe.device_observer.DeviceReading` (the update's sums
            taken on the device: the observation then holds no weights), or
            `None` to read one (`read_model`; the `MetaAdjuster` passes the one
            its rollback point is taken from). Defaults to `None`.

    Example:

    ```python
    observation = observe_model(model, step=40, loss=0.7, val_loss=0.8,
                                budget_used=0.2, total_steps=200)
    history.observe(observation)
    ```
    """
    reading = read_model(model) if reading is None else reading
    sums = getattr(reading, "sums", None)
    return Observation(
        step=int(step), loss=float(loss), val_loss=None if val_loss is None else float(val_loss),
        learning_rate=reading.learning_rate, momentum=reading.momentum,
        weights=None if sums is not None else _flat_trainable(model, reading.variables),
        budget_used=float(budget_used), schedule_ahead=schedule_ratio(model.optimizer, step, total_steps),
        range_test_rate=range_test_rate, update_sums=sums)


def _flat_trainable(model, values):
    """The trainable ones of `values` (one per `model.variables`), flattened into one array."""
    trainable = {id(v) for v in model.trainable_variables}
    arrays = [np.ravel(value) for variable, value in zip(model.variables, values, strict=True)
              if id(variable) in trainable]
    return np.concatenate(arrays) if arrays else np.zeros(0, "float32")
