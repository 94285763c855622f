"""A user's own network for `kadapt train --model package.module:function`.

The function takes one row's input shape (a tuple) and the class count (an
int) and returns an uncompiled `keras.Model` whose one output is the
`num_classes` logits. `num_classes` is the output width: 1 for a regression
(float labels), whose one output is the standardized target. For rows that
are not images, `input_shape` is the encoded row's (`kadapt.run.encoding`),
and `model.keras` wraps the network with the preprocessing. The recipe compiles it (its optimizer, schedule and
from-logits loss) as it compiles the built-in networks. The spec is recorded
in `config.json`, so `--resume` imports the same function again.
"""

import contextlib
import importlib
import os
import sys
from collections.abc import Callable

import keras

from kadapt.run.errors import UsageError

SIGNATURE = "a function (input_shape, num_classes) -> uncompiled keras.Model with num_classes logits"


def is_model_spec(model: str) -> bool:
    """Whether `model` names a user's function (`package.module:function`)."""
    return isinstance(model, str) and ":" in model


def build_user_model(spec: str, input_shape: tuple, num_classes: int) -> keras.Model:
    """The model `spec`'s function returns for `input_shape` and `num_classes`, checked.

    Args:
        spec: String. `package.module:function`, imported from the current
            directory or `sys.path` (as `python -m` would).
        input_shape: Tuple. One row's shape.
        num_classes: Int. Logits the model must output.

    Returns:
        The uncompiled `keras.Model`, built on `input_shape`.
    """
    function = import_model_function(spec)
    call = f"{spec}(input_shape={tuple(input_shape)}, num_classes={num_classes})"
    with _current_directory_on_path():
        try:
            model = function(tuple(input_shape), num_classes)
        except Exception as error:
            raise UsageError(f"--model {call} raised {_one_line(error)}. Fix the function (call it "
                             "alone to see the traceback). "
                             f"Received: --model={spec}") from None
    _check_returned(spec, call, model)
    _check_outputs(spec, call, model, input_shape, num_classes)
    return model


def import_model_function(spec: str) -> Callable:
    """The callable `package.module:function` names, or a `UsageError` saying what is missing."""
    module_name, _, name = spec.partition(":")
    with _current_directory_on_path():
        try:
            module = importlib.import_module(module_name)
        except Exception as error:  # the user's module may raise anything at import
            raise UsageError(
                f"--model cannot import module {module_name} ({_one_line(error)}). Run from the directory "
                f"that holds it or put it on PYTHONPATH. Received: --model={spec}"
            ) from None
    function = getattr(module, name, None)
    if function is None:
        where = getattr(module, "__file__", None) or "a namespace package"
        raise UsageError(f"--model names {name}, which module {module_name} ({where}) does not define. "
                         f"Received: --model={spec}")
    if not callable(function):
        raise UsageError(f"--model must name {SIGNATURE}; {spec} is of type {type(function).__name__}. "
                         f"Received: --model={spec}")
    return function


def _check_returned(spec, call, model):
    if not isinstance(model, keras.Model):
        raise UsageError(f"--model {call} must return a keras.Model. Received: a {type(model).__name__} "
                         f"from --model={spec}")
    # `compiled` is set by `Model.compile`; the recipe's optimizer, loss and metrics would replace the user's.
    if model.compiled:
        raise UsageError(f"--model {call} returned a compiled model; the recipe compiles it (optimizer, "
                         f"schedule, loss). Return it before model.compile(). Received: --model={spec}")


def _check_outputs(spec, call, model, input_shape, num_classes):
    """One output of `num_classes` logits, on a symbolic row: the recipe's loss is from logits."""
    try:
        output = model(keras.KerasTensor((None, *input_shape)))
    except Exception as error:
        raise UsageError(f"--model {call} returned a model that cannot take rows of shape "
                         f"{tuple(input_shape)} ({_one_line(error)}). Received: --model={spec}") from None
    shape = getattr(output, "shape", None)
    if shape is None or len(shape) != 2 or shape[-1] != num_classes:
        raise UsageError(f"--model {call} must return a model with one output of shape (batch, {num_classes}); "
                         f"it outputs {_shapes(output)}. Received: --model={spec}")
    last = model.layers[-1] if model.layers else None
    if getattr(last, "activation", None) is keras.activations.softmax:
        raise UsageError(f"--model {call} ends in a softmax; the recipe's loss takes logits. Drop the last "
                         f"layer's activation. Received: --model={spec}")


@contextlib.contextmanager
def _current_directory_on_path():
    """`python -m` puts the current directory first on `sys.path`; the `kadapt` script does not."""
    directory = os.getcwd()
    added = directory not in sys.path
    if added:
        sys.path.insert(0, directory)
    try:
        yield
    finally:
        if added:
            sys.path.remove(directory)


def _shapes(output):
    return keras.tree.map_structure(lambda tensor: tuple(getattr(tensor, "shape", ())), output)


def _one_line(error):
    return f"{type(error).__name__}: {' '.join(str(error).split())}"
