"""KerasTuner integration."""

from kadapt.tuning.accumulating_hyper_model import AccumulatingHyperModel
