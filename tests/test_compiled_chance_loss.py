"""`compiled_chance_loss`: the chance level of Keras' own losses equals the loss Keras computes for the
best constant prediction (an independent oracle: the loss object itself), and a custom loss has none."""

import keras
import numpy as np
import pytest

from kadapt.meta.live.chance_loss import compiled_chance_loss

LABELS = np.array([0, 0, 0, 1, 1, 2, 0, 1])  # frequencies 1/2, 3/8, 1/8


def keras_value(loss, targets, constant):
    return float(keras.ops.convert_to_numpy(loss(targets, np.broadcast_to(constant, (len(targets), len(constant))))))


@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_categorical_chance_is_keras_loss_at_the_smoothed_frequencies(smoothing):
    onehot = np.eye(3, dtype="float32")[LABELS]
    frequencies = (1 - smoothing) * onehot.mean(axis=0) + smoothing / 3
    loss = keras.losses.CategoricalCrossentropy(label_smoothing=smoothing)
    expected = keras_value(loss, onehot, frequencies.astype("float32"))
    assert compiled_chance_loss(loss, onehot) == pytest.approx(expected, rel=1e-5)


def test_sparse_chance_is_keras_loss_at_the_frequencies_from_logits_or_not():
    frequencies = np.bincount(LABELS, minlength=3) / len(LABELS)
    expected = keras_value(keras.losses.SparseCategoricalCrossentropy(), LABELS, frequencies.astype("float32"))
    for loss in ("sparse_categorical_crossentropy", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                 keras.losses.sparse_categorical_crossentropy):
        assert compiled_chance_loss(loss, LABELS) == pytest.approx(expected, rel=1e-5)


def test_binary_chance_is_keras_loss_at_the_smoothed_mean():
    targets = np.array([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [1.0, 0.0]], "float32")
    mean = (0.9 * targets.mean(axis=0) + 0.05).astype("float32")
    loss = keras.losses.BinaryCrossentropy(label_smoothing=0.1)
    assert compiled_chance_loss(loss, targets) == pytest.approx(keras_value(loss, targets, mean), rel=1e-5)


def test_squared_and_absolute_errors_are_keras_losses_at_the_mean_and_the_median():
    targets = np.array([[1.0], [2.0], [6.0]], "float32")
    assert compiled_chance_loss("mse", targets) == pytest.approx(keras_value(keras.losses.MeanSquaredError(),
                                                                             targets, np.array([3.0], "float32")))
    assert compiled_chance_loss("mae", targets) == pytest.approx(keras_value(keras.losses.MeanAbsoluteError(),
                                                                             targets, np.array([2.0], "float32")))


def test_a_custom_or_unknown_loss_has_no_chance_level():
    def my_loss(y_true, y_pred):
        return keras.losses.mean_squared_error(y_true, y_pred)

    for loss in (my_loss, keras.losses.Huber(), "hinge", ["mse", "mae"]):
        assert compiled_chance_loss(loss, np.zeros((4, 1))) is None
