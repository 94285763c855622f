"""Offline data sets."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np

_FASHION_FILES = {
    "x_train": "train-images-idx3-ubyte.gz",
    "y_train": "train-labels-idx1-ubyte.gz",
    "x_test": "t10k-images-idx3-ubyte.gz",
    "y_test": "t10k-labels-idx1-ubyte.gz",
}
DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
KERAS_CACHE_FASHION_MNIST = Path("~/.keras/datasets/fashion-mnist").expanduser()


def fashion_mnist(download: bool = True) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Loads Fashion-MNIST as uint8 images (N, 28, 28) and uint8 labels (N,).

    Looks in `$KADAPT_DATA` (a folder holding the four `*-ubyte.gz` files),
    then `/usr/share/datasets/fashion-mnist` (Debian package
    `dataset-fashion-mnist`), then the Keras cache, then — if `download` —
    asks Keras to download it.

    Args:
        download: Bool. Whether to fall back to Keras' download. Defaults to
            `True`.

    Returns:
        `(x_train, y_train), (x_test, y_test)`, as
        `keras.datasets.fashion_mnist.load_data()` returns them.

    Raises:
        FileNotFoundError: if no place has the files.
    """
    places = _candidate_folders()
    for folder in places:
        if all((folder / name).is_file() for name in _FASHION_FILES.values()):
            return _read_folder(folder)
    if download:
        try:
            import keras

            return keras.datasets.fashion_mnist.load_data()
        except Exception as error:  # noqa: BLE001 - reported below with the places.
            places.append(f"Keras download ({type(error).__name__}: {error})")
    raise FileNotFoundError(
        "Fashion-MNIST was not found. Looked in: "
        + "; ".join(str(p) for p in places)
        + ". Install it with `apt-get install -y dataset-fashion-mnist`, or "
        "set KADAPT_DATA to a folder holding "
        + ", ".join(_FASHION_FILES.values())
    )


def _candidate_folders():
    folders = []
    if os.environ.get("KADAPT_DATA"):
        folders.append(Path(os.environ["KADAPT_DATA"]).expanduser())
    folders += [DEBIAN_FASHION_MNIST, KERAS_CACHE_FASHION_MNIST]
    return folders


def _read_folder(folder):
    arrays = {key: _read_idx(folder / name) for key, name in _FASHION_FILES.items()}
    return (arrays["x_train"], arrays["y_train"]), (arrays["x_test"], arrays["y_test"])


def _read_idx(path):
    """Reads an IDX file (the MNIST format): magic, dims, then uint8 data."""
    with gzip.open(path, "rb") as stream:
        data = stream.read()
    if data[:2] != b"\x00\x00" or data[2] != 0x08:
        raise ValueError(f"{path} is not an IDX file of unsigned bytes.")
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    array = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if array.size != int(np.prod(shape)):
        raise ValueError(f"{path} is truncated: expected {shape}, got {array.size} values.")
    return array.reshape(shape)
