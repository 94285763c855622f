"""KerasTuner integration."""

from kadapt.tuning.accumulating_hyper_model import AccumulatingHyperModel
from kadapt.tuning.distributed_search import DistributedSearch
from kadapt.tuning.distributed_search import distributed_search
