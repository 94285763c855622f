"""A string column of many values (names, shops, codes) reaches the table network as an index into
its training values, which the network embeds (`kadapt.run.encoding.string_vocabularies`,
`kadapt.models.table_mlp`), not one-hot over thousands of inputs. Oracles: NumPy lookups."""

import collections
import csv
import json
import re
import zipfile

import keras
import numpy as np
import pytest

from kadapt import cli
from kadapt.models.table_mlp import network_text
from kadapt.models.table_mlp import table_mlp
from kadapt.run import encoding
from kadapt.run import tables
from kadapt.run.encoding import column_encoder
from kadapt.run.encoding import encode
from kadapt.run.encoding import indexed
from kadapt.run.encoding import statistics
from kadapt.run.encoding import training_rows

pytestmark = pytest.mark.backends("tensorflow", "jax")
SHORT = ["--batch-size", "16", "--memory-budget", "256MiB", "--meta", "off", "--epochs", "1", "--max-steps", "3",
         "--fit-verbose", "0"]


def _shops(rows, seed=0):
    """A column of 30 shops, s00 the commonest, s25..s29 once each; colours of 3 values."""
    rng = np.random.default_rng(seed)
    common = [f"s{i:02d}" for i in rng.zipf(1.5, rows - 5) % 25]
    return np.array(common + [f"s{i}" for i in range(25, 30)], dtype=object)


def test_a_column_of_more_values_than_the_limit_is_an_index_into_its_values_most_frequent_first(monkeypatch):
    monkeypatch.setattr(encoding, "EMBED_ABOVE", 10)
    shops = _shops(300)
    colours = np.array(["red", "green", "blue"] * 100, dtype=object)
    stats = statistics({"shop": shops, "colour": colours, "n": np.arange(300, dtype="float32")})
    counts = collections.Counter(shops.tolist())
    frequent = sorted(counts, key=lambda value: (-counts[value], value))
    assert stats.embedded == ("shop",) and stats.vocabularies["shop"] == frequent
    assert stats.vocabularies["colour"] == ["blue", "green", "red"]  # 3 values: one-hot
    assert stats.embedding_sizes == (31,)
    kinds = {"shop": tables.STRING, "colour": tables.STRING, "n": tables.NUMERIC}
    encoder, _ = column_encoder(stats, kinds)
    later = {"shop": np.array(["s27", "never seen", frequent[0], frequent[1]], dtype=object),
             "colour": np.array(["red"] * 4, dtype=object), "n": np.zeros(4, "float32")}
    (matrix,) = training_rows(stats, kinds, [later])
    expected = [frequent.index("s27") + 1, 0, 1, 2]  # 1 + its place, most frequent first; never seen: 0
    np.testing.assert_array_equal(matrix[:, -1], expected)
    assert matrix.shape[1] == 1 + 4 + 1  # the number, colour one-hot (3 + 1 other), the shop's index last
    # The saved encoder (strings on TensorFlow, indices elsewhere) makes the same matrix.
    given = later if encoding.strings_in_model() else indexed(later, stats.vocabularies)
    np.testing.assert_array_equal(encode(encoder, given), matrix)
    said = encoding.notes(stats, "column {}")
    assert "column shop: 30 distinct values: an embedding, a vector for each, one for a value not seen in " \
           "training" in said
    monkeypatch.setattr(encoding, "EMBED_VALUES", 20)  # a column of more values: its most frequent
    fewer = statistics({"shop": shops})
    assert fewer.vocabularies["shop"] == frequent[:20] and fewer.embedding_sizes == (21,)
    assert "column shop: 30 distinct values: an embedding, a vector for the 20 most frequent, one for a value not " \
           "seen in training" in encoding.notes(fewer, "column {}")
    assert statistics({"shop": shops}, embed=False).embedded == ()  # a user's network: one-hot


def test_the_network_embeds_each_index_column_and_cuts_only_the_numbers():
    rng = np.random.default_rng(0)
    x = np.stack([rng.normal(size=200), rng.integers(0, 40, 200), rng.integers(0, 7, 200)], axis=1).astype("float32")
    model = table_mlp(x, 2, embedding_sizes=(40, 7))
    first, second = (model.get_layer(f"embedding_{i}") for i in (0, 1))
    assert (first.input_dim, first.output_dim, second.input_dim, second.output_dim) == (40, 8, 7, 5)
    assert network_text(model) == ("mlp: its 1 inputs and 16 quantile pieces of the numeric ones (piecewise linear), "
                                   "an embedding of 40 values x 8, an embedding of 7 values x 5")
    vectors = keras.Model(model.input, model.get_layer("embedded_0").output)(x[:5])
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(vectors),
                                  keras.ops.convert_to_numpy(first.embeddings)[x[:5, 1].astype(int)])


@pytest.mark.parametrize("stream", ["off", pytest.param("on", marks=pytest.mark.backends("tensorflow"))])
def test_a_table_with_a_many_valued_column_trains_predicts_and_loads_in_plain_keras(stream, tmp_path, monkeypatch,
                                                                                    capsys):
    monkeypatch.setattr(encoding, "EMBED_ABOVE", 10)
    shops = _shops(240)
    rng = np.random.default_rng(1)
    with open(tmp_path / "t.csv", "w", newline="") as file:
        csv.writer(file).writerows([["shop", "x", "label"], *([shop, f"{v:.3f}", "yes" if v > 0 else "no"]
                                                                for shop, v in zip(shops, rng.normal(size=240)))])
    (tmp_path / "new.csv").write_text("shop,x\ns01,0.5\nnever seen,-1\n,2\n")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "--data", "t.csv", "--target", "label", "--out", "run", "--stream", stream, *SHORT]) == 0
    out = capsys.readouterr().out
    said = re.search(r"column shop: \d+ distinct values: an embedding, a vector for each, one for a value not seen in "
                     r"training", out)
    assert said and re.search(r"network: mlp: .*, an embedding of \d+ values x \d+\n", out)
    data = json.loads((tmp_path / "run" / "config.json").read_text())["resolved"]["data"]
    assert said.group() in data["notes"]
    assert cli.main(["predict", "run", "--data", "new.csv", "--output", "p.csv"]) == 0
    assert (tmp_path / "p.csv").read_text().splitlines()[0] == "class"
    assert set((tmp_path / "p.csv").read_text().splitlines()[1:]) <= {"yes", "no"}
    with zipfile.ZipFile(tmp_path / "run" / "model.keras") as archive:
        assert "kadapt" not in archive.read("config.json").decode()
    model = keras.saving.load_model(tmp_path / "run" / "model.keras", safe_mode=True)
    assert any(isinstance(layer, keras.layers.Embedding) for layer in model.get_layer("mlp").layers)
