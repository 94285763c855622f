"""XLA's memory plan of the JAX train step, and the probe that plans instead of running."""

import jax
import keras
import numpy as np
import pytest

from kadapt.batching import auto_micro_batch
from kadapt.batching import micro_batch_probe
from kadapt.batching.jax import probe as jax_probe
from kadapt.batching.jax.memory_plan import step_plan

pytestmark = pytest.mark.backends("jax")

FEATURES, HIDDEN, CLASSES = 32, 64, 3


@pytest.fixture(autouse=True)
def _fresh(monkeypatch, tmp_path):
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    monkeypatch.delenv("KADAPT_MEMORY_BUDGET", raising=False)
    monkeypatch.setenv("KADAPT_CACHE_DIR", str(tmp_path))


def mlp():
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(HIDDEN, activation="relu"),
                              keras.layers.Dense(CLASSES)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


def batch(rows):
    rng = np.random.default_rng(rows)
    return rng.random((rows, FEATURES), dtype=np.float32), rng.random((rows, CLASSES), dtype=np.float32)


def test_plan_grows_with_rows():
    model = mlp()
    small, large = step_plan(model, batch(8)), step_plan(model, batch(64))
    assert large.temporary_bytes > small.temporary_bytes
    assert large.peak_bytes > small.peak_bytes


def test_plan_is_the_same_on_every_compile():
    model = mlp()
    assert step_plan(model, batch(16)) == step_plan(model, batch(16))


def test_arguments_are_the_state_and_the_batch():
    rows = 16
    plan = step_plan(mlp(), batch(rows))
    weights = FEATURES * HIDDEN + HIDDEN + HIDDEN * CLASSES + CLASSES  # float32
    # SGD without momentum: iteration (int32) and learning_rate; the loss tracker: total and count.
    state = 4 * weights + 2 * 4 + 2 * 4
    x, y = batch(rows)
    assert plan.argument_bytes == state + x.nbytes + y.nbytes
    assert plan.peak_bytes == plan.argument_bytes + plan.output_bytes - plan.alias_bytes + plan.temporary_bytes


def test_plan_takes_shapes_only():
    x = jax.ShapeDtypeStruct((16, FEATURES), "float32")
    y = jax.ShapeDtypeStruct((16, CLASSES), "float32")
    assert step_plan(mlp(), (x, y)) == step_plan(mlp(), batch(16))


def test_probe_picks_the_largest_planned_size_within_the_budget():
    model = mlp()
    low, high = 40, 48
    budget = (step_plan(model, batch(low)).peak_bytes + step_plan(model, batch(high)).peak_bytes) // 2
    result = jax_probe.probe_micro_batch_jax(model, batch(64), memory_budget=budget)
    assert low <= result.micro_batch_size < high
    chosen = [t for t in result.trials if t.micro_batch_size == result.micro_batch_size]
    assert chosen and chosen[-1].plan.peak_bytes <= budget  # planned, not extrapolated


def _state(model):
    return [np.array(v.value) for v in model.variables + model.optimizer.variables]


def test_probe_leaves_no_trace_and_measures_on_a_device_with_statistics(monkeypatch):
    model = mlp()
    model.fit(*batch(8), epochs=1, verbose=0)  # built, optimizer built, iterations 1
    model.train_function = None
    before = _state(model)
    reads = iter(range(1, 100))
    monkeypatch.setattr(jax_probe, "device_memory_stats",
                        lambda: {"bytes_in_use": 1000, "peak_bytes_in_use": 10**8 * next(reads)})
    result = jax_probe.probe_micro_batch_jax(model, batch(64), memory_budget="200KiB")
    after = _state(model)
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    assert int(model.optimizer.iterations.value) == 1
    assert model.train_function is None
    chosen = [t for t in result.trials if t.measured_peak_bytes is not None]
    assert [t.micro_batch_size for t in chosen] == [result.micro_batch_size]
    # Stats read 1 (the check), 2 (before the step), 3 (after): the rise over what was in use, plus the arguments.
    assert chosen[0].measured_peak_bytes == 3 * 10**8 - 1000 + chosen[0].plan.argument_bytes


def test_a_planned_model_trains_as_one_never_planned():
    keras.utils.set_random_seed(1)
    planned = mlp()
    step_plan(planned, batch(8))
    assert not planned.optimizer.built  # a built copy was planned, then swapped out
    keras.utils.set_random_seed(1)
    plain = mlp()
    for model in (planned, plain):
        model.fit(*batch(16), batch_size=8, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(planned.get_weights() + planned.optimizer.variables,
                    plain.get_weights() + plain.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_budget_of_a_device_that_reports_no_limit_is_half_the_available_ram_as_on_tensorflow(monkeypatch):
    monkeypatch.delenv("KADAPT_MEMORY_BUDGET", raising=False)
    monkeypatch.setattr(jax_probe, "available_ram", lambda: 3 * 2**30)
    budget = jax_probe.plan_budget(None)
    assert jax.devices()[0].memory_stats() is None  # JAX's CPU
    assert budget.bytes == 3 * 2**29 and budget.source == f"50% of available RAM; {budget.device} reports no memory limit"
    assert jax_probe.probe_micro_batch_jax(mlp(), batch(8)).budget == budget


def test_budget_below_the_smallest_plan_is_an_error():
    with pytest.raises(ValueError, match="Argument `memory_budget` is smaller than one sample's training step"):
        jax_probe.probe_micro_batch_jax(mlp(), batch(1), memory_budget=1000)


def test_plan_needs_the_jax_backend(monkeypatch):
    monkeypatch.setattr(keras.backend, "backend", lambda: "tensorflow")
    with pytest.raises(ValueError, match="needs Keras' JAX backend.*Received: keras.backend.backend\\(\\)='tensorflow'"):
        step_plan(mlp(), batch(8))


def test_plan_needs_a_compiled_model():
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(CLASSES)])
    with pytest.raises(ValueError, match="must be compiled before planning"):
        step_plan(model, batch(8))
    with pytest.raises(TypeError, match="Argument `model` must be a compiled `keras.Model`"):
        step_plan("model", batch(8))


def test_auto_on_jax_probes_by_plan_then_reads_the_cache(monkeypatch):
    model = mlp()
    model.memory_budget = "200KiB"
    x, y = batch(64)
    auto_micro_batch.resolve_auto_micro_batch(model, x, y, 64, None)
    probed = model.micro_batch_size
    assert isinstance(model.probe_result.trials[0], jax_probe.PlannedTrial)
    monkeypatch.setattr(micro_batch_probe, "probe_micro_batch", lambda *a, **k: pytest.fail("probed again"))
    model.micro_batch_size = 1
    auto_micro_batch.resolve_auto_micro_batch(model, x, y, 64, None)
    assert model.micro_batch_size == probed


def test_probe_on_jax_prefers_the_largest_only():
    with pytest.raises(ValueError, match="Argument `prefer` must be 'largest' on the JAX backend"):
        micro_batch_probe.probe_micro_batch(mlp(), batch(8), memory_budget="1MiB", prefer="fastest")


def accumulating(micro_batch_size, **kwargs):
    import kadapt

    return kadapt.accumulate(mlp(), micro_batch_size, **kwargs)


def test_an_accumulating_plan_grows_with_the_micro_batch_not_the_logical_batch():
    model = accumulating(8)
    assert (step_plan(model, batch(128), micro_batch_size=8).temporary_bytes
            < step_plan(model, batch(64), micro_batch_size=32).temporary_bytes)
    assert model.micro_batch_size == 8


def test_auto_on_jax_trains_at_the_planned_size():
    model = accumulating("auto", memory_budget="200KiB")
    x, y = batch(128)
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    chosen = [t for t in model.probe_result.trials if t.micro_batch_size == model.micro_batch_size]
    assert chosen and chosen[-1].plan.rows == 64 and chosen[-1].peak_bytes <= 200 * 2**10


def test_an_accumulating_plan_donates_the_state_as_training_does():
    # Recovery on: training keeps the old state through the step (no donation), and so does the
    # plan; recovery off: donated, as in Keras, the new state in the old one's buffers. The two
    # are different programs (here XLA's temporaries differ too: 11,360 bytes against 20,832).
    kept = step_plan(accumulating(8), batch(64), micro_batch_size=8)
    donated = step_plan(accumulating(8, max_oom_retries=0), batch(64), micro_batch_size=8)
    assert kept.alias_bytes == 0
    assert donated.alias_bytes > 0
