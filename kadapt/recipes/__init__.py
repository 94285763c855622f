"""One-call training recipes and inference helpers.

`FastFitConfig` is importable without TensorFlow (the command line builds its
flags from it); `fast_fit` and `predict_with_tta` load their modules when
first used (PEP 562).
"""

from kadapt.lazy import lazy_attributes

from kadapt.recipes.config import FastFitConfig

_NAMES = {
    "fast_fit": "kadapt.recipes.fast_fit",
    "predict_with_tta": "kadapt.recipes.inference",
}
__all__ = ["FastFitConfig", *sorted(_NAMES)]


__getattr__, __dir__ = lazy_attributes(__name__, _NAMES)
