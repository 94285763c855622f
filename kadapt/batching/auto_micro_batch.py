"""`micro_batch_size="auto"`: probe at the first `fit`, cache the answer on disk.

The cache key is the model's signature (its config and weight shapes), the
input shapes and dtypes, the dtype policy, the optimizer, the device and its
budget, and the largest size worth having; a run with the same key reuses the
micro-batch without probing. The cache lives in `$KADAPT_CACHE_DIR`
(default `~/.cache/kadapt`), one JSON file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from kadapt.batching import probe
from kadapt.batching.allocator_region import reserve_region
from kadapt.batching.batch_plan import balanced_micro_batch
from kadapt.batching.layer_walk import reachable_layers
from kadapt.batching.memory_budget import MemoryBudget
from kadapt.batching.memory_budget import device_budget

logger = logging.getLogger("kadapt")
KERAS_DEFAULT_BATCH_SIZE = 32


def cache_path() -> Path:
    folder = os.environ.get("KADAPT_CACHE_DIR") or Path("~/.cache/kadapt").expanduser()
    return Path(folder) / "probe-cache.json"


def resolve_auto_micro_batch(model: keras.Model, x: Any, y: Any, batch_size: int | None, sample_weight: Any) -> None:
    """Sets `model.micro_batch_size` from the cache or a fresh probe."""
    data = x if isinstance(x, tf.data.Dataset) else (x, y, sample_weight)
    sample = probe.sample_rows(data)
    cap = _logical_batch_size(x, sample, batch_size)
    budget = device_budget(model.memory_budget)
    key = cache_key(model, sample, budget, cap)
    cached = _read_cache().get(key)
    if cached is not None:
        reserve_region(budget)  # the region the cached size was measured in (a probe holds its own)
        model.micro_batch_size = cached["micro_batch_size"]
        logger.info("micro_batch_size=%d from the probe cache", model.micro_batch_size)
        return
    result = probe.probe_micro_batch(model, data, model.memory_budget, max_micro_batch_size=cap)
    model.probe_result = result
    # As many passes as the largest size that fits needs, split evenly (never a sliver).
    model.micro_batch_size = balanced_micro_batch(cap, result.micro_batch_size)
    _write_cache(key, {"micro_batch_size": model.micro_batch_size, "probe": result.to_dict()})
    logger.info(
        "micro_batch_size=%d after %d trial steps (the largest that fits: %d; budget %d bytes, %s)",
        model.micro_batch_size, len(result.trials), result.micro_batch_size, budget.bytes, budget.source,
    )


def _logical_batch_size(x, sample, batch_size):
    if isinstance(x, tf.data.Dataset):
        return probe.row_count(sample)
    return batch_size or KERAS_DEFAULT_BATCH_SIZE


def cache_key(model: keras.Model, sample: tuple, budget: MemoryBudget, cap: int) -> str:
    inputs = [
        (list(a.shape[1:]), str(a.dtype)) for a in tf.nest.flatten(sample[0]) if a is not None
    ]
    try:
        config = model.get_config()
    except (NotImplementedError, TypeError):
        config = type(model).__qualname__  # a subclassed model without get_config
    signature = {
        "model": config,
        "weights": [list(w.shape) for w in model.weights],
        "inputs": inputs,
        # The policies the layers compute under (a network built under mixed_bfloat16 and
        # trained after the global policy went back to float32 is a bfloat16 network).
        "dtype_policy": sorted({layer.dtype_policy.name for layer in reachable_layers(model)}),
        "optimizer": type(model.optimizer).__name__,
        "device": budget.device,
        "budget": budget.bytes,
        "cap": cap,
        "versions": [tf.__version__, keras.__version__],
    }
    text = json.dumps(_without_names(signature), sort_keys=True, default=str)
    # Keras numbers auto-generated names per session ("conv2d_3"); the same
    # architecture must hit the same entry in the next run.
    text = re.sub(r"_\d+\b", "", text)
    return hashlib.sha256(text.encode()).hexdigest()


def _without_names(value):
    if isinstance(value, dict):
        return {k: _without_names(v) for k, v in value.items() if k != "name"}
    if isinstance(value, (list, tuple)):
        return [_without_names(v) for v in value]
    return value


def _read_cache():
    path = cache_path()
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:
        logger.warning("ignoring unreadable probe cache %s (%s)", path, error)
        return {}


def _write_cache(key, entry):
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    entries = _read_cache()
    entries[key] = entry
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps(entries, indent=1))
    os.replace(temporary, path)  # atomic: readers never see half a file
