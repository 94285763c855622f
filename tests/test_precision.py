"""kadapt.precision: the choice by measurement, the policies a device has
units for, accumulation under bfloat16, and `precision` in both front doors."""

import json

import keras
import numpy as np
import pytest

import kadapt
from kadapt import cli
from kadapt import precision
from kadapt.recipes import FastFitConfig
from kadapt.recipes import fast_fit


def test_the_fastest_policy_is_chosen_when_it_beats_float32_by_the_margin():
    choice = precision.decide({"float32": 0.30, "mixed_bfloat16": 0.20, "mixed_float16": 0.25})
    assert choice.policy == "mixed_bfloat16"
    assert choice.speedup("mixed_bfloat16") == pytest.approx(1.5)
    assert "1.50x faster than float32" in choice.reason


def test_float32_stays_when_nothing_beats_it_by_the_margin():
    choice = precision.decide({"float32": 0.30, "mixed_bfloat16": 0.27})
    assert choice.policy == "float32"
    assert choice.reason == "no policy beat float32 by 1.15x (mixed_bfloat16 1.11x)"
    assert precision.decide({"float32": 0.3}).reason == "this device has no bfloat16 or float16 units"
    assert precision.decide({"float32": 0.30, "mixed_float16": 0.27}, min_speedup=1.1).policy == "mixed_float16"


def test_policies_follow_the_devices_units():
    assert precision.supported_policies(gpus=[(9, 0)]) == ["float32", "mixed_bfloat16", "mixed_float16"]
    assert precision.supported_policies(gpus=[(7, 5)]) == ["float32", "mixed_float16"]
    assert precision.supported_policies(gpus=[], flags={"avx512f", "amx_bf16"}) == ["float32", "mixed_bfloat16"]
    assert precision.supported_policies(gpus=[], flags={"avx2"}) == ["float32"]


def test_the_jax_backend_reads_the_gpus_compute_capability_from_jax(monkeypatch):
    import types

    import jax

    devices = [types.SimpleNamespace(platform="gpu", compute_capability="7.5"),
               types.SimpleNamespace(platform="gpu", compute_capability="9.0")]
    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    monkeypatch.setattr(jax, "devices", lambda: devices)
    assert precision.supported_policies(flags={"amx_bf16"}) == ["float32", "mixed_float16"]  # the weakest GPU's


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse avx512_bf16\n")
    assert precision.cpu_flags(cpuinfo) == {"fpu", "sse", "avx512_bf16"}
    assert precision.cpu_flags(tmp_path / "missing") == set()


def _build():
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(3)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


@pytest.fixture
def unpinned(monkeypatch):
    """The suite pins float32 (tests/conftest.py); these tests measure."""
    monkeypatch.delenv(precision.PIN, raising=False)


def _recorded(built_under):
    """`_build`, recording the global policy of each call in `built_under`."""
    def build():
        built_under.append(keras.mixed_precision.global_policy().name)
        return _build()

    return build


def _rows(rows):
    rng = np.random.default_rng(0)
    return rng.normal(size=(rows, 16)).astype("float32"), rng.integers(0, 3, rows)


def test_choose_precision_times_each_policy_and_restores_the_global_one(unpinned):
    x, y = _rows(64)
    built_under = []
    build = _recorded(built_under)

    choice = kadapt.choose_precision(build, x, y, batch_size=32, steps=2, rounds=2, policies=["float32", "bfloat16"])
    assert built_under == ["float32", "mixed_bfloat16"]
    assert set(choice.seconds_per_step) == {"float32", "mixed_bfloat16"}
    assert all(seconds > 0 for seconds in choice.seconds_per_step.values())
    assert choice.policy in choice.seconds_per_step
    assert keras.mixed_precision.global_policy().name == "float32"


def test_choose_precision_refuses_what_it_cannot_time(unpinned):
    x, y = np.zeros((8, 16), "float32"), np.zeros(8, "int32")
    with pytest.raises(TypeError, match="`build_model` must be a callable"):
        kadapt.choose_precision("model", x, y)
    with pytest.raises(ValueError, match="must return a compiled keras.Model"):
        kadapt.choose_precision(lambda: keras.Sequential([keras.Input((16,)), keras.layers.Dense(3)]), x, y,
                                policies=["float32", "bfloat16"])
    with pytest.raises(ValueError, match=r"`precision` must be one of auto, float32, bfloat16, float16. "
                                         r"Received: precision='int8'"):
        kadapt.choose_precision(_build, x, y, policies=["int8"])


class _Clock:
    """A machine that slows down as it runs: each step costs `cost` x (1 + seconds so far / 50)."""

    def __init__(self):
        self.now = 0.0

    def model(self, cost):
        clock = self

        class Model:
            def train_on_batch(self, x, y):
                clock.now += cost * (1 + clock.now / 50)

        return Model()


@pytest.mark.parametrize("costs, speedup", [((1.0, 1.0), 1.0), ((1.0, 0.7), 1 / 0.7)])
def test_the_policies_take_turns_so_a_drifting_machine_does_not_decide(costs, speedup):
    clock = _Clock()
    models = {"float32": clock.model(costs[0]), "mixed_bfloat16": clock.model(costs[1])}
    def median_round(models):
        return {name: np.median(seconds) for name, seconds in
                precision.alternated_rounds(models, (None, None), clock=lambda: clock.now).items()}

    timings = median_round(models)
    assert timings["float32"] / timings["mixed_bfloat16"] == pytest.approx(speedup, rel=0.01)
    clock.now, one_after_the_other = 0.0, {}  # the same steps timed policy after policy
    for policy, model in models.items():
        one_after_the_other.update(median_round({policy: model}))
    assert one_after_the_other["float32"] / one_after_the_other["mixed_bfloat16"] < 0.8 * speedup


def test_a_choice_is_measured_once_per_machine_and_network(unpinned, monkeypatch):
    x, y = _rows(32)
    built = []
    build = _recorded(built)

    def choose(key):
        return kadapt.choose_precision(build, x, y, batch_size=32, steps=1, rounds=1, cache_key=key,
                                       policies=["float32", "bfloat16"])

    first = choose({"network": "dense", "input": [16]})
    again = choose({"network": "dense", "input": [16]})
    assert len(built) == 2 and again.policy == first.policy and again.seconds_per_step == first.seconds_per_step
    assert again.reason == f"{first.reason}; measured by an earlier run on this machine"
    choose({"network": "dense", "input": [17]})
    assert len(built) == 4
    monkeypatch.setattr(precision, "machine_signature", lambda: {"cpu": "another"})
    choose({"network": "dense", "input": [16]})
    assert len(built) == 6


def test_kadapt_precision_pins_a_precision_on_the_machine(monkeypatch):
    def build():
        raise AssertionError("nothing is built or timed under a pinned precision")

    monkeypatch.setenv(precision.PIN, "bfloat16")
    choice = kadapt.choose_precision(build, np.zeros((4, 16), "float32"), policies=["float32", "bfloat16"])
    assert (choice.policy, choice.seconds_per_step, choice.reason) == ("mixed_bfloat16", {}, "KADAPT_PRECISION=bfloat16")
    monkeypatch.setenv(precision.PIN, "half")
    with pytest.raises(ValueError, match=r"The environment variable KADAPT_PRECISION must be one of float32, "
                                         r"bfloat16, float16, or unset to measure. Received: KADAPT_PRECISION='half'"):
        kadapt.choose_precision(build, np.zeros((4, 16), "float32"))


def test_bfloat16_asked_for_without_its_units_runs_and_says_so(monkeypatch):
    monkeypatch.setattr(precision, "supported_policies", lambda: ["float32"])
    choice = precision.asked_precision("bfloat16")
    assert choice.policy == "mixed_bfloat16"
    assert choice.reason == ("--precision bfloat16; this device has no bfloat16 units: it is emulated, which is "
                             "usually slower than float32 (--precision auto measures)")
    assert precision.asked_precision("float32").reason == "--precision float32"


def test_accumulation_under_bfloat16_keeps_float32_sums_and_one_update():
    """Three micro-batches under `mixed_bfloat16` against plain Keras' one
    batch under the same policy: the update agrees within bfloat16's rounding
    (8 significant bits, 3.9e-3 a rounding; the micro-batches round other
    partial products; 7e-3 measured): 3e-2 of each update's size. Against
    float32 it is as far as plain Keras under bfloat16 is (12% on one bias
    here, from the logits' rounding)."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(24, 16)).astype("float32"), rng.integers(0, 3, 24)

    def update(policy, micro_batch_size=None):
        with precision.global_policy(policy):
            keras.utils.set_random_seed(0)
            model = _build()
        trainer = model if micro_batch_size is None else kadapt.accumulate(model, micro_batch_size)
        trainer.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        before = [w.copy() for w in model.get_weights()]
        trainer.fit(x, y, batch_size=24, epochs=1, verbose=0)
        assert int(trainer.optimizer.iterations) == 1
        assert all(v.dtype == "float32" for v in model.trainable_variables)
        return [after - start for after, start in zip(model.get_weights(), before)]

    def distance(a, b):
        return max(float(np.max(np.abs(u - v)) / np.max(np.abs(v))) for u, v in zip(a, b, strict=True))

    ours, plain, full_precision = update("mixed_bfloat16", micro_batch_size=10), update("mixed_bfloat16"), update(
        "float32")
    assert distance(ours, plain) <= 3e-2
    assert distance(ours, full_precision) <= distance(plain, full_precision) + 3e-2


def _images(rows=32, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(rows, 8, 8)).astype("uint8"), rng.integers(0, 3, size=rows)


TINY = FastFitConfig(widths=(4, 8), residual_stages=(0,))


def test_fast_fit_trains_under_the_precision_asked_for():
    model = fast_fit(*_images(), epochs=1, batch_size=16, config=TINY.replace(precision="bfloat16"), seed=0)
    assert model.dtype_policy.name == "mixed_bfloat16"
    assert model.precision.policy == "mixed_bfloat16" and model.precision.seconds_per_step == {}
    assert keras.mixed_precision.global_policy().name == "float32"


def test_auto_on_a_device_without_16_bit_units_times_nothing(monkeypatch, unpinned):
    monkeypatch.setattr(precision, "supported_policies", lambda: ["float32"])
    model = fast_fit(*_images(), epochs=1, batch_size=16, config=TINY.replace(precision="auto"), seed=0)
    assert model.precision.policy == "float32" and model.precision.seconds_per_step == {}
    assert model.precision.reason == "this device has no bfloat16 or float16 units"


def test_kadapt_train_records_the_measured_choice_and_builds_under_it(tmp_path, monkeypatch, unpinned):
    monkeypatch.setattr(precision, "supported_policies", lambda: ["float32", "mixed_bfloat16"])
    # Whatever the timings, bfloat16: a float32 choice would not show which policy the network was built under.
    monkeypatch.setattr(precision, "decide", lambda timings, _: precision.PrecisionChoice(
        "mixed_bfloat16", timings, "chosen by the test"))
    out = tmp_path / "run"
    assert cli.main(["train", "--data", "digits", "--model", "mlp", "--batch-size", "64", "--max-steps", "2",
                     "--precision", "auto", "--meta", "off", "--out", str(out)]) == 0
    recorded = json.loads((out / "config.json").read_text())["resolved"]["precision"]
    assert set(recorded["seconds_per_step"]) == {"float32", "mixed_bfloat16"}
    assert recorded["policy"] == "mixed_bfloat16" and recorded["reason"] == "chosen by the test"
    saved = kadapt.load_model(out / "model.keras")
    assert {layer.dtype_policy.name for layer in saved.layers if layer.weights} == {recorded["policy"]}


def test_config_rejects_an_unknown_precision():
    with pytest.raises(ValueError, match=r"`precision` must be one of float32, bfloat16, float16, auto. "
                                         r"Received: precision='half'"):
        FastFitConfig(precision="half")


def test_the_probe_cache_tells_a_bfloat16_network_from_a_float32_one():
    """The recipe builds under the chosen policy and trains after the global
    policy is back to float32: the key reads the layers' policies."""
    from kadapt.batching.auto_micro_batch import cache_key
    from kadapt.batching.memory_budget import MemoryBudget

    sample = (np.zeros((4, 16), "float32"), np.zeros(4, "int32"))
    budget = MemoryBudget(2**30, "CPU:0", "test")
    keys = []
    for policy in ("float32", "mixed_bfloat16"):
        with precision.global_policy(policy):
            model = _build()
        keys.append(cache_key(model, sample, budget, cap=1024))
    assert keys[0] != keys[1]
    assert cache_key(_build(), sample, budget, cap=1024) == keys[0]
