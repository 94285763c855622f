"""Memory-adaptive batching: exact in-step gradient accumulation, memory probe,
batch plans and out-of-memory recovery."""

from kadapt.batching.accumulate import AccumulatingWrapper
from kadapt.batching.accumulate import accumulate
from kadapt.batching.accumulating_model import AccumulatingModel
from kadapt.batching.accumulating_train_step import AccumulatingTrainStep
from kadapt.batching.allocator_region import reserve_region
from kadapt.batching.batch_plan import BatchPlan
from kadapt.batching.batch_plan import balanced_micro_batch
from kadapt.batching.batch_plan import plan_batch
from kadapt.batching.logical_batch_loss import LogicalBatchLoss
from kadapt.batching.memory_budget import MemoryBudget
from kadapt.batching.memory_budget import device_budget
from kadapt.batching.memory_budget import parse_memory_size
from kadapt.batching.memory_model import MemoryModel
from kadapt.batching.oom_recovery import OutOfMemoryError
from kadapt.batching.probe import ProbeResult
from kadapt.batching.probe import ProbeTrial
from kadapt.batching.probe import probe_micro_batch
