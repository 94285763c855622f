"""Offline Fashion-MNIST loading."""

import gzip

import numpy as np
import pytest

from kadapt import datasets


def _write_idx(path, array):
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(
        int(d).to_bytes(4, "big") for d in array.shape
    )
    with gzip.open(path, "wb") as stream:
        stream.write(header + array.astype(np.uint8).tobytes())


@pytest.fixture
def tiny_fashion_mnist(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {
        "train-images-idx3-ubyte.gz": rng.integers(0, 256, (6, 28, 28)),
        "train-labels-idx1-ubyte.gz": rng.integers(0, 10, 6),
        "t10k-images-idx3-ubyte.gz": rng.integers(0, 256, (2, 28, 28)),
        "t10k-labels-idx1-ubyte.gz": rng.integers(0, 10, 2),
    }
    for name, array in arrays.items():
        _write_idx(tmp_path / name, array)
    return tmp_path, arrays


def test_reads_from_kadapt_data_first(tiny_fashion_mnist, monkeypatch):
    folder, arrays = tiny_fashion_mnist
    monkeypatch.setenv("KADAPT_DATA", str(folder))
    (x_train, y_train), (x_test, y_test) = datasets.fashion_mnist(download=False)
    np.testing.assert_array_equal(x_train, arrays["train-images-idx3-ubyte.gz"])
    np.testing.assert_array_equal(y_test, arrays["t10k-labels-idx1-ubyte.gz"])
    assert x_train.dtype == np.uint8 and x_test.shape == (2, 28, 28)
    assert y_train.shape == (6,)


def test_missing_everywhere_lists_the_places_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("KADAPT_DATA", str(tmp_path / "empty"))
    monkeypatch.setattr(datasets, "DEBIAN_FASHION_MNIST", tmp_path / "debian")
    monkeypatch.setattr(datasets, "KERAS_CACHE_FASHION_MNIST", tmp_path / "cache")
    with pytest.raises(FileNotFoundError, match=r"empty.*debian.*cache.*apt-get install -y dataset-fashion-mnist"):
        datasets.fashion_mnist(download=False)


def test_truncated_file_is_reported(tiny_fashion_mnist, monkeypatch):
    folder, _ = tiny_fashion_mnist
    with gzip.open(folder / "train-labels-idx1-ubyte.gz", "wb") as stream:
        stream.write(bytes([0, 0, 8, 1]) + (99).to_bytes(4, "big") + b"\x01")
    monkeypatch.setenv("KADAPT_DATA", str(folder))
    with pytest.raises(ValueError, match="truncated"):
        datasets.fashion_mnist(download=False)
