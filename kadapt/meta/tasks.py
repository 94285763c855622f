"""Small offline training tasks for collecting records and judging adjusters.

A task is a data set, a model and an optimizer with a learning rate drawn
log-uniformly over a wide range, so that tasks start with the rate mis-set in
both directions and some diverge. Families are built only from data that needs
no download (scikit-learn's bundled and generated sets, Fashion-MNIST from the
Debian package). `TRAINING_FAMILIES` feed the default meta-model's records;
`HELD_OUT_FAMILIES` are kept out of them so the adjuster can be judged on
tasks it has never seen.
"""

import dataclasses
import math
import zlib

import keras
import numpy as np

from kadapt import optimizers

TRAINING_FAMILIES = ("digits", "wine", "breast_cancer", "moons", "classification", "diabetes")
HELD_OUT_FAMILIES = ("fashion_mnist", "iris", "circles", "friedman")
LEARNING_RATE_RANGES = {"sgd": (1e-4, 3.0), "adam": (1e-5, 0.3)}


@dataclasses.dataclass
class Task:
    """One training problem: data, a model builder and an optimizer setting.

    Args:
        family: String. The data family, e.g. `"digits"`.
        name: String. A unique, readable id, e.g. `"digits/mlp64/sgd/lr=0.3"`.
        data: Tuple `(x_train, y_train, x_val, y_val)` of arrays.
        regression: Bool. Mean squared error instead of cross-entropy.
        hidden: Tuple of ints. Hidden layer widths of the MLP.
        optimizer: String. `"sgd"` or `"adam"`.
        learning_rate: Float. The initial learning rate.
        momentum: Float. SGD momentum or Adam `beta_1`.
        batch_size: Int. Defaults to `32`.
        seed: Int. Initialization and shuffling seed.
    """

    family: str
    name: str
    data: tuple
    regression: bool
    hidden: tuple
    optimizer: str
    learning_rate: float
    momentum: float
    batch_size: int = 32
    seed: int = 0

    def build(self):
        """A freshly initialized, compiled model for this task."""
        keras.utils.set_random_seed(self.seed)
        x_train, y_train = self.data[0], self.data[1]
        outputs = 1 if self.regression else int(y_train.max()) + 1
        layers = [keras.Input(x_train.shape[1:])]
        layers += [keras.layers.Dense(width, activation="relu") for width in self.hidden]
        model = keras.Sequential(layers + [keras.layers.Dense(outputs)], name="task_mlp")
        model.compile(optimizer=self.make_optimizer(), loss=self.loss(), jit_compile=False)
        # Built now, so snapshots of the optimizer hold the same variables at every step.
        model.optimizer.build(model.trainable_variables)
        return model

    def make_optimizer(self):
        if self.optimizer == "sgd":
            return optimizers.SGD(self.learning_rate, momentum=self.momentum)
        return optimizers.Adam(self.learning_rate, beta_1=self.momentum)

    def loss(self):
        if self.regression:
            return keras.losses.MeanSquaredError()
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def make_task(family, seed, learning_rate=None, optimizer=None):
    """Draws one task of `family`; `seed` fixes everything that is not given."""
    rng = np.random.default_rng([seed, zlib.crc32(family.encode())])
    optimizer = optimizer or str(rng.choice(["sgd", "adam"]))
    low, high = LEARNING_RATE_RANGES[optimizer]
    if learning_rate is None:
        learning_rate = float(math.exp(rng.uniform(math.log(low), math.log(high))))
    momentum = float(rng.choice([0.0, 0.9])) if optimizer == "sgd" else 0.9
    hidden = ((32,), (64,), (64, 32))[int(rng.integers(3))]
    data, regression = load_family(family, seed)
    name = f"{family}/mlp{'-'.join(map(str, hidden))}/{optimizer}/lr={learning_rate:.3g}/seed={seed}"
    return Task(family, name, data, regression, hidden, optimizer, learning_rate, momentum, seed=seed)


def load_family(family, seed):
    """`((x_train, y_train, x_val, y_val), regression)`, standardized, float32."""
    if family not in _LOADERS:
        known = ", ".join(sorted(_LOADERS))
        raise ValueError(f"Argument `family` must be one of {known}. Received: family={family!r}")
    x, y, regression = _LOADERS[family](seed)
    return _split(x, y, regression, seed), regression


def _split(x, y, regression, seed, validation_fraction=0.25):
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order].astype("float32"), y[order]
    cut = int(len(x) * (1 - validation_fraction))
    mean, std = x[:cut].mean(0), x[:cut].std(0) + 1e-6
    x = (x - mean) / std
    if regression:
        y = ((y - y[:cut].mean()) / (y[:cut].std() + 1e-6)).astype("float32")[:, None]
    else:
        y = y.astype("int32")
    return x[:cut], y[:cut], x[cut:], y[cut:]


def _sklearn_bundled(name, regression=False):
    def load(seed):
        from sklearn import datasets

        x, y = getattr(datasets, f"load_{name}")(return_X_y=True)
        return x, y, regression

    return load


def _generated(name, regression=False, **kwargs):
    def load(seed):
        from sklearn import datasets

        x, y = getattr(datasets, f"make_{name}")(random_state=seed, **kwargs)
        return x, y, regression

    return load


def _fashion_mnist(seed, rows=3000):
    from kadapt import datasets

    (x, y), _ = datasets.fashion_mnist(download=False)
    pick = np.random.default_rng(seed).choice(len(x), rows, replace=False)
    return x[pick].reshape(rows, -1) / 255.0, y[pick], False


_LOADERS = {
    "digits": _sklearn_bundled("digits"),
    "wine": _sklearn_bundled("wine"),
    "breast_cancer": _sklearn_bundled("breast_cancer"),
    "diabetes": _sklearn_bundled("diabetes", regression=True),
    "iris": _sklearn_bundled("iris"),
    "moons": _generated("moons", n_samples=1500, noise=0.3),
    "circles": _generated("circles", n_samples=1500, noise=0.15, factor=0.5),
    "classification": _generated("classification", n_samples=2000, n_features=20,
                                  n_informative=8, n_classes=4, n_clusters_per_class=2),
    "friedman": _generated("friedman1", regression=True, n_samples=1500, noise=1.0),
    "fashion_mnist": _fashion_mnist,
}
