"""micro_batch_size="auto": probe at the first fit, reuse through the cache."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import kadapt


def _cnn():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10),
        ]
    )
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KADAPT_CACHE_DIR", str(tmp_path / "cache"))


def _data(rows=128):
    rng = np.random.default_rng(0)
    return rng.random((rows, 28, 28, 1), dtype=np.float32), rng.integers(0, 10, rows)


def test_auto_probes_at_first_fit_then_reuses_the_cache(tmp_path):
    x, y = _data()
    # A budget counts all the device's memory in use, here also what earlier tests in this
    # process left alive (40 MiB in one CI run): give 20 MiB and 8 MiB above that.
    in_use = tf.config.experimental.get_memory_info("CPU:0")["current"]
    budget, smaller = in_use + 20 * 2**20, in_use + 8 * 2**20
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

    again = kadapt.accumulate(_cnn(), "auto", memory_budget=budget)
    again.fit(x, y, batch_size=128, epochs=1, verbose=0)
    assert again.micro_batch_size == chosen
    assert again.probe_result is None  # from the cache, no trial run

    other_budget = kadapt.accumulate(_cnn(), "auto", memory_budget=smaller)
    other_budget.fit(x, y, batch_size=128, epochs=1, verbose=0)
    assert other_budget.probe_result is not None
    assert other_budget.probe_result.micro_batch_size < probed
    assert other_budget.micro_batch_size <= chosen


def test_auto_with_a_dataset_caps_at_its_batch():
    x, y = _data(rows=32)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    model = kadapt.accumulate(_cnn(), "auto", memory_budget="1GiB")
    model.fit(dataset, epochs=1, verbose=0)
    assert model.micro_batch_size == 16
    assert int(model.optimizer.iterations) == 2


def test_auto_needs_a_fit_before_train_on_batch():
    x, y = _data(rows=8)
    model = kadapt.accumulate(_cnn(), "auto")
    with pytest.raises(ValueError, match=r"`micro_batch_size='auto'` is resolved by the first `fit`"):
        model.train_on_batch(x, y)


def test_auto_holds_the_region_also_when_the_size_comes_from_the_cache(monkeypatch):
    from kadapt.batching import auto_micro_batch

    x, y = _data(rows=32)
    budget = tf.config.experimental.get_memory_info("CPU:0")["current"] + 64 * 2**20
    kadapt.accumulate(_cnn(), "auto", memory_budget=budget).fit(x, y, batch_size=32, epochs=1, verbose=0)
    held = []
    monkeypatch.setattr(auto_micro_batch, "reserve_region", held.append)
    again = kadapt.accumulate(_cnn(), "auto", memory_budget=budget)
    again.fit(x, y, batch_size=32, epochs=1, verbose=0)
    assert again.probe_result is None  # from the cache, no trial run
    assert [b.bytes for b in held] == [budget]
