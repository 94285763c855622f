"""`load_model`: a saved `.keras` file, loaded in safe mode with kadapt's objects known."""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import keras

# The modules whose classes are registered with Keras (optimizers, schedules,
# layers, models); Keras finds a registered class only once its module ran.
REGISTERING_MODULES = (
    "kadapt.batching", "kadapt.meta.meta_model", "kadapt.models", "kadapt.optimizers",
    "kadapt.schedules",
)


def register_objects() -> None:
    """Imports every kadapt module that registers classes with Keras."""
    for name in REGISTERING_MODULES:
        importlib.import_module(name)


def load_model(path: str | os.PathLike, compile: bool = True) -> keras.Model:
    """Loads a `.keras` file in Keras' safe mode, kadapt's objects registered.

    Args:
        path: String or `pathlib.Path`. The `.keras` file.
        compile: Bool. Compile with the saved optimizer and loss. Defaults to `True`.

    Returns:
        The `keras.Model`.

    Example:

    ```python
    model = kadapt.load_model("runs/demo/model.keras")
    ```
    """
    import keras

    register_objects()
    return keras.saving.load_model(path, compile=compile, safe_mode=True)
