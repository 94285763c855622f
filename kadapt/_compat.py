"""The framework internals kadapt reads where Keras and TensorFlow have no public API.

Every private name and private attribute kadapt uses is here, nowhere else (tests/test_compat.py
checks both): private code moves without notice between releases. Read against, and tested with,
Keras 3.15.1, TensorFlow 2.21.0 and JAX 0.10.2 (pyproject.toml); on another release
tests/test_compat.py names each private name that moved. Each is imported when first called:
importing kadapt loads no framework.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Sequence
from typing import Any

# module -> the names read from it (tests/test_compat.py checks that each exists).
PRIVATE_NAMES = {
    "keras.src.backend.common.masking": ("get_keras_mask",),
    "keras.src.trainers.compile_utils": ("get_loss",),
    "keras.src.trainers.trainer": ("Trainer._symbolic_build",),
    "tensorflow.python.eager.context": ("context",),
    "tensorflow.python.pywrap_tfe": ("TFE_ContextListDevices", "TF_DeviceListCount", "TF_DeviceListName",
                                     "TF_DeleteDeviceList"),
    "tensorflow.python.client.pywrap_tf_session": ("TF_DeviceListMemoryBytes",),
    "keras.src.optimizers.base_optimizer": ("BaseOptimizer._get_variable_index",),
    "keras.src.callbacks.backup_and_restore": ("BackupAndRestore._save_model", "BackupAndRestore._load_model"),
    "keras.src.backend.tensorflow.trainer": ("TensorFlowTrainer._maybe_symbolic_build",),
    "tensorflow.python.distribute.collective_all_reduce_strategy": (
        "CollectiveAllReduceExtended._in_multi_worker_mode",),
    "keras.src.optimizers.muon": ("Muon._should_use_adamw",),
}

# Private attribute -> the framework class that holds it (a method, or set on its instances),
# in the releases named above. Only this module reads or sets them, each through one function
# below; tests/test_compat.py fails on any other use of these names outside it, and on any
# underscored attribute kadapt does not define itself.
PRIVATE_ATTRIBUTES = {
    "_context_handle": "tensorflow.python.eager.context.Context",
    "_current_epoch": "keras.src.callbacks.backup_and_restore.BackupAndRestore",
    "_distribute_strategy": "keras.src.backend.tensorflow.trainer.TensorFlowTrainer",
    "_distributed_container": "a component of tensorflow.python.distribute.values.DistributedVariable",
    "_distributed_dataset": "keras.src.backend.tensorflow.trainer.TFEpochIterator",
    "_get_variable_index": "keras.src.optimizers.base_optimizer.BaseOptimizer",
    "_in_multi_worker_mode": "tensorflow.python.distribute.collective_all_reduce_strategy.CollectiveAllReduceExtended",
    "_initial_epoch": "keras.src.trainers.trainer.Trainer",
    "_last_batch_seen": "keras.src.callbacks.backup_and_restore.BackupAndRestore",
    "_learning_rate": "keras.src.optimizers.base_optimizer.BaseOptimizer",
    "_load_model": "keras.src.callbacks.backup_and_restore.BackupAndRestore",
    "_maybe_symbolic_build": "keras.src.backend.tensorflow.trainer.TensorFlowTrainer",
    "_save_model": "keras.src.callbacks.backup_and_restore.BackupAndRestore",
    "_should_use_adamw": "keras.src.optimizers.muon.Muon",
    "_symbolic_build": "keras.src.trainers.trainer.Trainer",
    "_value_specs": "tensorflow.python.distribute.values.PerReplicaSpec",
    "_velocities": "keras.src.optimizers.adam.Adam",
    "_velocity_hats": "keras.src.optimizers.adam.Adam",
}

# kadapt class -> the private methods of its framework base it overrides, where Keras offers no
# public hook for the job (each override says why). Each is named in `PRIVATE_NAMES` too, so a
# release that drops it is reported; tests/test_compat.py allows these overrides, and their
# `super()` calls, nowhere else.
PRIVATE_OVERRIDES = {
    "kadapt.run.backup.InterruptSafeBackup": ("_save_model", "_load_model"),
    "kadapt.batching.tensorflow.train_step.TensorFlowAccumulation": ("_maybe_symbolic_build",),
    # Keras' Muon decides its slots, its step and its decay per variable through this one method
    "kadapt.optimizers.filter_muon.FilterMuon": ("_should_use_adamw",),
}


def missing_private_names() -> list[str]:
    """The entries of `PRIVATE_NAMES` this installation lacks, as `"module.name"`
    (a module that is not installed counts as none missing: its backend is optional)."""
    missing = []
    for module_name, names in PRIVATE_NAMES.items():
        if importlib.util.find_spec(module_name.partition(".")[0]) is None:
            continue
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            missing += [f"{module_name}.{name}" for name in names]
            continue
        missing += [f"{module_name}.{name}" for name in names if not _has_path(module, name)]
    return missing


def _has_path(module: Any, dotted: str) -> bool:
    for part in dotted.split("."):
        if not hasattr(module, part):
            return False
        module = getattr(module, part)
    return True


def muon_takes_adamw(optimizer: Any, variable: Any) -> bool:
    """Whether Keras' `Muon` (or `kadapt.optimizers.FilterMuon`) gives `variable` its AdamW step
    rather than the orthogonalized one (`Muon._should_use_adamw`)."""
    return optimizer._should_use_adamw(variable)


def build_training_state(model: Any, data_batch: Any) -> None:
    """Creates `model`'s, its compiled metrics' and loss's and its optimizer's
    variables for batches shaped as `data_batch` (`(x, y, sample_weight)`),
    without running a step.

    Keras' TensorFlow trainer builds them this way only under a distribution
    strategy; otherwise the first trace of the train step creates them, and a
    `tf.function` whose first trace creates variables traces a second time
    (a second XLA compile under `jit_compile`): plain Keras does so too.
    `keras.src.trainers.trainer.Trainer._symbolic_build` is the step Keras
    runs for this (symbolic tensors, nothing computed; what `train_on_batch`
    calls first); there is no public entry. The JAX memory plan builds a model
    from shapes alone the same way. Read against Keras 3.15.1.
    """
    model._symbolic_build(data_batch=data_batch)


def learning_rate_as_set(optimizer: Any) -> Any:
    """What `optimizer.learning_rate` was set to: a variable, or the
    `LearningRateSchedule` object itself; `None` for an object without one.

    The public `learning_rate` evaluates a schedule at the current step, and
    no public getter returns the schedule, which kadapt needs as the same
    object: to put it back after swapping it out, to look ahead along it, to
    tell a new one from the one traced into a function. Keras 3.15.1 keeps it
    in `_learning_rate` (`keras/src/optimizers/base_optimizer.py`).
    """
    return getattr(optimizer, "_learning_rate", None)


def adam_second_moments(optimizer: Any, variables: Sequence[Any]) -> list[Any]:
    """The second-moment slots of a built `keras.optimizers.Adam` (or `AdamW`)
    for `variables`, in their order: `v`, or `v_hat` under `amsgrad`.

    Keras has no public reader of an optimizer's slot for a variable. Keras
    3.15.1 keeps Adam's in the lists `_velocities` and `_velocity_hats`,
    indexed by `_get_variable_index` (`keras/src/optimizers/adam.py`,
    `base_optimizer.py`).
    """
    slots = optimizer._velocity_hats if optimizer.amsgrad else optimizer._velocities
    return [slots[optimizer._get_variable_index(variable)] for variable in variables]


def creation_strategy(model: Any) -> Any:
    """The `tf.distribute` strategy `model` was created under, or `None`.

    The public `model.distribute_strategy` falls back to the default strategy
    for a model created outside any, so it cannot tell the two apart. Keras
    3.15.1's TensorFlow trainer keeps the creation scope's strategy in
    `_distribute_strategy` (`keras/src/backend/tensorflow/trainer.py`).
    """
    return model._distribute_strategy


def epoch_iterator_spec(iterator: Any) -> Any:
    """The `element_spec` of the distributed dataset a Keras epoch iterator on
    TensorFlow draws from, or `None` where it has none.

    Reading it draws no batch. Keras 3.15.1's `TFEpochIterator` keeps the
    dataset in `_distributed_dataset` (`keras/src/backend/tensorflow/trainer.py`)
    and has no public reader.
    """
    return getattr(getattr(iterator, "_distributed_dataset", None), "element_spec", None)


def per_replica_specs(spec: Any) -> tuple | None:
    """The specs of each replica's value in a `tf.distribute` `PerReplicaSpec`,
    or `None` for any other spec.

    TensorFlow 2.21 keeps them in `_value_specs`
    (`tensorflow/python/distribute/values.py`) and has no public reader.
    """
    return getattr(spec, "_value_specs", None)


def distributed_container(value: Any) -> Any:
    """The `tf.distribute` variable of which `value` is one replica's component,
    or `None` (not a component).

    An optimizer's `update_step` receives a replica's component, while its slot
    belongs to the distributed variable. TensorFlow 2.21 links each component
    to its container by a weak reference, `_distributed_container`, set on the
    component, or on its `handle` for a resource variable
    (`tensorflow/python/distribute/values.py`); no public call maps one to the
    other.
    """
    link = getattr(value, "_distributed_container", None)
    return None if link is None else link()


def spans_several_workers(strategy: Any) -> bool:
    """Whether a `tf.distribute.MultiWorkerMirroredStrategy` spans more than
    this process.

    TensorFlow 2.21 answers it with `strategy.extended._in_multi_worker_mode()`
    (more than one worker in its cluster,
    `tensorflow/python/distribute/collective_all_reduce_strategy.py`); the
    public strategy does not say how many workers it has.
    """
    return strategy.extended._in_multi_worker_mode()


def backup_position(callback: Any) -> tuple[int, int]:
    """`(epoch, batch)` a checkpoint of `keras.callbacks.BackupAndRestore`
    written now records: the epoch a resumed run starts at, and the last batch
    seen in it.

    Keras 3.15.1 keeps them in `_current_epoch` and `_last_batch_seen`, which
    its `on_epoch_end` and `on_train_batch_end` set and its own `_save_model`
    writes (`keras/src/callbacks/backup_and_restore.py`); no public reader.
    """
    return callback._current_epoch, callback._last_batch_seen


def resume_at_epoch(model: Any, epoch: int) -> None:
    """Makes the `fit` that is starting run from `epoch`, when a callback's
    `on_train_begin` restores a checkpoint (as `BackupAndRestore` does).

    `fit`'s `initial_epoch` is an argument, fixed before the callbacks run.
    Keras 3.15.1's trainers (TensorFlow and JAX) read `_initial_epoch` after
    `on_train_begin` instead when it is set, and Keras' own `BackupAndRestore`
    sets it so (`keras/src/backend/*/trainer.py`,
    `keras/src/callbacks/backup_and_restore.py`).
    """
    model._initial_epoch = epoch


def get_keras_mask(tensor: Any) -> Any:
    """The Keras mask a layer attached to `tensor`, or `None`.

    Keras has no public reader: a JAX array takes no attribute, so Keras keeps
    its masks in a table by the array's id, which only its own reader
    (`keras.src.backend.common.masking.get_keras_mask`) consults. Read
    against Keras 3.15.1.
    """
    from keras.src.backend.common.masking import get_keras_mask as read

    return read(tensor)


def resolve_loss(identifier: Any, y_true: Any, y_pred: Any) -> Any:
    """The `keras.losses.Loss` that `compile(loss=identifier)` trains with.

    Keras' own resolution (`keras.src.trainers.compile_utils.get_loss`):
    `keras.losses.get` for a name, function or config, except `"crossentropy"`
    / `"ce"`, which become the binary, sparse or categorical cross-entropy by
    the shapes of `y_true` and `y_pred`, a rule with no public entry; a plain
    function is wrapped in a `LossFunctionWrapper`. Read against Keras 3.15.1.
    """
    from keras.src.trainers.compile_utils import get_loss

    return get_loss(identifier, y_true, y_pred)


def tensorflow_device_memory_limits() -> dict[str, int]:
    """`{"/job:localhost/replica:0/task:0/device:GPU:0": bytes, ...}`: the
    `memory_limit` of each device of TensorFlow's eager context, or `{}` where
    the internals it reads are gone.

    TensorFlow has no public call for it: `tf.config` reports a logical
    device's configured limit only, and `device_lib.list_local_devices()` /
    `tf.compat.v1.Session().list_devices()` create a second set of devices,
    whose limit TensorFlow computes again from the free memory of that moment,
    after this process's allocator took its pool (read in the TF sources, not
    measured). So this reads the eager context's own device list. Read
    against TensorFlow 2.21.0.
    """
    try:
        from tensorflow.python import pywrap_tfe
        from tensorflow.python.client import pywrap_tf_session
        from tensorflow.python.eager import context

        handle = context.context()
        handle.ensure_initialized()
        listing = pywrap_tfe.TFE_ContextListDevices(handle._context_handle)
    except (ImportError, AttributeError, TypeError):
        return {}
    try:
        return {
            pywrap_tfe.TF_DeviceListName(listing, i): int(pywrap_tf_session.TF_DeviceListMemoryBytes(listing, i))
            for i in range(pywrap_tfe.TF_DeviceListCount(listing))
        }
    except (AttributeError, TypeError):
        return {}
    finally:
        pywrap_tfe.TF_DeleteDeviceList(listing)
