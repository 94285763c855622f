"""`pack_ensemble`: K meta-models of one architecture as one model whose output is their mean."""

import keras
import keras_tuner
import numpy as np
import pytest

from kadapt import cli
from kadapt.meta import load_meta_model
from kadapt.meta import train_meta_model
from kadapt.meta.model.ensemble import pack_ensemble
from kadapt.meta.model.features import FEATURE_NAMES
from kadapt.meta.model.features import WINDOW
from kadapt.meta.model.hyper_model import MetaHyperModel
from kadapt.meta.model.numpy_forward import numpy_forward


def members(cell, layers, count=3, units=8):
    hp = keras_tuner.HyperParameters()
    for name, value in (("cell", cell), ("units", units), ("layers", layers), ("dropout", 0.1),
                        ("learning_rate", 1e-3)):
        hp.Fixed(name, value)
    built = []
    for seed in range(count):
        keras.utils.set_random_seed(seed)
        built.append(MetaHyperModel().build(hp))
    return built


@pytest.mark.backends("tensorflow", "jax")
@pytest.mark.parametrize("cell,layers", [("gru", 1), ("gru", 2), ("lstm", 2)])
def test_the_packed_model_is_the_mean_of_its_members(cell, layers, tmp_path):
    models = members(cell, layers)
    windows = np.random.default_rng(0).normal(size=(6, WINDOW, len(FEATURE_NAMES))).astype("float32")
    mean = np.mean([np.asarray(model(windows)) for model in models], axis=0)  # the members' own Keras calls
    packed = pack_ensemble(models)
    np.testing.assert_allclose(np.asarray(packed(windows)), mean, atol=1e-6)
    np.testing.assert_allclose(numpy_forward(packed)(windows), mean, atol=1e-6)  # the adjuster's fast path
    packed.save(tmp_path / "packed.keras")
    np.testing.assert_allclose(np.asarray(load_meta_model(tmp_path / "packed.keras")(windows)), mean, atol=1e-6)


def test_members_of_different_architectures_are_refused():
    with pytest.raises(ValueError, match="must share one architecture"):
        pack_ensemble([*members("gru", 1, count=1), *members("gru", 1, count=1, units=16)])
    with pytest.raises(ValueError, match=r"at least one meta-model. Received: members=\[\]"):
        pack_ensemble([])
    dense = keras.Sequential([keras.Input((WINDOW, len(FEATURE_NAMES))), keras.layers.Flatten(), keras.layers.Dense(9)])
    with pytest.raises(ValueError, match=r"stacks of GRU or LSTM layers .* Received layers: \[\('Flatten', None\)"):
        pack_ensemble([dense, dense])


def test_an_ensemble_count_below_one_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"Argument `ensemble` must be in \[1, None\]. Received: ensemble=0"):
        train_meta_model([], "unused", ensemble=0)
    store = tmp_path / "records.sqlite"
    with pytest.raises(SystemExit, match=r"--ensemble must be a count of fits >= 1, e.g. 5. Received: 0"):
        cli.main(["meta", "train", "--store", str(store), "--output", str(tmp_path / "m.keras"), "--ensemble", "0"])
    assert not store.exists()  # refused before the store opens
