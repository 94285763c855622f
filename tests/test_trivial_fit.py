"""`kadapt.batching.trivial_fit`: the bound that lets `kadapt train` skip the probe on small tables."""

import json

import keras
import numpy as np

from kadapt.batching.trivial_fit import model_output_units
from kadapt.batching.trivial_fit import step_bytes_bound
from kadapt.batching.trivial_fit import trivially_fits


def test_the_bound_is_four_bytes_of_five_parameter_copies_and_eight_per_output_unit_and_row():
    assert step_bytes_bound(num_parameters=1091, output_units=80, batch_size=16) == 4 * (5 * 1091 + 8 * 16 * 80)


def test_trivially_fits_at_a_tenth_of_the_budget():
    assert trivially_fits(1_000, 10_000) and not trivially_fits(1_001, 10_000)


def test_output_units_count_the_input_and_every_layer():
    model = keras.Sequential([keras.Input((13,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(3)])
    assert model_output_units(model) == 13 + 64 + 3


def test_a_subclassed_model_has_no_known_output_units():
    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    assert model_output_units(Subclassed()) is None


def test_kadapt_train_on_a_small_table_skips_the_probe_and_chooses_adam(tmp_path, monkeypatch):
    from kadapt.run.pipeline import start_run
    from kadapt.run.pipeline import train

    rng = np.random.default_rng(0)
    np.save(tmp_path / "x.npy", rng.normal(size=(60, 4)).astype("float32"))
    np.save(tmp_path / "y.npy", np.arange(60) % 3)
    monkeypatch.chdir(tmp_path)
    lines = []
    run = start_run({"data": "x.npy,y.npy", "model": "mlp", "epochs": 1, "meta": "off"}, str(tmp_path / "run"))
    train(run, echo=lines.append, verbose=0)
    probe = json.loads((tmp_path / "run" / "probe.json").read_text())
    assert probe["micro_batch_size"] == 16 and probe["skipped"].startswith("a step of the whole logical batch (16 rows)")
    assert any(line.startswith("probe skipped: ") for line in lines)
    assert any(line.startswith("optimizer: adam, learning rate ") for line in lines)
    assert not (tmp_path / "run" / "probe.png").exists()
