"""fast_resnet and its parts: whitening, identity init, frozen BN scale with a faster bias."""

import keras
import numpy as np
import pytest

import kadapt
from kadapt.models.fast_resnet import CentreTap
from kadapt.models.fast_resnet import PartialIdentity
from kadapt.models.fast_resnet import ScaledGradientBias
from kadapt.models.fast_resnet import fast_resnet
from kadapt.models.fast_resnet import patch_whitening

LR = 0.05


def _correlated_images(rows=64, size=8, channels=1, seed=0):
    rng = np.random.default_rng(seed)
    noise = rng.normal(size=(rows, size + 1, size + 1, channels))
    smooth = noise[:, 1:, 1:] + 0.8 * noise[:, :-1, :-1] + 0.5 * noise[:, 1:, :-1]
    return (3.0 + 2.0 * smooth).astype("float32")


def test_whitening_layer_makes_patch_covariance_the_identity():
    images = _correlated_images(channels=2)
    kernel, bias = patch_whitening(images, patch_size=2, epsilon=0.0, include_negatives=False)
    conv = keras.layers.Conv2D(kernel.shape[-1], 2)  # stride 1: every patch, as the oracle
    conv.build(images.shape)
    conv.set_weights([kernel, bias])
    out = keras.ops.convert_to_numpy(conv(images)).reshape(-1, kernel.shape[-1]).astype("float64")
    np.testing.assert_allclose(np.cov(out, rowvar=False), np.eye(8), atol=1e-4)
    np.testing.assert_allclose(out.mean(axis=0), 0.0, atol=1e-4)


def test_whitening_epsilon_and_negatives_follow_the_formula():
    images = _correlated_images()
    kernel, bias = patch_whitening(images, patch_size=2, epsilon=0.1)
    assert kernel.shape == (2, 2, 1, 8) and bias.shape == (8,)
    np.testing.assert_allclose(kernel[..., 4:], -kernel[..., :4])
    patches = np.lib.stride_tricks.sliding_window_view(images[..., 0], (2, 2), axis=(1, 2)).reshape(-1, 4)
    eigenvalues = np.linalg.eigvalsh(np.cov(patches, rowvar=False))
    whitened = (patches - patches.mean(0)) @ kernel[..., :4].reshape(4, 4)
    np.testing.assert_allclose(np.cov(whitened, rowvar=False), np.diag(eigenvalues / (eigenvalues + 0.1)), atol=1e-4)


def test_partial_identity_conv_is_the_identity_on_the_first_channels():
    x = np.random.default_rng(0).normal(size=(2, 5, 5, 3)).astype("float32")
    conv = keras.layers.Conv2D(7, 3, padding="same", use_bias=False, kernel_initializer=PartialIdentity())
    y = keras.ops.convert_to_numpy(conv(x))
    np.testing.assert_array_equal(y[..., :3], x)
    assert np.abs(y[..., 3:]).min() > 0.0


def test_partial_identity_rejects_dense_kernels():
    with pytest.raises(ValueError, match=r"initializes 2D conv kernels .* Received: shape=\(3, 4\)"):
        PartialIdentity()((3, 4))


def _train_one_step(model, images, labels, optimizer):
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(images, labels, batch_size=len(images), epochs=1, shuffle=False, verbose=0)


def _tiny(bias_lr_multiplier, seed=0):
    keras.utils.set_random_seed(seed)
    return fast_resnet((8, 8, 1), 3, widths=(4, 6), residual_stages=(0,), bias_lr_multiplier=bias_lr_multiplier)


def _biases(model):
    return [keras.ops.convert_to_numpy(layer.bias) for layer in model.layers if isinstance(layer, ScaledGradientBias)]


@pytest.mark.parametrize("accumulate", [False, True])
def test_bias_moves_multiplier_times_as_far_and_bn_scale_stays_frozen(accumulate):
    images, labels = _correlated_images(rows=8), np.arange(8) % 3
    fast, plain = _tiny(8.0), _tiny(1.0)
    plain.set_weights(fast.get_weights())
    before = _biases(fast)
    for model in (fast, plain):
        trained = kadapt.accumulate(model, micro_batch_size=4) if accumulate else model
        _train_one_step(trained, images, labels, keras.optimizers.SGD(LR))
    for b0, b_fast, b_plain in zip(before, _biases(fast), _biases(plain)):
        np.testing.assert_allclose(b_fast - b0, 8.0 * (b_plain - b0), rtol=1e-4, atol=1e-7)
    batch_norms = [layer for layer in fast.layers if isinstance(layer, keras.layers.BatchNormalization)]
    assert batch_norms and all(not layer.scale and not layer.trainable_weights for layer in batch_norms)


def test_scaled_gradient_bias_forward_is_exact():
    layer = ScaledGradientBias(64.0)
    x = np.random.default_rng(0).normal(size=(2, 3)).astype("float32")
    layer.build(x.shape)
    layer.bias.assign([0.5, -1.0, 2.0])
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer(x)), x + np.float32([0.5, -1.0, 2.0]))


def test_trainable_bn_scale_when_not_frozen():
    model = fast_resnet((8, 8, 1), 3, widths=(4,), residual_stages=(), freeze_bn_scale=False)
    assert any(w.path.endswith("gamma") for w in model.trainable_weights)


def test_a_1x1_image_gets_the_centre_of_the_3x3_kernel_it_would_have_had():
    # 28x28 -> stem 14 -> 7 -> 3 -> 1: the last stage's residual convolutions see 1x1 images.
    model = fast_resnet((28, 28, 1), 10, widths=(8, 16, 32), residual_stages=(2,))
    convs = [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)]
    sizes = [tuple(layer.input.shape[1:3]) for layer in convs]
    assert [layer.kernel_size for layer, size in zip(convs, sizes) if size == (1, 1)] == [(1, 1), (1, 1)]
    assert all(layer.kernel_size == (3, 3) for layer, size in zip(convs, sizes) if size not in ((1, 1), (28, 28)))
    one = convs[-1]
    x = np.random.default_rng(0).normal(size=(4, 1, 1, 32)).astype("float32")
    # Oracle: a 3x3 "same" convolution with this centre and any other taps, on the 1x1 image.
    three = keras.layers.Conv2D(32, 3, padding="same", use_bias=False)
    three.build(x.shape)
    kernel = np.random.default_rng(1).normal(size=(3, 3, 32, 32)).astype("float32")
    kernel[1, 1] = keras.ops.convert_to_numpy(one.kernel)[0, 0]
    three.set_weights([kernel])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(one(x)), keras.ops.convert_to_numpy(three(x)),
                               rtol=1e-5, atol=1e-5)
    # Its initial values are the centre of the 3x3 kernel that the same initializer draws.
    for base in ("glorot_uniform", PartialIdentity()):
        keras.utils.set_random_seed(3)
        centre = keras.ops.convert_to_numpy(CentreTap(base)((1, 1, 32, 16)))
        keras.utils.set_random_seed(3)
        full = keras.ops.convert_to_numpy(keras.initializers.get(base)((3, 3, 32, 16)))
        np.testing.assert_array_equal(centre, full[1:2, 1:2])


def test_saved_model_round_trips_in_safe_mode(tmp_path):
    images = _correlated_images(rows=4)
    model = fast_resnet((8, 8, 1), 3, widths=(4, 6), residual_stages=(0, 1), whitening=patch_whitening(images),
                        bias_lr_multiplier=4.0)  # stage 1's residual convolutions see 1x1 images
    model.save(tmp_path / "m.keras")
    restored = keras.saving.load_model(tmp_path / "m.keras", safe_mode=True)
    np.testing.assert_allclose(restored.predict(images, verbose=0), model.predict(images, verbose=0), rtol=1e-6)
    assert not restored.get_layer("whitening").trainable


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(widths=()), r"`widths` must be a non-empty tuple of positive ints. Received: widths=\(\)"),
        (dict(residual_stages=(3,)), r"`residual_stages` must hold stage indices below len\(widths\)=3"),
        (dict(whitening=(np.zeros((3, 3, 1, 18)), np.zeros(18))), r"`whitening` must be \(kernel, bias\)"),
    ],
)
def test_bad_architecture_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        fast_resnet((8, 8, 1), 3, **kwargs)


def test_patch_whitening_rejects_flat_images():
    with pytest.raises(ValueError, match=r"`images` must have shape \(N, H, W, C\). Received: images.shape=\(4, 8, 8\)"):
        patch_whitening(np.zeros((4, 8, 8)))
