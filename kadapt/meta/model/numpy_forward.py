"""The meta-model's forward pass in NumPy, for one window at a time inside `fit`.

The `MetaAdjuster` asks its meta-model about one `(WINDOW, features)` window
whenever the trigger fires. Called eagerly, a Keras GRU runs its 8 time steps
op by op: measured on 2 shared cores (load ~7), 110-170 ms a call on
TensorFlow and 0.6-0.9 s on JAX, where the same arithmetic in NumPy took
0.6-0.8 ms. The
meta-models `MetaHyperModel` builds are a stack of GRU or LSTM layers, a
dropout (the identity at inference) and a dense layer: `numpy_forward` reads
their weights once and computes

    GRU (gates z, r, h; `reset_after` as Keras' default):
        z = σ(x Wz + bz + h Uz + cz),  r = σ(x Wr + br + h Ur + cr)
        h~ = tanh(x Wh + bh + r ⊙ (h Uh + ch))   (reset_after)
        h~ = tanh(x Wh + bh + (r ⊙ h) Uh)        (reset before)
        h' = z ⊙ h + (1 - z) ⊙ h~
    LSTM (gates i, f, c, o):
        [i, f, g, o] = x W + h U + b;  c' = σ(f) ⊙ c + σ(i) ⊙ tanh(g);  h' = σ(o) ⊙ tanh(c')

from zero states, with σ the logistic sigmoid, in float64. For any other
layer or setting it returns `None` and the Keras call is used.
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import numpy as np

_RECURRENT = ("GRU", "LSTM")
_PASSED_THROUGH = ("InputLayer", "MetaSpec", "Dropout")


def numpy_forward(model: keras.Model) -> Callable[[np.ndarray], np.ndarray] | None:
    """`windows (n, time, features) -> outputs (n, outputs)` computed in NumPy, or `None`
    where `model` is not a stack of GRU/LSTM layers and a linear `Dense` head.

    The weights are read when this is called: call it again after training the model.

    Example:

    ```python
    forward = numpy_forward(load_meta_model("default"))
    scores = forward(window[None])  # equals meta_model(window[None]) to float rounding
    ```
    """
    steps = []
    layers = computing_layers(model)
    if not layers or not is_linear_dense(layers[-1]):
        return None
    for index, layer in enumerate(layers[:-1]):
        last = index == len(layers) - 2
        if not _is_plain_recurrent(layer, return_sequences=not last):
            return None
        steps.append(_recurrent_step(layer))
    kernel, bias = (np.asarray(keras.ops.convert_to_numpy(w), "float64") for w in layers[-1].weights)

    def forward(windows):
        hidden = np.asarray(windows, "float64")
        for step in steps:
            hidden = step(hidden)
        return hidden[:, -1] @ kernel + bias

    return forward


def computing_layers(model: keras.Model) -> list:
    """`model`'s layers that compute at inference: all but the input, the `MetaSpec` and dropouts."""
    return [layer for layer in model.layers if type(layer).__name__ not in _PASSED_THROUGH]


def is_linear_dense(layer: keras.layers.Layer) -> bool:
    """Whether `layer` is a `Dense` with a bias and no activation (a meta-model's head)."""
    return (isinstance(layer, keras.layers.Dense) and layer.use_bias
            and layer.get_config()["activation"] == "linear")


def _is_plain_recurrent(layer, return_sequences):
    """A GRU/LSTM with Keras' default activations, biases, no state carried or reversed."""
    if type(layer).__name__ not in _RECURRENT:
        return False
    config = layer.get_config()
    return (config["activation"] == "tanh" and config["recurrent_activation"] == "sigmoid"
            and config["use_bias"] and not config["go_backwards"] and not config["stateful"]
            and config["return_sequences"] == return_sequences and not config.get("return_state", False))


def _recurrent_step(layer):
    """`sequence (n, time, in) -> hidden states (n, time, units)` of a GRU or LSTM layer."""
    kernel, recurrent, bias = (np.asarray(keras.ops.convert_to_numpy(w), "float64") for w in layer.weights)
    units = recurrent.shape[0]
    if type(layer).__name__ == "LSTM":
        cell = _lstm_cell(kernel, recurrent, bias, units)
    else:
        cell = _gru_cell(kernel, recurrent, bias, units, layer.get_config()["reset_after"])

    def run(sequence):
        state, outputs = None, []
        for time in range(sequence.shape[1]):
            state = cell(sequence[:, time], state)
            outputs.append(state[0])
        return np.stack(outputs, axis=1)

    return run


def _gru_cell(kernel, recurrent, bias, units, reset_after):
    input_bias, recurrent_bias = (bias[0], bias[1]) if reset_after else (bias, np.zeros_like(bias))

    def cell(x, state):
        h = np.zeros((x.shape[0], units)) if state is None else state[0]
        x_z, x_r, x_h = np.split(x @ kernel + input_bias, 3, axis=-1)
        inner = h @ recurrent + recurrent_bias
        z = _sigmoid(x_z + inner[:, :units])
        r = _sigmoid(x_r + inner[:, units:2 * units])
        if reset_after:
            candidate = np.tanh(x_h + r * inner[:, 2 * units:])
        else:
            candidate = np.tanh(x_h + (r * h) @ recurrent[:, 2 * units:])
        return (z * h + (1 - z) * candidate,)

    return cell


def _lstm_cell(kernel, recurrent, bias, units):
    def cell(x, state):
        h, c = (np.zeros((x.shape[0], units)),) * 2 if state is None else state
        i, f, g, o = np.split(x @ kernel + h @ recurrent + bias, 4, axis=-1)
        c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
        return _sigmoid(o) * np.tanh(c), c

    return cell


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # = 1 / (1 + exp(-x)), without overflow for large |x|
