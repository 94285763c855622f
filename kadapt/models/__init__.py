"""Model builders."""

from kadapt.models.fast_resnet import PartialIdentity
from kadapt.models.fast_resnet import ScaledGradientBias
from kadapt.models.fast_resnet import fast_resnet
from kadapt.models.fast_resnet import patch_whitening
from kadapt.models.small_cnn import small_cnn
