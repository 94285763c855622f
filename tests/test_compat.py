"""kadapt reads framework internals only through kadapt/_compat.py, and each name it reads exists here."""

import re
from pathlib import Path

import keras
import pytest

from kadapt import _compat

pytestmark = pytest.mark.backends("tensorflow", "jax")

PACKAGE = Path(__file__).resolve().parents[1] / "kadapt"
PRIVATE_IMPORT = re.compile(r"\b(keras\.src|tensorflow\.python)\b")


def test_every_private_name_kadapt_reads_exists_in_this_installation():
    missing = _compat.missing_private_names()
    assert not missing, (
        f"Private names kadapt/_compat.py reads are gone in Keras {keras.__version__}: {', '.join(missing)}. "
        "Find where this release moved each (or a public API that replaces it), update kadapt/_compat.py, "
        "and state the tested versions in pyproject.toml.")


def test_a_moved_name_is_reported(monkeypatch):
    monkeypatch.setitem(_compat.PRIVATE_NAMES, "keras.src.trainers.compile_utils", ("get_loss", "moved_away"))
    monkeypatch.setitem(_compat.PRIVATE_NAMES, "keras.src.no_such_module", ("anything",))
    assert _compat.missing_private_names() == ["keras.src.trainers.compile_utils.moved_away",
                                               "keras.src.no_such_module.anything"]


def test_no_module_but_compat_names_framework_internals():
    found = [f"{path.relative_to(PACKAGE.parent)}:{number}"
             for path in sorted(PACKAGE.rglob("*.py")) if path.name != "_compat.py"
             for number, line in enumerate(path.read_text().splitlines(), 1) if PRIVATE_IMPORT.search(line)]
    assert not found, f"framework internals outside kadapt/_compat.py (move them there): {found}"


def test_the_mask_reader_reads_what_a_layer_attached():
    embedded = keras.layers.Embedding(5, 2, mask_zero=True)(keras.ops.convert_to_tensor([[0, 3, 1]]))
    assert keras.ops.convert_to_numpy(_compat.get_keras_mask(embedded)).tolist() == [[False, True, True]]
    assert _compat.get_keras_mask(keras.ops.ones((1, 3))) is None
