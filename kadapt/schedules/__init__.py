"""Learning-rate and momentum schedules."""

from kadapt.schedules.cosine_annealing import CosineAnnealing
from kadapt.schedules.cosine_momentum import CosineMomentum
from kadapt.schedules.piecewise_linear import PiecewiseLinear
