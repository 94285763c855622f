"""The observation-cost rule (pure, on given wall times) and the MetaAdjuster's one warning."""

import time
import warnings

import keras
import numpy as np
import pytest

from kadapt.meta import MetaAdjuster
from kadapt.meta import Trigger
from kadapt.meta.observe.observation_cost import ObservationCost


def _cost(observation_seconds, steps_seconds, count=3):
    cost = ObservationCost(check_every=10)
    for _ in range(count):
        cost.add(observation_seconds, steps_seconds)
    return cost


def test_silent_before_three_observations():
    assert _cost(0.06, 0.5, count=2).advice() is None


def test_silent_within_the_share():
    assert _cost(0.02, 0.5).share() == pytest.approx(0.04)
    assert _cost(0.02, 0.5).advice() is None


def test_silent_below_the_least_time_an_observation_must_take():
    assert _cost(0.004, 0.01).share() == pytest.approx(0.4)
    assert _cost(0.004, 0.01).advice() is None


def test_names_the_share_and_the_interval_that_brings_it_near_three_percent():
    advice = _cost(0.06, 0.5).advice()  # 12%: four times the 3%, so four times the interval
    assert "every 10 steps takes 12% of the steps' time (60 ms an observation" in advice
    assert "check_every=40" in advice


def test_the_median_decides_not_one_slow_observation():
    cost = ObservationCost(check_every=10)
    for seconds in (0.01, 0.5, 0.01):  # one observation that consulted the meta-model
        cost.add(seconds, 0.5)
    assert cost.advice() is None


class _SlowObservations(keras.callbacks.Callback):
    """Makes each of the adjuster's observations take 30 ms more (as a wide model's read would)."""

    def __init__(self, adjuster):
        super().__init__()
        self.adjuster = adjuster

    def on_train_begin(self, logs=None):
        runner = self.adjuster._runner
        observe = runner.observe

        def slow(*args, **kwargs):
            time.sleep(0.03)
            return observe(*args, **kwargs)

        runner.observe = slow


def _warnings_of_a_fit(callbacks_for):
    x = np.linspace(-1, 1, 64 * 3, dtype="float32").reshape(64, 3)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    adjuster = MetaAdjuster(check_every=2, monitor="loss", trigger=Trigger(patience=10**6), verbose=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, x[:, :1], batch_size=4, epochs=1, verbose=0, callbacks=[adjuster, *callbacks_for(adjuster)])
    return [w for w in caught if issubclass(w.category, RuntimeWarning) and "MetaAdjuster" in str(w.message)]


def test_the_adjuster_warns_once_where_observing_outweighs_the_steps():
    caught = _warnings_of_a_fit(lambda adjuster: [_SlowObservations(adjuster)])
    assert len(caught) == 1  # 8 observations of 16 steps, one warning
    assert "Pass check_every=" in str(caught[0].message)


def test_the_medians_are_of_the_recent_observations():
    cost = ObservationCost(check_every=10)
    for _ in range(40):
        cost.add(0.001, 0.5)  # cheap at first
    for _ in range(16):
        cost.add(0.06, 0.5)  # then 12%: the last 16 decide, and the watch holds no more than them
    assert len(cost.observations) == 16 and "check_every=40" in cost.advice()
