"""Optimizers whose hyperparameters can change during `fit`."""

from kadapt.optimizers.sgd import SGD
