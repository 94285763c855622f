"""`require`: an optional dependency, imported where it is first needed.

`pip install kadapt` installs Keras and NumPy, and no Keras backend: install
one with its extra (`kadapt[tensorflow]`, the default backend, or `kadapt[jax]`).
Every other feature names its packages as an extra in `pyproject.toml`;
a module that needs one imports it through `require`, so a missing package is one
`MissingExtraError` (an `ImportError`) that says which `pip install "kadapt[...]"`
brings it; the `kadapt` command reports it in one line. A feature that runs on
TensorFlow only calls `require_tensorflow`, which also refuses another Keras
backend with `UnsupportedBackendError`.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# Extra -> what it is for, as the error message says it. Keep in step with
# [project.optional-dependencies] in pyproject.toml.
EXTRAS = {
    "data": "Loading scikit-learn's bundled data sets (kadapt.meta.tasks, `kadapt train --data digits`)",
    "jax": "Keras' JAX backend (`KERAS_BACKEND=jax`), where kadapt's accumulating models also run",
    "plots": "Drawing the run directory's plots (`kadapt train`, `kadapt report`)",
    "postgres": "A record store on a PostgreSQL server",
    "store": "The record store (kadapt.meta.RecordStore, `kadapt meta`)",
    "tables": "Reading CSV and Parquet tables (`kadapt train --data TABLE.csv`)",
    "tensorflow": "TensorFlow (Keras' default backend; tf.data pipelines, multi-worker training)",
    "tuner": "A KerasTuner search (kadapt.tuning, kadapt.meta.MetaHyperModel, kadapt.meta.train_meta_model)",
}


class MissingExtraError(ImportError):
    """An optional package is missing; the message names the extra that installs it."""


class UnsupportedBackendError(RuntimeError):
    """A feature that runs on TensorFlow only was used on another Keras backend."""


def require(module: str, extra: str) -> ModuleType:
    """Imports `module`, or raises `MissingExtraError` naming the extra that installs it.

    Args:
        module: String. The module to import, e.g. `"sqlalchemy"`.
        extra: String. The kadapt extra that installs it, one of `EXTRAS`.

    Returns:
        The imported module.

    Example:

    ```python
    sa = require("sqlalchemy", extra="store")
    ```
    """
    if extra not in EXTRAS:
        raise ValueError(f"Argument `extra` must be one of {sorted(EXTRAS)}. Received: extra={extra!r}")
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise MissingExtraError(
            f"{EXTRAS[extra]} needs `{module}`, which cannot be imported ({error}). "
            f'Install it with: pip install "kadapt[{extra}]"',
            name=module,
        ) from error


def require_tensorflow(feature: str) -> ModuleType:
    """Imports TensorFlow for a feature that runs on Keras' TensorFlow backend only.

    Args:
        feature: String. What needs it, as the error message says it, e.g.
            `"Multi-worker training (kadapt.distribute)"`.

    Returns:
        The `tensorflow` module.

    Raises:
        UnsupportedBackendError: Keras runs on another backend (JAX).
        MissingExtraError: TensorFlow is not installed.

    Example:

    ```python
    tf = require_tensorflow("Multi-worker training (kadapt.distribute)")
    ```
    """
    import keras

    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise UnsupportedBackendError(
            f"{feature} runs on Keras' TensorFlow backend only; this process runs Keras on "
            f"{backend!r}. Set KERAS_BACKEND=tensorflow before Keras is imported "
            '(and pip install "kadapt[tensorflow]").')
    return require("tensorflow", extra="tensorflow")
