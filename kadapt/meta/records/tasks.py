"""Small offline training tasks for collecting records and judging adjusters.

A task is a data set, a model and an optimizer with a learning rate drawn
log-uniformly over a wide range, so that tasks start with the rate mis-set in
both directions and some diverge; the rate is constant or the peak of a
cosine or triangular schedule over the task's budget. The families cover what
users train: MLPs on tables (classification and regression), small conv nets
on images, recurrent nets on sequences and autoencoders (reconstruction).
Families are built only from data that needs no download (scikit-learn's
bundled and generated sets, Fashion-MNIST from the Debian package, sequences
generated here). `TRAINING_FAMILIES` feed the default meta-model's records;
`HELD_OUT_FAMILIES` are kept out of them so the adjuster can be judged on
tasks it has never seen.
"""

from __future__ import annotations

import dataclasses
import math
import zlib

import keras
import numpy as np

from kadapt import optimizers
from kadapt.extras import require
from kadapt.schedules import CosineAnnealing
from kadapt.schedules import PiecewiseLinear

TRAINING_FAMILIES = ("digits", "wine", "breast_cancer", "moons", "classification", "diabetes",
                     "digits_conv", "waves", "digits_autoencoder")
HELD_OUT_FAMILIES = ("fashion_mnist", "iris", "circles", "friedman", "fashion_conv", "adding",
                     "fashion_autoencoder")
LEARNING_RATE_RANGES = {"sgd": (1e-4, 3.0), "adam": (1e-5, 0.3)}
SCHEDULES = ("constant", "cosine", "triangular")
LOSSES = ("classification", "regression", "reconstruction")
ARCHITECTURES = ("mlp", "conv", "rnn", "autoencoder")


@dataclasses.dataclass
class Task:
    """One training problem: data, a model builder and an optimizer setting.

    Args:
        family: String. The data family, e.g. `"digits"`.
        name: String. A unique, readable id, e.g. `"digits/mlp64/sgd/cosine/lr=0.3/seed=0"`.
        data: Tuple `(x_train, y_train, x_val, y_val)` of arrays.
        loss: String. `"classification"` (cross-entropy), `"regression"` or
            `"reconstruction"` (mean squared error; `y` is `x`).
        architecture: String. `"mlp"`, `"conv"`, `"rnn"` or `"autoencoder"`.
        hidden: Tuple of ints. Layer widths (MLP, autoencoder), filters
            (conv) or units (rnn).
        optimizer: String. `"sgd"` or `"adam"`.
        learning_rate: Float. The constant rate, or the schedule's peak.
        momentum: Float. SGD momentum or Adam `beta_1`.
        schedule: String. `"constant"`, `"cosine"` (from the peak to 0) or
            `"triangular"` (a linear rise over the first fifth to the peak,
            then down to 0). Defaults to `"constant"`.
        batch_size: Int. Defaults to `32`.
        seed: Int. Initialization and shuffling seed.
    """

    family: str
    name: str
    data: tuple
    loss: str
    architecture: str
    hidden: tuple
    optimizer: str
    learning_rate: float
    momentum: float
    schedule: str = "constant"
    batch_size: int = 32
    seed: int = 0

    @property
    def regression(self) -> bool:
        return self.loss != "classification"

    def build(self, total_steps: int | None = None) -> keras.Model:
        """A freshly initialized, compiled model; a schedule spans `total_steps`."""
        keras.utils.set_random_seed(self.seed)
        model = keras.Sequential(_layers(self), name=f"task_{self.architecture}")
        model.compile(optimizer=self.make_optimizer(total_steps), loss=self.make_loss(), jit_compile=False)
        # Built now, so snapshots of the optimizer hold the same variables at every step.
        model.optimizer.build(model.trainable_variables)
        return model

    def learning_rate_schedule(
            self, total_steps: int | None = None) -> float | keras.optimizers.schedules.LearningRateSchedule:
        """The float rate, or the schedule over `total_steps` peaking at `learning_rate`."""
        if self.schedule == "constant":
            return self.learning_rate
        if not total_steps:
            raise ValueError(f"Task {self.name} has a {self.schedule} schedule: pass `total_steps` to build().")
        if self.schedule == "cosine":
            return CosineAnnealing(self.learning_rate, 0.0, total_steps)
        rise = max(total_steps // 5, 1)
        return PiecewiseLinear([0, rise, total_steps], [0.1 * self.learning_rate, self.learning_rate, 0.0])

    def make_optimizer(self, total_steps: int | None = None) -> keras.optimizers.Optimizer:
        rate = self.learning_rate_schedule(total_steps)
        if self.optimizer == "sgd":
            return optimizers.SGD(rate, momentum=self.momentum)
        return optimizers.Adam(rate, beta_1=self.momentum)

    def make_loss(self) -> keras.losses.Loss:
        if self.regression:
            return keras.losses.MeanSquaredError()
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _layers(task):
    x_train, y_train = task.data[0], task.data[1]
    outputs = int(y_train.max()) + 1 if task.loss == "classification" else int(np.prod(y_train.shape[1:]))
    layers = [keras.Input(x_train.shape[1:])]
    if task.architecture == "conv":
        first, second = task.hidden
        layers += [keras.layers.Conv2D(first, 3, padding="same", activation="relu"), keras.layers.MaxPooling2D(),
                   keras.layers.Conv2D(second, 3, padding="same", activation="relu"),
                   keras.layers.GlobalAveragePooling2D()]
    elif task.architecture == "rnn":
        layers += [keras.layers.GRU(task.hidden[0])]
    else:  # an MLP; an autoencoder is an MLP through a narrow middle back to the input's size
        layers += [keras.layers.Dense(width, activation="relu") for width in task.hidden]
    return layers + [keras.layers.Dense(outputs)]


_ARCHITECTURE_CHOICES = {  # hidden widths, filters or units a task draws from
    "mlp": ((32,), (64,), (64, 32)),
    "conv": ((8, 16), (16, 32)),
    "rnn": ((16,), (32,)),
    "autoencoder": ((64, 8, 64), (64, 16, 64), (128, 32, 128)),
}


def make_task(family: str, seed: int, learning_rate: float | None = None, optimizer: str | None = None,
              schedule: str | None = None) -> Task:
    """Draws one task of `family`; `seed` fixes everything that is not given."""
    rng = np.random.default_rng([seed, zlib.crc32(family.encode())])
    optimizer = optimizer or str(rng.choice(["sgd", "adam"]))
    low, high = LEARNING_RATE_RANGES[optimizer]
    if learning_rate is None:
        learning_rate = float(math.exp(rng.uniform(math.log(low), math.log(high))))
    momentum = float(rng.choice([0.0, 0.9])) if optimizer == "sgd" else 0.9
    drawn_schedule = str(rng.choice(SCHEDULES))
    schedule = schedule or drawn_schedule
    if schedule not in SCHEDULES:
        raise ValueError(f"Argument `schedule` must be one of {SCHEDULES}. Received: schedule={schedule!r}")
    data, loss, architecture = load_family(family, seed)
    choices = _ARCHITECTURE_CHOICES[architecture]
    hidden = choices[int(rng.integers(len(choices)))]
    name = (f"{family}/{architecture}{'-'.join(map(str, hidden))}/{optimizer}/{schedule}/"
            f"lr={learning_rate:.3g}/seed={seed}")
    return Task(family, name, data, loss, architecture, hidden, optimizer, learning_rate, momentum,
                schedule, seed=seed)


def load_family(family: str, seed: int) -> tuple[tuple[np.ndarray, ...], str, str]:
    """`((x_train, y_train, x_val, y_val), loss, architecture)`, standardized, float32."""
    if family not in _LOADERS:
        known = ", ".join(sorted(_LOADERS))
        raise ValueError(f"Argument `family` must be one of {known}. Received: family={family!r}")
    load, loss, architecture = _LOADERS[family]
    x, y = load(seed)
    return _split(x, y, loss, seed), loss, architecture


def _split(x, y, loss, seed, validation_fraction=0.25):
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order].astype("float32"), y[order]
    cut = int(len(x) * (1 - validation_fraction))
    mean, std = x[:cut].mean(0), x[:cut].std(0) + 1e-6
    x = (x - mean) / std
    if loss == "reconstruction":
        y = x
    elif loss == "regression":
        y = ((y - y[:cut].mean()) / (y[:cut].std() + 1e-6)).astype("float32")[:, None]
    else:
        y = y.astype("int32")
    return x[:cut], y[:cut], x[cut:], y[cut:]


def _sklearn_bundled(name, images=False):
    def load(seed):
        datasets = require("sklearn.datasets", extra="data")
        x, y = getattr(datasets, f"load_{name}")(return_X_y=True)
        return (x.reshape(-1, 8, 8, 1) if images else x), y

    return load


def _generated(name, **kwargs):
    def load(seed):
        datasets = require("sklearn.datasets", extra="data")
        return getattr(datasets, f"make_{name}")(random_state=seed, **kwargs)

    return load


def _fashion_mnist(rows, images):
    def load(seed):
        from kadapt import datasets

        (x, y), _ = datasets.fashion_mnist(download=False)
        pick = np.random.default_rng(seed).choice(len(x), rows, replace=False)
        x = x[pick].astype("float32") / 255.0
        if not images:
            return x.reshape(rows, -1), y[pick]
        small = x.reshape(rows, 14, 2, 14, 2).mean((2, 4))  # 14 x 14: a conv step stays cheap
        return small[..., None], y[pick]

    return load


def _fashion_small_flat(seed):
    x, y = _fashion_mnist(2000, images=True)(seed)
    return x.reshape(len(x), -1), y


def _waves(seed, rows=1200, length=24):
    """Which of four frequencies a noisy sine wave has, from its samples."""
    rng = np.random.default_rng(seed)
    label = rng.integers(4, size=rows)
    t = np.arange(length)
    phase = rng.uniform(0, 2 * np.pi, (rows, 1))
    x = np.sin(2 * np.pi * (0.05 + 0.05 * label[:, None]) * t + phase) + rng.normal(0, 0.4, (rows, length))
    return x[..., None], label


def _adding(seed, rows=1500, length=20):
    """The adding problem: the sum of the two values whose marker is 1."""
    rng = np.random.default_rng(seed)
    values = rng.uniform(0, 1, (rows, length))
    marks = np.zeros((rows, length))
    for row in range(rows):
        marks[row, rng.choice(length, 2, replace=False)] = 1.0
    return np.stack([values, marks], -1), (values * marks).sum(1)


_LOADERS = {  # family: (loader, loss, architecture)
    "digits": (_sklearn_bundled("digits"), "classification", "mlp"),
    "wine": (_sklearn_bundled("wine"), "classification", "mlp"),
    "breast_cancer": (_sklearn_bundled("breast_cancer"), "classification", "mlp"),
    "diabetes": (_sklearn_bundled("diabetes"), "regression", "mlp"),
    "iris": (_sklearn_bundled("iris"), "classification", "mlp"),
    "moons": (_generated("moons", n_samples=1500, noise=0.3), "classification", "mlp"),
    "circles": (_generated("circles", n_samples=1500, noise=0.15, factor=0.5), "classification", "mlp"),
    "classification": (_generated("classification", n_samples=2000, n_features=20, n_informative=8,
                                  n_classes=4, n_clusters_per_class=2), "classification", "mlp"),
    "friedman": (_generated("friedman1", n_samples=1500, noise=1.0), "regression", "mlp"),
    "fashion_mnist": (_fashion_mnist(3000, images=False), "classification", "mlp"),
    "digits_conv": (_sklearn_bundled("digits", images=True), "classification", "conv"),
    "fashion_conv": (_fashion_mnist(2000, images=True), "classification", "conv"),
    "waves": (_waves, "classification", "rnn"),
    "adding": (_adding, "regression", "rnn"),
    "digits_autoencoder": (_sklearn_bundled("digits"), "reconstruction", "autoencoder"),
    "fashion_autoencoder": (_fashion_small_flat, "reconstruction", "autoencoder"),
}
