"""`reserve_region`: with the budget held as one region, the CPU allocator
counts a buffer as requested (rounded to its 256-byte unit) instead of a whole
chunk of a region grown for it. Allocator regions are per process, so the
counting runs in fresh subprocesses."""

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
from kadapt.batching import allocator_region

REQUEST = 3 * 2**20 + 100  # bytes: over the allocator's first 2 MiB region
BFC_UNIT = 256

ONE_BUFFER_SCRIPT = """
    import json
    from kadapt import environment
    environment.configure_tensorflow()
    import tensorflow as tf
    from kadapt.batching import MemoryBudget
    from kadapt.batching.allocator_region import reserve_region

    if {reserve}:
        reserve_region(MemoryBudget(32 * 2**20, "CPU:0", "test"))
    tf.config.experimental.reset_memory_stats("CPU:0")
    block = tf.raw_ops.Empty(shape=[{request}], dtype=tf.uint8, init=False)
    print(json.dumps(tf.config.experimental.get_memory_info("CPU:0")))
"""


def peak_of_one_buffer(reserve):
    done = run_python(ONE_BUFFER_SCRIPT.format(request=REQUEST, reserve=reserve), clean_env())
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["peak"]


def test_a_buffer_in_the_held_region_is_counted_as_requested():
    assert peak_of_one_buffer(reserve=True) == -(-REQUEST // BFC_UNIT) * BFC_UNIT


def test_without_the_region_the_buffer_is_counted_as_the_region_grown_for_it():
    # The first region (2 MiB) doubles to 4 MiB for it, and a chunk under
    # twice the request is not split: 4 MiB counted for 3 MiB asked.
    assert peak_of_one_buffer(reserve=False) == 4 * 2**20


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
