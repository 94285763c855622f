"""`FilterMuon`: a convolution filter's step equals airbench's Muon step, written out in NumPy on the
filter bank flattened PyTorch's way (out, in * kh * kw) and scaled as Keras scales a 2-D one; the
other weights take the AdamW step; the recipe's `"muon_filters"` is exact under micro-batches, saves
and loads, and says when a network has nothing for it to orthogonalize."""

import keras
import numpy as np
import pytest

import kadapt
from helpers import classification_data
from helpers import max_relative_difference
from kadapt.optimizers import FilterMuon
from kadapt.optimizers.filter_muon import muon_variables
from kadapt.optimizers.live_rate import set_learning_rate_multiplier
from kadapt.recipes.config import FastFitConfig
from kadapt.recipes.training import muon_fallback
from kadapt.recipes.training import recipe_optimizer

pytestmark = pytest.mark.backends("tensorflow", "jax")

A, B, C = 3.4445, -4.7750, 2.0315  # the quintic Newton-Schulz coefficients (Keller Jordan's Muon)
LR, MOMENTUM, DECAY, RMS_RATE, NS_STEPS = 0.05, 0.95, 0.1, 0.2, 5


def newton_schulz(matrix, steps=NS_STEPS):
    """airbench's `zeropower_via_newtonschulz5`: the wide orientation, normalized, `steps` quintic iterations."""
    tall = matrix.shape[0] > matrix.shape[1]
    x = matrix.T if tall else matrix
    x = x / (np.linalg.norm(x) + 1e-7)
    for _ in range(steps):
        gram = x @ x.T
        x = A * x + (B * gram + C * gram @ gram) @ x
    return x.T if tall else x


def muon_steps(kernel, gradients):
    """The kernel after Muon steps on `gradients`, each filter bank as PyTorch lays it out: (out, in*window)."""
    kernel, momentum = kernel.astype(np.float64), np.zeros_like(kernel, np.float64)
    axes = (kernel.ndim - 1, kernel.ndim - 2, *range(kernel.ndim - 2))  # (*window, in, out) -> (out, in, *window)
    for gradient in gradients:
        kernel = kernel * (1 - LR * DECAY)  # Keras' decoupled decay, before the step
        momentum = MOMENTUM * momentum + gradient
        nesterov = gradient + MOMENTUM * momentum
        matrix = np.transpose(nesterov, axes).reshape(kernel.shape[-1], -1)
        update = np.transpose(newton_schulz(matrix).reshape(np.transpose(nesterov, axes).shape), np.argsort(axes))
        kernel = kernel - LR * update * np.sqrt(max(matrix.shape)) * RMS_RATE
    return kernel


@pytest.mark.parametrize("shape", [(3, 3, 2, 4), (3, 3, 4, 2), (1, 1, 2, 8), (5, 3, 6)],
                         ids=["conv2d", "conv2d-few-out", "conv2d-1x1-wide", "conv1d"])
def test_a_filter_takes_airbench_s_muon_step_of_its_flattened_matrix(shape):
    rng = np.random.default_rng(0)
    kernel = rng.normal(size=shape).astype("float32")
    gradients = [rng.normal(size=shape).astype("float32") for _ in range(3)]
    variable = keras.Variable(kernel)
    optimizer = FilterMuon(LR, momentum=MOMENTUM, weight_decay=DECAY, rms_rate=RMS_RATE, ns_steps=NS_STEPS)
    for gradient in gradients:
        optimizer.apply_gradients([(keras.ops.convert_to_tensor(gradient), variable)])
    expected = muon_steps(kernel, gradients)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(variable), expected, rtol=0, atol=2e-5)
    assert np.abs(expected - kernel).max() > 100 * 2e-5  # the steps moved it well beyond the tolerance


def test_the_newton_schulz_step_orthogonalizes_the_flattened_filter():
    # Keller Jordan's quintic leaves the singular values in about (0.5, 1.5), not at 1, by design.
    gradient = np.random.default_rng(1).normal(size=(3, 3, 8, 16)).astype("float32")
    update = keras.ops.convert_to_numpy(FilterMuon().zeropower_via_newtonschulz5(gradient, NS_STEPS))
    singular = np.linalg.svd(update.reshape(-1, 16), compute_uv=False)
    assert 0.5 < singular.min() and singular.max() < 1.5
    assert singular.max() / singular.min() < np.linalg.cond(gradient.reshape(-1, 16))


def _conv_network(batch_norm=True):
    # Batch normalization sees each micro-batch's statistics (ghost batch norm): the exactness test leaves it out.
    keras.utils.set_random_seed(0)
    return keras.Sequential([
        keras.Input((6, 6, 2)),
        keras.layers.Conv2D(4, 3, name="stem"),
        keras.layers.BatchNormalization() if batch_norm else keras.layers.Identity(),
        keras.layers.ReLU(),
        keras.layers.Conv2D(8, 3, use_bias=False, name="block"),
        keras.layers.GlobalMaxPooling2D(),
        keras.layers.Dense(3, name="head"),
    ])


def test_muon_trains_the_filters_and_adamw_the_rest():
    model = _conv_network()
    taken = muon_variables(FilterMuon(), model.trainable_variables)
    assert [variable.path for variable in taken] == ["sequential/stem/kernel", "sequential/block/kernel"]
    taken = muon_variables(FilterMuon(exclude_layers=["stem"]), model.trainable_variables)
    assert [variable.path for variable in taken] == ["sequential/block/kernel"]


def _compiled(model, jit_compile=False):
    config = FastFitConfig(optimizer="muon_filters", schedule="constant", learning_rate=0.01)
    model.compile(recipe_optimizer(config, 10), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=jit_compile)
    return model


def _images(rows=21):
    x, y = classification_data(rows=rows, features=72)
    return x.reshape(rows, 6, 6, 2), y


# Without jit_compile JAX runs the step eagerly, the same update op by op: TensorFlow's graph only.
@pytest.mark.parametrize("jit_compile", [pytest.param(False, marks=pytest.mark.backends("tensorflow")), True],
                         ids=["graph", "xla"])
def test_micro_batches_equal_one_batch_under_filter_muon(jit_compile):
    # 2 logical batches (16, then a ragged 5) an epoch, 3 epochs: the filters' Muon momentum and the
    # biases' and head's Adam moments carry across steps.
    x, y = _images()
    plain = _compiled(_conv_network(batch_norm=False), jit_compile)
    accumulated = kadapt.accumulate(_compiled(_conv_network(batch_norm=False), jit_compile), 3)
    for model in (plain, accumulated):
        model.fit(x, y, batch_size=16, epochs=3, verbose=0, shuffle=False)
    assert int(accumulated.optimizer.iterations) == 6
    assert max_relative_difference(plain.get_weights(), accumulated.get_weights()) <= 1e-5


def test_a_changed_multiplier_scales_the_next_filter_step_in_the_compiled_step():
    # Muon's step and the decay are linear in the rate from a given state: after one step at 1 the
    # next at 0.3 moves the filters 0.3 times as far as the one at 1, without a retrace.
    x, y = _images()
    steady, changed = _compiled(_conv_network(batch_norm=False)), _compiled(_conv_network(batch_norm=False))
    for model in (steady, changed):
        model.train_on_batch(x, y)
    before = keras.ops.convert_to_numpy(changed.get_layer("block").kernel)
    function = changed.train_function
    set_learning_rate_multiplier(changed.optimizer, 0.3)
    for model in (steady, changed):
        model.train_on_batch(x, y)
    assert changed.train_function is function
    step = keras.ops.convert_to_numpy(changed.get_layer("block").kernel) - before
    np.testing.assert_allclose(step, 0.3 * (keras.ops.convert_to_numpy(steady.get_layer("block").kernel) - before),
                               rtol=1e-4, atol=1e-7)


def test_a_saved_run_loads_in_safe_mode_and_trains_on_alike(tmp_path):
    x, y = _images()
    model = _compiled(_conv_network())
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    model.save(tmp_path / "training.keras")
    loaded = keras.saving.load_model(tmp_path / "training.keras", safe_mode=True)
    assert type(loaded.optimizer) is FilterMuon
    for each in (model, loaded):
        each.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    assert max_relative_difference(model.get_weights(), loaded.get_weights()) <= 1e-6
    model.save(tmp_path / "weights_only.keras", include_optimizer=False)
    plain = keras.saving.load_model(tmp_path / "weights_only.keras", safe_mode=True, compile=False)
    assert max_relative_difference(model.get_weights(), plain.get_weights()) == 0


def test_a_network_without_filters_falls_back_and_says_why():
    dense = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3)], name="table_net")
    dense.compile(FilterMuon(), "mse")
    assert muon_fallback(dense) == (
        "--optimizer muon_filters falls back to its AdamW step on every weight: table_net has no convolution "
        "filter (3 to 5 dimensions) for Muon's orthogonalized step (--optimizer muon: its 2-D kernels; or adam)")
    convolutions = keras.Sequential([keras.Input((6, 6, 2)), keras.layers.Conv2D(3, 3),
                                     keras.layers.GlobalMaxPooling2D()], name="conv_net")
    convolutions.compile(keras.optimizers.Muon(), "mse")
    assert muon_fallback(convolutions) == (
        "--optimizer muon falls back to its AdamW step on every weight: conv_net has no 2-D kernel for Muon's "
        "orthogonalized step (--optimizer muon_filters: its convolution filters; or adam)")
    filters = _conv_network()
    filters.compile(FilterMuon(), "mse")
    assert muon_fallback(filters) is None
