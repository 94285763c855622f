"""Keras callbacks."""

from kadapt.callbacks.adaptive_batch_size import AdaptiveBatchSize
from kadapt.callbacks.best_weights import BestWeights
from kadapt.callbacks.momentum_scheduler import MomentumScheduler
from kadapt.callbacks.schedule_free_evaluation import ScheduleFreeEvaluation
