"""A user's own network (`--model package.module:function`) and `.npy` data in
`kadapt train` and `kadapt predict`: one short run in-process, its predict
round trip and resume; every bad input as one pinned line."""

import json
import sys

import numpy as np
import pytest

from kadapt import cli
from kadapt.run import RunConfig
from kadapt.run import UsageError
from kadapt.run import start_run
from kadapt.run.data import load_arrays
from kadapt.run.data import load_inputs
from kadapt.run.networks import build_model

MODULE = "user_networks_for_tests"
USER_NETWORKS = '''
import keras


def build(input_shape, num_classes):
    return keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(),
                             keras.layers.Dense(num_classes)], name="user_net")


def raises(input_shape, num_classes):
    raise RuntimeError("no weights here")


def not_a_model(input_shape, num_classes):
    return "a model"


def compiled(input_shape, num_classes):
    model = build(input_shape, num_classes)
    model.compile(optimizer="adam", loss="mse")
    return model


def softmax(input_shape, num_classes):
    return keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(),
                             keras.layers.Dense(num_classes, activation="softmax")])


def too_many_classes(input_shape, num_classes):
    return build(input_shape, num_classes + 1)


NOT_CALLABLE = 3
'''


@pytest.fixture
def in_user_directory(tmp_path, monkeypatch):
    """A directory holding the user's modules, as the current directory (not on `sys.path`)."""
    (tmp_path / f"{MODULE}.py").write_text(USER_NETWORKS)
    (tmp_path / "broken_networks.py").write_text("import a_package_that_is_not_installed\n")
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    for name in (MODULE, "broken_networks"):
        sys.modules.pop(name, None)


def test_a_user_function_builds_the_network(in_user_directory):
    model = build_model(f"{MODULE}:build", (4, 4, 1), 3)
    assert model.name == "user_net" and model.outputs[0].shape == (None, 3)
    assert not model.compiled
    assert str(in_user_directory) not in sys.path  # the current directory was on it for the import only


CALL = f"{MODULE}:{{}}(input_shape=(4,), num_classes=3)"


@pytest.mark.parametrize(
    "function, message",
    [
        ("raises", f"--model {CALL.format('raises')} raised RuntimeError: no weights here. Fix the function "
                   "(call it alone to see the traceback). "
                   f"Received: --model={MODULE}:raises"),
        ("not_a_model", f"--model {CALL.format('not_a_model')} must return a keras.Model. Received: a str from "
                        f"--model={MODULE}:not_a_model"),
        ("compiled", f"--model {CALL.format('compiled')} returned a compiled model; the recipe compiles it "
                     "(optimizer, schedule, loss). Return it before model.compile(). "
                     f"Received: --model={MODULE}:compiled"),
        ("softmax", f"--model {CALL.format('softmax')} ends in a softmax; the recipe's loss takes logits. Drop the "
                    f"last layer's activation. Received: --model={MODULE}:softmax"),
        ("too_many_classes", f"--model {CALL.format('too_many_classes')} must return a model with one output of "
                             f"shape (batch, 3); it outputs (None, 4). Received: --model={MODULE}:too_many_classes"),
        ("NOT_CALLABLE", "--model must name a function (input_shape, num_classes) -> uncompiled keras.Model with "
                         f"num_classes logits; {MODULE}:NOT_CALLABLE is of type int. "
                         f"Received: --model={MODULE}:NOT_CALLABLE"),
        ("missing", f"--model names missing, which module {MODULE} ("),
    ],
)
def test_a_bad_user_function_is_one_usage_error(in_user_directory, function, message):
    with pytest.raises(UsageError) as raised:
        build_model(f"{MODULE}:{function}", (4,), 3)
    assert str(raised.value).startswith(message)


def test_a_module_that_cannot_be_imported_says_which_and_why(in_user_directory):
    with pytest.raises(UsageError) as raised:
        build_model("broken_networks:build", (4,), 3)
    assert str(raised.value) == (
        "--model cannot import module broken_networks (ModuleNotFoundError: No module named "
        "'a_package_that_is_not_installed'). Run from the directory that holds it or put it on PYTHONPATH. "
        "Received: --model=broken_networks:build")


@pytest.mark.parametrize("model", ["vgg", "my_models.build", ":build", "my_models:"])
def test_a_model_that_is_neither_built_in_nor_module_colon_function(model):
    with pytest.raises(UsageError) as raised:
        RunConfig(data="digits", model=model)
    assert str(raised.value) == (
        "--model must be one of auto, fast_resnet, small_cnn, mlp, or package.module:function naming a function "
        "(input_shape, num_classes) -> uncompiled keras.Model with num_classes logits, e.g. my_models:build. "
        f"Received: --model={model}")


def _save(folder, **arrays):
    """Each array to `folder/NAME.npy`; the paths joined by commas, in order."""
    for name, array in arrays.items():
        np.save(folder / f"{name}.npy", array, allow_pickle=True)
    return ",".join(str(folder / f"{name}.npy") for name in arrays)


def test_two_npy_files_split_off_a_seeded_fifth_as_test_rows(tmp_path):
    x = np.arange(20, dtype="uint8").reshape(10, 2)
    spec = _save(tmp_path, x=x, y=np.arange(10) % 3)
    (x_train, y_train), (x_test, y_test) = load_arrays(spec, seed=1)
    assert len(x_train) == 8 and len(x_test) == 2
    # Every row once, each with its own label, scaled as pixels.
    first = np.rint(np.concatenate([x_train, x_test])[:, 0] * 255).astype(int)
    assert sorted(first.tolist()) == list(range(0, 20, 2))
    np.testing.assert_array_equal(np.concatenate([y_train, y_test]), (first // 2) % 3)
    assert np.array_equal(load_arrays(spec, seed=1)[1][0], x_test)  # the seed decides


def test_four_npy_files_are_train_and_test(tmp_path):
    spec = _save(tmp_path, a=np.ones((6, 3), "float32"), b=np.zeros(6, "int64"),
                 c=np.ones((2, 3), "float32"), d=np.ones(2, "int64"))
    (x_train, y_train), (x_test, y_test) = load_arrays(spec)
    assert x_train.shape == (6, 3) and x_test.shape == (2, 3) and y_test.tolist() == [1, 1]


@pytest.mark.parametrize(
    "arrays, message",
    [
        ({"x": np.array([None] * 4), "y": np.zeros(4, int)},
         "x.npy is not a readable .npy of a numeric array (Object arrays cannot be loaded when allow_pickle=False)."),
        ({"x": np.zeros((4, 3)), "y": np.zeros(5, int)},
         "labels must be 4 values, one per input row: integer classes, float targets or class names. "
         "Received shape (5,), dtype int64."),
        ({"x": np.zeros((4, 3)), "y": np.zeros(4, bool)},
         "labels must be 4 values, one per input row: integer classes, float targets or class names. "
         "Received shape (4,), dtype bool."),
        ({"x": np.zeros((4, 3)), "y": np.zeros(4, int), "z": np.zeros(4, int)},
         "--data takes 2 or 4 .npy files separated by commas, X.npy,Y.npy or "
         "X_TRAIN.npy,Y_TRAIN.npy,X_TEST.npy,Y_TEST.npy. Received: --data="),
    ],
    ids=["pickled objects", "row counts", "bool labels", "three files"],
)
def test_bad_npy_data_is_one_usage_error(tmp_path, arrays, message):
    with pytest.raises(UsageError) as raised:
        load_arrays(_save(tmp_path, **arrays))
    assert message in str(raised.value)


def test_a_missing_npy_file_and_an_archive_named_npy(tmp_path):
    with pytest.raises(UsageError, match=r"^--data missing\.npy does not exist\.$"):
        load_arrays("missing.npy,y.npy")
    np.savez(tmp_path / "archive.npz", x=np.zeros(3))
    (tmp_path / "archive.npz").rename(tmp_path / "archive.npy")
    with pytest.raises(UsageError) as raised:
        load_inputs(str(tmp_path / "archive.npy"))
    assert str(raised.value) == (f"--data {tmp_path / 'archive.npy'} is an .npz archive, not one .npy array: "
                                 "rename it to .npz.")


@pytest.fixture
def trained(in_user_directory):
    """`kadapt train --model MODULE:build --data x.npy,y.npy`, in-process, 2 steps."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 6)).astype("float32")
    _save(in_user_directory, x=x, y=(x[:, 0] > 0).astype("int64"))
    assert cli.main(["train", "--data", "x.npy,y.npy", "--model", f"{MODULE}:build", "--batch-size", "16",
                     "--memory-budget", "256MiB", "--meta", "off", "--epochs", "1", "--max-steps", "2",
                     "--out", "run"]) == 0
    return in_user_directory / "run"


def test_train_predict_and_resume_a_user_network_on_npy_files(trained, capsys):
    config = json.loads((trained / "config.json").read_text())
    assert config["options"]["model"] == config["resolved"]["model"] == f"{MODULE}:build"
    assert config["resolved"]["data"]["train_rows"] == 29 and config["resolved"]["data"]["test_rows"] == 8
    assert cli.main(["predict", str(trained), "--data", "x.npy", "--output", "p.csv", "--probabilities"]) == 0
    assert cli.main(["predict", str(trained), "--data", "x.npy,y.npy", "--output", "classes.npy"]) == 0
    assert "accuracy" in capsys.readouterr().out
    probabilities = np.loadtxt(trained.parent / "p.csv", delimiter=",", skiprows=1)
    assert (trained.parent / "p.csv").read_text().splitlines()[0] == "class_0,class_1"
    assert probabilities.shape == (40, 2)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(probabilities.argmax(axis=1), np.load(trained.parent / "classes.npy"))
    # --resume imports the recorded function again, here from a fresh import.
    run = json.loads((trained / "run.json").read_text())
    (trained / "run.json").write_text(json.dumps({**run, "status": "interrupted"}))
    sys.modules.pop(MODULE)
    resumed = start_run(dict.fromkeys(("data", "model")), str(trained), resume=True)
    assert resumed.plan.network == f"{MODULE}:build" and resumed.model.name == "user_net"
    assert MODULE in sys.modules


def test_predict_refuses_probabilities_without_an_output_file():
    with pytest.raises(SystemExit) as raised:
        cli.main(["predict", "no_run", "--data", "x.npy", "--probabilities"])
    assert str(raised.value) == ("kadapt: error: --probabilities writes to --output: add --output "
                                 "probabilities.npy (or .csv).")


def test_predict_names_a_layer_class_it_cannot_load_without_importing_user_code(tmp_path):
    import keras

    class Twice(keras.layers.Layer):  # not registered: found only by importing the code that defines it
        def call(self, inputs):
            return 2 * inputs

    keras.Sequential([keras.Input((3,)), Twice(), keras.layers.Dense(2)]).save(tmp_path / "model.keras")
    with pytest.raises(SystemExit) as raised:
        cli.main(["predict", str(tmp_path), "--data", "x.npy"])
    assert str(raised.value) == (
        f"kadapt: error: {tmp_path / 'model.keras'} uses the class Twice, which kadapt predict cannot load (it "
        "imports no user code). Load it in Python: import the module that defines it (decorated with "
        "@keras.saving.register_keras_serializable()), then kadapt.load_model.")
