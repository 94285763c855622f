"""Keras' own example and guide models (`real_clients.py`) trained by kadapt:
equal to plain Keras on the full batch, and still after a `.keras` round trip."""

import pytest

import kadapt
from real_clients import CLIENTS
from real_clients import MICRO
from real_clients import accumulated
from real_clients import assert_equals_plain_keras
from real_clients import fit_client


@pytest.mark.parametrize("name", sorted(CLIENTS))
def test_equals_plain_keras_and_continues_alike_from_a_keras_file(name, tmp_path):
    model, trainer, data = accumulated(name)
    fit_client(trainer, data)
    trainer.save(tmp_path / "model.keras")
    restored = kadapt.load_model(tmp_path / "model.keras")
    assert restored.micro_batch_size == MICRO
    # The restored model's epoch must be plain Keras' second one: its optimizer state came through the file.
    fit_client(restored, data)
    assert_equals_plain_keras(name, [model.get_weights(), restored.get_weights()])
