"""Ctrl-C cannot cut a `kadapt train` checkpoint short."""

import os
import shutil
import signal
import time
from pathlib import Path

import keras
import numpy as np
import pytest

from kadapt.run.backup import InterruptSafeBackup
from kadapt.run.backup import _sigint_held


def test_sigint_waits_until_the_checkpoint_is_written():
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    written = []
    try:
        with pytest.raises(KeyboardInterrupt):
            with _sigint_held():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
                written.append(True)  # not interrupted half-way
    finally:
        signal.signal(signal.SIGINT, previous)
    assert written == [True]


class _InterruptAtEpochEnd(keras.callbacks.Callback):
    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.epoch:
            raise KeyboardInterrupt


class _EpochsBegun(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epochs = []

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append(epoch)


def _fit(directory, *middle, epochs=4, first_epoch=None):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    backup = InterruptSafeBackup(backup_dir=str(directory), first_epoch=first_epoch)
    x = np.arange(24, dtype="float32").reshape(8, 3) / 24
    model.fit(x, x[:, :1], batch_size=4, epochs=epochs, verbose=0,
              callbacks=[backup, *middle, backup.committer])


def test_an_epoch_is_checkpointed_only_after_every_callback_finished_it(tmp_path):
    # An interrupt while a later callback (the history writer) ends epoch 2:
    # that epoch must not count as done, or the resumed run skips its records.
    with pytest.raises(KeyboardInterrupt):
        _fit(tmp_path, _InterruptAtEpochEnd(2))
    begun = _EpochsBegun()
    _fit(tmp_path, begun)
    assert begun.epochs == [2, 3]


def test_a_restored_epoch_other_than_the_prepared_one_stops_with_a_clear_error(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        _fit(tmp_path, _InterruptAtEpochEnd(2))
    assert InterruptSafeBackup.checkpointed_epoch(tmp_path) == 2
    with pytest.raises(RuntimeError, match="holds epoch 2, not epoch 1 whose batches were prepared"):
        _fit(tmp_path, first_epoch=1)
    begun = _EpochsBegun()
    _fit(tmp_path, begun, first_epoch=2)
    assert begun.epochs == [2, 3]


def test_the_checkpoint_of_a_finished_run_is_gone_at_once(tmp_path, monkeypatch):
    # A kill while the files are deleted (here: the deletion fails after the first) leaves no
    # part of the checkpoint where a resume would read it.
    real = shutil.rmtree

    def first_file_only(path):
        next(p for p in sorted(Path(path).iterdir())).unlink()
        raise OSError("killed")

    monkeypatch.setattr(shutil, "rmtree", first_file_only)
    with pytest.raises(OSError, match="killed"):
        _fit(tmp_path / "backup", epochs=2)
    monkeypatch.setattr(shutil, "rmtree", real)
    assert not (tmp_path / "backup").exists()
    [aside] = tmp_path.iterdir()  # what is left lies aside, under a name the next run clears
    assert aside.name.startswith(".kadapt-tmp.") and "training_metadata.json" in {p.name for p in aside.iterdir()}


class _KilledAt(keras.callbacks.Callback):
    """Stops the process's writing of epoch `epoch`'s checkpoint right after its weights."""

    def __init__(self, epoch, monkeypatch):
        super().__init__()
        self.epoch, self.monkeypatch = epoch, monkeypatch

    def on_epoch_end(self, epoch, logs=None):
        if epoch != self.epoch:
            return
        import kadapt.run.backup as backup

        real = backup.whole_file

        def weights_only(path):
            if str(path).endswith(".json"):
                raise KeyboardInterrupt  # killed between the weights and the record
            return real(path)

        self.monkeypatch.setattr(backup, "whole_file", weights_only)


def test_a_kill_between_the_weights_and_the_record_resumes_the_earlier_checkpoint_whole(tmp_path, monkeypatch):
    # Keras wrote the weights in place and then the record: killed between them, the resumed
    # run took the weights of epoch 3 with the record of epoch 2 and trained epoch 3 twice.
    weights = []
    with pytest.raises(KeyboardInterrupt):
        _fit(tmp_path, _KilledAt(2, monkeypatch), _Weights(weights), epochs=4)
    monkeypatch.undo()
    assert InterruptSafeBackup.checkpointed_epoch(tmp_path) == 2
    restored = []
    _fit(tmp_path, _Weights(restored, at_begin=True), epochs=4)
    np.testing.assert_array_equal(restored[0], weights[1])  # epoch 2's end, not epoch 3's


class _Weights(keras.callbacks.Callback):
    def __init__(self, into, at_begin=False):
        super().__init__()
        self.into, self.at_begin = into, at_begin

    def on_epoch_begin(self, epoch, logs=None):
        if self.at_begin:
            self.into.append(self.model.get_weights()[0].copy())

    def on_epoch_end(self, epoch, logs=None):
        if not self.at_begin:
            self.into.append(self.model.get_weights()[0].copy())
