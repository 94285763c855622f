"""Bad input is met with errors that name the argument and the value."""

import keras
import pytest

import kadapt
from helpers import classification_data
from helpers import mlp

pytestmark = pytest.mark.backends("tensorflow", "jax")


@pytest.mark.parametrize("value", [0, -3])
def test_non_positive_micro_batch_size(value):
    with pytest.raises(ValueError, match=rf"`micro_batch_size` must be a positive int.*Received: micro_batch_size={value}"):
        kadapt.accumulate(mlp(), value)


@pytest.mark.parametrize("value", [2.5, "8", True, None])
def test_micro_batch_size_of_the_wrong_type(value):
    with pytest.raises(TypeError, match=r"`micro_batch_size` must be a positive int.*Received: micro_batch_size="):
        kadapt.accumulate(mlp(), value)


def test_functional_model_and_setter_validate_too():
    model = mlp()
    with pytest.raises(ValueError, match="Received: micro_batch_size=0"):
        kadapt.AccumulatingModel(model.inputs, model.outputs, micro_batch_size=0)
    accumulating = kadapt.accumulate(model, 4)
    with pytest.raises(ValueError, match="Received: micro_batch_size=-1"):
        accumulating.micro_batch_size = -1
    assert accumulating.micro_batch_size == 4


def test_model_that_is_not_a_keras_model():
    with pytest.raises(TypeError, match=r"`model` must be a `keras.Model`.*Received: model='dense'"):
        kadapt.accumulate("dense", 4)
    with pytest.raises(TypeError, match=r"Received: model=<Dense"):
        kadapt.accumulate(keras.layers.Dense(3), 4)


def test_fit_before_compile():
    x, y = classification_data()
    with pytest.raises(ValueError, match=r"must be compiled before `fit`.*model\.compile"):
        kadapt.accumulate(mlp(), 4).fit(x, y, verbose=0)
