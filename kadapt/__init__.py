"""kadapt: Keras training that adapts to the machine and to the run."""

from kadapt import datasets
from kadapt import tuning
from kadapt.batching import AccumulatingModel
from kadapt.batching import AccumulatingTrainStep
from kadapt.batching import AccumulatingWrapper
from kadapt.batching import accumulate

__version__ = "0.1.0"

