"""MetaAdjuster between the steps of one epoch (on JAX, Keras syncs the trainer's state into the
variables only when a callback reads `self.model`): rollback and cut, proven by the weights."""

import keras
import numpy as np
import pytest
from helpers import constant_meta_model
from test_meta_adjuster import LR_DOWN_10, ROWS, linear_model, numpy_descent, regression_data

import kadapt
from kadapt.meta import MetaAdjuster
from kadapt.meta import Trigger

pytestmark = pytest.mark.backends("tensorflow", "jax")


class DivergesAtStep3(Trigger):
    """Reports a divergence at the third observation (and nothing else)."""

    def update(self, loss):
        super().update(loss)
        return "divergence" if len(self.losses) == 3 else None


def test_a_rollback_and_a_cut_inside_one_epoch_reach_the_next_step(observed_on):
    rate, momentum = 0.05, 0.5
    model = linear_model(kadapt.optimizers.SGD(rate, momentum=momentum))
    adjuster = MetaAdjuster(constant_meta_model(LR_DOWN_10), monitor="loss", check_every=1,
                            trigger=DivergesAtStep3(patience=10**6), verbose=0)
    x, y = regression_data()
    model.fit(np.concatenate([x] * 4), np.concatenate([y] * 4), batch_size=ROWS, epochs=1, shuffle=False,
              verbose=0, callbacks=[adjuster])
    assert [(d["step"], d["trigger"], d["action"]) for d in adjuster.decisions] == [(3, "divergence", "lr x0.1")]
    assert (adjuster._runner.observer is not None) == (observed_on == "device")
    # A training loss is measured before its step's update, so the last good state at step 3 is
    # the one after step 1 (weights and velocity); step 4 starts there at a tenth of the rate.
    expected = numpy_descent(x, y, [rate, rate / 10], [momentum] * 2)
    np.testing.assert_allclose(model.get_weights()[0], expected, rtol=1e-5)
    assert not np.allclose(expected, numpy_descent(x, y, [rate] * 4, [momentum] * 4), rtol=1e-3)
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 4  # the step count goes on
