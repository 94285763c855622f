"""`StepLogger`: one JSON line per optimizer step, flushed as it is written."""

import json
import math

import keras

from kadapt.optimizers.live_variables import applied_learning_rate
from kadapt.optimizers.live_variables import current_momentum
from kadapt.run.run_directory import whole_file


class StepLogger(keras.callbacks.Callback):
    """Writes `{"step", "epoch", "loss", "learning_rate", "momentum"}` per step.

    `step` is `optimizer.iterations` before the step (the argument the
    learning-rate schedule saw); `learning_rate` is the rate the step applied,
    schedule(step) x `learning_rate_multiplier`; `momentum` the optimizer's
    momentum (or Adam's `beta_1`) during the step. Keras logs the running mean of the
    loss over the epoch, weighted by rows, so the step's own loss is
    recovered from two consecutive means. List it after callbacks that set
    hyperparameters at batch begin (`kadapt.MomentumScheduler`) and before
    those that change them at batch end (`MetaAdjuster`).

    On a resumed run, lines at or after the restored step are dropped: that
    part of training runs again.

    Args:
        path: String or `Path`. The `.jsonl` file (appended to).
        batch_size: Int. Rows per step.
        rows_per_epoch: Int. Training rows per epoch (the last step may be ragged).
    """

    def __init__(self, path, batch_size, rows_per_epoch):
        super().__init__()
        self.path, self.batch_size, self.rows_per_epoch = path, batch_size, rows_per_epoch
        self._file = None

    def on_train_begin(self, logs=None):
        self._truncate(int(self.model.optimizer.iterations.numpy()))
        self._file = open(self.path, "a")

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch, self._rows_seen, self._loss_sum = epoch, 0, 0.0

    def on_train_batch_begin(self, batch, logs=None):
        optimizer = self.model.optimizer
        self._pending = {
            "step": int(optimizer.iterations.numpy()),
            "epoch": self._epoch,
            "learning_rate": applied_learning_rate(optimizer),
            "momentum": current_momentum(optimizer),
        }

    def on_train_batch_end(self, batch, logs=None):
        rows = min(self.batch_size, self.rows_per_epoch - self._rows_seen)
        mean = float((logs or {}).get("loss", math.nan))
        total = mean * (self._rows_seen + rows)
        loss = (total - self._loss_sum) / rows
        self._rows_seen, self._loss_sum = self._rows_seen + rows, total
        self._file.write(json.dumps({**self._pending, "loss": loss}) + "\n")
        self._file.flush()

    def on_train_end(self, logs=None):
        self.close()

    def close(self):
        if self._file is not None:
            self._file.close()
            self._file = None

    def _truncate(self, first_step_to_redo):
        try:
            with open(self.path) as stream:
                lines = stream.readlines()
        except FileNotFoundError:
            return
        kept = [line for line in lines if _step_of(line) < first_step_to_redo]
        with whole_file(self.path) as temporary, open(temporary, "w") as stream:
            stream.writelines(kept)


def _step_of(line):
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return math.inf  # a line cut short by an interrupt: drop it
