"""kadapt: Keras training that adapts to the machine and to the run."""

from kadapt import augment
from kadapt import callbacks
from kadapt import datasets
from kadapt import meta
from kadapt import models
from kadapt import optimizers
from kadapt import recipes
from kadapt import schedules
from kadapt import tuning
from kadapt.batching import AccumulatingModel
from kadapt.batching import AccumulatingTrainStep
from kadapt.batching import AccumulatingWrapper
from kadapt.batching import BatchPlan
from kadapt.batching import MemoryModel
from kadapt.batching import OutOfMemoryError
from kadapt.batching import ProbeResult
from kadapt.batching import ProbeTrial
from kadapt.batching import accumulate
from kadapt.batching import plan_batch
from kadapt.batching import probe_micro_batch
from kadapt.callbacks import AdaptiveBatchSize
from kadapt.callbacks import MomentumScheduler
from kadapt.meta import MetaAdjuster
from kadapt.schedules import CosineAnnealing
from kadapt.schedules import CosineMomentum

__version__ = "0.1.0"
