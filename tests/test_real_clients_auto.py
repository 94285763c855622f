"""Keras' own example and guide models (`real_clients.py`) trained by kadapt
with `micro_batch_size="auto"` and the MetaAdjuster."""

import numpy as np
import pytest
import tensorflow as tf

import kadapt
from real_clients import accumulated
from real_clients import fit_client


# The attention and sequence-to-sequence clients are left out here: their probe trials cost the most
# (~50 s each on 2 busy cores), their exactness is tests/test_real_clients.py's, and the probe on them
# adds nothing the four kept (an add_loss, a multi-input, a subclassed embedding and a recurrent
# client) do not exercise.
AUTO_CLIENTS = ("add_loss", "multi_io", "recommender", "timeseries")


@pytest.mark.parametrize("name", AUTO_CLIENTS)
def test_auto_and_the_meta_adjuster_train_it(name):
    in_use = tf.config.experimental.get_memory_info("CPU:0")["current"]
    model, trainer, data = accumulated(name, "auto", memory_budget=in_use + 32 * 2**20)
    adjuster = kadapt.MetaAdjuster(monitor="loss", check_every=1, verbose=0)
    history = fit_client(trainer, data, epochs=2, callbacks=[adjuster])
    assert isinstance(trainer.micro_batch_size, int)
    assert int(trainer.optimizer.iterations) == 4
    assert np.isfinite(history.history["loss"]).all()
    assert all(np.isfinite(w).all() for w in model.get_weights())
