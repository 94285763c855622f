"""Saved models: `load_model` (kadapt's objects known) and `portable_model` (none needed).

A `.keras` file a run writes is for whoever receives it: a colleague, a
serving container, a notebook with Keras alone. `portable_model` makes the
copy that file holds, of Keras' own classes only; the training state that
needs kadapt (its optimizers, schedules, the adjuster) lives in a run's
backup, which `kadapt train --resume` reads.
"""

from __future__ import annotations

import importlib
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import keras

# The modules whose classes are registered with Keras (optimizers, schedules,
# layers, models); Keras finds a registered class only once its module ran.
REGISTERING_MODULES = (
    "kadapt.batching", "kadapt.meta.model.meta_model", "kadapt.models", "kadapt.optimizers",
    "kadapt.schedules",
)
KADAPT_PACKAGE = "kadapt>"
# What Keras says where a file holds more optimizer variables than the optimizer it builds from the config.
SKIPPED_STATE = "Skipping variable loading for optimizer"


def register_objects() -> None:
    """Imports every kadapt module that registers classes with Keras."""
    for name in REGISTERING_MODULES:
        importlib.import_module(name)


def load_model(path: str | os.PathLike, compile: bool = True, for_training: bool = False) -> keras.Model:
    """Loads a `.keras` file, or a `kadapt train` run's model, in Keras' safe mode, kadapt's objects registered.

    A run directory holds two: `model.keras`, what the run predicts with (raw
    rows in, plain Keras loads it), and `training.keras`, the network as it
    trained (on the rows as the network takes them: `model.keras` up to its
    network layer, `keras.Model(model.inputs, model.get_layer(network.name).input)`,
    encodes a table's), compiled with kadapt's optimizer, its schedule and
    its state at the end of the run, to train further.

    Args:
        path: String or `pathlib.Path`. A `.keras` file, or a run directory.
        compile: Bool. Compile with the saved optimizer and loss. Defaults to `True`.
        for_training: Bool. From a run directory, its `training.keras`.
            Defaults to `False` (its `model.keras`).

    Returns:
        The `keras.Model`.

    Example:

    ```python
    model = kadapt.load_model("runs/demo")                       # model.keras: predict
    network = kadapt.load_model("runs/demo", for_training=True)  # train on: its optimizer's state kept
    network.fit(x, keras.utils.to_categorical(y, 10), epochs=1)
    ```
    """
    import keras

    path = Path(path)
    if path.is_dir():
        name = "training.keras" if for_training else "model.keras"
        if not (path / name).is_file():
            raise ValueError(f"Argument `path` names a directory without {name}: a run writes it when it ends "
                             "(train it to the end; a run that ended before kadapt wrote training.keras has none). "
                             f"Received: path={path}")
        path = path / name
    elif for_training and path.name != "training.keras":
        raise ValueError("Argument `for_training` reads a run's training.keras: pass the run directory (or that "
                         f"file). Received: path={path}")
    register_objects()
    from kadapt.optimizers.live_rate import reload_live_rate

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = keras.saving.load_model(path, compile=compile, safe_mode=True)
    restored = compile and reload_live_rate(model, path)
    for warning in caught:  # Keras' skipped optimizer state, restored here
        if not (restored and SKIPPED_STATE in str(warning.message)):
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return model


def portable_model(model: keras.Model) -> keras.Model:
    """A copy of `model` for inference that plain Keras loads without kadapt.

    The copy computes what `model` computes (in inference mode) and shares
    its layers wherever they are Keras' own; what a saved file would name
    kadapt for is rebuilt from Keras' classes:

    - no compile state: the optimizer, its schedule and the loss stay with
      the training run (a nested network's too);
    - kadapt's initializers (`PartialIdentity`, `CentreTap`) give way to
      `"zeros"`: the layer's weights are copied, an initializer never runs again;
    - `ScaledGradientBias` (inputs + bias, its gradient scaled in training)
      becomes a frozen `BatchNormalization(center=True, scale=False,
      epsilon=0)` with moving mean 0 and variance 1: inputs * 1 + bias, exactly.

    A subclassed network inside it is kept as it is: the file names its
    class, which the user registered and which must be importable where the
    file is loaded.

    Args:
        model: `keras.Model`. A built model.

    Returns:
        A functional `keras.Model`, not compiled.

    Example:

    ```python
    kadapt.portable_model(model).save("model.keras")  # keras.saving.load_model needs no kadapt
    ```
    """
    import keras

    if not isinstance(model, (keras.Sequential, keras.Function)) or not model.built:
        raise TypeError("Argument `model` must be a built functional or Sequential `keras.Model`; wrap a "
                        "subclassed one: `keras.Model(inputs, model(inputs))`. Received: "
                        f"model={type(model).__name__}")
    rebuilt = []

    def clone(layer):
        if isinstance(layer, (keras.Sequential, keras.Function)):
            return portable_model(layer)
        copy = _keras_layer(layer)
        if copy is not layer:
            rebuilt.append((layer, copy))
        return copy

    # Keras compiles a clone of a compiled model, and clones a subclass with a functional
    # constructor (`kadapt.AccumulatingModel`) as itself: the graph goes to a plain functional model first.
    graph = _uncompiled_graph(model)
    copy = keras.models.clone_model(graph, clone_function=clone)
    for layer, twin in rebuilt:
        _copy_weights(layer, twin)
    return copy


def _uncompiled_graph(model):
    """A new, uncompiled functional or Sequential model over `model`'s own layers."""
    import keras

    if isinstance(model, keras.Sequential):  # its `output` is that of its first call, which may be outside it
        first = model.inputs[0]
        return keras.Sequential([keras.Input(batch_shape=first.shape, dtype=first.dtype), *model.layers],
                                name=model.name)
    return keras.Model(model.input, model.output, name=model.name)


def _keras_layer(layer):
    """`layer` itself where Keras can rebuild it alone, else a copy of Keras' own classes."""
    import keras

    from kadapt.models import ScaledGradientBias

    if isinstance(layer, ScaledGradientBias):
        return keras.layers.BatchNormalization(center=True, scale=False, epsilon=0.0, trainable=False,
                                               dtype=layer.dtype_policy, name=layer.name)
    try:
        config = layer.get_config()
    except NotImplementedError:  # a user's layer without a config: Keras could not save it either
        return layer
    plain = _without_kadapt_initializers(config)
    return layer if plain == config else layer.__class__.from_config(plain)


def _without_kadapt_initializers(config):
    """`config` with every kadapt initializer (`..._initializer` keys) replaced by `"zeros"`."""
    if not isinstance(config, dict):
        return config
    return {key: "zeros" if key.endswith("initializer") and _names_kadapt(value) else _without_kadapt_initializers(value)
            for key, value in config.items()}


def _names_kadapt(value):
    return isinstance(value, dict) and str(value.get("registered_name", "")).startswith(KADAPT_PACKAGE)


def _copy_weights(layer, twin):
    from kadapt.models import ScaledGradientBias

    if isinstance(layer, ScaledGradientBias):
        twin.beta.assign(layer.bias)  # moving mean 0 and variance 1 are its initial values
    else:
        twin.set_weights(layer.get_weights())
