"""`reserve_region`: with the budget held as one region, the CPU allocator
counts a buffer as requested (rounded to its 256-byte unit) instead of a whole
chunk of a region grown for it. Allocator regions are per process, so the
counting runs in a fresh subprocess."""

import gc
import json

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_environment import clean_env
from test_environment import run_python

import kadapt
from kadapt.batching import MemoryBudget
from kadapt.batching.tensorflow import allocator_region

REQUEST = 3 * 2**20 + 100  # bytes: over the allocator's first 2 MiB region
BFC_UNIT = 256

BUFFER_SCRIPT = """
    import json
    from kadapt import environment
    environment.configure_tensorflow()
    import tensorflow as tf
    from kadapt.batching import MemoryBudget
    from kadapt.batching.tensorflow.allocator_region import reserve_region

    def counted_bytes():
        # The peak restarts from the bytes in use: what the buffer adds is what it is counted as.
        tf.config.experimental.reset_memory_stats("CPU:0")
        before = tf.config.experimental.get_memory_info("CPU:0")["current"]
        block = tf.raw_ops.Empty(shape=[{request}], dtype=tf.uint8, init=False)
        return block, tf.config.experimental.get_memory_info("CPU:0")["peak"] - before

    # Without the region first, as the process's first buffer; it stays alive, so that the
    # second cannot take its chunk.
    grown, without_region = counted_bytes()
    reserve_region(MemoryBudget(32 * 2**20, "CPU:0", "test"))
    held, in_region = counted_bytes()
    print(json.dumps({{"without_region": without_region, "in_region": in_region}}))
"""


@pytest.fixture(scope="module")
def counted():
    """What one buffer is counted as in a fresh process (allocator regions are per process):
    first as its first buffer, then with the region held."""
    done = run_python(BUFFER_SCRIPT.format(request=REQUEST), clean_env())
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_buffer_in_the_held_region_is_counted_as_requested(counted):
    assert counted["in_region"] == -(-REQUEST // BFC_UNIT) * BFC_UNIT


def test_without_the_region_the_buffer_is_counted_as_the_region_grown_for_it(counted):
    # The first region (2 MiB) doubles to 4 MiB for it, and a chunk under
    # twice the request is not split: 4 MiB counted for 3 MiB asked.
    assert counted["without_region"] == 4 * 2**20


@pytest.fixture
def empty_calls(monkeypatch):
    monkeypatch.setattr(allocator_region, "_reserved_bytes", {})
    calls = []
    real = tf.raw_ops.Empty

    def spy(**kwargs):
        calls.append(int(np.prod(kwargs["shape"])))
        return real(**kwargs)

    monkeypatch.setattr(tf.raw_ops, "Empty", spy)
    return calls


def test_held_once_per_process_and_size(empty_calls):
    small, large = (MemoryBudget(size, "CPU:0", "test") for size in (2**20, 4 * 2**20))
    for budget in (small, small, large, small):
        allocator_region.reserve_region(budget)
    factor = allocator_region.REGION_FACTOR
    assert empty_calls == [factor * 2**20, factor * 4 * 2**20]


def test_a_region_past_two_gib_is_held(empty_calls, monkeypatch):
    monkeypatch.setattr(allocator_region, "available_ram", lambda: 2**40)
    allocator_region.reserve_region(MemoryBudget(3 * 2**29, "CPU:0", "test"))
    assert empty_calls == [allocator_region.REGION_FACTOR * 3 * 2**29]


def test_at_most_half_the_ram_available(empty_calls, monkeypatch):
    monkeypatch.setattr(allocator_region, "available_ram", lambda: 4 * 2**20)
    allocator_region.reserve_region(MemoryBudget(8 * 2**20, "CPU:0", "test"))
    assert empty_calls == [2 * 2**20]


def test_no_region_on_a_gpu(empty_calls):
    allocator_region.reserve_region(MemoryBudget(2**20, "GPU:0", "test"))
    assert empty_calls == []


def test_the_probe_holds_its_budget_before_its_trials(empty_calls):
    # The budget leaves room for what earlier tests in this process still hold
    # (a trial's peak counts every live buffer): 8 MiB was over in one suite run.
    gc.collect()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    x = np.zeros((32, 4), np.float32)
    kadapt.probe_micro_batch(model, (x, np.zeros((32, 2), np.float32)), memory_budget="64MiB")
    assert empty_calls[0] == allocator_region.REGION_FACTOR * 64 * 2**20


def test_a_region_the_allocator_cannot_hold_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(allocator_region, "_reserved_bytes", {})

    def refuse(**kwargs):
        raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating")

    monkeypatch.setattr(tf.raw_ops, "Empty", refuse)
    with pytest.raises(ValueError, match=r"pass a smaller `memory_budget`. Received: memory_budget=1048576 bytes"):
        allocator_region.reserve_region(MemoryBudget(2**20, "CPU:0", "memory_budget argument"))
