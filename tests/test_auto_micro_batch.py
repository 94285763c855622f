"""micro_batch_size="auto": probe at the first fit, reuse through the cache."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import kadapt
from kadapt.batching import auto_micro_batch
from kadapt.batching import probe
from kadapt.batching.memory_budget import device_budget
from kadapt.batching.memory_model import MemoryModel


SIDE = 28  # pixels: a step of 128 rows peaks tens of MiB above what is resident
SMALL_SIDE = 8  # pixels: where no peak is compared with a budget


def _cnn(jit_compile="auto", side=SIDE):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((side, side, 1)),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            # 1x1: the activations, so the peaks, of a 3x3 convolution at a ninth of its arithmetic.
            keras.layers.Conv2D(32, 1, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10),
        ]
    )
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=jit_compile)
    return model


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KADAPT_CACHE_DIR", str(tmp_path / "cache"))


def _data(rows=128, side=SIDE):
    rng = np.random.default_rng(0)
    return rng.random((rows, side, side, 1), dtype=np.float32), rng.integers(0, 10, rows)


def test_auto_probes_at_first_fit_then_reuses_the_cache(tmp_path, monkeypatch):
    x, y = _data()
    # A budget counts all the device's memory in use, here also what earlier tests in this
    # process left alive (40 MiB in one CI run): give 20 MiB above that.
    budget = tf.config.experimental.get_memory_info("CPU:0")["current"] + 20 * 2**20
    model = kadapt.accumulate(_cnn(), "auto", memory_budget=budget)
    assert model.micro_batch_size == "auto"
    model.fit(x, y, batch_size=128, epochs=1, verbose=0)
    chosen = model.micro_batch_size
    assert isinstance(chosen, int) and 1 <= chosen < 128
    # The largest size that fits, split evenly over as many passes as it needs.
    probed = model.probe_result.micro_batch_size
    assert chosen == -(-128 // -(-128 // probed)) <= probed
    assert all(t.peak_bytes <= budget for t in model.probe_result.trials if t.fits)
    assert (tmp_path / "cache" / "probe-cache.json").is_file()

    held = []
    monkeypatch.setattr(auto_micro_batch, "reserve_region", held.append)
    again = kadapt.accumulate(_cnn(), "auto", memory_budget=budget)
    again.fit(x, y, batch_size=128, epochs=1, verbose=0)
    assert again.probe_result is None  # from the cache, no trial run
    assert again.first_step_check.peak_bytes > 0  # its first step measured where it trains
    assert again.micro_batch_size == (again.first_step_check.shrunk_to or chosen)
    # The region the cached size was measured in, held before the first step.
    assert [b.bytes for b in held] == [budget]


def test_a_cached_size_over_the_budget_where_it_trains_shrinks_after_the_first_step():
    x, y = _data(rows=256)
    budget = tf.config.experimental.get_memory_info("CPU:0")["current"] + 16 * 2**20
    model = kadapt.accumulate(_cnn(), "auto", memory_budget=budget)
    # Another host's probe said 128 rows fit (a line of 1 KiB a row): here a
    # step of 128 rows peaks above the budget.
    line = MemoryModel(budget - 2**20 - 128 * 2**10, 2**10)
    key = auto_micro_batch.cache_key(model, probe.sample_rows((x, y, None)), device_budget(budget), 128)
    auto_micro_batch._write_cache(key, {"micro_batch_size": 128, "probe": {"memory_model": line.to_dict()}})
    model.fit(x, y, batch_size=128, epochs=1, verbose=0)
    check = model.first_step_check
    assert model.probe_result is None and check.peak_bytes > budget
    # Re-solved from the line through the measured peak: no row fits above it, and a shrink
    # never goes below half.
    assert check.shrunk_to == model.micro_batch_size == 64
    assert int(model.optimizer.iterations) == 2


@pytest.mark.parametrize(
    "peak, expected",
    [(900, 100), (1100, 83), (2000, 50)],  # within the budget; 100 MB over; far over: half
)
def test_size_after_the_first_step_moves_the_line_through_the_measured_peak(peak, expected):
    # The probe's line: 100 MB + 8 MB a row, so 100 rows peak at 900 MB.
    line = MemoryModel(100e6, 8e6)
    # 1100 MB: moved up by 200 MB, (1000 - 300) MB x 0.95 / 8 MB = 83 rows.
    assert auto_micro_batch.size_after_first_step(100, int(peak * 1e6), int(1000e6), line) == expected


def test_the_cache_key_holds_what_a_peak_depends_on(monkeypatch):
    x, y = _data(rows=8)
    sample, budget = probe.sample_rows((x, y, None)), device_budget("1GiB")

    def key(jit_compile="auto", budget=budget):
        return auto_micro_batch.cache_key(kadapt.accumulate(_cnn(jit_compile), "auto"), sample, budget, 8)

    plain = key()
    assert key() == plain != key(jit_compile=True)
    assert key(budget=device_budget("2GiB")) != plain
    bfc = os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "").lower() in {"1", "true"}
    monkeypatch.setenv("TF_CPU_ALLOCATOR_USE_BFC", "false" if bfc else "true")  # the CPU's other allocator
    assert key() != plain
    assert auto_micro_batch.device_name("CPU:0")


# XLA: as Keras runs the step on a GPU (`jit_compile="auto"` is True there).
@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
def test_auto_with_a_dataset_caps_at_its_batch(jit_compile):
    x, y = _data(rows=32, side=SMALL_SIDE)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    model = kadapt.accumulate(_cnn(jit_compile, side=SMALL_SIDE), "auto", memory_budget="1GiB")
    model.fit(dataset, epochs=1, verbose=0)
    assert model.jit_compile == jit_compile
    assert model.micro_batch_size == 16
    assert int(model.optimizer.iterations) == 2


def test_auto_needs_a_fit_before_train_on_batch():
    x, y = _data(rows=8)
    model = kadapt.accumulate(_cnn(), "auto")
    with pytest.raises(ValueError, match=r"`micro_batch_size='auto'` is resolved by the first `fit`"):
        model.train_on_batch(x, y)
