"""Meta-learning of mid-run hyperparameter adjustments: records, features, collection, model, adjuster."""

from kadapt.meta import actions
from kadapt.meta import features
from kadapt.meta import tasks
from kadapt.meta.adjuster import MetaAdjuster
from kadapt.meta.adjustment_record import AdjustmentRecord
from kadapt.meta.collect import CollectionConfig
from kadapt.meta.collect import collect
from kadapt.meta.hyper_model import MetaHyperModel
from kadapt.meta.meta_model import MetaSpec
from kadapt.meta.meta_model import load_meta_model
from kadapt.meta.record_store import RecordStore
from kadapt.meta.record_store import RecordStoreError
from kadapt.meta.train import train_meta_model
from kadapt.meta.triggers import Trigger
