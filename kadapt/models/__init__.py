"""Model builders."""

from kadapt.models.fast_resnet import PartialIdentity, ScaledGradientBias, fast_resnet, patch_whitening
from kadapt.models.small_cnn import small_cnn
