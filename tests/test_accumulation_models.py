"""Sequential, functional and subclassed models; `.keras` round trips."""

import keras
import numpy as np
import pytest

import kadapt
from helpers import classification_data
from helpers import compile_classifier
from helpers import max_relative_difference
from helpers import mlp

pytestmark = pytest.mark.backends("tensorflow", "jax")

# On TensorFlow, graph mode: these tests are about model kinds and files, and XLA about
# doubles each compile; test_accumulation_exactness and test_real_clients prove the XLA
# step (real_clients through `.keras` files too). On JAX, XLA is the compiled mode.
JIT_COMPILE = keras.backend.backend() == "jax"


def _compiled(model):
    return compile_classifier(model, jit_compile=JIT_COMPILE)


@keras.saving.register_keras_serializable(package="kadapt_tests")
class TwoLayers(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(16, activation="tanh")
        self.logits = keras.layers.Dense(3)

    def call(self, inputs):
        return self.logits(self.hidden(inputs))


@keras.saving.register_keras_serializable(package="kadapt_tests")
class AccumulatingTwoLayers(kadapt.AccumulatingTrainStep, keras.Model):
    def __init__(self, micro_batch_size=4, **kwargs):
        super().__init__(micro_batch_size=micro_batch_size, **kwargs)
        self.hidden = keras.layers.Dense(16, activation="tanh")
        self.logits = keras.layers.Dense(3)

    def call(self, inputs):
        return self.logits(self.hidden(inputs))


def _functional(micro_batch_size):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((5,))
    hidden = keras.layers.Dense(16, activation="tanh")(inputs)
    outputs = keras.layers.Dense(3)(hidden)
    return kadapt.AccumulatingModel(inputs, outputs, micro_batch_size=micro_batch_size)


def _train(model, epochs=2):
    # 32 rows: whole logical batches of 16, so each model traces its step for one batch
    # shape (a ragged last batch would trace and compile it again; test_accumulation_exactness
    # covers ragged logical batches).
    x, y = classification_data(rows=32)
    model.fit(x, y, batch_size=16, epochs=epochs, verbose=0, shuffle=False)
    return model


def _reference():
    return _train(_compiled(mlp(regularize=False)))


def test_functional_accumulating_model_matches_plain_training():
    model = _train(_compiled(_functional(micro_batch_size=3)))
    assert max_relative_difference(_reference().get_weights(), model.get_weights()) <= 1e-5


def test_subclassed_models_match_plain_subclassed_training():
    keras.utils.set_random_seed(0)
    plain = _train(_compiled(TwoLayers()))
    keras.utils.set_random_seed(0)
    wrapped = _train(_compiled(kadapt.accumulate(TwoLayers(), 3)))
    keras.utils.set_random_seed(0)
    based = _train(_compiled(AccumulatingTwoLayers(micro_batch_size=3)))
    assert max_relative_difference(plain.get_weights(), wrapped.get_weights()) <= 1e-5
    assert max_relative_difference(plain.get_weights(), based.get_weights()) <= 1e-5


def test_accumulate_reuses_the_compiled_optimizer_and_shares_weights():
    model = _compiled(mlp())
    wrapper = kadapt.accumulate(model, 4)
    assert wrapper.optimizer is model.optimizer
    _train(wrapper, epochs=1)
    assert int(model.optimizer.iterations) == 2
    np.testing.assert_array_equal(wrapper.get_weights()[0], model.get_weights()[0])


def _round_trip_then_train(model, tmp_path):
    _train(model, epochs=1)
    path = tmp_path / "model.keras"
    model.save(path)
    restored = keras.models.load_model(path, safe_mode=True)
    assert type(restored) is type(model)
    assert restored.micro_batch_size == model.micro_batch_size
    assert int(restored.optimizer.iterations) == int(model.optimizer.iterations)
    # Continuing from the restored file gives what continuing in memory gives:
    # weights, optimizer slots and the micro-batch size all came back.
    _train(model, epochs=1)
    _train(restored, epochs=1)
    assert max_relative_difference(model.get_weights(), restored.get_weights()) <= 1e-6


def test_wrapper_round_trips_through_keras_file(tmp_path):
    _round_trip_then_train(kadapt.accumulate(_compiled(mlp()), 5), tmp_path)


def test_wrapper_of_subclassed_model_round_trips(tmp_path):
    _round_trip_then_train(_compiled(kadapt.accumulate(TwoLayers(), 5)), tmp_path)


def test_functional_accumulating_model_round_trips(tmp_path):
    _round_trip_then_train(_compiled(_functional(micro_batch_size=5)), tmp_path)
