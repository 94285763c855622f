"""One-call training recipes and inference helpers."""

from kadapt.recipes.config import FastFitConfig
from kadapt.recipes.fast_fit import fast_fit
from kadapt.recipes.inference import predict_with_tta
