"""Meta-learning of mid-run hyperparameter adjustments: the adjuster, its start, records, the model.

The modules live in rooms by job (docs/layout.md): `live/`, `start/`, `observe/`, `records/`, `model/`.

`MetaAdjuster` and its default meta-model need only the core install. The record
store (extra `store`) and the meta-model search (extra `tuner`) load on first use,
so a missing extra is an `ImportError` there and nowhere else.
"""

from kadapt.lazy import lazy_attributes

from kadapt.meta.live.adjuster import MetaAdjuster
from kadapt.meta.live.chance_loss import chance_loss
from kadapt.meta.live.chance_loss import regression_chance_loss
from kadapt.meta.live.dead_run import DeadRunRule
from kadapt.meta.live.dead_run_rescue import DeadRunRescue
from kadapt.meta.live.high_rate import HighRateCheck
from kadapt.meta.live.policy import AdjustmentPolicy
from kadapt.meta.live.restart_trial import RestartTrial
from kadapt.meta.live.triggers import Trigger
from kadapt.meta.model import actions
from kadapt.meta.model import features
from kadapt.meta.model.adjustment_record import AdjustmentRecord
from kadapt.meta.model.meta_model import MetaSpec
from kadapt.meta.model.meta_model import load_meta_model
from kadapt.meta.records import tasks
from kadapt.meta.records.collect import CollectionConfig
from kadapt.meta.records.collect import collect
from kadapt.meta.start.range_test_start import RangeTestStart

_OPTIONAL_NAMES = {
    "MetaHyperModel": "kadapt.meta.model.hyper_model",
    "RecordStore": "kadapt.meta.records.record_store",
    "RecordStoreError": "kadapt.meta.records.record_store",
    "train_meta_model": "kadapt.meta.records.train",
}
__all__ = sorted([
    "AdjustmentPolicy", "AdjustmentRecord", "CollectionConfig", "DeadRunRescue", "DeadRunRule", "HighRateCheck",
    "MetaAdjuster",
    "MetaSpec", "RangeTestStart", "RestartTrial", "Trigger", "actions", "chance_loss", "collect",
    "features", "load_meta_model", "regression_chance_loss", "tasks", *_OPTIONAL_NAMES,
])


__getattr__, __dir__ = lazy_attributes(__name__, _OPTIONAL_NAMES)
