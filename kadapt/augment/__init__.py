"""Data augmentation from Keras' own layers: on the fly, or appended to the training set."""

from kadapt.augment.expand import expand
from kadapt.augment.pipeline import augmentation
from kadapt.augment.pipeline import augment_dataset
