"""Keras callbacks."""

from kadapt.callbacks.momentum_scheduler import MomentumScheduler
