"""The data of a run: a named offline set or a user's `.npz` or `.npy` files, as float32 arrays.

Images become (N, height, width, channels) float32; uint8 pixels are scaled
to [0, 1]. `kadapt train` and `kadapt predict` prepare inputs the same way,
here, so a saved model sees at inference what it saw in training.
"""

import dataclasses
import zipfile
from pathlib import Path

import numpy as np

from kadapt.extras import require
from kadapt.run.config import DATA_NAMES
from kadapt.run.errors import UsageError

NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")
# The test rows split off a set that comes without them (digits, `--data x.npy,y.npy`).
TEST_FRACTION = 0.2
NPY_FORMS = "X.npy,Y.npy or X_TRAIN.npy,Y_TRAIN.npy,X_TEST.npy,Y_TEST.npy"


@dataclasses.dataclass(frozen=True)
class TrainingData:
    """Train, validation and test arrays; `y` are integer class labels."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int

    @property
    def input_shape(self):
        return tuple(int(d) for d in self.x_train.shape[1:])

    @property
    def is_image(self):
        return self.x_train.ndim == 4

    def summary(self):
        return {
            "input_shape": list(self.input_shape),
            "num_classes": self.num_classes,
            "train_rows": len(self.x_train),
            "validation_rows": len(self.x_val),
            "test_rows": len(self.x_test),
        }


def load_data(config):
    """The `TrainingData` of a `RunConfig`: its set, rows and validation split."""
    (x_train, y_train), (x_test, y_test) = load_arrays(config.data, config.seed)
    if config.train_rows is not None:
        x_train, y_train = x_train[: config.train_rows], y_train[: config.train_rows]
    # As Keras' `validation_split`: the last rows, before any shuffling.
    validation_rows = int(len(x_train) * config.validation_split)
    cut = len(x_train) - validation_rows
    if cut <= 0:
        raise UsageError(f"--data {config.data} leaves no training rows after the validation split.")
    num_classes = int(max(y_train.max(), y_test.max())) + 1
    return TrainingData(
        x_train[:cut], y_train[:cut], x_train[cut:], y_train[cut:], x_test, y_test, num_classes
    )


def load_arrays(spec: str, seed: int = 0) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """`(x_train, y_train), (x_test, y_test)` of a name, an `.npz` path or
    comma-separated `.npy` paths (`NPY_FORMS`), prepared."""
    if spec == "fashion_mnist":
        train, test = _fashion_mnist()
    elif spec == "digits":
        train, test = _digits(seed)
    elif spec.endswith(".npz"):
        arrays = read_npz(spec, NPZ_KEYS)
        train, test = (arrays["x_train"], arrays["y_train"]), (arrays["x_test"], arrays["y_test"])
    elif is_npy_spec(spec):
        train, test = _npy_arrays(spec, seed)
    else:
        raise UsageError(
            f"--data must be one of {', '.join(DATA_NAMES)} or a .npz file with "
            f"{', '.join(NPZ_KEYS)}, or .npy files {NPY_FORMS}. Received: --data={spec}"
        )
    return _prepared(spec, *train), _prepared(spec, *test)


def is_npy_spec(spec: str) -> bool:
    """Whether `--data` names `.npy` files (comma-separated)."""
    return any(path.endswith(".npy") for path in spec.split(","))


def read_npy(path: str) -> np.ndarray:
    """The array of one `.npy` file (no pickled objects), or a `UsageError`."""
    if not Path(path).is_file():
        raise UsageError(f"--data {path} does not exist.")
    try:
        array = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise UsageError(
            f"--data {path} is not a readable .npy of a numeric array ({_one_line(error)})."
        ) from None
    if not isinstance(array, np.ndarray):  # np.load reads an archive whatever its name
        array.close()
        raise UsageError(f"--data {path} is an .npz archive, not one .npy array: rename it to .npz.")
    return array


def read_npz(path: str, keys: tuple) -> dict:
    """The arrays `keys` of an `.npz` file (no pickled objects), or a `UsageError`."""
    if not Path(path).is_file():
        raise UsageError(f"--data {path} does not exist.")
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as error:
        raise UsageError(
            f"--data {path} is not a readable .npz of numeric arrays ({_one_line(error)})."
        ) from None
    missing = [key for key in keys if key not in arrays]
    if missing:
        raise UsageError(
            f"--data {path} lacks {', '.join(missing)}: it needs {', '.join(keys)} "
            f"(it has: {', '.join(arrays) or 'nothing'})."
        )
    return {key: arrays[key] for key in keys}


def prepare_inputs(spec: str, x: np.ndarray) -> np.ndarray:
    """Float32 inputs: uint8 images scaled to [0, 1], a channel axis added to
    (N, height, width) images."""
    if x.dtype.kind not in "uif":
        raise UsageError(f"--data {spec}: inputs must be numbers. Received dtype {x.dtype}.")
    if x.ndim < 2:
        raise UsageError(f"--data {spec}: inputs need a row axis and features. Received shape {x.shape}.")
    scale = 255.0 if x.dtype == np.uint8 else 1.0
    x = x.astype("float32") / scale
    return x[..., None] if x.ndim == 3 else x


def prepare_labels(spec: str, y: np.ndarray, rows: int) -> np.ndarray:
    """Integer class labels, shape (N,)."""
    y = y.reshape(-1) if y.ndim == 2 and y.shape[1] == 1 else y
    if y.ndim != 1 or y.dtype.kind not in "iu" or len(y) != rows or (len(y) and y.min() < 0):
        raise UsageError(
            f"--data {spec}: labels must be {rows} integer classes >= 0, one per input row. "
            f"Received shape {y.shape}, dtype {y.dtype}."
        )
    return y.astype("int32")


def _prepared(spec, x, y):
    x = prepare_inputs(spec, x)
    return x, prepare_labels(spec, y, len(x))


def _fashion_mnist():
    from kadapt.datasets import fashion_mnist

    try:
        return fashion_mnist()
    except FileNotFoundError as error:
        raise UsageError(_one_line(error)) from None


def _digits(seed):
    """scikit-learn's 8x8 digits (pixels 0..16, scaled to [0, 1]), a seeded 80/20 split."""
    load_digits = require("sklearn.datasets", extra="data").load_digits

    digits = load_digits()
    return _seeded_split((digits.images / 16.0).astype("float32"), digits.target, seed)


def _seeded_split(x, y, seed):
    """`(x_train, y_train), (x_test, y_test)`: a seeded `TEST_FRACTION` of the
    rows, drawn at random because files are often sorted by class."""
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(len(x) * (1 - TEST_FRACTION))
    train, test = order[:cut], order[cut:]
    return (x[train], y[train]), (x[test], y[test])


def _npy_paths(spec, counts):
    """The paths of `--data X.npy,Y.npy[,...]`, `len` in `counts`."""
    paths = spec.split(",")
    if len(paths) not in counts or not all(path.endswith(".npy") for path in paths):
        raise UsageError(f"--data takes {' or '.join(map(str, counts))} .npy files separated by commas, "
                         f"{NPY_FORMS}. Received: --data={spec}")
    return paths


def _npy_arrays(spec, seed):
    """Train and test arrays of 4 files, or of 2 with the test rows split off."""
    arrays = [read_npy(path) for path in _npy_paths(spec, (2, 4))]
    if len(arrays) == 4:
        return tuple(arrays[:2]), tuple(arrays[2:])
    # Checked before the split, which would cut a label file of other rows into a plausible
    # shape; `load_arrays` prepares them again, which leaves prepared arrays as they are.
    x = prepare_inputs(spec, arrays[0])
    return _seeded_split(x, prepare_labels(spec, arrays[1], len(x)), seed)


def _one_line(error):
    return " ".join(str(error).split())


def load_inputs(spec: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray | None]:
    """Rows to predict and their labels (`None` when the file has none): the
    test split of a named set or of four `.npy` files, `x_test`/`y_test`
    (else `x`/`y`) of an `.npz`, or every row of `X.npy[,Y.npy]`."""
    if is_npy_spec(spec) and len(spec.split(",")) < 4:
        return _npy_inputs(spec)
    if not spec.endswith(".npz"):
        _, (x, y) = load_arrays(spec, seed)
        return x, y
    with_keys = _npz_keys(spec)
    x_key = "x_test" if "x_test" in with_keys else "x"
    y_key = "y_test" if x_key == "x_test" else "y"
    keys = (x_key, y_key) if y_key in with_keys else (x_key,)
    arrays = read_npz(spec, keys)
    x = prepare_inputs(spec, arrays[x_key])
    y = prepare_labels(spec, arrays[y_key], len(x)) if y_key in arrays else None
    return x, y


def _npz_keys(path):
    if not Path(path).is_file():
        raise UsageError(f"--data {path} does not exist.")
    try:
        with np.load(path, allow_pickle=False) as archive:
            return set(archive.files)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as error:
        raise UsageError(f"--data {path} is not a readable .npz ({_one_line(error)}).") from None


def _npy_inputs(spec):
    arrays = [read_npy(path) for path in _npy_paths(spec, (1, 2, 4))]
    x = prepare_inputs(spec, arrays[0])
    return x, prepare_labels(spec, arrays[1], len(x)) if len(arrays) == 2 else None
