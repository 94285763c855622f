"""Memory-adaptive batching: exact in-step gradient accumulation, memory probe,
batch plans and out-of-memory recovery.

The other public names load their modules on first use (`kadapt.lazy`): on
the JAX backend the accumulation API imports no TensorFlow.
"""

from kadapt.batching.accumulate import AccumulatingWrapper  # noqa: F401
from kadapt.batching.accumulate import accumulate  # noqa: F401  (eager: the name is also its module's)
from kadapt.lazy import lazy_attributes

_NAMES = {
    "AccumulatingModel": "kadapt.batching.accumulating_model",
    "AccumulatingTrainStep": "kadapt.batching.accumulating_train_step",
    "BatchPlan": "kadapt.batching.batch_plan",
    "LogicalBatchLoss": "kadapt.batching.logical_batch_loss",
    "MemoryBudget": "kadapt.batching.memory_budget",
    "MemoryModel": "kadapt.batching.memory_model",
    "OutOfMemoryError": "kadapt.batching.oom_recovery",
    "ProbeResult": "kadapt.batching.probe",
    "ProbeTrial": "kadapt.batching.probe",
    "balanced_micro_batch": "kadapt.batching.batch_plan",
    "device_budget": "kadapt.batching.memory_budget",
    "parse_memory_size": "kadapt.batching.memory_budget",
    "plan_batch": "kadapt.batching.batch_plan",
    "probe_micro_batch": "kadapt.batching.micro_batch_probe",
    "reserve_region": "kadapt.batching.tensorflow.allocator_region",
}
__all__ = sorted([*_NAMES, "AccumulatingWrapper", "accumulate"])

__getattr__, __dir__ = lazy_attributes(__name__, _NAMES)
