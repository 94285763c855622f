"""Meta-learning of mid-run hyperparameter adjustments: records, features, collection, model, adjuster.

`MetaAdjuster` and its default meta-model need only the core install. The record
store (extra `store`) and the meta-model search (extra `tuner`) load on first use,
so a missing extra is an `ImportError` there and nowhere else.
"""

from kadapt.lazy import lazy_attributes

from kadapt.meta import actions
from kadapt.meta import features
from kadapt.meta import tasks
from kadapt.meta.adjuster import MetaAdjuster
from kadapt.meta.adjustment_record import AdjustmentRecord
from kadapt.meta.chance_loss import chance_loss
from kadapt.meta.chance_loss import regression_chance_loss
from kadapt.meta.collect import CollectionConfig
from kadapt.meta.collect import collect
from kadapt.meta.dead_run import DeadRunRule
from kadapt.meta.meta_model import MetaSpec
from kadapt.meta.meta_model import load_meta_model
from kadapt.meta.policy import AdjustmentPolicy
from kadapt.meta.range_test_start import RangeTestStart
from kadapt.meta.restart_trial import RestartTrial
from kadapt.meta.triggers import Trigger

_OPTIONAL_NAMES = {
    "MetaHyperModel": "kadapt.meta.hyper_model",
    "RecordStore": "kadapt.meta.record_store",
    "RecordStoreError": "kadapt.meta.record_store",
    "train_meta_model": "kadapt.meta.train",
}
__all__ = sorted([
    "AdjustmentPolicy", "AdjustmentRecord", "CollectionConfig", "DeadRunRule", "MetaAdjuster", "MetaSpec", "RangeTestStart", "RestartTrial", "Trigger", "actions", "chance_loss", "collect",
    "features", "load_meta_model", "regression_chance_loss", "tasks", *_OPTIONAL_NAMES,
])


__getattr__, __dir__ = lazy_attributes(__name__, _OPTIONAL_NAMES)
