"""`require`: an optional dependency, imported where it is first needed.

`pip install kadapt` installs what `kadapt.accumulate` needs (Keras, TensorFlow,
NumPy). Every other feature names its packages as an extra in `pyproject.toml`;
a module that needs one imports it through `require`, so a missing package is one
`MissingExtraError` (an `ImportError`) that says which `pip install "kadapt[...]"`
brings it; the `kadapt` command reports it in one line.
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
    "tuner": "A KerasTuner search (kadapt.tuning, kadapt.meta.MetaHyperModel, kadapt.meta.train_meta_model)",
}


class MissingExtraError(ImportError):
    """An optional package is missing; the message names the extra that installs it."""


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
