"""Keras' own example and guide models (`real_clients.py`) trained by kadapt:
equal to plain Keras on the full batch, and alike after a `.keras` round trip."""

import pytest

import kadapt
from helpers import max_relative_difference
from real_clients import CLIENTS
from real_clients import MICRO
from real_clients import accumulated
from real_clients import assert_equals_plain_keras
from real_clients import fit_client


@pytest.mark.parametrize("name", sorted(CLIENTS))
def test_equals_plain_keras_and_continues_alike_from_a_keras_file(name, tmp_path):
    model, trainer, data = accumulated(name)
    fit_client(trainer, data)
    first_epoch = model.get_weights()
    trainer.save(tmp_path / "model.keras")
    # The trainer continues before another model is built or loaded: after either, its next
    # fit traces the whole accumulating step again.
    fit_client(trainer, data)
    restored = kadapt.load_model(tmp_path / "model.keras")
    assert restored.micro_batch_size == MICRO
    fit_client(restored, data)
    assert max_relative_difference(trainer.get_weights(), restored.get_weights()) <= 1e-6
    assert_equals_plain_keras(name, first_epoch)
