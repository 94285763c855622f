"""Learning-rate and momentum schedules against NumPy closed forms."""

import keras
import numpy as np
import pytest

import kadapt
from kadapt.schedules import PiecewiseLinear

pytestmark = pytest.mark.backends("tensorflow", "jax")


def _values(schedule, steps):
    """The schedule at each step as a compiled train step reads it. On JAX it is traced once: each
    eager call dispatches every op alone (2.5 s of CPU for 15 steps, against 0.15 s jitted);
    the eager path stays checked by the serialization tests."""
    if keras.backend.backend() == "jax":
        import jax

        schedule = jax.jit(schedule)
    return [float(schedule(step)) for step in steps]


def _closed_form(step, lr_max, lr_min, total, warmup):
    if step < warmup:
        return lr_max * step / warmup
    t = min(step - warmup, total - warmup)
    return lr_min + 0.5 * (lr_max - lr_min) * (1 + np.cos(np.pi * t / (total - warmup)))


@pytest.mark.parametrize("warmup", [0, 10])
def test_cosine_annealing_matches_the_formula(warmup):
    schedule = kadapt.CosineAnnealing(lr_max=0.4, lr_min=0.01, total_steps=100, warmup_steps=warmup)
    steps = [0, 1, 5, 10, 11, 37, 50, 99, 100, 150]
    for step, value in zip(steps, _values(schedule, steps), strict=True):
        assert value == pytest.approx(_closed_form(step, 0.4, 0.01, 100, warmup), rel=1e-6, abs=1e-8), step


def test_cosine_annealing_serializes():
    schedule = kadapt.CosineAnnealing(0.4, 0.01, 100, warmup_steps=10)
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert restored.get_config() == schedule.get_config()
    assert float(restored(42)) == pytest.approx(float(schedule(42)))


def test_cosine_momentum_mirrors_the_learning_rate():
    momentum = kadapt.CosineMomentum(0.95, 0.85, total_steps=100, warmup_steps=10)
    assert float(momentum(0)) == pytest.approx(0.95)
    assert float(momentum(10)) == pytest.approx(0.85)
    assert float(momentum(100)) == pytest.approx(0.95)
    shape = _closed_form(40, 1.0, 0.0, 100, 10)
    assert float(momentum(40)) == pytest.approx(0.95 - 0.10 * shape, rel=1e-6)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(lr_max=0.0, lr_min=0.0, total_steps=10), ValueError, r"`lr_max` must be in \(0.0, None\]. Received: lr_max=0.0"),
        (dict(lr_max=0.1, lr_min=0.2, total_steps=10), ValueError, r"`lr_min` must be in \[0.0, 0.1\]. Received: lr_min=0.2"),
        (dict(lr_max=0.1, lr_min=0.0, total_steps=10, warmup_steps=10), ValueError, r"Received: warmup_steps=10"),
        (dict(lr_max=0.1, lr_min=0.0, total_steps=2.5), TypeError, r"`total_steps` must be an int. Received: total_steps=2.5"),
    ],
)
def test_bad_schedule_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        kadapt.CosineAnnealing(**kwargs)


def _restarts_closed_form(step, lr_max, lr_min, total, warmup, restarts, length_multiplier, peak_multiplier):
    if step < warmup:
        return lr_max * step / warmup
    if step >= total:
        return lr_min
    lengths = [length_multiplier**i for i in range(restarts + 1)]
    first = (total - warmup) / sum(lengths)
    t, cycle = step - warmup, 0
    while t >= first * lengths[cycle]:
        t -= first * lengths[cycle]
        cycle += 1
    cosine = 0.5 * (1 + np.cos(np.pi * t / (first * lengths[cycle])))
    return lr_min + (lr_max - lr_min) * peak_multiplier**cycle * cosine


@pytest.mark.parametrize(
    "warmup, restarts, length_multiplier, peak_multiplier",
    [(0, 2, 2.0, 1.0), (10, 2, 2.0, 0.5), (5, 3, 1.0, 0.8)],
)
def test_cosine_annealing_with_restarts_matches_the_formula(warmup, restarts, length_multiplier, peak_multiplier):
    schedule = kadapt.CosineAnnealing(
        0.4, 0.01, 150, warmup_steps=warmup, restarts=restarts,
        cycle_length_multiplier=length_multiplier, peak_multiplier=peak_multiplier,
    )
    steps = [0, 3, 9, 11, 17, 31, 33, 47, 61, 79, 101, 123, 149, 150, 400]
    for step, value in zip(steps, _values(schedule, steps), strict=True):
        expected = _restarts_closed_form(step, 0.4, 0.01, 150, warmup, restarts, length_multiplier, peak_multiplier)
        assert value == pytest.approx(expected, rel=1e-5, abs=1e-7), step


def test_cosine_annealing_restarts_at_the_cycle_starts():
    schedule = kadapt.CosineAnnealing(1.0, 0.0, 70, restarts=2)  # cycles of 10, 20 and 40 steps
    assert [round(value, 4) for value in _values(schedule, (9, 11, 29, 31, 69, 70))] == [
        pytest.approx(0.5 * (1 + np.cos(np.pi * 9 / 10)), abs=1e-4),
        pytest.approx(0.5 * (1 + np.cos(np.pi * 1 / 20)), abs=1e-4),
        pytest.approx(0.5 * (1 + np.cos(np.pi * 19 / 20)), abs=1e-4),
        pytest.approx(0.5 * (1 + np.cos(np.pi * 1 / 40)), abs=1e-4),
        pytest.approx(0.5 * (1 + np.cos(np.pi * 39 / 40)), abs=1e-4),
        0.0,
    ]


def test_cosine_annealing_with_restarts_serializes_exactly():
    schedule = kadapt.CosineAnnealing(0.4, 0.01, 150, warmup_steps=10, restarts=2,
                                      cycle_length_multiplier=1.5, peak_multiplier=0.5)
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert restored.get_config() == schedule.get_config() == {
        "lr_max": 0.4, "lr_min": 0.01, "total_steps": 150, "warmup_steps": 10, "restarts": 2,
        "cycle_length_multiplier": 1.5, "peak_multiplier": 0.5, "name": "CosineAnnealing",
    }
    assert float(restored(77)) == pytest.approx(float(schedule(77)))


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(restarts=-1), ValueError, r"`restarts` must be in \[0, None\]. Received: restarts=-1"),
        (dict(restarts=1.5), TypeError, r"`restarts` must be an int. Received: restarts=1.5"),
        (dict(restarts=1, cycle_length_multiplier=0.0), ValueError, r"Received: cycle_length_multiplier=0.0"),
        (dict(restarts=1, peak_multiplier=1.5), ValueError, r"`peak_multiplier` must be in \(0.0, 1.0\]. Received: peak_multiplier=1.5"),
    ],
)
def test_bad_restart_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        kadapt.CosineAnnealing(0.1, 0.0, 100, **kwargs)


def test_piecewise_linear_matches_numpy_interp_and_serializes():
    schedule = PiecewiseLinear([0, 10, 40, 50], [0.0, 0.4, 0.1, 0.0])
    steps = [0, 3, 10, 11, 25, 40, 47, 50, 80]
    expected = np.interp(steps, [0, 10, 40, 50], [0.0, 0.4, 0.1, 0.0])
    np.testing.assert_allclose(_values(schedule, steps), expected, rtol=1e-6, atol=1e-8)
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert restored.get_config() == schedule.get_config() == {
        "boundaries": [0, 10, 40, 50], "values": [0.0, 0.4, 0.1, 0.0], "name": "PiecewiseLinear"}


@pytest.mark.parametrize(
    "boundaries, values, message",
    [([0], [0.1], r"same length >= 2"), ([0, 5], [0.1], r"same length >= 2"), ([0, 5, 5], [0.1, 0.2, 0.0], r"`boundaries` must be increasing")],
)
def test_piecewise_linear_rejects_bad_knots(boundaries, values, message):
    with pytest.raises(ValueError, match=message):
        PiecewiseLinear(boundaries, values)
