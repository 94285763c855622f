"""Cosine learning rate and momentum schedules against the NumPy closed form."""

import keras
import numpy as np
import pytest

import kadapt


def _closed_form(step, lr_max, lr_min, total, warmup):
    if step < warmup:
        return lr_max * step / warmup
    t = min(step - warmup, total - warmup)
    return lr_min + 0.5 * (lr_max - lr_min) * (1 + np.cos(np.pi * t / (total - warmup)))


@pytest.mark.parametrize("warmup", [0, 10])
def test_cosine_annealing_matches_the_formula(warmup):
    schedule = kadapt.CosineAnnealing(lr_max=0.4, lr_min=0.01, total_steps=100, warmup_steps=warmup)
    for step in [0, 1, 5, 10, 11, 37, 50, 99, 100, 150]:
        expected = _closed_form(step, 0.4, 0.01, 100, warmup)
        assert float(schedule(step)) == pytest.approx(expected, rel=1e-6, abs=1e-8)


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
