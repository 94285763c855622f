"""Memory-adaptive batching: exact in-step gradient accumulation."""

from kadapt.batching.accumulate import AccumulatingWrapper
from kadapt.batching.accumulate import accumulate
from kadapt.batching.accumulating_model import AccumulatingModel
from kadapt.batching.accumulating_train_step import AccumulatingTrainStep
