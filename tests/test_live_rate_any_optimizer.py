"""`kadapt.optimizers.live_rate` on Keras' own optimizers: at a multiplier of 1 the steps are the
unwrapped optimizer's; after a change the next step is the unwrapped step times the multiplier
(each of these updates is linear in the rate), taken in the same compiled step, not a retraced one."""

import keras
import numpy as np
import pytest

from kadapt.optimizers import MultipliedSchedule
from kadapt.optimizers import live_rate
from kadapt.optimizers.live_rate import learning_rate_multiplier
from kadapt.optimizers.live_rate import live_rate_of
from kadapt.optimizers.live_rate import set_learning_rate_multiplier

pytestmark = pytest.mark.backends("tensorflow", "jax")

LR = 0.01
OPTIMIZERS = {
    "AdamW": lambda rate: keras.optimizers.AdamW(rate, weight_decay=0.1),
    "Nadam": lambda rate: keras.optimizers.Nadam(rate),
    "RMSprop": lambda rate: keras.optimizers.RMSprop(rate),
    "Lion": lambda rate: keras.optimizers.Lion(rate),
    "Muon": lambda rate: keras.optimizers.Muon(rate),
    "Adam(amsgrad=True)": lambda rate: keras.optimizers.Adam(rate, amsgrad=True),
}


class Counted(keras.layers.Dense):
    """Dense counting its traces: under a compiled step, Python runs once per trace."""

    traces = 0

    def call(self, inputs):
        Counted.traces += 1
        return super().call(inputs)


def _model(optimizer):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), Counted(4, activation="tanh"), keras.layers.Dense(1)])
    model.compile(optimizer, loss="mse", jit_compile=True)
    return model


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 3)).astype("float32")
    return x, (x @ np.array([[1.0], [-2.0], [0.5]]) + 0.3).astype("float32")


def _steps(model, steps):
    x, y = _data()
    for _ in range(steps):
        model.train_on_batch(x, y)
    return [np.array(w) for w in model.get_weights()]


def _pair(make, learning_rate=LR):
    """The unwrapped optimizer's model and one with the channel installed, at the same start."""
    plain, live = _model(make(learning_rate)), _model(make(learning_rate))
    live_rate(live.optimizer)
    return plain, live


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_the_steps_are_the_unwrapped_optimizers_and_a_changed_multiplier_scales_the_next_without_a_retrace(name):
    """Two steps at a multiplier of 1 equal the unwrapped optimizer's. From there, the step at 0.3
    moves each weight 0.3 times as far as the unwrapped step; the slots stay the same (the same
    gradients), so from the live weights the unwrapped optimizer at Keras' own float rate 0.3 x LR
    gives the step after (the multiplier read again, not a stale value). No step is retraced."""
    plain, live = _pair(OPTIMIZERS[name])
    start = _steps(plain, 2)
    for ours, theirs in zip(_steps(live, 2), start, strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7)
    traces = Counted.traces
    set_learning_rate_multiplier(live.optimizer, 0.3)
    for ours, theirs, before in zip(_steps(live, 1), _steps(plain, 1), start, strict=True):
        np.testing.assert_allclose(ours - before, 0.3 * (theirs - before), rtol=1e-4, atol=1e-7)
    plain.set_weights(live.get_weights())
    plain.optimizer.learning_rate = 0.3 * LR
    for ours, theirs in zip(_steps(live, 1), _steps(plain, 1), strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-7)
    assert Counted.traces == traces


def test_a_schedule_keeps_its_shape_under_the_multiplier():
    """A piecewise schedule (0.01 for steps 0-1, then 0.002) at multiplier 0.5 steps as the unwrapped
    optimizer would at half of each piece: equal to it built on the halved schedule."""
    def halved(values):
        return lambda rate: keras.optimizers.Nadam(keras.optimizers.schedules.PiecewiseConstantDecay([1], values))

    live = _model(halved([0.01, 0.002])(None))
    set_learning_rate_multiplier(live.optimizer, 0.5)
    plain = _model(halved([0.005, 0.001])(None))
    for ours, theirs in zip(_steps(live, 4), _steps(plain, 4), strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-7)


def test_installing_twice_gives_the_same_variable_and_kadapts_own_is_kept():
    from kadapt.optimizers import SGD

    optimizer = keras.optimizers.RMSprop(LR)
    assert learning_rate_multiplier(optimizer) is None
    assert live_rate(optimizer) is live_rate(optimizer) is learning_rate_multiplier(optimizer)
    own = SGD(LR)
    assert live_rate(own) is own.learning_rate_multiplier


def test_installing_on_a_traced_model_rebuilds_its_train_function():
    """Installed after steps were traced, through `live_rate_of(model)`: the new step reads the multiplier."""
    plain, live = _model(keras.optimizers.Lion(LR)), _model(keras.optimizers.Lion(LR))
    start = _steps(plain, 1)
    _steps(live, 1)
    live_rate_of(live).assign(0.5)
    for ours, theirs, before in zip(_steps(live, 1), _steps(plain, 1), start, strict=True):
        np.testing.assert_allclose(ours - before, 0.5 * (theirs - before), rtol=1e-4, atol=1e-8)


def test_a_callable_learning_rate_is_refused():
    optimizer = keras.optimizers.Adam(lambda: 0.01)
    with pytest.raises(ValueError, match="A live learning rate needs a float or a LearningRateSchedule"):
        live_rate(optimizer)


def test_a_saved_model_loads_with_its_rate_and_takes_the_channel_again(tmp_path):
    """The file names `kadapt>MultipliedSchedule` (safe mode loads it) holding the multiplier as a
    float: the loaded optimizer applies the same rate, and `live_rate` makes it live again at that value."""
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.AdamW(LR), loss="mse")
    set_learning_rate_multiplier(model.optimizer, 0.3)
    _steps(model, 1)
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras", safe_mode=True)
    assert float(loaded.optimizer.learning_rate) == pytest.approx(0.3 * LR)
    assert float(live_rate(loaded.optimizer)) == pytest.approx(0.3)
    assert float(loaded.optimizer.learning_rate) == pytest.approx(0.3 * LR)
    for ours, theirs in zip(loaded.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("installed", ["before the build", "after the build"])
def test_kadapt_load_model_keeps_the_optimizer_state_of_a_file_with_a_live_rate(tmp_path, installed):
    """The file holds the multiplier among the optimizer's variables, and a float in its config:
    Keras' load builds one variable fewer and skips the state (moments, iterations). Loaded by
    kadapt, the next step equals the saved model's own next step (the oracle: the model that
    never left memory), whether the channel was installed before the optimizer's build
    (`kadapt train`) or after it (a callback in `fit`)."""
    import warnings

    import kadapt

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)])
    model.compile(keras.optimizers.AdamW(LR, weight_decay=0.1), loss="mse")
    if installed == "before the build":
        set_learning_rate_multiplier(model.optimizer, 0.3)
        _steps(model, 3)
    else:
        _steps(model, 2)
        set_learning_rate_multiplier(model.optimizer, 0.3)
        model.make_train_function(force=True)
        _steps(model, 1)
    model.save(tmp_path / "training.keras")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # Keras' "Skipping variable loading" would raise here
        loaded = kadapt.load_model(tmp_path / "training.keras", for_training=True)
    assert int(loaded.optimizer.iterations) == 3
    assert float(learning_rate_multiplier(loaded.optimizer)) == pytest.approx(0.3)
    for ours, theirs in zip(_steps(loaded, 1), _steps(model, 1), strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7)


def test_the_schedule_serializes_to_itself():
    schedule = MultipliedSchedule(keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5), 0.25)
    again = MultipliedSchedule.from_config(schedule.get_config())
    assert float(again(10)) == pytest.approx(float(schedule(10))) == pytest.approx(0.1 * 0.5 * 0.25)
