"""`BestWeights`: the weights of the best epoch at the end of training, kept across a resume."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import keras
import numpy as np

from kadapt.callbacks.schedule_free_evaluation import at_evaluation_point

STATE_FILE = "best-weights.npz"


class BestWeights(keras.callbacks.EarlyStopping):
    """`keras.callbacks.EarlyStopping(restore_best_weights=True)` that never
    stops early: at the end of training the model holds the weights of the
    epoch with the best `monitor` value; `best_epoch` (0-based) says which.

    With `backup_dir` (the directory of the run's `BackupAndRestore`), the
    best value, its epoch and its weights are written there at every
    improvement and read back when training begins, so a run resumed after
    an interruption still ends with the best epoch of the whole run, not of
    the epochs after the resume. The file is replaced whole (written aside,
    then renamed), never left half-written.

    With a Schedule-Free optimizer the weights kept are x, the average that
    `kadapt.callbacks.ScheduleFreeEvaluation` validates, not y, the point
    the gradients were taken at.

    Args:
        monitor: String. The logged value to watch, e.g. `"val_loss"`.
        backup_dir: Path-like or `None`. Where the state lives between runs.
            Defaults to `None` (kept in memory only).
    """

    def __init__(self, monitor: str = "val_loss", backup_dir: str | os.PathLike | None = None) -> None:
        super().__init__(monitor=monitor, patience=2**62, restore_best_weights=True)
        self.backup_dir = None if backup_dir is None else Path(backup_dir)

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        super().on_train_begin(logs)
        path = self._path()
        if path is not None and path.is_file():
            with np.load(path, allow_pickle=False) as saved:
                self.best, self.best_epoch = float(saved["best"]), int(saved["best_epoch"])
                count = int(saved["count"])
                self.best_weights = [saved[f"weight_{i}"] for i in range(count)]

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        before = self.best_weights
        with at_evaluation_point(self.model):
            super().on_epoch_end(epoch, logs)  # a new best is a new list of weights
        path = self._path()
        if path is not None and self.best_weights is not before:
            self._write(path)

    def _path(self):
        return None if self.backup_dir is None else self.backup_dir / STATE_FILE

    def _write(self, path):
        path.parent.mkdir(parents=True, exist_ok=True)
        aside = path.with_name(path.name + ".partial.npz")
        np.savez(aside, best=np.float64(self.best), best_epoch=np.int64(self.best_epoch),
                 count=np.int64(len(self.best_weights)),
                 **{f"weight_{i}": weight for i, weight in enumerate(self.best_weights)})
        os.replace(aside, path)
