"""`kadapt.portable_model`: the copy a `.keras` file holds, which plain Keras loads without kadapt."""

import json
import subprocess
import sys
import zipfile

import keras
import numpy as np
import pytest

import kadapt
from helpers import NO_KADAPT
from kadapt.models import fast_resnet
from kadapt.models.fast_resnet import patch_whitening

PLAIN_KERAS = NO_KADAPT + """
import keras, numpy as np
model = keras.saving.load_model(sys.argv[1], safe_mode=True)
x = np.load(sys.argv[2])
np.save(sys.argv[3], keras.ops.convert_to_numpy(model(x, training=False)))
"""


def _trained_resnet(images, labels):
    keras.utils.set_random_seed(0)
    model = fast_resnet(images.shape[1:], 3, widths=(8, 16), residual_stages=(1,),
                        whitening=patch_whitening(images), bias_lr_multiplier=64.0)
    model.compile(kadapt.optimizers.SGD(0.05, momentum=0.9), "sparse_categorical_crossentropy")
    kadapt.accumulate(model, micro_batch_size=8).fit(images, labels, batch_size=16, epochs=1, verbose=0)
    return model


def _names(path):
    with zipfile.ZipFile(path) as archive:
        return json.dumps(json.loads(archive.read("config.json")))


def test_a_trained_fast_resnet_travels_without_kadapt(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.uniform(size=(32, 8, 8, 1)).astype("float32")
    model = _trained_resnet(images, rng.integers(0, 3, 32))
    path = tmp_path / "model.keras"
    kadapt.portable_model(model).save(path)
    assert "kadapt" not in _names(path)
    np.save(tmp_path / "x.npy", images)
    subprocess.run([sys.executable, "-I", "-c", PLAIN_KERAS, str(path), str(tmp_path / "x.npy"),
                    str(tmp_path / "y.npy")], check=True, cwd=tmp_path, timeout=240)
    expected = keras.ops.convert_to_numpy(model(images, training=False))
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), expected, rtol=1e-5, atol=1e-5)


def test_the_copy_computes_what_the_model_computes_and_shares_keras_layers():
    rng = np.random.default_rng(1)
    images = rng.uniform(size=(16, 8, 8, 3)).astype("float32")
    model = _trained_resnet(images, rng.integers(0, 3, 16))
    copy = kadapt.portable_model(model)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(copy(images, training=False)),
                               keras.ops.convert_to_numpy(model(images, training=False)), rtol=1e-6, atol=1e-6)
    assert not copy.compiled
    assert any(layer is original for layer, original in zip(copy.layers, model.layers)), "Keras' layers are shared"


def test_a_nested_compiled_network_loses_its_optimizer_and_wrapper_class():
    inputs = keras.Input((3,))
    network = kadapt.AccumulatingModel(inputs, keras.layers.Dense(2)(inputs), micro_batch_size=2)
    network.compile(kadapt.optimizers.Adam(1e-3), "mse")
    rows = keras.Input((3,), name="rows")
    outer = keras.Model(rows, keras.layers.Normalization(mean=1.0, variance=4.0)(network(rows)))
    config = json.dumps(keras.saving.serialize_keras_object(kadapt.portable_model(outer)))
    assert "kadapt" not in config and "Adam" not in config


def test_a_subclassed_model_is_refused_with_the_fix():
    class Net(keras.Model):
        def call(self, x):
            return x

    with pytest.raises(TypeError, match=r"wrap a subclassed one: `keras.Model\(inputs, model\(inputs\)\)`. "
                                        r"Received: model=Net"):
        kadapt.portable_model(Net())
