"""Losses whose divisor depends on the data (masks, `mean_with_sample_weight`,
`"sum"`): divided by the logical batch's count, so any split equals the full
batch. Oracle: plain Keras on the full batch, same weights."""

import keras
import numpy as np
import pytest

import kadapt
from helpers import max_relative_difference

pytestmark = pytest.mark.backends("tensorflow", "jax")

ROWS, LENGTH, BATCH = 16, 7, 16


def _tokens():
    """The first 4 rows full of tokens, the other 12 one token long: the
    micro-batches of 4 hold 28, 4, 4 and 4 real tokens."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 9, size=(ROWS, LENGTH))
    tokens[4:, 1:] = 0
    return tokens, rng.integers(0, 5, size=(ROWS, LENGTH)), rng.uniform(0.5, 2.0, (ROWS, LENGTH)).astype("float32")


def _tagger():
    """A per-token tagger; the embedding's mask reaches its output through the
    dense layers. Without a recurrent layer its accumulating step traces in a
    third of the time; the two-output test keeps an LSTM tagger."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((LENGTH,), dtype="int32")
    hidden = keras.layers.Embedding(9, 6, mask_zero=True)(inputs)
    hidden = keras.layers.Dense(8, activation="tanh")(hidden)
    return keras.Model(inputs, keras.layers.Dense(5)(hidden))


def _fit(model, loss, sample_weight, micro_batch_size=None):
    x, y, _ = _tokens()
    trainer = model if micro_batch_size is None else kadapt.accumulate(model, micro_batch_size)
    trainer.compile(keras.optimizers.SGD(0.5), loss)
    history = trainer.fit(x, y, sample_weight=sample_weight, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    return model.get_weights(), history.history["loss"]


@pytest.mark.parametrize("reduction, weighted", [
    ("sum_over_batch_size", False), ("sum_over_batch_size", True), ("mean_with_sample_weight", True), ("sum", False)])
def test_a_masked_token_loss_equals_the_full_batch(reduction, weighted):
    def loss():
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction)

    sample_weight = _tokens()[2] if weighted else None
    full, full_loss = _fit(_tagger(), loss(), sample_weight)
    accumulated, accumulated_loss = _fit(_tagger(), loss(), sample_weight, micro_batch_size=4)
    assert max_relative_difference(full, accumulated) <= 1e-5
    np.testing.assert_allclose(accumulated_loss, full_loss, rtol=1e-5)


def test_two_outputs_with_different_masks_and_weights():
    """Each output divided by its own logical count: the tags by their real
    tokens, the weighted score by its sample weights."""
    x, y, _ = _tokens()
    rng = np.random.default_rng(1)
    scores, weights = rng.normal(size=(ROWS, 1)).astype("float32"), rng.uniform(0.1, 3.0, ROWS).astype("float32")

    def build():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((LENGTH,), dtype="int32")
        hidden = keras.layers.Embedding(9, 6, mask_zero=True)(inputs)
        tags = keras.layers.Dense(5, name="tags")(keras.layers.LSTM(8, return_sequences=True)(hidden))
        score = keras.layers.Dense(1, name="score")(keras.layers.GlobalAveragePooling1D()(hidden))
        return keras.Model(inputs, {"tags": tags, "score": score})

    def train(micro_batch_size=None):
        model = build()
        trainer = model if micro_batch_size is None else kadapt.accumulate(model, micro_batch_size)
        trainer.compile(keras.optimizers.SGD(0.3), loss={
            "tags": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            "score": keras.losses.MeanSquaredError(reduction="mean_with_sample_weight")},
            loss_weights={"tags": 1.0, "score": 0.5})
        trainer.fit(x, {"tags": y, "score": scores}, sample_weight={"tags": None, "score": weights},
                    batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
        return model.get_weights()

    assert max_relative_difference(train(), train(micro_batch_size=3)) <= 1e-5


def test_compiled_losses_survive_a_keras_file(tmp_path):
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")
    trainer = kadapt.accumulate(_tagger(), 4)
    trainer.compile(keras.optimizers.SGD(0.5), loss)
    trainer.save(tmp_path / "tagger.keras")
    restored = kadapt.load_model(tmp_path / "tagger.keras").loss
    assert isinstance(restored, kadapt.batching.LogicalBatchLoss)
    assert restored.loss.reduction == "sum"


def test_every_loss_of_a_nested_loss_argument_is_wrapped_once():
    from kadapt.batching.logical_batch_loss import wrap

    huber = keras.losses.Huber()
    wrapped = wrap({"a": "mse", "b": [None, huber]})
    assert wrapped["a"].loss == "mse" and wrapped["b"][0] is None and wrapped["b"][1].loss is huber
    assert wrap(wrapped)["a"] is wrapped["a"]
