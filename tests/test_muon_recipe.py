"""The recipe's `"muon"`: Keras' Muon with kadapt's live rate, and k micro-batches in one step equal
one full-batch step under it (the oracle is plain Keras `fit` with the same optimizer)."""

import keras
import pytest

import kadapt
from helpers import classification_data
from helpers import max_relative_difference
from helpers import mlp
from kadapt.optimizers.live_rate import learning_rate_multiplier
from kadapt.recipes.config import FastFitConfig
from kadapt.recipes.training import recipe_optimizer

pytestmark = pytest.mark.backends("tensorflow", "jax")

CONFIG = FastFitConfig(optimizer="muon", schedule="constant", learning_rate=0.01)


def _compiled(model, jit_compile):
    model.compile(recipe_optimizer(CONFIG, 10), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=jit_compile)
    return model


def test_the_recipe_compiles_keras_muon_with_a_live_rate():
    optimizer = recipe_optimizer(CONFIG, 10)
    assert type(optimizer) is keras.optimizers.Muon
    assert float(keras.ops.convert_to_numpy(learning_rate_multiplier(optimizer))) == 1.0
    assert float(keras.ops.convert_to_numpy(optimizer.learning_rate)) == pytest.approx(0.01)


# Without jit_compile JAX runs the step eagerly, the same update op by op: TensorFlow's graph only.
@pytest.mark.parametrize("jit_compile", [pytest.param(False, marks=pytest.mark.backends("tensorflow")), True],
                         ids=["graph", "xla"])
def test_micro_batches_equal_one_batch_under_muon(jit_compile):
    # mlp()'s 5x16 and 16x3 kernels take Muon's orthogonalized step, its biases AdamW's; 3 epochs of 2
    # logical batches (16, then a ragged 5) carry Muon's momentum and Adam's moments across steps.
    x, y = classification_data()
    plain = _compiled(mlp(), jit_compile)
    accumulated = kadapt.accumulate(_compiled(mlp(), jit_compile), 3)
    for model in (plain, accumulated):
        model.fit(x[:21], y[:21], batch_size=16, epochs=3, verbose=0, shuffle=False)
    assert int(accumulated.optimizer.iterations) == 6
    assert max_relative_difference(plain.get_weights(), accumulated.get_weights()) <= 1e-5
