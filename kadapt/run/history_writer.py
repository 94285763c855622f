"""`HistoryWriter`: the Keras History as JSON, rewritten after every epoch."""

import json
import numbers

import keras

from kadapt.run.run_directory import whole_file


class HistoryWriter(keras.callbacks.Callback):
    """Keeps `history.json` (`{"epoch": [...], metric: [...]}`, as Keras'
    `History.history` plus the epoch numbers) current after every epoch, so an
    interrupted run keeps the epochs that finished. A resumed run continues
    the file from the epoch it restarts at.

    Args:
        path: String or `Path`. The JSON file.
    """

    def __init__(self, path):
        super().__init__()
        self.path = path
        self.history = None

    def on_epoch_begin(self, epoch, logs=None):
        if self.history is None:
            self.history = self._read_until(epoch)

    def on_epoch_end(self, epoch, logs=None):
        self.history.setdefault("epoch", []).append(epoch)
        for key, value in (logs or {}).items():
            self.history.setdefault(key, []).append(_json_value(value))
        with whole_file(self.path) as temporary, open(temporary, "w") as stream:
            json.dump(self.history, stream, indent=1)

    def _read_until(self, epoch):
        """The saved history of epochs before `epoch` (those a resume keeps)."""
        try:
            with open(self.path) as stream:
                saved = json.load(stream)
        except (FileNotFoundError, ValueError):
            return {}
        return {key: values[:epoch] for key, values in saved.items()}


def _json_value(value):
    """Numbers (NumPy and backend scalars too) as floats; anything else as text."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Number) or getattr(value, "shape", None) == ():
        return float(value)
    return str(value)
