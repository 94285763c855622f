"""The networks `kadapt train` and `kadapt probe` build by name, or a user's
`package.module:function` (`kadapt.run.user_model`)."""

import re

import keras

from kadapt.models import fast_resnet
from kadapt.models import small_cnn
from kadapt.models.table_mlp import SAMPLE_ROWS
from kadapt.models.table_mlp import table_mlp
from kadapt.recipes import FastFitConfig
from kadapt.run.data import TrainingData
from kadapt.run.errors import UsageError
from kadapt.run.user_model import build_user_model
from kadapt.run.user_model import is_model_spec

IMAGE_MODELS = ("small_cnn", "fast_resnet")


def build_network(name: str, data: TrainingData, recipe: FastFitConfig) -> keras.Model:
    """The network `kadapt train` trains: `fast_resnet` with the recipe's
    switches and its whitening computed from `data.x_train`; for a table's
    rows, `mlp` is `kadapt.models.table_mlp` with its pieces cut at the
    training rows' quantiles; else `build_model`.

    Args:
        name: String. A `--model` other than `"auto"`: a built-in name or
            `package.module:function`.
        data: `TrainingData`.
        recipe: `kadapt.recipes.FastFitConfig`.
    """
    if name == "mlp" and data.columns:
        return table_mlp(data.in_memory(SAMPLE_ROWS)[0], data.num_classes, rows=len(data.x_train),
                         embedding_sizes=data.embedding_sizes)
    if name != "fast_resnet":
        return build_model(name, data.input_shape, data.num_classes)
    from kadapt.recipes.training import recipe_network

    _check_images(name, data.input_shape)
    try:
        return recipe_network(recipe, data.x_train, data.num_classes)
    except ValueError as error:
        raise UsageError(
            f"--model {name} cannot take inputs of shape {tuple(data.input_shape)} ({_reason(error)}) "
            "Use larger images or --model mlp."
        ) from None


def build_model(name: str, input_shape: tuple, num_classes: int) -> keras.Model:
    """A fresh, uncompiled model that outputs logits.

    Args:
        name: String. `"small_cnn"`, `"fast_resnet"` (images), `"mlp"` (any
            input), or a user's `package.module:function`.
        input_shape: Tuple. One row's shape.
        num_classes: Int. Output logits.
    """
    if is_model_spec(name):
        return build_user_model(name, input_shape, num_classes)
    _check_images(name, input_shape)
    try:
        return _builder(name)(tuple(input_shape), num_classes)
    except ValueError as error:
        raise UsageError(
            f"--model {name} cannot take inputs of shape {tuple(input_shape)} ({_reason(error)}) "
            "Use larger images or --model mlp."
        ) from None


def _check_images(name, input_shape):
    if name in IMAGE_MODELS and len(input_shape) != 3:
        raise UsageError(
            f"--model {name} needs images (height, width, channels); the data rows have shape "
            f"{tuple(input_shape)}. Use --model mlp."
        )


def mlp(input_shape, num_classes, name="mlp"):
    """Flatten-Dense(128, relu)-Dense(num_classes), logits out."""
    return keras.Sequential(
        [keras.Input(input_shape), keras.layers.Flatten(),
         keras.layers.Dense(128, activation="relu"), keras.layers.Dense(num_classes)],
        name=name,
    )


def _reason(error):
    """The line of a Keras layer error that says what went wrong, without colour codes."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in str(error).splitlines()]
    lines = [line for line in lines if line and not line.startswith("Exception encountered")]
    return lines[0] if lines else type(error).__name__


def _builder(name):
    builders = {"small_cnn": small_cnn, "fast_resnet": fast_resnet, "mlp": mlp}
    if name not in builders:
        raise UsageError(f"--model must be one of small_cnn, fast_resnet, mlp. Received: --model={name}")
    return builders[name]
