"""kadapt: Keras training that adapts to the machine and to the run.

Importing kadapt does not import TensorFlow: each public name loads its module
when first used (PEP 562). So a program, and the `kadapt` command, can set
TensorFlow's process settings first (`kadapt.environment.configure_tensorflow`).
`kadapt.load_model` loads a saved `.keras` file with kadapt's objects known to
Keras.
"""

from kadapt.lazy import lazy_attributes

__version__ = "0.1.0"

_SUBMODULES = (
    "augment", "batching", "callbacks", "datasets", "distribute", "environment", "meta", "models",
    "optimizers", "precision", "range_test", "recipes", "schedules", "tuning",
)
_NAMES = {
    "AccumulatingModel": "kadapt.batching",
    "AccumulatingTrainStep": "kadapt.batching",
    "AccumulatingWrapper": "kadapt.batching",
    "AdaptiveBatchSize": "kadapt.callbacks",
    "AllocatorStatisticsError": "kadapt.environment",
    "BatchPlan": "kadapt.batching",
    "CosineAnnealing": "kadapt.schedules",
    "CosineMomentum": "kadapt.schedules",
    "DeadRunRescue": "kadapt.meta",
    "MemoryModel": "kadapt.batching",
    "MetaAdjuster": "kadapt.meta",
    "MomentumScheduler": "kadapt.callbacks",
    "OutOfMemoryError": "kadapt.batching",
    "PrecisionChoice": "kadapt.precision",
    "ProbeResult": "kadapt.batching",
    "ProbeTrial": "kadapt.batching",
    "RangeTestResult": "kadapt.range_test",
    "accumulate": "kadapt.batching",
    "balanced_micro_batch": "kadapt.batching",
    "choose_precision": "kadapt.precision",
    "find_learning_rate": "kadapt.range_test",
    "load_model": "kadapt.saving",
    "plan_batch": "kadapt.batching",
    "portable_model": "kadapt.saving",
    "probe_micro_batch": "kadapt.batching",
}
__all__ = sorted(_NAMES) + list(_SUBMODULES)


__getattr__, __dir__ = lazy_attributes(__name__, _NAMES, _SUBMODULES)
