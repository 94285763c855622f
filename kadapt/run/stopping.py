"""Callbacks that end `fit` early: at a step count, or at a target accuracy."""

import keras


class StopAtStep(keras.callbacks.Callback):
    """Stops training once `optimizer.iterations` reaches `max_steps`.

    Args:
        max_steps: Positive int. Optimizer steps in all.
    """

    def __init__(self, max_steps):
        super().__init__()
        self.max_steps = max_steps

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) >= self.max_steps:
            self.model.stop_training = True


class StopAtTarget(keras.callbacks.Callback):
    """Stops training at the end of the first epoch where `monitor` >= `target`.

    Args:
        target: Float. The accuracy to reach.
        monitor: String. A metric of the epoch logs. Defaults to `"val_accuracy"`.
    """

    def __init__(self, target, monitor="val_accuracy"):
        super().__init__()
        self.target, self.monitor = target, monitor

    def on_epoch_end(self, epoch, logs=None):
        value = (logs or {}).get(self.monitor)
        if value is not None and float(value) >= self.target:
            self.model.stop_training = True
            print(f"{self.monitor} {float(value):.4f} >= target {self.target}: stopping after epoch {epoch + 1}")
