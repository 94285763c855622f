"""Optimizers whose hyperparameters can change during `fit`, the
learning-rate-free ones Keras lacks (Schedule-Free SGD/AdamW, Prodigy), and
Keras' Muon on convolution filters (`FilterMuon`)."""

from kadapt.optimizers.adam import Adam
from kadapt.optimizers.batch_statistics import recompute_batch_statistics
from kadapt.optimizers.by_name import get
from kadapt.optimizers.filter_muon import FilterMuon
from kadapt.optimizers.live_rate import MultipliedSchedule
from kadapt.optimizers.live_rate import live_rate
from kadapt.optimizers.prodigy import Prodigy
from kadapt.optimizers.schedule_free_adamw import ScheduleFreeAdamW
from kadapt.optimizers.schedule_free_sgd import ScheduleFreeSGD
from kadapt.optimizers.sgd import SGD
