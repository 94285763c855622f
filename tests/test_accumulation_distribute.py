"""tf.distribute.MirroredStrategy on two logical CPU devices."""

import numpy as np

import kadapt
from helpers import classification_data
from helpers import compile_classifier
from helpers import max_relative_difference
from helpers import mlp


def test_mirrored_strategy_matches_single_device_full_batch(mirrored_strategy):
    strategy = mirrored_strategy
    assert strategy.num_replicas_in_sync == 2
    x, y = classification_data(rows=32)
    plain = compile_classifier(mlp())
    plain_history = plain.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
    with strategy.scope():
        accumulated = kadapt.accumulate(compile_classifier(mlp()), 3)
    # 16 rows per step, 8 per replica: micro-batches of 3, 3 and a ragged 2.
    history = accumulated.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
    assert int(accumulated.optimizer.iterations.numpy()) == 4
    assert max_relative_difference(plain.get_weights(), accumulated.get_weights()) <= 1e-5
    for key in ("loss", "accuracy"):
        np.testing.assert_allclose(history.history[key], plain_history.history[key], rtol=1e-5)
