"""A user's own tables in `kadapt train`, `report` and `predict`: the task from
the labels (classes, class names, a regression), CSV columns, preprocessing
adapted on the training rows and saved in `model.keras`, which takes raw rows.
Three short runs in-process, one per module fixture; every bad input as one
pinned line."""

import csv
import json
import re
import subprocess
import sys

import keras
import numpy as np
import pytest

import kadapt
from helpers import NO_KADAPT
from helpers import load_data_error as bad
from kadapt import cli
from kadapt.recipes.task import Task
from kadapt.run import RunConfig
from kadapt.run.data import load_arrays
from kadapt.run.data import load_data

SHORT = ["--batch-size", "16", "--memory-budget", "256MiB", "--meta", "off", "--epochs", "1", "--max-steps", "2",
         "--fit-verbose", "2"]
COLORS = ("red", "green", "blue")


def write_csv(path, header, rows):
    with open(path, "w", newline="") as file:
        csv.writer(file).writerows([header, *rows])
    return path


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    """Raw rows as users keep them: feature scales from 0.01 to 1000, a target in the thousands."""
    folder = tmp_path_factory.mktemp("own_data")
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(60, 3)) * [1.0, 1000.0, 0.01] + [0.0, 5000.0, 1.0]).astype("float32")
    np.save(folder / "x.npy", x)
    np.save(folder / "values.npy", 3000.0 + 1000.0 * x[:, 0] + 0.5 * (x[:, 1] - 5000.0))
    np.save(folder / "names.npy", np.where(x[:, 0] > 0, "cat", "dog"))
    rows = [[f"{x[i, 1]:.2f}", COLORS[i % 3], "yes" if x[i, 1] > 5000 else "no"] for i in range(60)]
    write_csv(folder / "train.csv", ["floor area", "color", "label"], rows[:48])
    write_csv(folder / "test.csv", ["color", "floor area", "label"], [[c, s, label] for s, c, label in rows[48:]])
    write_csv(folder / "new.csv", ["floor area", "color"], [["4000", "red"], ["6000", "purple"]])
    return folder


def train(tables, monkeypatch, *args):
    monkeypatch.chdir(tables)
    assert cli.main(["train", *args, *SHORT]) == 0
    return tables / args[args.index("--out") + 1]


@pytest.fixture(scope="module")
def regression_run(tables):
    with pytest.MonkeyPatch.context() as patch:
        return train(tables, patch, "--data", "x.npy,values.npy", "--out", "regression")


@pytest.fixture(scope="module")
def names_run(tables):
    with pytest.MonkeyPatch.context() as patch:
        return train(tables, patch, "--data", "x.npy,names.npy", "--out", "names")


@pytest.fixture(scope="module")
def csv_run(tables):
    with pytest.MonkeyPatch.context() as patch:
        return train(tables, patch, "--data", "train.csv", "--target", "label", "--test", "test.csv",
                     "--out", "table")


def test_normalization_is_adapted_on_the_training_rows_only(tables, monkeypatch):
    monkeypatch.chdir(tables)
    data = load_data(RunConfig(data="x.npy,values.npy", validation_split=0.25))
    (raw, _), (raw_test, _) = load_arrays("x.npy,values.npy", seed=0)
    train_rows, validation_rows = raw[:36], raw[36:]  # 48 rows, the last quarter held out
    mean, std = train_rows.mean(axis=0), train_rows.std(axis=0)
    normalization = data.encoder.get_layer("normalization")
    np.testing.assert_allclose(np.ravel(normalization.mean), mean, rtol=1e-5)
    np.testing.assert_allclose(np.ravel(normalization.variance), std**2, rtol=1e-4)
    for encoded, rows in ((data.x_train, train_rows), (data.x_val, validation_rows), (data.x_test, raw_test)):
        np.testing.assert_allclose(encoded, (rows - mean) / std, rtol=1e-4, atol=1e-4)


def test_a_regression_target_is_standardized_with_the_training_rows(tables, monkeypatch):
    monkeypatch.chdir(tables)
    data = load_data(RunConfig(data="x.npy,values.npy", validation_split=0.25))
    y = data.y_train.astype("float64")
    assert (data.task.kind, data.task.outputs) == ("regression", 1)
    assert (data.task.target_mean, data.task.target_std) == (pytest.approx(y.mean()), pytest.approx(y.std()))
    assert data.targets(data.y_train).shape == (36, 1)
    assert data.chance_loss() == pytest.approx(1.0, rel=1e-5)  # the standardized target's variance


def test_the_chance_loss_of_classes_is_the_entropy_of_the_smoothed_frequencies():
    p = np.array([0.5, 0.25, 0.25])
    q = 0.9 * p + 0.1 / 3
    assert Task(outputs=3).chance_loss([0, 0, 1, 2], label_smoothing=0.1) == pytest.approx(-np.sum(q * np.log(q)))
    assert Task(outputs=3).chance_loss([0, 1, 2]) == pytest.approx(np.log(3))


def test_a_regression_trains_reports_and_predicts_values(regression_run, tables, capsys, monkeypatch):
    resolved = json.loads((regression_run / "config.json").read_text())["resolved"]
    assert resolved["data"]["task"]["kind"] == "regression" and resolved["data"]["num_classes"] == 1
    assert resolved["recipe"]["label_smoothing"] == 0.0 and resolved["augmentation"] == "off"
    record = json.loads((regression_run / "run.json").read_text())
    assert record["test_rmse"] == pytest.approx(record["test_mse"] ** 0.5) and "test_accuracy" not in record
    assert "accuracy" not in json.loads((regression_run / "history.json").read_text())
    capsys.readouterr()
    assert cli.main(["report", str(regression_run)]) == 0
    assert re.search(r"test error +MAE [\d.e+]+, RMSE [\d.e+]+, R² -?\d\.\d{4} \(MSE ", capsys.readouterr().out)
    monkeypatch.chdir(tables)
    assert cli.main(["predict", "regression", "--data", "x.npy,values.npy", "--output", "values.csv"]) == 0
    assert re.search(r"MAE [\d.e+]+, RMSE [\d.e+]+, R² -?\d\.\d{4} against the labels", capsys.readouterr().out)
    written = np.loadtxt(tables / "values.csv", skiprows=1)
    assert (tables / "values.csv").read_text().startswith("value\n") and written.shape == (60,)
    # model.keras takes the raw rows and answers in the target's units.
    model = kadapt.load_model(regression_run / "model.keras")
    raw = np.load(tables / "x.npy")
    np.testing.assert_allclose(model.predict(raw, verbose=0).ravel(), written, rtol=1e-4)


def test_string_labels_are_class_names_kept_in_the_run_and_predicted_by_name(names_run, tables, capsys, monkeypatch):
    assert json.loads((names_run / "classes.json").read_text()) == ["cat", "dog"]
    data = json.loads((names_run / "config.json").read_text())["resolved"]["data"]
    assert data["classes"] == ["cat", "dog"] and data["task"]["kind"] == "classification"
    monkeypatch.chdir(tables)
    assert cli.main(["predict", "names", "--data", "x.npy,names.npy", "--output", "names.csv"]) == 0
    assert re.search(r"accuracy \d\.\d{4} \(\d+ of 60 right\)", capsys.readouterr().out)
    lines = (tables / "names.csv").read_text().splitlines()
    assert lines[0] == "class" and len(lines) == 61 and set(lines[1:]) <= {"cat", "dog"}


def test_predicted_class_names_with_commas_and_quotes_read_back_from_the_csv(tmp_path):
    """`np.savetxt` wrote names unquoted: "New York, NY" split a row in two, and pandas could not read the file."""
    import argparse
    import csv

    from kadapt.cli.predict import _Predictions

    names = ["New York, NY", 'Paris "FR"']
    logits = np.array([[2.0, 0.0], [0.0, 1.0], [3.0, 1.0]], "float32")
    for probabilities, header, expected in ((False, ["class"], [["New York, NY"], ['Paris "FR"'], ["New York, NY"]]),
                                            (True, [f"class_{name}" for name in names], None)):
        output = tmp_path / f"p{int(probabilities)}.csv"
        predictions = _Predictions(argparse.Namespace(output=str(output), probabilities=probabilities), names, False,
                                   "label")
        predictions.add(logits[:2], None)
        predictions.add(logits[2:], None)  # a second batch appends
        predictions.close()
        with open(output, newline="") as file:
            rows = list(csv.reader(file))
        assert rows[0] == header and len(rows) == 4
        if expected is not None:
            assert rows[1:] == expected
        else:
            np.testing.assert_allclose(np.array(rows[1:], float).sum(axis=1), 1.0, rtol=1e-5)


def test_a_csv_trains_on_its_columns_and_predicts_raw_rows_with_an_unseen_category(csv_run, tables, capsys,
                                                                                     monkeypatch):
    data = json.loads((csv_run / "config.json").read_text())["resolved"]["data"]
    assert data["target"] == "label" and data["columns"] == {"floor area": "numeric", "color": "string"}
    assert data["classes"] == ["no", "yes"] and data["test_rows"] == 12  # --test's rows
    assert data["input_shape"] == [5]  # floor area, then one-hot color: 3 seen + 1 out-of-vocabulary slot
    capsys.readouterr()
    assert cli.main(["report", str(csv_run)]) == 0
    assert re.search(r"train\.csv: 44 train / 4 validation / 12 test rows of \(5,\) \(2 columns\), 2 classes",
                     capsys.readouterr().out)
    monkeypatch.chdir(tables)
    assert cli.main(["predict", "table", "--data", "new.csv", "--output", "new.csv.npy"]) == 0
    assert np.load(tables / "new.csv.npy").tolist()[0] in ("no", "yes")
    model = kadapt.load_model(csv_run / "model.keras")  # safe mode: only Keras' own layers
    lookup = model.get_layer("lookup_color")
    assert lookup(np.array([["purple"]])).numpy().tolist() == [[1.0, 0.0, 0.0, 0.0]]  # the OOV slot


# Predicts with a run's model.keras as someone without kadapt would: plain Keras, safe mode.
WITHOUT_KADAPT = NO_KADAPT + """
import keras, numpy as np, tensorflow as tf
for model_path, rows, out in zip(*[iter(sys.argv[1:])] * 3):
    model = keras.saving.load_model(model_path, safe_mode=True)
    if rows.endswith(".npz"):  # a table's named columns, strings as tf.string (no Keras data adapter takes them)
        with np.load(rows) as columns:
            rows = {name: tf.constant(columns[name]) for name in columns.files}
    else:
        rows = np.load(rows)
    np.save(out, keras.ops.convert_to_numpy(model(rows, training=False)))
"""


def test_every_run_s_model_loads_and_predicts_in_plain_keras(regression_run, names_run, csv_run, tables,
                                                            monkeypatch):
    monkeypatch.chdir(tables)
    assert cli.main(["predict", "names", "--data", "x.npy", "--probabilities", "--output", "p_names.npy"]) == 0
    assert cli.main(["predict", "table", "--data", "new.csv", "--probabilities", "--output", "p_table.npy"]) == 0
    assert cli.main(["predict", "regression", "--data", "x.npy", "--output", "p_values.npy"]) == 0
    np.savez(tables / "new.npz", floor_area=np.array([[4000.0], [6000.0]], "float32"),
             color=np.array([["red"], ["purple"]]))
    runs = [(names_run, "x.npy", "p_names.npy"), (csv_run, "new.npz", "p_table.npy"),
            (regression_run, "x.npy", "p_values.npy")]
    arguments = [str(value) for run, rows, _ in runs for value in (run / "model.keras", rows, f"plain_{run.name}.npy")]
    subprocess.run([sys.executable, "-I", "-c", WITHOUT_KADAPT, *arguments], check=True, cwd=tables, timeout=300)
    for run, _, predicted in runs:
        plain = np.load(tables / f"plain_{run.name}.npy")
        kadapt_said = np.load(tables / predicted)
        # kadapt predict writes probabilities (softmax of the logits) and values; the model outputs logits
        expected = np.log(kadapt_said) - np.log(kadapt_said).mean(axis=1, keepdims=True) if kadapt_said.ndim == 2 \
            else kadapt_said
        given = plain - plain.mean(axis=1, keepdims=True) if kadapt_said.ndim == 2 else plain.ravel()
        np.testing.assert_allclose(given, expected, rtol=1e-4, atol=1e-4)


def test_export_writes_a_saved_model_that_tensorflow_alone_serves(csv_run, tables, monkeypatch, capsys):
    import tensorflow as tf

    monkeypatch.chdir(tables)
    assert cli.main(["export", "table", "--out", "served"]) == 0
    assert "exported" in capsys.readouterr().out
    serve = NO_KADAPT + """
import numpy as np, tensorflow as tf
served = tf.saved_model.load(sys.argv[1])
logits = served.serve({"floor_area": tf.constant([[4000.0], [6000.0]]), "color": tf.constant([["red"], ["purple"]])})
np.save(sys.argv[2], logits.numpy())
"""
    subprocess.run([sys.executable, "-I", "-c", serve, str(tables / "served"), str(tables / "served.npy")], check=True,
                   cwd=tables, timeout=300)
    model = kadapt.load_model(csv_run / "model.keras")
    expected = model({"floor_area": tf.constant([[4000.0], [6000.0]]),
                      "color": tf.constant([["red"], ["purple"]])}, training=False)
    np.testing.assert_allclose(np.load(tables / "served.npy"), keras.ops.convert_to_numpy(expected), rtol=1e-5,
                               atol=1e-5)
    with pytest.raises(SystemExit, match=r"kadapt: error: --out served exists and is not empty"):
        cli.main(["export", "table", "--out", "served"])


def test_a_regression_plot_has_no_accuracy_panel():
    from kadapt.run.plots import training_figure

    steps = [{"step": s, "epoch": 0, "loss": 1.0, "learning_rate": 0.1, "momentum": 0.9} for s in range(4)]
    assert len(training_figure(steps, [], {"epoch": [0], "loss": [1.0]}, accuracy=False).axes) == 3


def test_a_misspelled_target_lists_the_columns(tables, monkeypatch):
    assert bad(tables, monkeypatch, data="train.csv", target="lable") == (
        "--target lable is not a column of train.csv; its columns: floor area, color, label. Did you mean "
        "--target 'label'? Received: --target=lable")


def test_a_target_with_arrays(tables, monkeypatch):
    assert bad(tables, monkeypatch, data="x.npy,names.npy", target="label") == (
        "--target goes with a table (--data TABLE.csv or TABLE.parquet); --data x.npy,names.npy is not one. Drop --target. "
        "Received: --target=label")


def test_a_csv_without_target(tables, monkeypatch):
    assert bad(tables, monkeypatch, data="train.csv") == (
        "--data train.csv is a table: add --target COLUMN, the column to predict (its columns: floor area, color, "
        "label).")


def test_a_label_column_of_numbers_and_words(tables, monkeypatch):
    write_csv(tables / "mixed.csv", ["a", "label"], [["1", "3"], ["2", "cat"], ["3", "4"]])
    assert bad(tables, monkeypatch, data="mixed.csv", target="label") == (
        "--target label: column label of mixed.csv holds numbers ('3' on line 2) and words ('cat' on line 3); "
        "a label column holds numbers (classes or values) or words (class names), not both. Fix the file.")


def test_one_class_only(tables, monkeypatch):
    write_csv(tables / "one.csv", ["a", "label"], [[str(i), "cat"] for i in range(6)])
    assert bad(tables, monkeypatch, data="one.csv", target="label") == (
        "--data one.csv: every training label is cat: one class only, nothing to tell apart. "
        "Give rows of at least two classes.")


def test_fewer_rows_than_classes(tables, monkeypatch):
    write_csv(tables / "few.csv", ["a", "label"], [[str(i), str(3 * i)] for i in range(6)])
    # Read alone, 0, 3, ..., 15 leave most class numbers unused: a regression. As classes each names one: 6.
    assert bad(tables, monkeypatch, data="few.csv", target="label", validation_split=0.0, task="classification") == (
        "--data few.csv: 4 training rows for 6 classes; each class needs rows to learn from. "
        "Give more rows, or fewer classes. Whole numbers are classes: for a regression, pass --task regression.")


def test_a_test_file_with_other_columns(tables, monkeypatch):
    write_csv(tables / "other.csv", ["floor area", "colour", "label"], [["1", "red", "no"]])
    assert bad(tables, monkeypatch, data="train.csv", target="label", test="other.csv") == (
        "--test other.csv lacks color and adds colour: its columns must be the training file's "
        "(floor area, color).")


def test_two_columns_that_would_share_a_model_input(tables, monkeypatch):
    write_csv(tables / "clash.csv", ["a b", "a/b", "label"], [["1", "2", "0"], ["2", "1", "1"]])
    assert bad(tables, monkeypatch, data="clash.csv", target="label") == (
        "--data clash.csv: columns 'a b' and 'a/b' both become the model input 'a_b' (Keras takes letters, digits "
        "and _.- in a name). Rename one of them.")


def test_nan_in_array_rows_is_filled_and_flagged_but_inf_names_the_file_row_and_column(tables, monkeypatch):
    x = np.load(tables / "x.npy")
    x[::5, 2] = np.nan
    np.save(tables / "nan.npy", x)
    monkeypatch.chdir(tables)
    data = load_data(RunConfig(data="nan.npy,values.npy"))
    assert data.input_shape == (4,)  # three columns and the flag of column 2
    flags = data.x_train[:, 3]
    assert set(np.unique(flags)) == {0.0, 1.0} and np.all(data.x_train[flags == 1, 2] == data.x_train[flags == 1, 2][0])
    assert any(note.startswith(f"column 2 (counted from 0) of the inputs: {int(flags.sum())} of {len(flags)} training "
                               "values missing: filled with the median ") for note in data.notes)
    x[7, 2] = np.inf
    np.save(tables / "inf.npy", x)
    assert bad(tables, monkeypatch, data="inf.npy,values.npy") == (
        "--data inf.npy: row 7, column 2 (counted from 0) of the inputs is inf, not a number a network can learn "
        "from. Fix or drop the row.")


def test_inf_in_a_csv_names_the_file_line_and_column(tables, monkeypatch):
    write_csv(tables / "inf.csv", ["a", "label"], [["1", "0"], ["inf", "1"], ["2", "1"]])
    assert bad(tables, monkeypatch, data="inf.csv", target="label") == (
        "--data inf.csv: line 3, column a holds inf, not a number a network can learn from (an empty cell is a "
        "missing value). Fix the cell.")


def test_a_constant_column_is_kept_with_a_note(tables, monkeypatch):
    x = np.load(tables / "x.npy")
    x[:, 1] = 4.5
    np.save(tables / "constant.npy", x)
    monkeypatch.chdir(tables)
    data = load_data(RunConfig(data="constant.npy,values.npy"))
    assert "column 1 (counted from 0) of the inputs: 4.5 in every training row: kept (it adds nothing)" in data.notes
    assert np.all(data.x_train[:, 1] == 0)
    rows = np.array([[0.0, 5.5, 1.0]], "float32")  # a value training never saw stays bounded: std 1, not 0
    assert keras.ops.convert_to_numpy(data.encoder(rows))[0, 1] == pytest.approx(1.0)


def test_a_constant_csv_column_is_kept_with_a_note(tables, monkeypatch):
    write_csv(tables / "flat.csv", ["a", "b", "label"], [[str(i), "7", str(i % 2)] for i in range(10)])
    monkeypatch.chdir(tables)
    data = load_data(RunConfig(data="flat.csv", target="label"))
    assert "column b: 7 in every training row: kept (it adds nothing)" in data.notes and data.input_shape == (2,)


def test_a_test_file_for_arrays(tables, monkeypatch):
    assert bad(tables, monkeypatch, data="x.npy,names.npy", test="test.csv") == (
        "--test goes with a table (--data TABLE.csv or TABLE.parquet); --data x.npy,names.npy is not one. Drop --test. "
        "Received: --test=test.csv")


def test_an_empty_csv(tables, monkeypatch):
    write_csv(tables / "empty.csv", ["a", "label"], [])
    assert bad(tables, monkeypatch, data="empty.csv", target="label") == (
        "--data empty.csv is empty: it needs a header line of column names and at least one row of values.")


def test_a_bad_table_ends_the_command_in_one_line(tables, monkeypatch):
    monkeypatch.chdir(tables)
    with pytest.raises(SystemExit) as raised:
        cli.main(["train", "--data", "train.csv", "--target", "lable", "--out", "never"])
    assert str(raised.value).startswith("kadapt: error: --target lable is not a column of train.csv")
    assert not (tables / "never").exists()


def test_predict_refuses_a_lambda_in_one_line_saying_why(tmp_path):
    import keras

    layers = [keras.Input((3,)), keras.layers.Lambda(lambda rows: 2 * rows), keras.layers.Dense(2)]
    keras.Sequential(layers).save(tmp_path / "model.keras")
    with pytest.raises(SystemExit) as raised:
        cli.main(["predict", str(tmp_path), "--data", "x.npy"])
    assert str(raised.value) == (
        f"kadapt: error: {tmp_path / 'model.keras'} holds a Lambda layer, Python code saved in the file; kadapt "
        "predict loads models in Keras' safe mode, which runs no code from a file, so it refuses it. If you trust "
        "the file, load it in Python with keras.saving.load_model(path, safe_mode=False); or replace the Lambda "
        "with a layer class registered with @keras.saving.register_keras_serializable() and train again.")


def test_the_training_targets_are_made_once_and_shared_by_the_rescue_and_the_judged_restart(tmp_path):
    """One-hot rows of many classes are large: `kadapt train`'s rescue (its range test) and judged
    restart (its branch and score) hold the run's one read-only copy, not copies of their own."""
    import contextlib
    import types

    from kadapt.run.callbacks import self_tuning
    from kadapt.run.data import TrainingData
    from kadapt.run.run_directory import RunDirectory

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 3)).astype("float32"), rng.integers(0, 5, 40)
    data = TrainingData(x, y, x[:8], y[:8], x[:8], y[:8], Task(outputs=5))
    assert data.train_targets is data.train_targets and not data.train_targets.flags.writeable
    np.testing.assert_array_equal(data.train_targets, np.eye(5, dtype="float32")[y])
    config = RunConfig(data="x.npy,y.npy", batch_size=8, seed=1)
    directory = RunDirectory(tmp_path)
    recipe = types.SimpleNamespace(label_smoothing=0.0, learning_rate=0.1)
    run = types.SimpleNamespace(member=None, data=data, directory=directory, meta_model="default",
                                plan=types.SimpleNamespace(config=config, recipe=recipe), local=contextlib.nullcontext)
    adjuster = self_tuning(run)
    assert adjuster.rescue.range_test.y is data.train_targets
    trial = adjuster.restart_trial
    assert trial.y is data.train_targets and trial.validation_data[1] is data.val_targets


def test_a_run_s_network_loads_to_train_on_with_its_optimizer_s_state(names_run, tables):
    network = kadapt.load_model(names_run, for_training=True)
    record = json.loads((names_run / "run.json").read_text())
    assert int(network.optimizer.iterations.numpy()) == record["steps_completed"] > 0
    model = kadapt.load_model(names_run)  # model.keras: raw rows -> the encoder -> the same network
    x = np.load(tables / "x.npy")
    encoder = keras.Model(model.inputs, model.get_layer(network.name).input)  # model.keras up to the network
    encoded = encoder.predict(x, verbose=0)
    np.testing.assert_allclose(network.predict(encoded, verbose=0), model.predict(x, verbose=0), rtol=1e-5,
                               atol=1e-5)
    network.fit(encoded, keras.utils.to_categorical(x[:, 0] <= 0, 2), batch_size=16, epochs=1, verbose=0)
    assert int(network.optimizer.iterations.numpy()) == record["steps_completed"] + 4  # 60 rows, 16 a step
    with pytest.raises(ValueError, match="reads a run's training.keras: pass the run directory"):
        kadapt.load_model(names_run / "model.keras", for_training=True)
    with pytest.raises(ValueError, match="names a directory without training.keras"):
        kadapt.load_model(tables, for_training=True)
