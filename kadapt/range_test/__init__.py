"""The learning-rate range test: `find_learning_rate` and its `RangeTestResult`.

The names load their modules when first used, so the rules
(`kadapt.range_test.curve`, NumPy only) import without TensorFlow."""

from kadapt.lazy import lazy_attributes

_NAMES = {
    "RangeTestResult": "kadapt.range_test.result",
    "find_learning_rate": "kadapt.range_test.find",
}
__all__ = sorted(_NAMES)

__getattr__, __dir__ = lazy_attributes(__name__, _NAMES)
