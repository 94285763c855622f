"""A table larger than memory (`kadapt.run.table_stream`, `kadapt.recipes.disk_rows`): read in
batches, statistics from a first pass, encoded rows on disk, training a window of blocks at a time.

The oracle for the encoding is NumPy on the whole file (the median, the mean and variance of
the filled column, the one-hot categories), for the stream its rows counted; the command line
trains, reports and predicts a table streamed because it is "too large" (the memory rule's
factor raised), and its predictions equal those of the rows read whole."""

import csv
import json

import numpy as np
import pytest

from kadapt import cli
from kadapt.recipes import training
from kadapt.recipes.config import FastFitConfig
from kadapt.recipes.disk_rows import RowStore
from kadapt.recipes.task import RegressionSums
from kadapt.recipes.task import Task
from kadapt.run import RunConfig
from kadapt.run import UsageError
from kadapt.run import table_stream
from kadapt.run.data import TEST_FRACTION
from kadapt.run.data import load_data

COLOURS = ["red", "green", "blue", "", "teal"]


def write_csv(path, rows, seed=0):
    """`rows` rows: a whole-number column that turns fractional, then textual, past the first
    blocks (pyarrow infers a CSV's types from its first block), empty cells, a colour, a 0/1 label."""
    rng = np.random.default_rng(seed)
    with open(path, "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["size", "code", "colour", "new", "label"])
        for i in range(rows):
            size = rng.normal(10, 3)
            code = str(i % 7) if i < rows // 2 else (f"{i % 7}.5" if i < 3 * rows // 4 else f"c{i % 5}")
            colour = COLOURS[int(rng.integers(0, len(COLOURS)))]
            new = ["yes", "No", "", "YES", "no", "no"][i % 6]
            label = int(size + (2 if colour == "red" else 0) + rng.normal() > 11)
            writer.writerow(["" if i % 9 == 0 else f"{size:.3f}", code, colour, new, "" if i % 31 == 0 else label])
    return path


@pytest.fixture
def small_blocks(monkeypatch):
    """Batches of ~1,000 rows, so a few thousand rows take several of them."""
    monkeypatch.setattr(table_stream, "CSV_BLOCK_BYTES", 1 << 14)


def test_streamed_rows_encode_as_numpy_encodes_the_whole_file(tmp_path, small_blocks):
    path = write_csv(tmp_path / "t.csv", 3000)
    write_csv(tmp_path / "test.csv", 200, seed=1)
    config = RunConfig(str(path), target="label", test=str(tmp_path / "test.csv"), validation_split=0.0,
                       stream="on")
    data = load_data(config)
    assert data.streamed and len(data.x_val) == 0 and len(data.x_test) == 200 - len(range(0, 200, 31))
    with open(path) as file:
        rows = [row for row in csv.DictReader(file) if row["label"] != ""]
    assert len(data.x_train) == len(rows)
    size = np.array([float(row["size"]) if row["size"] else np.nan for row in rows])
    filled = np.where(np.isnan(size), np.median(size[~np.isnan(size)]), size)
    new = np.array([{"yes": 1.0, "no": 0.0}.get(row["new"].lower(), np.nan) for row in rows])
    new_filled = np.where(np.isnan(new), np.median(new[~np.isnan(new)]), new)
    code = np.array([row["code"] for row in rows])  # widened to strings: 7 + 7 + 5 values
    colour = np.array([row["colour"] for row in rows])

    def one_hot(values):
        counts = {value: int(np.sum(values == value)) for value in set(values.tolist())}
        order = sorted(counts, key=lambda value: (-counts[value], value))
        return (values[:, None] == np.array(order)[None, :]).astype("float32")

    expected = np.concatenate([((filled - filled.mean()) / filled.std())[:, None],
                               ((new_filled - new_filled.mean()) / new_filled.std())[:, None],
                               np.isnan(size)[:, None], np.isnan(new)[:, None],
                               np.zeros((len(rows), 1)), one_hot(code), np.zeros((len(rows), 1)), one_hot(colour)],
                              axis=1)
    # StringLookup's one-hot puts the out-of-vocabulary slot first
    assert data.columns == {"size": "numeric", "code": "string", "colour": "string", "new": "yes/no"}
    np.testing.assert_allclose(data.x_train[0:len(rows)], expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(data.y_train, [int(row["label"]) for row in rows])


def test_the_split_is_the_seeds_whatever_the_batches(tmp_path, monkeypatch):
    path = write_csv(tmp_path / "t.csv", 6000)
    config = RunConfig(str(path), target="label", stream="on", seed=3)
    whole = load_data(config)
    monkeypatch.setattr(table_stream, "CSV_BLOCK_BYTES", 1 << 13)
    batched = load_data(config)
    for name in ("x_train", "x_val", "x_test"):
        rows = len(getattr(whole, name))
        np.testing.assert_array_equal(getattr(whole, name)[0:rows], getattr(batched, name)[0:rows])
    labelled = 6000 - len(range(0, 6000, 31))
    assert len(whole.x_train) + len(whole.x_val) + len(whole.x_test) == labelled
    # 5,806 rows drawn with --seed 3: the test share within 3 standard deviations of TEST_FRACTION
    assert abs(len(whole.x_test) / labelled - TEST_FRACTION) < 3 * (TEST_FRACTION * 0.8 / labelled) ** 0.5
    other = load_data(RunConfig(str(path), target="label", stream="on", seed=4))
    assert len(other.x_test) != len(whole.x_test) or not np.array_equal(other.y_test, whole.y_test)
    first = load_data(RunConfig(str(path), target="label", stream="on", seed=3, train_rows=1000))
    assert len(first.x_train) == 1000  # the first 1,000 training rows of the file, read no further
    np.testing.assert_array_equal(first.y_train, whole.y_train[:1000])
    assert len(first.x_test) < len(whole.x_test) / 3


def test_disk_rows_stream_every_row_once_an_epoch_in_a_seeded_order(monkeypatch):
    monkeypatch.setattr("kadapt.recipes.disk_rows.BLOCK_BYTES", 64 * 2 * 4)  # 64 rows of 2 features
    monkeypatch.setattr("kadapt.recipes.disk_rows.WINDOW_BLOCKS", 3)
    rows = 1000
    writer = RowStore().writer("train", (2,))
    writer.write(np.stack([np.arange(rows), -np.arange(rows)], axis=1))
    x = writer.close()
    labels = np.arange(rows) % 3
    targets = training.expanded(x, x_targets := _label_targets(labels), FastFitConfig(), 3)[1]
    assert targets is x_targets

    def epochs(first_epoch=0, seed=7):
        stream = training.shuffled_batches(x, targets, 96, 3, seed=seed, epochs=3, first_epoch=first_epoch)
        return [(b.numpy(), t.numpy()) for b, t in stream]

    batches = epochs()
    assert len(batches) == 3 * 11 and [len(b) for b, _ in batches[:11]] == [96] * 10 + [40]
    orders = [np.concatenate([b[:, 0] for b, _ in batches[11 * e:11 * (e + 1)]]) for e in range(3)]
    for order in orders:
        np.testing.assert_array_equal(np.sort(order), np.arange(rows))  # each row once
    assert not np.array_equal(orders[0], orders[1])
    for rows_, targets_ in batches:  # each row with its own target
        np.testing.assert_array_equal(targets_.argmax(-1), rows_[:, 0].astype(int) % 3)
    resumed = epochs(first_epoch=1)
    np.testing.assert_array_equal(np.concatenate([b for b, _ in resumed]),
                                  np.concatenate([b for b, _ in batches[11:]]))
    with pytest.raises(TypeError, match="not read into memory whole"):
        np.asarray(x)


def _label_targets(labels):
    from kadapt.recipes.disk_rows import LabelTargets

    return LabelTargets(labels, Task("classification", 3))


def test_regression_sums_batch_by_batch_equal_the_closed_form():
    rng = np.random.default_rng(0)
    y, predicted = rng.normal(1e4, 3, 1000), rng.normal(1e4, 3, 1000)
    sums = RegressionSums()
    for start in range(0, 1000, 130):
        sums.add(predicted[start:start + 130], y[start:start + 130])
    scores = sums.scores()
    error = predicted - y
    np.testing.assert_allclose(scores["mse"], np.mean(error**2), rtol=1e-10)
    np.testing.assert_allclose(scores["mae"], np.mean(np.abs(error)), rtol=1e-10)
    np.testing.assert_allclose(scores["r2"], 1 - np.sum(error**2) / np.sum((y - y.mean()) ** 2), rtol=1e-9)


@pytest.mark.backends("tensorflow", "jax")
def test_a_table_too_large_for_memory_trains_reports_and_predicts_streamed(tmp_path, monkeypatch, capsys,
                                                                              small_blocks):
    monkeypatch.chdir(tmp_path)
    write_csv(tmp_path / "big.csv", 4000)
    monkeypatch.setattr(table_stream, "MEMORY_FACTOR", 10**9)  # every file is "too large"
    assert cli.main(["train", "--data", "big.csv", "--target", "label", "--out", "run", "--epochs", "2",
                     "--batch-size", "64", "--meta", "off", "--fit-verbose", "0"]) == 0
    out = capsys.readouterr().out
    assert "data: streamed from disk (held whole it would take about" in out
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["status"] == "completed" and record["test_accuracy"] > 0.75  # chance: ~0.6
    assert json.loads((tmp_path / "run" / "config.json").read_text())["resolved"]["data"]["streamed"] is True
    assert cli.main(["report", "run"]) == 0
    assert "test accuracy" in capsys.readouterr().out
    assert cli.main(["predict", "run", "--data", "big.csv", "--output", "streamed.csv"]) == 0
    streamed = capsys.readouterr().out
    monkeypatch.setattr(table_stream, "MEMORY_FACTOR", 1)
    assert cli.main(["predict", "run", "--data", "big.csv", "--output", "whole.csv"]) == 0
    whole = capsys.readouterr().out
    assert (tmp_path / "streamed.csv").read_text() == (tmp_path / "whole.csv").read_text()
    assert streamed.splitlines()[1:2] == whole.splitlines()[1:2]  # the same accuracy line


def test_streaming_refuses_a_disk_without_room_with_the_figure(tmp_path, monkeypatch):
    import collections

    path = write_csv(tmp_path / "t.csv", 500)
    monkeypatch.setattr(table_stream.shutil, "disk_usage",
                        lambda _: collections.namedtuple("usage", "total used free")(10, 10, 1000))
    with pytest.raises(UsageError, match=r"encoded rows take 0\.0 GiB on disk, and .* has 0\.0 GiB free"):
        load_data(RunConfig(str(path), target="label", stream="on"))


def test_a_streamed_prediction_file_gives_each_batch_its_row_ids_as_written(tmp_path):
    """The columns a run dropped as ids name a streamed file's rows too, read as strings ("007" stays so)."""
    from kadapt.run import tables

    with open(tmp_path / "new.csv", "w", newline="") as file:
        csv.writer(file).writerows([["id", "x"], *([f"{i:03d}", str(i / 10)] for i in range(25))])
    data = {"columns": {"x": tables.NUMERIC}, "dropped_columns": {"id": tables.ID_REASON}, "target": "label"}
    batches = list(table_stream.prediction_batches(str(tmp_path / "new.csv"), data))
    ids = np.concatenate([ids["id"] for _, _, ids in batches])
    assert ids.tolist() == [f"{i:03d}" for i in range(25)]
    np.testing.assert_allclose(np.concatenate([columns["x"] for columns, _, _ in batches]).reshape(-1),
                               np.arange(25) / 10, rtol=1e-6)
