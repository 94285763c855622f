"""`InterruptSafeBackup`: Keras' `BackupAndRestore` whose checkpoints Ctrl-C cannot cut short."""

import contextlib
import json
import os
import shutil
import signal
import threading
from pathlib import Path

import keras

from kadapt._compat import backup_position
from kadapt._compat import resume_at_epoch
from kadapt.run.run_directory import TEMPORARY
from kadapt.run.run_directory import whole_file


METADATA = "training_metadata.json"  # Keras' BackupAndRestore: the epoch the checkpoint holds


class InterruptSafeBackup(keras.callbacks.BackupAndRestore):
    """`BackupAndRestore` that holds SIGINT back while it writes a checkpoint,
    and checkpoints an epoch only after every other callback has finished it.

    A Ctrl-C that landed inside the weights write left a truncated file, and
    Keras falls back to its second checkpoint only on `OSError`, not on the
    `ValueError` loading such a file raises: `--resume` then failed. Here the
    signal waits until the write is done and is delivered right after, so the
    run still stops at once, with a whole checkpoint behind it.

    List it first (it restores the weights before the others look at them)
    and `self.committer` last: the epoch-end checkpoint is written by the
    committer. A checkpoint declares its epoch done, so it must follow the
    records of that epoch (`history.json`, an adjustment the `MetaAdjuster`
    made at epoch end); written first, a Ctrl-C between the two lost the
    epoch from the history of the resumed run.

    The training data of a resumed run starts at the checkpointed epoch
    (`checkpointed_epoch`); pass that epoch as `first_epoch`, and training
    stops with a clear error if the restored checkpoint is another one
    (`None`, the default: no check, for data that does not depend on it).

    `save_scope` (a callable returning a context manager, or `None`) is
    where the checkpoint is written: outside the distribution of a run over
    several JAX processes (`kadapt.run.jax_workers.JaxProcess.local`), where
    Keras' saving otherwise makes variables with collectives, and a peer
    lost during them cut the checkpoint short.
    """

    def __init__(self, *args, first_epoch=None, save_scope=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.committer = _EpochCommitter(self)
        self.first_epoch = first_epoch
        self.save_scope = save_scope or contextlib.nullcontext

    @staticmethod
    def checkpointed_epoch(backup_dir):
        """The epoch a run restored from `backup_dir` continues at (0 without a checkpoint)."""
        path = Path(backup_dir) / METADATA
        return json.loads(path.read_text())["epoch"] if path.is_file() else 0

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        restored = self.checkpointed_epoch(self.backup_dir)
        if self.first_epoch is not None and restored != self.first_epoch:  # Keras fell back to the previous checkpoint
            raise RuntimeError(
                f"The checkpoint in {self.backup_dir} holds epoch {restored}, not epoch {self.first_epoch} "
                "whose batches were prepared (the latest checkpoint could not be read). Resume again: the "
                "run continues from the checkpoint that was restored.")

    def on_epoch_end(self, epoch, logs=None):
        """Nothing: `self.committer` writes the checkpoint after the others."""

    def on_train_batch_end(self, batch, logs=None):
        with _sigint_held():
            super().on_train_batch_end(batch, logs)

    def on_train_end(self, logs=None):
        """Removes the checkpoint (`delete_checkpoint`) at once: renamed aside, then deleted.
        Keras deletes it file by file; a kill among them could leave the last epoch's
        metadata without its weights, which a resume took for a finished run (and saved
        the initial weights)."""
        backup = Path(self.backup_dir)
        if self.delete_checkpoint and backup.is_dir():
            aside = backup.with_name(f"{TEMPORARY}{os.getpid()}.{backup.name}")
            os.replace(backup, aside)
            shutil.rmtree(aside)
        super().on_train_end(logs)

    # Keras' own checkpoint write and read, overridden (kadapt._compat.PRIVATE_OVERRIDES): it
    # has no public hook for either.
    def _save_model(self):
        """One checkpoint, committed at once: the weights written whole under a name of their
        own, then the epoch record naming them replaced into place (the commit), then the
        weights of earlier checkpoints removed. Keras writes `latest.weights.h5` and then the
        record, each in place: a kill between the two resumed an epoch from the next epoch's
        weights, and one inside the record's write left a record cut short."""
        backup = Path(self.backup_dir)
        backup.mkdir(parents=True, exist_ok=True)
        epoch, batch = backup_position(self)
        name = f"epoch-{epoch}-batch-{batch}.weights.h5"
        with whole_file(backup / name) as temporary:
            self.model.save_weights(temporary)
        record = {"epoch": epoch, "batch": batch, "weights": name}
        with whole_file(backup / METADATA) as temporary:
            temporary.write_text(json.dumps(record))
        for earlier in backup.glob("*.weights.h5"):
            if earlier.name != name:
                earlier.unlink(missing_ok=True)

    def _load_model(self):
        """Restores the checkpoint the epoch record names (`_save_model`'s)."""
        path = Path(self.backup_dir) / METADATA
        if not path.is_file():
            return
        record = json.loads(path.read_text())
        if self.model.optimizer is not None and not self.model.optimizer.built:
            self.model.optimizer.build(self.model.trainable_variables)  # its variables are in the file
        # A checkpoint Keras wrote (a run begun before kadapt wrote its own) names no weights file.
        self.model.load_weights(Path(self.backup_dir) / record.get("weights", "latest.weights.h5"))
        resume_at_epoch(self.model, record["epoch"])

    def _commit_epoch(self, epoch, logs):
        with _sigint_held(), self.save_scope():
            super().on_epoch_end(epoch, logs)


class _EpochCommitter(keras.callbacks.Callback):
    """Writes the epoch-end checkpoint of its `InterruptSafeBackup`; list it last."""

    def __init__(self, backup):
        super().__init__()
        self._backup = backup

    def on_epoch_end(self, epoch, logs=None):
        self._backup._commit_epoch(epoch, logs)


@contextlib.contextmanager
def _sigint_held():
    """Records a SIGINT instead of acting on it, and passes it on at the end.

    A Python-level handler, not a signal mask: TensorFlow's threads would
    take a process-directed signal that the main thread masks.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received and callable(previous):
            previous(signal.SIGINT, None)
        elif received and previous == signal.SIG_DFL:
            signal.raise_signal(signal.SIGINT)
