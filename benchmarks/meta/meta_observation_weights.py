"""Which weights the update features see: trainable (the adjuster, and now the collector) or all.

The record collector once flattened `model.get_weights()` (all weights), the
MetaAdjuster the trainable ones. `kadapt.meta.observe.observation.observe_model` now
gives both the trainable ones. This measures what that changes:

1. the non-trainable weights of each training family's task model (the
   records the shipped meta-model learned from): none means identical inputs;
2. one run of a BatchNorm network on digits (the kind `kadapt train` trains):
   the update features from all weights against trainable ones at each epoch,
   and the action and predicted gain of the shipped meta-model on each.

    .venv/bin/python benchmarks/meta/meta_observation_weights.py
"""

import dataclasses

import keras
import numpy as np

from kadapt.meta.model.actions import ACTIONS
from kadapt.meta.model.actions import describe
from kadapt.meta.model.features import FEATURE_NAMES
from kadapt.meta.model.features import FeatureHistory
from kadapt.meta.model.meta_model import choose
from kadapt.meta.model.meta_model import load_meta_model
from kadapt.meta.observe.observation import observe_model
from kadapt.meta.records import tasks
from kadapt.optimizers import SGD

EPOCHS, BATCH = 8, 64
UPDATE_FEATURES = [FEATURE_NAMES.index("update_size"), FEATURE_NAMES.index("update_cosine")]


def training_families():
    for family in tasks.TRAINING_FAMILIES:
        model = tasks.make_task(family, 0).build(100)
        frozen = sum(int(np.prod(w.shape)) for w in model.non_trainable_weights)
        print(f"{family:20s} {model.name:18s} non-trainable weights: {frozen}")


class BothWindows(keras.callbacks.Callback):
    """At each epoch end, the observation fed to two histories: trainable weights, and all."""

    def __init__(self, x_val, y_val):
        super().__init__()
        self.validation = (x_val, y_val)
        self.trainable, self.all = FeatureHistory(), FeatureHistory()
        self.windows = []  # (trainable, all) at each epoch end

    def on_epoch_end(self, epoch, logs=None):
        step = (epoch + 1) * self.params["steps"]
        observation = observe_model(self.model, step, logs["loss"], logs["val_loss"], (epoch + 1) / EPOCHS,
                                    EPOCHS * self.params["steps"])
        every = np.concatenate([np.ravel(w) for w in self.model.get_weights()])
        self.trainable.observe(observation)
        self.all.observe(dataclasses.replace(observation, weights=every))
        self.windows.append((self.trainable.window(), self.all.window()))


def batch_norm_run():
    (x, y, x_val, y_val), _, _ = tasks.load_family("digits_conv", 0)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input(x.shape[1:]), keras.layers.Conv2D(16, 3, padding="same"),
                              keras.layers.BatchNormalization(), keras.layers.ReLU(),
                              keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
    model.compile(optimizer=SGD(0.05, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    both = BothWindows(x_val, y_val)
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, validation_data=(x_val, y_val), verbose=0, callbacks=[both])
    meta = load_meta_model("default")
    print(f"\nBatchNorm conv on digits, {EPOCHS} epochs: "
          f"{sum(w.size for w in model.get_weights())} weights, "
          f"{sum(int(np.prod(w.shape)) for w in model.trainable_weights)} trainable")
    print("epoch  update_size(trainable, all)  update_cosine(trainable, all)  meta-model pick (trainable | all)")
    for end, windows in enumerate(both.windows, start=1):
        picks = [choose(meta, window, min_gain=0.0) for window in windows]
        size, cosine = ([w[-1, i] for w in windows] for i in UPDATE_FEATURES)
        print(f"{end:5d}  {size[0]:+.4f} {size[1]:+.4f}             {cosine[0]:+.4f} {cosine[1]:+.4f}"
              "              " + " | ".join(f"{describe(ACTIONS[p.action])} ({p.gain:+.3f})" for p in picks))


if __name__ == "__main__":
    training_families()
    batch_norm_run()
