"""Optimizers whose hyperparameters can change during `fit`."""

from kadapt.optimizers.adam import Adam
from kadapt.optimizers.sgd import SGD
