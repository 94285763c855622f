"""One-call training recipes and inference helpers.

`FastFitConfig` is importable without TensorFlow (the command line builds its
flags from it); `fast_fit` and `predict_with_tta` load their modules when
first used (PEP 562).
"""

import importlib

from kadapt.recipes.config import FastFitConfig

_NAMES = {
    "fast_fit": "kadapt.recipes.fast_fit",
    "predict_with_tta": "kadapt.recipes.inference",
}
__all__ = ["FastFitConfig", *sorted(_NAMES)]


def __getattr__(name):
    if name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kadapt.recipes' has no attribute {name!r}")
