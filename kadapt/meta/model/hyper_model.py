"""`MetaHyperModel`: the recurrent meta-model's search space for KerasTuner."""

from __future__ import annotations

import keras

from kadapt.extras import require
from kadapt.meta.model import actions as action_lib
from kadapt.meta.model.features import FEATURE_NAMES
from kadapt.meta.model.features import WINDOW
from kadapt.meta.model.meta_model import MaskedScoreError
from kadapt.meta.model.meta_model import MetaSpec

keras_tuner = require("keras_tuner", extra="tuner")
require("tensorboard", extra="tuner")  # KerasTuner imports it in every trial on the TensorFlow backend


class MetaHyperModel(keras_tuner.HyperModel):
    """A GRU/LSTM over the feature window, a predicted score difference to keep per action.

    Searched: the cell (`"gru"`/`"lstm"`), `units`, `layers` (1–2 stacked
    recurrent layers), `dropout` and the Adam `learning_rate`. The first layer
    after the input is a `MetaSpec`, so every model built here carries the
    feature spec into its `.keras` file.

    Args:
        **kwargs: Passed to `keras_tuner.HyperModel` (`name`, `tunable`).

    Example:

    ```python
    tuner = keras_tuner.RandomSearch(kadapt.meta.MetaHyperModel(),
                                     objective="val_loss", max_trials=8)
    tuner.search(windows, targets, validation_data=(val_windows, val_targets))
    ```
    """

    def build(self, hp: keras_tuner.HyperParameters) -> keras.Model:
        cell = {"gru": keras.layers.GRU, "lstm": keras.layers.LSTM}[hp.Choice("cell", ["gru", "lstm"])]
        units = hp.Choice("units", [16, 32, 64])
        layers = hp.Int("layers", 1, 2)
        dropout = hp.Choice("dropout", [0.0, 0.1, 0.3])
        inputs = keras.Input((WINDOW, len(FEATURE_NAMES)), name="window")
        hidden = MetaSpec(name="meta_spec")(inputs)
        for index in range(layers):
            hidden = cell(units, return_sequences=index < layers - 1, name=f"recurrent_{index}")(hidden)
        hidden = keras.layers.Dropout(dropout)(hidden)
        outputs = keras.layers.Dense(len(action_lib.ACTIONS), name="score_difference")(hidden)
        model = keras.Model(inputs, outputs, name="meta_model")
        model.compile(optimizer=keras.optimizers.Adam(hp.Choice("learning_rate", [1e-3, 3e-3, 1e-2])),
                      loss=MaskedScoreError())
        return model
