"""The framework internals kadapt reads where Keras and TensorFlow have no public API.

Every private name kadapt uses is here, nowhere else (tests/test_compat.py checks both):
private code moves without notice between releases. Read against, and tested with, Keras 3.15
and TensorFlow 2.21 (pyproject.toml); on another release tests/test_compat.py names each
one that moved. Each is imported when first called: importing kadapt loads no framework.
"""

from __future__ import annotations

import importlib
import importlib.util
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


def build_training_state(model: Any, data_batch: Any) -> None:
    """Creates `model`'s, its compiled metrics' and loss's and its optimizer's
    variables for batches shaped as `data_batch` (`(x, y, sample_weight)`),
    without running a step.

    Keras' TensorFlow trainer builds them this way only under a distribution
    strategy; otherwise the first trace of the train step creates them, and a
    `tf.function` whose first trace creates variables traces a second time
    (a second XLA compile under `jit_compile`): plain Keras does so too.
    `keras.src.trainers.trainer.Trainer._symbolic_build` is the step Keras
    runs for this (symbolic tensors, nothing computed); there is no public
    entry.
    """
    model._symbolic_build(data_batch=data_batch)


def get_keras_mask(tensor: Any) -> Any:
    """The Keras mask a layer attached to `tensor`, or `None`.

    Keras has no public reader: a JAX array takes no attribute, so Keras keeps
    its masks in a table by the array's id, which only its own reader
    (`keras.src.backend.common.masking.get_keras_mask`) consults.
    """
    from keras.src.backend.common.masking import get_keras_mask as read

    return read(tensor)


def resolve_loss(identifier: Any, y_true: Any, y_pred: Any) -> Any:
    """The `keras.losses.Loss` that `compile(loss=identifier)` trains with.

    Keras' own resolution (`keras.src.trainers.compile_utils.get_loss`):
    `keras.losses.get` for a name, function or config, except `"crossentropy"`
    / `"ce"`, which become the binary, sparse or categorical cross-entropy by
    the shapes of `y_true` and `y_pred`, a rule with no public entry; a plain
    function is wrapped in a `LossFunctionWrapper`.
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
    measured). So this reads the eager context's own device list.
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
