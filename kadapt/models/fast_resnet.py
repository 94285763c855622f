"""`fast_resnet`: a small residual network with the switches the speed records use.

The CIFAR-10 speed records (Page's ResNet-9, airbench) get their time from a
few changes to a plain conv-BN-activation network, each a switch here:

- `whitening`: a frozen first convolution whose filters whiten the image's
  patches (`patch_whitening`), so the first trainable layer sees decorrelated,
  unit-variance inputs.
- `identity_init`: convolutions start as the identity on their first input
  channels (`PartialIdentity`), so a deep stack starts as a shallow one.
- `freeze_bn_scale` and `bias_lr_multiplier`: batch normalization keeps its
  scale at 1 and its bias learns `bias_lr_multiplier` times faster
  (`ScaledGradientBias`).

Label smoothing, weight averaging and test-time augmentation are training
and inference choices, made in `kadapt.recipes`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
from keras import ops

from kadapt.validation import check_range


@keras.saving.register_keras_serializable(package="kadapt")
class PartialIdentity(keras.initializers.Initializer):
    """Conv kernel initializer: the identity on the first input channels.

    For a kernel of shape `(kh, kw, in, out)`, output channel j < min(in, out)
    copies input channel j (a 1 at the kernel's centre, 0 elsewhere, the
    "Dirac" init); the other output channels come from `base`. A stack of such
    convolutions starts close to the identity map, which trains faster.

    Args:
        base: String or initializer config. Initializer of the remaining
            output channels. Defaults to `"glorot_uniform"`.

    Example:

    ```python
    conv = keras.layers.Conv2D(32, 3, padding="same",
                               kernel_initializer=kadapt.models.PartialIdentity())
    ```
    """

    def __init__(self, base: str | keras.initializers.Initializer = "glorot_uniform") -> None:
        keras.initializers.get(base)
        self.base = base

    def __call__(self, shape: Sequence[int], dtype: Any = None) -> Any:
        if len(shape) != 4:
            raise ValueError(
                "`PartialIdentity` initializes 2D conv kernels of shape (kh, kw, in, out). "
                f"Received: shape={tuple(shape)}"
            )
        height, width, inputs, outputs = shape
        identity = np.zeros(shape, "float32")
        channels = np.arange(min(inputs, outputs))
        identity[height // 2, width // 2, channels, channels] = 1.0
        is_identity = np.zeros(shape, bool)
        is_identity[..., channels] = True
        random = keras.initializers.get(self.base)(shape, dtype=dtype)
        return ops.where(is_identity, ops.cast(identity, random.dtype), random)

    def get_config(self) -> dict[str, Any]:
        return {"base": self.base}


@keras.saving.register_keras_serializable(package="kadapt")
class CentreTap(keras.initializers.Initializer):
    """1x1 conv kernel initializer: the centre of the 3x3 kernel that `base` draws.

    The kernel of a 1x1 convolution that computes what a 3x3 "same"
    convolution computes on a 1x1 image, with the initial values the 3x3
    kernel would have had (its fan-in counts 9 taps per input channel).

    Args:
        base: String, initializer or initializer config, for the 3x3 kernel.
            Defaults to `"glorot_uniform"`.
    """

    def __init__(self, base: str | keras.initializers.Initializer = "glorot_uniform") -> None:
        self.base = keras.initializers.get(base)

    def __call__(self, shape: Sequence[int], dtype: Any = None) -> Any:
        if len(shape) != 4 or tuple(shape[:2]) != (1, 1):
            raise ValueError(f"`CentreTap` initializes 1x1 conv kernels. Received: shape={tuple(shape)}")
        return self.base((3, 3, *shape[2:]), dtype=dtype)[1:2, 1:2]

    def get_config(self) -> dict[str, Any]:
        return {"base": keras.initializers.serialize(self.base)}


@keras.saving.register_keras_serializable(package="kadapt")
class ScaledGradientBias(keras.layers.Layer):
    """Adds a per-channel bias whose gradient is multiplied by `gradient_scale`.

    The forward pass is `inputs + bias`, exactly. The backward pass hands the
    optimizer `gradient_scale * dL/dbias`, so with (momentum) SGD the bias
    moves as if its learning rate were `gradient_scale` times the others'.
    This works with any optimizer and with kadapt's accumulation, because
    it changes the gradient, not the optimizer; Adam-family optimizers
    normalize gradient magnitudes away, so there it changes little. Decoupled
    weight decay (w -= lr * weight_decay * w) is not scaled.

    Args:
        gradient_scale: Positive float. Multiplies the bias's gradient.
            Defaults to `1.0`.
        **kwargs: Passed to `keras.layers.Layer`.

    Example:

    ```python
    x = keras.layers.BatchNormalization(center=False, scale=False)(x)
    x = kadapt.models.ScaledGradientBias(64.0)(x)
    ```
    """

    def __init__(self, gradient_scale: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        check_range("gradient_scale", gradient_scale, low=0.0, low_open=True)
        self.gradient_scale = float(gradient_scale)

    def build(self, input_shape: Sequence[int | None]) -> None:
        self.bias = self.add_weight(shape=(input_shape[-1],), initializer="zeros", name="bias")

    def call(self, inputs: Any) -> Any:
        # A tensor read of the variable: `custom_gradient` must not see the variable itself.
        bias = ops.cast(self.bias, self.compute_dtype)
        return inputs + _scale_gradient(bias, self.gradient_scale)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "gradient_scale": self.gradient_scale}


def _scale_gradient(value, scale):
    @ops.custom_gradient
    def identity(x):
        def gradient(*args, upstream=None):
            if upstream is None:
                (upstream,) = args
            return upstream * scale

        return x * 1, gradient

    return identity(value)


def patch_whitening(images: np.ndarray, patch_size: int = 2, epsilon: float = 5e-4,
                    include_negatives: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Kernel and bias of a conv layer that whitens `patch_size` patches.

    With Σ = V diag(λ) Vᵀ the covariance and μ the mean of all
    `patch_size` x `patch_size` patches of `images`, the filters are the
    columns of W = V diag(λ + epsilon)^(-1/2) (PCA whitening) and the bias is
    -μW, so the layer maps a patch p to (p - μ)W, whose covariance is
    diag(λ / (λ + epsilon)) ≈ I. With `include_negatives` the filters -W
    follow W, so a ReLU/GELU after the layer keeps both signs (airbench).

    Args:
        images: Float array (N, H, W, C), scaled as the model will see them.
            A few thousand images are enough.
        patch_size: Positive int. Patch height and width. Defaults to `2`.
        epsilon: Non-negative float. Added to the eigenvalues; limits the gain
            on directions with almost no variance. Defaults to `5e-4`.
        include_negatives: Bool. Also return -W. Defaults to `True`.

    Returns:
        `(kernel, bias)`: arrays of shapes (patch_size, patch_size, C, F) and
        (F,), F = patch_size² · C, doubled with `include_negatives`.

    Example:

    ```python
    kernel, bias = kadapt.models.patch_whitening(x_train[:5000], patch_size=2)
    model = kadapt.models.fast_resnet((28, 28, 1), 10, whitening=(kernel, bias))
    ```
    """
    images = np.asarray(images, "float64")
    if images.ndim != 4:
        raise ValueError(
            f"Argument `images` must have shape (N, H, W, C). Received: images.shape={images.shape}"
        )
    check_range("patch_size", patch_size, low=1, high=min(images.shape[1:3]), integer=True)
    check_range("epsilon", epsilon, low=0.0)
    patches = image_patches(images, patch_size)
    mean = patches.mean(axis=0)
    eigenvalues, eigenvectors = np.linalg.eigh(np.cov(patches, rowvar=False))
    filters = eigenvectors / np.sqrt(np.maximum(eigenvalues, 0.0) + epsilon)
    if include_negatives:
        filters = np.concatenate([filters, -filters], axis=1)
    kernel = filters.reshape(patch_size, patch_size, images.shape[-1], -1)
    return kernel.astype("float32"), (-mean @ filters).astype("float32")


def image_patches(images: np.ndarray, patch_size: int) -> np.ndarray:
    """All `patch_size` x `patch_size` patches (stride 1) of `images` (N, H, W, C),
    flattened in conv-kernel order (row, column, channel): shape (P, patch_size² · C)."""
    windows = np.lib.stride_tricks.sliding_window_view(images, (patch_size, patch_size), axis=(1, 2))
    windows = np.moveaxis(windows, 3, -1)
    return windows.reshape(-1, patch_size * patch_size * images.shape[-1])


def fast_resnet(input_shape: tuple[int, int, int] = (28, 28, 1), num_classes: int = 10,
                widths: Sequence[int] = (64, 128, 256), residual_stages: Sequence[int] = (0, 2), *,
                whitening: tuple[np.ndarray, np.ndarray] | None = None, identity_init: bool = True,
                freeze_bn_scale: bool = True, bias_lr_multiplier: float = 1.0,
                name: str = "fast_resnet") -> keras.Model:
    """A ResNet-9-style network of conv-BN-activation combination layers.

    Stem: a 2x2 stride-2 convolution (`whitening`'s frozen filters, or a
    trainable conv-BN-ReLU with as many filters) that halves the resolution
    losslessly. Then one stage per width: a combination layer with 2x2 max
    pooling (conv -> pool -> BN -> ReLU, pooling before BN halves its cost),
    followed, for stages in `residual_stages`, by a residual module
    x + f(f(x)) of two combination layers. Head: global max pooling, a
    dense layer without bias, logits scaled by 1/8 (as ResNet-9).

    Args:
        input_shape: Tuple (H, W, C). Images scaled as for `whitening`.
            Defaults to `(28, 28, 1)`.
        num_classes: Int. Output logits. Defaults to `10`.
        widths: Tuple of ints. Filters per stage. Defaults to `(64, 128, 256)`.
        residual_stages: Tuple of stage indices with a residual module.
            Defaults to `(0, 2)`.
        whitening: `(kernel, bias)` from `patch_whitening` with a 2x2 kernel,
            or `None` for a trainable stem. Defaults to `None`.
        identity_init: Bool. Initialize 3x3 convs with `PartialIdentity`.
            Defaults to `True`.
        freeze_bn_scale: Bool. Batch normalization without a trainable scale
            (fixed at 1). Defaults to `True`.
        bias_lr_multiplier: Positive float. Gradient multiplier of the
            batch-normalization biases (`ScaledGradientBias`). Defaults to `1.0`.
        name: String. Defaults to `"fast_resnet"`.

    Returns:
        A functional `keras.Model` mapping images to logits.

    Example:

    ```python
    model = kadapt.models.fast_resnet((28, 28, 1), 10, widths=(32, 64, 128))
    ```
    """
    _check_architecture(num_classes, widths, residual_stages, whitening)
    settings = dict(identity_init=identity_init, freeze_bn_scale=freeze_bn_scale,
                    bias_lr_multiplier=bias_lr_multiplier)
    inputs = keras.Input(input_shape)
    x = _stem(inputs, whitening, settings)
    for stage, width in enumerate(widths):
        x = _combination(x, width, pool=True, **settings)
        if stage in residual_stages:
            shortcut = x
            x = _combination(x, width, **settings)
            x = keras.layers.Add()([shortcut, _combination(x, width, **settings)])
    x = keras.layers.GlobalMaxPooling2D()(x)
    x = keras.layers.Dense(num_classes, use_bias=False)(x)
    outputs = keras.layers.Rescaling(0.125, name="logits")(x)
    return keras.Model(inputs, outputs, name=name)


def _check_architecture(num_classes, widths, residual_stages, whitening):
    check_range("num_classes", num_classes, low=2, integer=True)
    if not widths or not all(isinstance(w, int) and w > 0 for w in widths):
        raise ValueError(f"Argument `widths` must be a non-empty tuple of positive ints. Received: widths={widths!r}")
    if any(stage not in range(len(widths)) for stage in residual_stages):
        raise ValueError(
            f"Argument `residual_stages` must hold stage indices below len(widths)={len(widths)}. "
            f"Received: residual_stages={residual_stages!r}"
        )
    if whitening is not None and np.shape(whitening[0])[:2] != (2, 2):
        raise ValueError(
            "Argument `whitening` must be (kernel, bias) from `patch_whitening(images, patch_size=2)`. "
            f"Received: kernel shape {np.shape(whitening[0])}"
        )


def _stem(inputs, whitening, settings):
    if whitening is None:
        filters = 8 * inputs.shape[-1]
        x = keras.layers.Conv2D(filters, 2, strides=2, use_bias=False)(inputs)
        return _normalize_and_activate(x, settings["freeze_bn_scale"], settings["bias_lr_multiplier"])
    kernel, bias = whitening
    layer = keras.layers.Conv2D(kernel.shape[-1], 2, strides=2, trainable=False, name="whitening")
    x = layer(inputs)
    layer.set_weights([kernel, bias])
    return keras.layers.ReLU()(x)


def _combination(x, filters, pool=False, *, identity_init, freeze_bn_scale, bias_lr_multiplier):
    initializer = PartialIdentity() if identity_init else "glorot_uniform"
    if tuple(x.shape[1:3]) == (1, 1):
        # A 3x3 "same" convolution of a 1x1 image sees only its kernel's centre (the rest
        # multiplies the zero padding): a 1x1 convolution with that centre computes the same
        # with a ninth of the work, from the same initial values.
        x = keras.layers.Conv2D(filters, 1, use_bias=False, kernel_initializer=CentreTap(initializer))(x)
    else:
        x = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False, kernel_initializer=initializer)(x)
    if pool:
        x = keras.layers.MaxPooling2D()(x)
    return _normalize_and_activate(x, freeze_bn_scale, bias_lr_multiplier)


def _normalize_and_activate(x, freeze_bn_scale, bias_lr_multiplier):
    x = keras.layers.BatchNormalization(momentum=0.9, center=False, scale=not freeze_bn_scale)(x)
    x = ScaledGradientBias(bias_lr_multiplier)(x)
    return keras.layers.ReLU()(x)
