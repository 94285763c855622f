"""mixed_float16 + LossScaleOptimizer: scale per micro-batch, apply once."""

import keras
import numpy as np
import pytest

import kadapt
from helpers import classification_data
from helpers import compile_classifier
from helpers import max_relative_difference
from helpers import mlp

pytestmark = pytest.mark.backends("tensorflow", "jax")


def _mixed_pair():
    keras.mixed_precision.set_global_policy("mixed_float16")
    plain = compile_classifier(mlp(regularize=False))
    accumulated = kadapt.accumulate(compile_classifier(mlp(regularize=False)), 4)
    return plain, accumulated


def test_mixed_precision_uses_loss_scaling_and_matches_full_batch():
    plain, accumulated = _mixed_pair()
    assert isinstance(accumulated.optimizer, keras.optimizers.LossScaleOptimizer)
    x, y = classification_data()
    for model in (plain, accumulated):
        model.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
    assert all(w.dtype == np.float32 for w in accumulated.get_weights())
    # float16 forward passes round differently per batch shape; float32 sums.
    assert max_relative_difference(plain.get_weights(), accumulated.get_weights()) <= 1e-3


def test_non_finite_gradient_in_one_micro_batch_skips_the_whole_step():
    _, accumulated = _mixed_pair()
    x, y = classification_data(rows=16)
    accumulated.fit(x, y, batch_size=16, epochs=1, verbose=0)  # builds, one real step
    before = accumulated.get_weights()
    scale_before = float(accumulated.optimizer.dynamic_scale.numpy())
    poisoned = x.copy()
    poisoned[9] = np.inf  # third micro-batch of four
    accumulated.fit(poisoned, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    for old, new in zip(before, accumulated.get_weights()):
        np.testing.assert_array_equal(old, new)
    assert float(accumulated.optimizer.dynamic_scale.numpy()) == scale_before / 2
    accumulated.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    assert max_relative_difference(before, accumulated.get_weights()) > 0
