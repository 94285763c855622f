"""`pack_ensemble`: several meta-models of one architecture as one recurrent model that averages them.

A meta-model trained on a few hundred decision points depends on its
training seed: two fits of the same hyperparameters rank the actions
differently on some windows. Averaging K fits lowers that variance. The
average is packed into one model of the same kind, so it loads, saves and
runs (`numpy_forward` included) as any meta-model does: K recurrent stacks of
`units` each are one stack of `K x units` whose weights keep the members
apart, since a GRU's and an LSTM's gates act unit by unit:

    kernel:      each member's gate columns side by side (the first layer
                 reads the shared window; a later layer reads only its own
                 member's units: block-diagonal rows)
    recurrent:   block-diagonal, the same column order
    bias:        the same column order
    head:        the members' Dense kernels stacked, divided by K; the bias
                 the members' mean

so the packed model's output is the mean of the members' outputs (to float
rounding), and a member's units never see another's.
"""

from __future__ import annotations

from collections.abc import Sequence

import keras
import numpy as np

from kadapt.meta.model import actions as action_lib
from kadapt.meta.model.features import FEATURE_NAMES
from kadapt.meta.model.features import WINDOW
from kadapt.meta.model.meta_model import MetaSpec
from kadapt.meta.model.numpy_forward import computing_layers
from kadapt.meta.model.numpy_forward import is_linear_dense

_GATES = {"GRU": 3, "LSTM": 4}


def pack_ensemble(members: Sequence[keras.Model]) -> keras.Model:
    """One meta-model whose output is the mean of `members`' outputs.

    Args:
        members: Meta-models of one architecture (`MetaHyperModel` builds
            with the same hyperparameters): a stack of GRU or LSTM layers, a
            dropout and a linear `Dense` head.

    Returns:
        A `keras.Model` of the same kind, `K x units` wide (not compiled).

    Raises:
        ValueError: no members, members of different architectures, or
            layers other than GRU/LSTM stacks under a linear `Dense` head.

    Example:

    ```python
    packed = pack_ensemble([model_seed_0, model_seed_1, model_seed_2])
    packed(windows)  # == mean(member(windows) for member in members), to float rounding
    ```
    """
    if not members:
        raise ValueError("Argument `members` must hold at least one meta-model. Received: members=[]")
    stacks = [computing_layers(member) for member in members]
    summaries = [[(type(layer).__name__, layer.get_config().get("units")) for layer in stack] for stack in stacks]
    if len({tuple(_signature(layer) for layer in stack) for stack in stacks}) != 1:
        raise ValueError(f"Argument `members` must share one architecture (the same cell, units, layers and "
                         f"settings). Received layers: {summaries}")
    if not _is_packable(stacks[0]):
        raise ValueError(f"Argument `members` must be stacks of GRU or LSTM layers under a linear Dense head, as "
                         f"kadapt.meta.MetaHyperModel builds them. Received layers: {summaries[0]}")
    first, count = stacks[0], len(members)
    inputs = keras.Input((WINDOW, len(FEATURE_NAMES)), name="window")
    hidden = MetaSpec(name="meta_spec")(inputs)
    recurrent = first[:-1]
    for index, layer in enumerate(recurrent):
        config = {**layer.get_config(), "units": layer.get_config()["units"] * count, "name": f"recurrent_{index}"}
        packed_layer = type(layer).from_config(config)  # every other setting as the fits have it
        hidden = packed_layer(hidden)
        packed_layer.set_weights(_packed_recurrent([stack[index] for stack in stacks], shared_input=index == 0))
    head = keras.layers.Dense(len(action_lib.ACTIONS), name="score_difference")
    outputs = head(hidden)
    head.set_weights(_packed_head([stack[-1] for stack in stacks]))
    return keras.Model(inputs, outputs, name="meta_model")  # not compiled: it is not trained further


def _is_packable(stack):
    head = stack[-1]
    return (len(stack) >= 2 and all(type(layer).__name__ in _GATES for layer in stack[:-1])
            and is_linear_dense(head))


def _signature(layer):
    """The layer's kind and settings, its name and initializers aside: equal for fits of one architecture."""
    config = {key: value for key, value in layer.get_config().items()
              if key != "name" and not key.endswith(("initializer", "seed"))}
    return type(layer).__name__, repr(sorted(config.items()))


def _packed_recurrent(layers, shared_input):
    """The weights of one packed GRU/LSTM layer from the members' layers at one depth."""
    gates = _GATES[type(layers[0]).__name__]
    count = len(layers)
    weights = [[np.asarray(keras.ops.convert_to_numpy(w)) for w in layer.weights] for layer in layers]
    units = weights[0][1].shape[0]
    width = gates * units * count

    def columns(member, gate):
        start = gate * units * count + member * units
        return slice(start, start + units)

    inputs = weights[0][0].shape[0] * (1 if shared_input else count)
    kernel = np.zeros((inputs, width), "float32")
    recurrent = np.zeros((units * count, width), "float32")
    bias = np.zeros(weights[0][2].shape[:-1] + (width,), "float32")
    for member, (k, u, b) in enumerate(weights):
        rows = slice(None) if shared_input else slice(member * units, (member + 1) * units)
        own = slice(member * units, (member + 1) * units)
        for gate in range(gates):
            source = slice(gate * units, (gate + 1) * units)
            kernel[rows, columns(member, gate)] = k[:, source]
            recurrent[own, columns(member, gate)] = u[:, source]
            bias[..., columns(member, gate)] = b[..., source]
    return [kernel, recurrent, bias]


def _packed_head(layers):
    kernels, biases = zip(*([np.asarray(keras.ops.convert_to_numpy(w)) for w in layer.weights] for layer in layers))
    return [np.concatenate(kernels, axis=0) / len(layers), np.mean(biases, axis=0)]
