"""`lazy_attributes`: a package's public names, each loading its module on first use (PEP 562).

So importing `kadapt` (or `kadapt.recipes`, `kadapt.run`, `kadapt.meta`) imports
no TensorFlow, and a name whose optional dependency is missing fails only when
it is used (`kadapt.extras`).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping


def lazy_attributes(package: str, names: Mapping[str, str],
                    submodules: Iterable[str] = ()) -> tuple[Callable, Callable]:
    """The `__getattr__` and `__dir__` of `package`.

    Args:
        package: String. The package's `__name__`.
        names: Mapping. Public name -> the module that defines it.
        submodules: Iterable of strings. Submodules reachable as attributes.
            Defaults to none.

    Example:

    ```python
    __getattr__, __dir__ = lazy_attributes(__name__, {"fast_fit": "kadapt.recipes.fast_fit"})
    ```
    """
    submodules = frozenset(submodules)

    def __getattr__(name):
        if name in submodules:
            return importlib.import_module(f"{package}.{name}")
        if name in names:
            value = getattr(importlib.import_module(names[name]), name)
            setattr(sys.modules[package], name, value)
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        module = sys.modules[package]
        return sorted(set(vars(module)) | set(getattr(module, "__all__", ())))

    return __getattr__, __dir__
