"""Tables as people keep them (`kadapt.run.tables`, `kadapt.run.encoding`): empty cells in any
spelling, labels missing, ids, dates, whole-number targets of many values, Parquet; the model
fills and flags what is missing itself, so `kadapt predict` takes rows with empty cells.
One short command-line run per module; the rest on the reader and encoder directly."""

import collections
import csv
import json
import re

import keras
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers import load_data_error as bad
from kadapt import cli
from kadapt.run import RunConfig
from kadapt.run import UsageError
from kadapt.run import table_stream
from kadapt.run import tables
from kadapt.run.data import load_data
from kadapt.run.data import load_table_inputs
from kadapt.run.coded_strings import CodedStrings
from kadapt.run.encoding import MEDIAN_ROWS
from kadapt.run.encoding import categories
from kadapt.run.encoding import category_limit
from kadapt.run.encoding import column_encoder
from kadapt.run.encoding import encode
from kadapt.run.encoding import indexed
from kadapt.run.encoding import notes
from kadapt.run.encoding import row_encoder
from kadapt.run.encoding import statistics
from kadapt.run.encoding import training_rows
from kadapt.run.table_stream import prediction_batches as read_prediction_batches
from kadapt.run.table_stream import read_batches
from kadapt.run.labels import label_task

SHORT = ["--batch-size", "16", "--memory-budget", "256MiB", "--meta", "off", "--epochs", "1", "--max-steps", "2",
         "--fit-verbose", "2"]
HEADER = ["user", "size", "colour", "sold on", "new", "price"]


def write_csv(path, header, rows):
    with open(path, "w", newline="") as file:
        csv.writer(file).writerows([header, *rows])
    return path


def messy_rows(count, seed=0):
    """A sales table as published: ids, empty cells spelled four ways, dates, yes/no, whole prices."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(count):
        size = rng.normal(50, 10)
        colour = ["red", "green", "", "NA"][i % 4]
        price = int(1000 + 20 * size + (300 if colour == "red" else 0) + rng.integers(0, 40))
        rows.append([f"u{i:04d}", ["", "nan", "NaN", f"{size:.1f}"][min(i % 7, 3)], colour,
                     f"2024-{1 + i % 12:02d}-{1 + i % 28:02d}", ["yes", "no"][i % 2], "" if i % 25 == 0 else price])
    return rows


@pytest.fixture(scope="module")
def sales(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sales")
    write_csv(folder / "sales.csv", HEADER, messy_rows(200))
    write_csv(folder / "new.csv", HEADER[:-1], [["x1", "", "", "2025-03-04", "no"], ["x2", "61.5", "red", "", "yes"]])
    return folder


@pytest.fixture(scope="module")
def sales_run(sales):
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(sales)
        assert cli.main(["train", "--data", "sales.csv", "--target", "price", "--out", "run", *SHORT]) == 0
    return sales / "run"


BOTH_BACKENDS = pytest.mark.backends("tensorflow", "jax")


@BOTH_BACKENDS
def test_a_messy_table_trains_with_every_choice_a_note_in_its_config(sales_run, capsys):
    data = json.loads((sales_run / "config.json").read_text())["resolved"]["data"]
    assert data["task"]["kind"] == "regression"
    assert data["columns"] == {"size": "numeric", "colour": "string", "sold on": "date", "new": "yes/no"}
    assert data["dropped_columns"] == {"user": "a distinct value on every training row (an id)"}
    notes = data["notes"]
    assert notes[0] == "--data sales.csv: 8 of 200 rows have no price (an empty cell): left out"
    assert notes[2] == "column new: the words yes and no: one input, 1 for yes and 0 for no"
    assert re.fullmatch(r"task: regression \(\d+ distinct whole numbers in \d+ training rows: more than 20 and more "
                        r"than 5% of the rows, so values to predict, not classes\)", notes[3])
    assert any(re.fullmatch(r"column size: \d+ of \d+ training values missing: filled with the median [\d.]+, and "
                            "an input flags them", note) for note in notes)
    # size, its flag, 4 date parts, new (1/0); colour: red, green, "" (NA is missing too) + 1 out-of-vocabulary
    assert data["input_shape"] == [2 + 4 + 1 + 4]
    # Only TensorFlow's models take strings: elsewhere they reach the model as indices in these vocabularies.
    expected = {} if keras.backend.backend() == "tensorflow" else {"colour": ["", "green", "red"]}
    assert data.get("vocabularies", {}) == expected
    capsys.readouterr()
    assert cli.main(["report", str(sales_run)]) == 0
    assert "test error" in capsys.readouterr().out


@BOTH_BACKENDS
def test_predict_takes_rows_with_empty_cells_and_scores_only_labelled_rows(sales_run, sales, capsys, monkeypatch):
    monkeypatch.chdir(sales)
    assert cli.main(["predict", "run", "--data", "new.csv", "--output", "new_prices.csv"]) == 0
    # The id column the run dropped names each row beside its prediction, as the file writes it.
    header, *rows = csv.reader((sales / "new_prices.csv").read_text().splitlines())
    assert header == ["user", "price"] and [user for user, _ in rows] == ["x1", "x2"]
    assert np.all(np.isfinite([float(value) for _, value in rows]))
    capsys.readouterr()
    assert cli.main(["predict", "run", "--data", "sales.csv"]) == 0
    assert re.search(r"MAE [\d.e+]+, RMSE [\d.e+]+, R² -?\d\.\d{4} against the labels", capsys.readouterr().out)


@BOTH_BACKENDS
def test_the_model_fills_missing_numbers_with_the_training_median_and_flags_them():
    values = np.array([[1.0, 5.0], [np.nan, 7.0], [3.0, 9.0], [10.0, np.nan]], "float32")
    encoder = row_encoder(statistics(dict(enumerate(values.T))), 2)
    median = np.array([3.0, 7.0])  # NumPy over the given values
    filled = np.where(np.isnan(values), median, values)
    expected = np.concatenate([(filled - filled.mean(0)) / filled.std(0), np.isnan(values)], axis=1)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(encoder(values)), expected, rtol=1e-5, atol=1e-6)


def test_a_long_column_takes_the_median_of_a_sample_and_its_moments_exactly():
    rng = np.random.default_rng(1)
    values = rng.exponential(size=MEDIAN_ROWS + 50_000).astype("float32") * 1000 + 5e6  # far from 0: float64 sums
    values[rng.random(len(values)) < 0.1] = np.nan
    stats = statistics({"x": values})
    given = values[~np.isnan(values)].astype("float64")
    median = np.log(2) * 1000 + 5e6  # the distribution's; a 180,000-value sample's is within a few 0.1%
    assert stats.median_rows == MEDIAN_ROWS and abs(stats.median[0] - median) < 0.02 * 1000
    filled = np.where(np.isnan(values), stats.median[0], values.astype("float64"))
    np.testing.assert_allclose([stats.mean[0], stats.variance[0]], [filled.mean(), filled.var()], rtol=1e-9)
    assert (stats.missing[0], stats.low[0], stats.high[0]) == (len(values) - len(given), given.min(), given.max())
    assert "of a 200000-row sample" in notes(stats, "column {}")[0]


def test_missing_is_one_thing_however_it_is_written(tmp_path):
    write_csv(tmp_path / "t.csv", ["a", "b"], [["", ""], ["NA", "NA"], ["nan", "nan"], ["NaN", "x"], ["1.5", "null"]])
    columns = tables.read_table(str(tmp_path / "t.csv")).columns
    assert np.isnan(columns["a"][:4]).all() and columns["a"][4] == 1.5
    assert columns["b"].tolist() == ["", "", "", "x", ""]


@pytest.mark.parametrize("name, delimiter, point, encoding, note", [
    ("semicolons.csv", ";", ",", "utf-8", "--data semicolons.csv: values separated by semicolons, decimal commas"),
    ("semicolons_points.csv", ";", ".", "utf-8", "--data semicolons_points.csv: values separated by semicolons"),
    ("tabs.tsv", "\t", ".", "utf-8", "--data tabs.tsv: values separated by tabs"),
    ("bars.csv", "|", ".", "utf-8", "--data bars.csv: values separated by bars"),
    ("commas.csv", ",", ".", "utf-8", None),
    ("bom.csv", ",", ".", "utf-8-sig", None),  # a spreadsheet's "CSV UTF-8"
    ("unicode.csv", "\t", ".", "utf-16", "--data unicode.csv: values separated by tabs, text in UTF-16"),
])
def test_a_csv_is_read_with_the_delimiter_and_decimal_point_it_was_written_with(tmp_path, monkeypatch, name,
                                                                               delimiter, point, encoding, note):
    """The oracle: the same rows written with commas and decimal points in UTF-8. A comma inside a
    quoted word (a semicolon file) and a semicolon inside one (a comma file) do not mislead the
    reading; a spreadsheet's "Unicode text" (UTF-16, tabs) is read as such."""
    rows = [["1.5", "red; dark", "yes"], ["-0.25", "green, light", "no"], ["", "blue", "yes"], ["3", "", "no"]]
    header = ["size", "colour", "label"]
    with open(tmp_path / name, "w", newline="", encoding=encoding) as file:
        writer = csv.writer(file, delimiter=delimiter, quoting=csv.QUOTE_MINIMAL)
        writer.writerows([header, *([cell.replace(".", point) for cell in row] for row in rows)])
    write_csv(tmp_path / "oracle.csv", header, rows)
    monkeypatch.chdir(tmp_path)
    table, oracle = tables.read_table(name), tables.read_table("oracle.csv")
    np.testing.assert_array_equal(table.columns["size"], oracle.columns["size"])
    assert table.columns["colour"].tolist() == oracle.columns["colour"].tolist() == [
        "red; dark", "green, light", "blue", ""]
    assert table.notes == ((note,) if note else ())
    assert (note is None) or note in load_data(RunConfig(data=name, target="label")).notes


def test_a_quoted_value_with_a_line_break_past_the_first_block_is_read(tmp_path):
    """A comment or an address over two lines, quoted, first met past pyarrow's first 1 MB block:
    it stopped in "CSV parser got out of sync"; it is one value, held whole and streamed alike."""
    with open(tmp_path / "t.csv", "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerows([["size", "comment", "label"],
                          *([str(i % 7), "fine,\nreally" if i > 100_000 and i % 5 == 0 else "ok", "yes"]
                            for i in range(120_000))])
    assert not tables.csv_dialect(tmp_path / "t.csv").quoted_lines  # no quote in the lines read for the dialect
    comments = tables.read_table(str(tmp_path / "t.csv")).columns["comment"]
    assert collections.Counter(comments.tolist()) == {"ok": 116_001, "fine,\nreally": 3_999}
    streamed = [columns["comment"] for _, columns, _ in read_batches(str(tmp_path / "t.csv"), "--data", {})]
    assert sum(len(batch) for batch in streamed) == 120_000


def test_a_header_one_name_short_is_rs_row_names(tmp_path, monkeypatch):
    """R's `write.table(sep=",")` writes no name for its row names: pyarrow stopped ("Expected 3 columns,
    got 4"). The first values are a column with no name (here the cars' names: an id, dropped)."""
    lines = ['"mpg","cyl","label"'] + [f'"car {i}",{20 + i % 7},{4 + 2 * (i % 3)},"{"ab"[i % 2]}"' for i in range(30)]
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    monkeypatch.chdir(tmp_path)
    data = load_data(RunConfig(data="t.csv", target="label"))
    assert data.columns == {"mpg": "numeric", "cyl": "numeric"}
    assert data.dropped == {"": "a distinct value on every training row (an id)"}
    assert "--data t.csv: its header names one column fewer than its rows hold: each row's first value is its " \
           "name (R's write.table), read as a column with no name" in data.notes


def test_empty_columns_without_names_beside_the_table_are_dropped_not_a_duplicate_name(tmp_path, monkeypatch):
    """A spreadsheet exports the empty cells it formatted beside and below a table ("a,b,,", ",,,,"): two
    columns named "" stopped ("the column name '' appears 2 times ... Rename one of them"). Named
    "Unnamed: i" as pandas names them, each is dropped as empty; two that hold values are both kept."""
    lines = ["size,colour,label,,"] + [f"{i % 7},{'rg'[i % 2]},{'ab'[i % 3 % 2]},," for i in range(30)] + [",,,,"] * 3
    (tmp_path / "t.csv").write_text("\r\n".join(lines) + "\r\n")
    monkeypatch.chdir(tmp_path)
    data = load_data(RunConfig(data="t.csv", target="label"))
    assert data.columns == {"size": "numeric", "colour": "string"}
    assert data.dropped == {"Unnamed: 3": "empty in every training row", "Unnamed: 4": "empty in every training row"}
    assert "--data t.csv: 3 of 33 rows have no label (an empty cell): left out" in data.notes
    write_csv(tmp_path / "two.csv", ["", "", "label"], [["1", "x", "a"], ["2", "y", "b"]])
    assert list(tables.read_table(str(tmp_path / "two.csv")).columns) == ["Unnamed: 0", "Unnamed: 1", "label"]


@pytest.mark.parametrize("stream", ["off", "on"])
def test_a_question_mark_for_a_label_is_no_label_and_plus_and_minus_are_classes(stream, tmp_path, monkeypatch):
    """UCI's files write "?" for an unknown value: in a target it was a class of its own ("?", "hi", "lo"),
    and beside numbers it stopped ("holds numbers and words"). Its rows are left out, counted; "+" and
    "-" (UCI's credit approval) stay classes."""
    words, values, signs = (["hi", "lo", "?"], ["1.5", "2.25", "?"], "+-")
    write_csv(tmp_path / "word.csv", ["x", "word", "sign"], [[i, words[i % 3], signs[i % 2]] for i in range(60)])
    write_csv(tmp_path / "value.csv", ["x", "value", "sign"], [[i, values[i % 3], signs[i % 2]] for i in range(60)])
    monkeypatch.chdir(tmp_path)
    for target in ("word", "value"):
        data = load_data(RunConfig(data=f"{target}.csv", target=target, stream=stream))
        assert f"--data {target}.csv: 20 of 60 rows have no {target} (an empty cell or '?'): left out" in data.notes
        assert len(data.y_train) + len(data.y_val) + len(data.y_test) == 40
        assert data.columns == {"x": "numeric", "sign": "string"}
    assert data.task.is_regression and set(np.asarray(data.y_test).tolist()) <= {1.5, 2.25}
    assert list(load_data(RunConfig(data="word.csv", target="sign", stream=stream)).class_names) == ["+", "-"]


@pytest.mark.parametrize("stream", ["off", "on"])
def test_a_number_column_named_as_an_id_with_its_own_whole_number_on_every_row_is_an_id(stream, tmp_path,
                                                                                      monkeypatch):
    """Kaggle's `PassengerId` (1..N) was a numeric input, noise to the network, and so not written beside
    the predictions; a measure of distinct whole numbers under another name, or an `Id` repeated, stays."""
    rows = [[i + 1, 1000 + 7 * i, i % 30, i % 5, "ab"[i % 3 % 2]] for i in range(60)]
    write_csv(tmp_path / "t.csv", ["PassengerId", "width", "Id", "size", "label"], rows)
    monkeypatch.chdir(tmp_path)
    data = load_data(RunConfig(data="t.csv", target="label", stream=stream))
    assert data.dropped == {"PassengerId": tables.ID_REASON}
    assert data.columns == {"width": "numeric", "Id": "numeric", "size": "numeric"}


@pytest.mark.parametrize("stream", ["off", "on"])
def test_true_and_false_labels_are_classes_named_as_the_file_writes_them(stream, tmp_path, monkeypatch):
    """A label column of TRUE/FALSE (a spreadsheet's export) was read as booleans, so classes 0 and 1:
    predictions came out 0 and 1. A feature column of them stays one input, 1 for true."""
    truth = [i % 3 == 0 for i in range(60)]
    for name, (yes, no) in (("upper.csv", ("TRUE", "FALSE")), ("title.csv", ("True", "False"))):
        write_csv(tmp_path / name, ["x", "flag", "label"], [[i, no if i % 2 else yes, yes if t else no]
                                                            for i, t in enumerate(truth)])
    pq.write_table(pa.table({"x": range(60), "flag": [i % 2 == 0 for i in range(60)], "label": truth}),
                   tmp_path / "stored.parquet")
    monkeypatch.chdir(tmp_path)
    for name, (yes, no) in (("upper.csv", ("TRUE", "FALSE")), ("title.csv", ("True", "False")),
                            ("stored.parquet", ("true", "false"))):
        data = load_data(RunConfig(data=name, target="label", stream=stream))
        assert data.class_names == (no, yes) and data.columns == {"x": "numeric", "flag": "numeric"}
        written = [yes if t else no for t in truth]
        assert load_table_inputs(name, data.summary())[1].tolist() == written  # kadapt predict's labels
        streamed = [labels for _, labels, _ in read_prediction_batches(name, data.summary())]
        assert np.concatenate(streamed).tolist() == written


def test_predict_writes_a_parquet_files_number_ids_as_whole_numbers(tmp_path, monkeypatch, capsys):
    table = pa.table({"PassengerId": pa.array(range(101, 161), pa.int64()), "size": [float(i % 7) for i in range(60)],
                      "label": ["ab"[i % 7 > 3] for i in range(60)]})
    pq.write_table(table, tmp_path / "t.parquet")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "--data", "t.parquet", "--target", "label", "--out", "run", *SHORT]) == 0
    assert cli.main(["predict", "run", "--data", "t.parquet", "--output", "p.csv"]) == 0
    header, *rows = csv.reader((tmp_path / "p.csv").read_text().splitlines())
    assert header == ["PassengerId", "class"] and [row[0] for row in rows] == [str(i) for i in range(101, 161)]


def test_a_title_above_the_header_is_named_with_the_fix(tmp_path, monkeypatch):
    (tmp_path / "t.csv").write_text("Sales report, 2023\n\nsize,colour,weight,label\n1,red,2,yes\n2,blue,3,no\n")
    assert bad(tmp_path, monkeypatch, data="t.csv", target="label") == (
        "--data t.csv: line 1 ('Sales report, 2023') is text above the table, whose header is line 3 (4 values "
        "separated by commas). Delete the lines above the header.")


def test_numbers_written_for_people_are_numbers_in_a_column_and_a_target(tmp_path, monkeypatch):
    """Thousands separators and currency signs, as a spreadsheet exports a price: read as numbers (a
    price on every row is no id), the target a regression, each choice a note; a later file's cell
    that is not such a number is named with its line."""
    fees = ["$1,234.50", "1,000", "", "€ 12", "-$3", "12.5%", "4 129", "1\u202f000\u00a0000.5"] * 4
    prices = [f"${1000 * (i + 1) + 0.25 * i:,.2f}" for i in range(25)]
    write_csv(tmp_path / "t.csv", ["fee", "colour", "price"],
              [[fee, "red" if i % 2 else "blue", price] for i, (fee, price) in enumerate(zip(fees, prices))])
    monkeypatch.chdir(tmp_path)
    data = load_data(RunConfig(data="t.csv", target="price", validation_split=0.0))
    assert data.columns == {"fee": "written number", "colour": "string"} and data.task.kind == "regression"
    assert "--target price: numbers written with thousands separators or a currency sign: read as numbers" in \
        data.notes
    assert "column fee: numbers written with thousands separators or a currency sign: read as numbers" in data.notes
    columns = tables.read_table("t.csv").columns
    np.testing.assert_array_equal(tables.written_number_values(columns["fee"][:8]),
                                  [1234.5, 1000, np.nan, 12, -3, 12.5, 4129, 1000000.5])
    np.testing.assert_array_equal(tables.label_array("t.csv", "price", columns["price"][:2], False), [1000, 2000.25])
    write_csv(tmp_path / "later.csv", ["fee", "colour"], [["$5", "red"], ["about 7", "blue"]])
    with pytest.raises(UsageError, match=r"^--data later.csv: column fee holds 'about 7' on line 3; in the training "
                                         r"file it holds numbers \(written as 1,234 or \$12\). Fix the cell.$"):
        load_table_inputs("later.csv", {"columns": data.columns, "target": "price"})


@pytest.mark.parametrize("stream", ["off", "on"])
def test_written_numbers_and_local_dates_are_read_alike_held_whole_or_streamed(stream, tmp_path, monkeypatch):
    """Streamed (a table too large to hold), "$4,237.67" prices were dropped as ids and "31/01/2024"
    dates kept as words. A column whose first rows are such numbers but a later cell a word is words,
    as held whole: the streamed file is read again."""
    monkeypatch.setattr(table_stream, "CSV_BLOCK_BYTES", 1 << 12)  # batches of about 100 rows
    rows = [[f"${1000 + 37.5 * i:,.2f}", f"{1 + i % 28:02d}/{1 + i % 12:02d}/2024", ["$1,000", "$40"][i % 2],
             "ab"[i % 3 % 2]] for i in range(400)]
    rows[350][2] = "call us"
    write_csv(tmp_path / "t.csv", ["price", "day", "fee", "label"], rows)
    monkeypatch.chdir(tmp_path)
    data = load_data(RunConfig(data="t.csv", target="label", stream=stream))
    assert data.streamed == (stream == "on")
    assert data.columns == {"price": "written number", "day": "date %d/%m/%Y", "fee": "string"}
    assert {"column price: numbers written with thousands separators or a currency sign: read as numbers",
            "column day: dates written day first ('01/01/2024'): read as dates (year, month, day, weekday)"} <= \
        set(data.notes)


def test_numbers_written_with_decimal_commas_and_thousands_points_are_numbers(tmp_path, monkeypatch):
    """A spreadsheet's export in much of Europe: semicolons, "2.423,40 €", a price "410.878,65". The
    kind keeps the decimal comma, so a later file's column reads the same."""
    rows = [[f"{i},5", f"{1 + i}.{i % 10}00,25 €" if i % 3 else f"{i},5 €", f"{100 + i}.000,{i % 100:02d}"]
            for i in range(30)]
    (tmp_path / "t.csv").write_text("size;fee;price\n" + "".join(";".join(row) + "\n" for row in rows))
    monkeypatch.chdir(tmp_path)
    data = load_data(RunConfig(data="t.csv", target="price", validation_split=0.0, test="t.csv"))
    assert data.columns == {"size": "numeric", "fee": "written number, decimal comma"}
    assert data.task.kind == "regression"
    np.testing.assert_allclose(tables.label_array("t.csv", "price", np.array(["410.878,65", "1.000"], object), False,
                                                  ","), [410878.65, 1000])
    (tmp_path / "later.csv").write_text("size;fee;price\n1,5;2.423,40 €;150.000\n2;12,5 %;7,5\n")
    record = {"columns": data.columns, "target": "price", "task": {"kind": "regression"}}
    columns, labels = load_table_inputs("later.csv", record)  # "150.000" beside "7,5": a thousand
    np.testing.assert_allclose(columns["fee"], [2423.4, 12.5])
    np.testing.assert_allclose(labels, [150000, 7.5])
    (tmp_path / "worded.csv").write_text("size;fee;price\n1,5;2.423,40 €;unknown\n")
    with pytest.raises(UsageError, match=r"^--data worded.csv: column price holds 'unknown' on line 2; the run "
                                         r"predicts numbers there. Fix the cell, or drop the column to predict "
                                         r"without scoring.$"):
        load_table_inputs("worded.csv", record)


def test_a_row_index_written_with_the_file_is_dropped_and_a_named_counter_kept(tmp_path, monkeypatch):
    """pandas' `to_csv` writes its index as a first column with no name: row numbers, not data. A
    named column of the same numbers (a time step) is the user's and stays."""
    rows = [[str(i), str(i), f"{np.sin(i):.3f}", "yes" if i % 3 else "no"] for i in range(30)]
    write_csv(tmp_path / "t.csv", ["", "step", "x", "label"], rows)
    monkeypatch.chdir(tmp_path)
    data = load_data(RunConfig(data="t.csv", target="label"))
    assert data.dropped == {"": "no name and whole numbers from 0 to 29 that only grow: a row index written with "
                                "the file"}
    assert data.columns == {"step": "numeric", "x": "numeric"}
    assert "column (no name): no name and whole numbers from 0 to 29 that only grow: a row index written with the " \
           "file: dropped" in data.notes


def test_a_file_sorted_by_class_is_split_into_the_seeded_draw_of_rows(tmp_path, monkeypatch):
    """Without --test the parts are a seeded draw of the rows (the training part gathered in the file's
    order, for speed): the same rows as the draw, so a file sorted by class validates and tests on
    every class, --train-rows included."""
    rows = [[str(i), ["a", "b", "c"][i // 100]] for i in range(300)]
    write_csv(tmp_path / "sorted.csv", ["step", "label"], rows)
    monkeypatch.chdir(tmp_path)
    data = load_data(RunConfig(data="sorted.csv", target="label", seed=3, train_rows=150))
    order = np.random.default_rng(3).permutation(300)  # the draw, as NumPy makes it
    training, test = order[:240][:150], order[240:]
    fit, validation = training[:135], training[135:]
    mean, std = fit.mean(), fit.std()
    for encoded, expected in ((data.x_train, fit), (data.x_val, validation), (data.x_test, test)):
        assert np.allclose(np.sort(encoded[:, 0]), np.sort((expected - mean) / std), atol=1e-5)
    assert np.allclose(data.x_val[:, 0], (validation - mean) / std, atol=1e-5)  # in the draw's order
    names = np.array(data.class_names)
    assert set(names[data.y_val]) == set(names[data.y_test]) == {"a", "b", "c"}
    assert list(names[data.y_val]) == [["a", "b", "c"][row // 100] for row in validation]  # beside their rows


def test_three_digits_after_a_comma_are_a_thousand_beside_tabs_and_a_decimal_beside_semicolons(tmp_path):
    (tmp_path / "tabs.tsv").write_text("count\tlabel\n1,234\tyes\n12\tno\n")
    (tmp_path / "halves.tsv").write_text("count\tlabel\n1,5\tyes\n12\tno\n")
    (tmp_path / "semicolons.csv").write_text("count;label\n1,234;yes\n12;no\n")
    assert tables.csv_dialect(tmp_path / "tabs.tsv") == tables.CsvDialect("\t", ".")
    assert tables.csv_dialect(tmp_path / "semicolons.csv") == tables.CsvDialect(";", ",")
    assert tables.csv_dialect(tmp_path / "halves.tsv") == tables.CsvDialect("\t", ",")
    assert tables.written_numbers(tables.read_table(str(tmp_path / "tabs.tsv")).columns["count"])
    assert tables.read_table(str(tmp_path / "semicolons.csv")).columns["count"][0] == pytest.approx(1.234)


def test_a_compressed_csv_is_read_as_its_csv(tmp_path):
    import gzip

    rows = [["1,5", "red"], ["-2", ""], ["", "blue"]] * 10
    write_csv(tmp_path / "t.csv", ["size", "colour"], rows)
    text = (tmp_path / "t.csv").read_text().replace(",", ";").replace('"1;5"', "1,5")  # semicolons, decimal commas
    (tmp_path / "t.csv").write_text(text)
    (tmp_path / "t.csv.gz").write_bytes(gzip.compress(text.encode()))
    table, oracle = tables.read_table(str(tmp_path / "t.csv.gz")), tables.read_table(str(tmp_path / "t.csv"))
    np.testing.assert_array_equal(table.columns["size"], oracle.columns["size"])
    assert table.columns["size"][0] == 1.5 and table.columns["colour"].tolist() == oracle.columns["colour"].tolist()
    assert tables.is_table_spec("t.csv.gz") and tables.is_table_spec("T.TSV.BZ2")
    assert not tables.is_table_spec("t.parquet.gz") and not tables.is_table_spec("t.gz")


def test_a_column_of_numbers_with_question_marks_is_numbers_with_missing_cells(tmp_path, monkeypatch):
    """UCI's files write an unknown value as "?", a spreadsheet a failed formula's "#DIV/0!": among
    numbers it is a missing cell, not a category per number; among words it stays a word. A later
    file's "?" is missing too."""
    ages = ["34", "?", "-5", "-", "61", "2.5"] * 5
    ratios = ["0.5", "#DIV/0!", "#VALUE!", "2"] * 8
    write_csv(tmp_path / "t.csv", ["age", "ratio", "code", "label"],
              [[age, ratio, "AB?"[i % 3], "yes" if i % 2 else "no"]
               for i, (age, ratio) in enumerate(zip(ages, ratios))])
    monkeypatch.chdir(tmp_path)
    table = tables.read_table("t.csv", target="label")
    np.testing.assert_array_equal(table.columns["age"][:6], [34, np.nan, -5, np.nan, 61, 2.5])
    np.testing.assert_array_equal(table.columns["ratio"][:4], [0.5, np.nan, np.nan, 2])
    assert table.columns["code"][:3].strings().tolist() == ["A", "B", "?"]
    assert table.notes == ("--data t.csv: column age: numbers, and '-' and '?' in 10 rows: read as missing",
                           "--data t.csv: column ratio: numbers, and '#DIV/0!' and '#VALUE!' in 15 rows: read as "
                           "missing")
    data = load_data(RunConfig(data="t.csv", target="label"))
    assert data.columns == {"age": "numeric", "ratio": "numeric", "code": "string"}
    write_csv(tmp_path / "later.csv", ["age", "ratio", "code"], [["?", "#REF!", "A"], ["7", "1", "?"]])
    columns, _ = load_table_inputs("later.csv", {"columns": data.columns, "target": "label"})
    np.testing.assert_array_equal(columns["age"], [np.nan, 7])
    np.testing.assert_array_equal(columns["ratio"], [np.nan, 1])


def test_spaces_around_a_word_do_not_make_a_class_or_category_of_their_own(tmp_path, monkeypatch):
    """"high " is "high": a space a spreadsheet does not show. Said once per column; a later file's
    padded word is the training file's word."""
    write_csv(tmp_path / "t.csv", ["size", "colour", "label"],
              [[str(i), ["red", "red ", " blue", "Red"][i % 4], "high " if i % 3 == 0 else ["high", "low"][i % 2]]
               for i in range(40)])
    monkeypatch.chdir(tmp_path)
    data = load_data(RunConfig(data="t.csv", target="label"))
    assert list(data.class_names) == ["high", "low"]
    assert data.vocabularies is None or sorted(data.vocabularies["colour"]) == ["Red", "blue", "red"]
    assert {"--data t.csv: column colour: the spaces around its values removed ('red ' is 'red')",
            "--data t.csv: column label: the spaces around its values removed ('high ' is 'high')"} <= set(data.notes)
    assert sorted(tables.read_table("t.csv", target="label").columns["colour"].counts()) == ["Red", "blue", "red"]
    write_csv(tmp_path / "later.csv", ["size", "colour"], [["1", " red "], ["2", "blue"]])
    columns, _ = load_table_inputs("later.csv", {"columns": data.columns, "target": "label"})
    assert columns["colour"].tolist() == ["red", "blue"]


def test_column_names_are_taken_without_the_spaces_around_them(tmp_path, monkeypatch):
    """A header written "a, b" (a comma and a space) names " b": `--target label` finds " label", and
    the values' leading spaces go too."""
    (tmp_path / "t.csv").write_text("size, colour, label\n" + "1, red, yes\n2, blue, no\n" * 10)
    monkeypatch.chdir(tmp_path)
    data = load_data(RunConfig(data="t.csv", target="label"))
    assert data.columns == {"size": "numeric", "colour": "string"} and data.class_names == ("no", "yes")
    assert "--data t.csv: the spaces around 2 column names removed (' colour' is 'colour')" in data.notes
    (tmp_path / "twice.csv").write_text("a, a,label\n1,2,yes\n")
    assert bad(tmp_path, monkeypatch, data="twice.csv", target="label") == (
        "--data twice.csv: the column name 'a' appears 2 times; the second would silently replace the first. "
        "Rename one of them.")


def test_dates_written_as_people_write_them_are_read_in_the_order_their_values_settle(tmp_path, monkeypatch):
    """1/31/2023 can only be month first, 31.01.2023 day first: read as dates, the format kept in the
    run's config, so a later file is read in the training file's order and a cell written otherwise is
    named. 1/2/2023 is January 2nd or February 1st: where no value settles it, the column stays words and
    the run says how to have dates."""
    days = np.datetime64("2023-01-01") + np.arange(0, 300, 7)  # 43 weeks: days past 12 in every month
    times = days.astype("datetime64[s]") + (np.arange(len(days)) % 24) * 3600 + 15 * 60
    us = [f"{d.month}/{d.day}/{d.year}" for d in days.tolist()]
    eu = [t.strftime("%d.%m.%Y %H:%M") for t in times.tolist()]
    unsettled = [f"{i % 6 + 1}/{i % 3 + 1}/2023" for i in range(len(days))]
    rows = [[u, e, n, "yes" if i % 2 else "no"] for i, (u, e, n) in enumerate(zip(us, eu, unsettled))]
    rows[5][0] = ""  # an empty cell is a missing date
    write_csv(tmp_path / "t.csv", ["sold", "sent", "day", "label"], rows)
    monkeypatch.chdir(tmp_path)
    data = load_data(RunConfig(data="t.csv", target="label", test="t.csv"))
    assert data.columns == {"sold": "date %m/%d/%Y", "sent": "datetime %d.%m.%Y %H:%M", "day": "string"}
    assert {"column sold: dates written month first ('1/1/2023'): read as dates (year, month, day, weekday)",
            "column sent: dates written day first ('01.01.2023 00:15'): read as dates (year, month, day, weekday, "
            "hour)"} <= set(data.notes)
    assert "column day: dates written as '1/1/2023' are read as words: no value settles which of its first two " \
           "numbers is the day (neither passes 12 in every place); write them as ISO dates (2023-01-31) to have " \
           "them read as dates (year, month, day, weekday)" in data.notes
    record = {"columns": data.columns, "target": "label", "classes": ["no", "yes"]}
    columns, _ = load_table_inputs("t.csv", record)  # how `kadapt predict` reads a file
    expected = {"sold": tables.date_parts(days), "sent": tables.date_parts(times)}  # from the dates themselves
    expected["sold"] = {part: np.where(np.arange(len(days)) == 5, np.nan, values) for part, values in
                        expected["sold"].items()}
    for name, parts in expected.items():
        for part, values in parts.items():
            if f"{name}.{part}" in columns:
                np.testing.assert_array_equal(columns[f"{name}.{part}"], values)
    assert set(columns) == {"sold.year", "sold.month", "sold.day", "sold.weekday", "sent.year", "sent.month",
                            "sent.day", "sent.weekday", "sent.hour", "day"}
    rows[7][1] = "2023-02-19 10:15"  # written otherwise in a later file
    write_csv(tmp_path / "later.csv", ["sold", "sent", "day", "label"], rows)
    with pytest.raises(UsageError, match=r"^--data later.csv: column sent holds '2023-02-19 10:15' on line 9; in the "
                                         r"training file it holds dates written as %d.%m.%Y %H:%M. Fix the cell.$"):
        load_table_inputs("later.csv", record)


def test_dates_with_the_months_name_are_dates(tmp_path, monkeypatch):
    """05-Jan-2023 (a bank's export) or Jan 5, 2023: the name settles the order."""
    days = np.datetime64("2023-01-01") + np.arange(0, 400, 9)
    rows = [[d.strftime("%d-%b-%Y"), d.strftime("%b %d, %Y"), "yes" if i % 2 else "no"]
            for i, d in enumerate(days.tolist())]
    write_csv(tmp_path / "t.csv", ["paid", "sent", "label"], rows)
    monkeypatch.chdir(tmp_path)
    data = load_data(RunConfig(data="t.csv", target="label"))
    assert data.columns == {"paid": "date %d-%b-%Y", "sent": "date %b %d, %Y"}
    assert "column paid: dates written with the month's name ('01-Jan-2023'): read as dates (year, month, day, " \
           "weekday)" in data.notes
    columns, _ = load_table_inputs("t.csv", {"columns": data.columns, "target": "label"})
    for name in ("paid", "sent"):
        for part, values in tables.date_parts(days).items():
            if part != "hour":
                np.testing.assert_array_equal(columns[f"{name}.{part}"], values)


@pytest.mark.parametrize("values, form", [
    (["1/31/2023", "12/1/2023"], "%m/%d/%Y"),
    (["31-01-23", "1-12-23"], "%d-%m-%y"),
    (["13.1.2023 8:05:59", "1.1.2023 23:00:00"], "%d.%m.%Y %H:%M:%S"),
    (["1/2/2023", "12/11/2023"], None),  # nothing past 12: the order is a guess
    (["13/1/2023", "1/13/2023"], None),  # both orders: not one format
    (["31/1/2023", "1-2-2023"], None),  # two separators
    (["31/1/2023", "1/2/23"], None),  # two lengths of year
])
def test_the_format_of_local_dates_is_the_one_every_value_settles(values, form):
    assert tables.local_date_format(values) == form


def test_text_in_windows_1252_is_read_so_and_past_the_first_lines_named_with_its_line(tmp_path):
    """A spreadsheet's plain "CSV" on Windows is Windows-1252 ("café", "5 €"): it stopped ("not UTF-8").
    Where the first lines are UTF-8 and a later one is not, the line is named."""
    (tmp_path / "t.csv").write_bytes("size,colour,price\n1,red,5 \u20ac\n2,caf\xe9,6 \u20ac\n".encode("cp1252"))
    table = tables.read_table(str(tmp_path / "t.csv"))
    assert table.columns["colour"].tolist() == ["red", "café"] and table.columns["price"].tolist() == ["5 €", "6 €"]
    assert table.notes == (f"--data {tmp_path / 't.csv'}: values separated by commas, text in Windows-1252 (its first "
                           "lines are not UTF-8)",)
    # UTF-8 whose first 64 KiB, the bytes the dialect is read off, end inside an "é" stays UTF-8.
    (tmp_path / "cut.csv").write_text("sz,colour\n" + "1,café\n" * 9000)
    assert (tmp_path / "cut.csv").read_bytes()[tables.SNIFF_BYTES - 1:tables.SNIFF_BYTES + 1] == "é".encode()
    cut = tables.read_table(str(tmp_path / "cut.csv"))
    assert cut.notes == () and set(cut.columns["colour"].tolist()) == {"café"}
    (tmp_path / "late.csv").write_bytes(("size,colour\n" + "1,red\n" * 20_000 + "2,caf\xe9\n").encode("latin-1"))
    with pytest.raises(UsageError, match=r"^--data .*late.csv: column colour holds text that is not UTF-8, first on "
                                         r"line 20002 \(b'caf\\xe9'\). Save the file as UTF-8"):
        tables.read_table(str(tmp_path / "late.csv"))


def test_a_first_line_naming_the_delimiter_is_read_and_skipped(tmp_path):
    """A spreadsheet writes "sep=;" above the header for itself: it was "text above the table"."""
    (tmp_path / "t.csv").write_text("sep=;\nsize;colour\n1,5;red\n2;blue\n")
    table = tables.read_table(str(tmp_path / "t.csv"))
    assert table.columns["size"].tolist() == [1.5, 2.0] and table.columns["colour"].tolist() == ["red", "blue"]
    assert table.notes == (f"--data {tmp_path / 't.csv'}: values separated by semicolons (its first line, 'sep=;', "
                           "says so: skipped), decimal commas",)


@BOTH_BACKENDS
def test_a_string_index_is_the_one_hot_position_of_string_lookup():
    vocabulary = ["red", "", "blue"]
    indices = indexed({"c": np.array(["blue", "red", "", "pink"], dtype=object)}, {"c": vocabulary})["c"]
    assert indices.tolist() == [3, 1, 2, 0]  # 0: out of vocabulary, then the vocabulary's order


def test_training_rows_by_codes_are_what_the_saved_string_encoder_makes():
    """On TensorFlow the saved model looks strings up; `kadapt train` encodes its rows from codes."""
    rng = np.random.default_rng(0)
    words = np.array([f"w{i}" for i in range(80)] + [""], dtype=object)  # more than are kept: a pooled tail
    train = words[rng.integers(0, len(words), 500)]
    numbers = rng.normal(size=500).astype("float32")
    coded = {"c": CodedStrings.from_arrow(pa, pa.array(train.tolist())), "n": numbers}
    stats = statistics(coded)
    reference = statistics({"c": train, "n": numbers})  # of the strings themselves
    assert (stats.vocabularies, stats.distinct) == (reference.vocabularies, reference.distinct)
    later = {"c": np.array(["w3", "", "never seen", train[0]], dtype=object), "n": np.array([0.5, np.nan, 1, 2], "f4")}
    kinds = {"c": tables.STRING, "n": tables.NUMERIC}
    encoder, _ = column_encoder(stats, kinds)
    assert encoder.get_layer("lookup_c").__class__.__name__ == "StringLookup"
    trained, predicted = training_rows(stats, kinds, [coded, later])
    np.testing.assert_array_equal(trained, encode(encoder, {"c": train, "n": numbers}))
    np.testing.assert_array_equal(predicted, encode(encoder, later))


def test_many_string_values_keep_the_most_frequent():
    values = np.array([f"v{i}" for i in range(100)] + ["v7"] * 3 + ["v42"] * 2)
    vocabulary = categories(collections.Counter(values.tolist()), limit=64)
    assert len(vocabulary) == 64 and vocabulary[:2] == ["v7", "v42"]
    assert len(categories(collections.Counter(values.tolist()))) == 100


def test_a_long_table_keeps_fewer_values_so_its_one_hot_inputs_stay_within_a_gib():
    assert category_limit(18_000, 1) == 1024
    assert category_limit(2_000_000, 1) == 2**30 // (4 * 2_000_000)  # 134 inputs: 1 GiB as float32
    assert category_limit(2_000_000, 2) == 67
    assert category_limit(20_000_000, 3) == 64


def test_date_parts_follow_the_calendar():
    days = np.array(["2024-02-29", "1999-12-31T23:10", "NaT"], "datetime64[s]")
    parts = tables.date_parts(days)
    assert parts["year"][:2].tolist() == [2024, 1999] and parts["month"][:2].tolist() == [2, 12]
    assert parts["day"][:2].tolist() == [29, 31] and parts["hour"][:2].tolist() == [0, 23]
    assert parts["weekday"][:2].tolist() == [3, 4]  # a Thursday, a Friday (Monday is 0)
    assert all(np.isnan(values[2]) for values in parts.values())


@pytest.mark.parametrize("labels, kind", [
    (np.arange(300) % 7, "classification"),  # 7 values: classes
    (np.arange(3000) % 40, "classification"),  # 40 values, 1.3% of the rows: classes
    (1000 + np.arange(300) * 7, "regression"),  # a price: 300 values in 300 rows
    (np.minimum(np.arange(3000) % 97, np.arange(3000) % 13), "classification"),  # 13 values
    (np.concatenate([np.zeros(2000, int), np.arange(1000) % 60]), "regression"),  # a count: 0 in most rows
    (np.array([1.0, 2.0, 3.0] * 10), "classification"),  # whole floats (a column with empty cells) read alike
    (np.array([1.5, 2.0, 3.0] * 10), "regression"),
    (np.array([0, 0, 0, 1, 2, 30, 80, 120, 480] * 2), "regression"),  # counts (1854's wounds): 6 values up to 480
    (np.array([2019, 2020, 2021] * 10), "regression"),  # years
    (np.array([1, 2, 3, 4, 5] * 10), "classification"),  # ratings 1-5: class 0 unused, the others all present
])
def test_the_task_is_read_from_the_distinct_values(labels, kind):
    assert label_task("t.csv", labels).task.kind == kind


def test_task_overrides_the_reading():
    assert label_task("t.csv", np.arange(30) % 3, task="regression").task.kind == "regression"
    labels = label_task("t.csv", np.arange(300) % 50, task="classification")  # 50 values, 17% of the rows
    assert labels.task.kind == "classification" and labels.reason == "--task"


@pytest.mark.parametrize("stream", ["off", "on"])
def test_whole_numbers_other_than_0_1_2_name_their_classes(stream, tmp_path, monkeypatch):
    """Labels -1 and 1 stopped ("number the classes from 0"); codes 101, 205, 310 under --task
    classification were 311 classes, too many for the rows. Each number now names a class."""
    signs = label_task("t.csv", np.array([1, -1, 1, 1, -1] * 6))
    assert signs.task.kind == "classification" and signs.class_names == ("-1", "1")
    assert signs.coded(np.array([1, -1, 1])).tolist() == [1, 0, 1]
    codes = label_task("t.csv", np.array([310, 101, 205] * 10), task="classification")
    assert codes.class_names == ("101", "205", "310") and codes.task.outputs == 3
    assert codes.coded(np.array([101.0, 310.0, 205.0])).tolist() == [0, 2, 1]  # whole floats (empty cells) alike
    assert label_task("t.csv", np.arange(30) % 3).class_names is None  # 0, 1, 2: the class numbers themselves
    write_csv(tmp_path / "t.csv", ["x", "code"], [[i, [101, 205, 310][i % 3]] for i in range(60)])
    monkeypatch.chdir(tmp_path)
    data = load_data(RunConfig(data="t.csv", target="code", task="classification", stream=stream))
    assert data.class_names == ("101", "205", "310") and data.num_classes == 3
    assert set(np.asarray(data.y_train).tolist()) == {0, 1, 2}
    assert load_table_inputs("t.csv", data.summary())[1][:3].tolist() == ["101", "205", "310"]  # as predict scores


def test_a_parquet_table_trains_and_predicts_from_the_command_line(tmp_path, monkeypatch, capsys):
    rows = messy_rows(120)
    table = pa.table({"size": pa.array([float(r[1]) if r[1] not in ("", "nan", "NaN") else None for r in rows]),
                      "colour": pa.array([r[2] or None for r in rows]),
                      "sold on": pa.array(np.array([r[3] for r in rows], "datetime64[D]")),
                      "label": pa.array([r[4] for r in rows])})
    pq.write_table(table, tmp_path / "t.parquet")
    pq.write_table(table.slice(0, 5).drop_columns(["label"]), tmp_path / "new.parquet")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "--data", "t.parquet", "--target", "label", "--out", "run", *SHORT]) == 0
    data = json.loads((tmp_path / "run" / "config.json").read_text())["resolved"]["data"]
    assert data["columns"] == {"size": "numeric", "colour": "string", "sold on": "date"}
    capsys.readouterr()
    assert cli.main(["predict", "run", "--data", "new.parquet", "--output", "new.csv"]) == 0
    lines = (tmp_path / "new.csv").read_text().splitlines()
    assert lines[0] == "class" and len(lines) == 6 and set(lines[1:]) <= {"no", "yes"}


def test_parquet_trains_like_its_csv(tmp_path, monkeypatch):
    rows = messy_rows(120)
    table = pa.table({"size": pa.array([float(r[1]) if r[1] not in ("", "nan", "NaN") else None for r in rows]),
                      "colour": pa.array([r[2] or None for r in rows]),
                      "label": pa.array([r[4] for r in rows])})
    pq.write_table(table, tmp_path / "t.parquet")
    monkeypatch.chdir(tmp_path)
    data = load_data(RunConfig(data="t.parquet", target="label"))
    assert data.columns == {"size": "numeric", "colour": "string"} and data.class_names == ("no", "yes")


def test_two_columns_of_one_name(tmp_path, monkeypatch):
    write_csv(tmp_path / "twice.csv", ["a", "a", "label"], [["1", "2", "0"], ["2", "1", "1"]])
    assert bad(tmp_path, monkeypatch, data="twice.csv", target="label") == (
        "--data twice.csv: the column name 'a' appears 2 times; the second would silently replace the first. "
        "Rename one of them.")


def test_a_target_empty_everywhere(tmp_path, monkeypatch):
    write_csv(tmp_path / "t.csv", ["a", "label"], [["1", ""], ["2", "NA"]])
    assert bad(tmp_path, monkeypatch, data="t.csv", target="label") == (
        "--target label: column label of t.csv is empty in every row: there is nothing to learn. Pass the column "
        "that holds the values to predict.")


@pytest.mark.parametrize("name, said", [
    ("t.xlsx", "is a spreadsheet, and kadapt reads tables from CSV (.csv, .tsv, .txt; compressed: .csv.gz) and "
               "Parquet (.parquet) files: save the sheet as CSV (UTF-8)."),
    ("t.zip", "is an archive, and kadapt reads tables from CSV (.csv, .tsv, .txt; compressed: .csv.gz) and Parquet "
              "(.parquet) files: unpack it and pass the table inside."),
    ("t.foo", "is neither CSV nor Parquet, and kadapt reads tables from CSV (.csv, .tsv, .txt; compressed: .csv.gz) "
              "and Parquet (.parquet) files: save the table as one of them."),
])
def test_a_file_that_is_neither_csv_nor_parquet_is_named_with_the_way_to_one(name, said, tmp_path, monkeypatch):
    """`--data t.xlsx --target y` said "--target goes with a table ...: Drop --target", a fix that fixes nothing."""
    (tmp_path / name).write_bytes(b"PK")
    with pytest.raises(UsageError) as raised:
        tables.read_table(str(tmp_path / name))
    assert str(raised.value) == f"--data {tmp_path / name} {said}"
    assert bad(tmp_path, monkeypatch, data=name, target="label") == f"--data {name} {said}"


def test_delimited_text_under_other_names_and_with_spaces_between_values_is_a_table(tmp_path, monkeypatch):
    """Tables published as `.data` or `.txt` (UCI's repository, R's `write.table`, whose default writes
    single spaces, quoted strings and row names) were "not a table"."""
    rows = [[str(i % 7), ["Lyon", "New York"][i % 2], "ab"[i % 3 % 2]] for i in range(30)]
    write_csv(tmp_path / "t.data", ["size", "city", "label"], rows)
    (tmp_path / "t.txt").write_text('"size" "city" "label"\n' + "".join(
        f'"{i + 1}" {size} "{city}" "{label}"\n' for i, (size, city, label) in enumerate(rows)))
    monkeypatch.chdir(tmp_path)
    for name in ("t.data", "t.txt"):
        data = load_data(RunConfig(data=name, target="label"))
        assert data.columns == {"size": "numeric", "city": "string"}
        assert len(data.y_train) + len(data.y_val) + len(data.y_test) == 30  # every row read
    assert "--data t.txt: values separated by spaces" in data.notes[0]


@pytest.mark.parametrize("target, advice", [
    ("Label", "Did you mean --target 'label'?"),
    ("lable", "Did you mean --target 'label'?"),
    ("price", "Pass one of them."),
])
def test_a_target_not_in_the_header_is_met_with_the_column_meant(target, advice, tmp_path, monkeypatch):
    write_csv(tmp_path / "t.csv", ["size", "label"], [["1", "a"], ["2", "b"]])
    assert bad(tmp_path, monkeypatch, data="t.csv", target=target) == (
        f"--target {target} is not a column of t.csv; its columns: size, label. {advice} Received: --target={target}")


def test_a_file_without_a_header_line_is_named_so_where_the_target_is_not_found(tmp_path, monkeypatch):
    """A file written without its header (UCI's `adult.data`): its first row read as names, numbers among
    them; `--target` names none of them, and the first row of data must not be lost as a header."""
    write_csv(tmp_path / "adult.data", ["39", "State-gov", "77516", "<=50K"], [["50", "Private", "83311", ">50K"]])
    assert bad(tmp_path, monkeypatch, data="adult.data", target="income") == (
        "--target income is not a column of adult.data; its columns: 39, State-gov, 77516, <=50K. Its first line "
        "holds numbers (39, 77516) where a header holds names: if the file has no header line, add one naming its "
        "columns, then pass the one to predict. Received: --target=income")


def test_a_nested_parquet_column(tmp_path):
    pq.write_table(pa.table({"a": [[1, 2], [3]], "label": [0, 1]}), tmp_path / "nested.parquet")
    with pytest.raises(UsageError, match=r"column a is of the type list<element: int64>, which kadapt cannot learn "
                                         r"from \(it takes numbers, strings, true/false and dates\). Flatten or drop "
                                         r"the column.$"):
        tables.read_table(str(tmp_path / "nested.parquet"))


def test_whole_numbers_past_a_floats_range_are_read_as_the_nearest_floats(tmp_path):
    """A hash or a long id (past 2**53) stopped in pyarrow's cast; it is read, and said."""
    pq.write_table(pa.table({"hash": pa.array([2**60 + 1, -(2**62), 7], pa.int64()), "label": [0, 1, 0]}),
                   tmp_path / "t.parquet")
    table = tables.read_table(str(tmp_path / "t.parquet"))
    np.testing.assert_array_equal(table.columns["hash"], [2.0**60, -(2.0**62), 7.0])
    assert table.notes == (f"--data {tmp_path / 't.parquet'}: column hash: whole numbers past 2**53, beyond a "
                           "float's exact range (an id or a code?): read as the nearest floats",)


def test_a_predict_file_with_words_in_a_column_of_numbers(sales_run, sales, monkeypatch):
    write_csv(sales / "words.csv", HEADER[:-1], [["x1", "big", "red", "2025-03-04", "no"]])
    monkeypatch.chdir(sales)
    with pytest.raises(SystemExit, match=r"kadapt: error: --data words.csv: column size holds 'big' on line 2; in "
                                         r"the training file it holds numbers. Fix the cell."):
        cli.main(["predict", "run", "--data", "words.csv"])


def test_a_yes_no_column_is_one_input_and_a_later_word_is_named(tmp_path):
    write_csv(tmp_path / "t.csv", ["new", "y"], [[word, i % 2] for i, word in
                                                 enumerate(["yes", "No", "", "YES", "no"] * 8)])
    data = load_data(RunConfig(str(tmp_path / "t.csv"), target="y", validation_split=0.0, seed=0))
    assert data.columns == {"new": "yes/no"} and data.input_shape == (2,)  # 1/0 and its "was missing" flag
    write_csv(tmp_path / "later.csv", ["new", "y"], [["yes", 1], ["maybe", 0]])
    with pytest.raises(UsageError, match=r"^--data .*later.csv: column new holds 'maybe' on line 3; in the training "
                                         r"file it holds the words yes and no. Fix the cell.$"):
        load_table_inputs(str(tmp_path / "later.csv"), {"columns": data.columns, "target": "y"})
