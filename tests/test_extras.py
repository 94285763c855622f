"""Each optional feature, its package missing: one ImportError naming the extra that installs it."""

import importlib
import subprocess
import sys
import textwrap

import pytest

import kadapt.meta
from kadapt import extras
from kadapt.meta.records import tasks

OPTIONAL_MODULES = ("keras_tuner", "matplotlib", "psycopg", "sklearn", "sqlalchemy", "tensorboard")


def fresh_import(monkeypatch, module):
    """Imports `module` anew (the test's sys.modules is restored afterwards)."""
    monkeypatch.delitem(sys.modules, module, raising=False)
    return importlib.import_module(module)


def block(monkeypatch, package):
    """Importing `package` or any module in it raises ImportError, as when it is not installed."""
    for name in [name for name in sys.modules if name.startswith(f"{package}.")] + [package]:
        monkeypatch.setitem(sys.modules, name, None)


def test_require_returns_the_module():
    assert extras.require("json", extra="store") is sys.modules["json"]


def test_require_names_the_extra(monkeypatch):
    block(monkeypatch, "matplotlib")
    message = r'matplotlib.figure`, which cannot be imported .*pip install "kadapt\[plots\]"'
    with pytest.raises(extras.MissingExtraError, match=message):
        extras.require("matplotlib.figure", extra="plots")


def test_the_command_reports_a_missing_extra_in_one_line(monkeypatch, tmp_path):
    from kadapt import cli

    block(monkeypatch, "sklearn")
    with pytest.raises(SystemExit, match=r'^kadapt: error: Loading scikit-learn.*pip install "kadapt\[data\]"$'):
        cli.main(["meta", "collect", "--families", "digits", "--tasks-per-family", "1",
                  "--store", str(tmp_path / "records.sqlite")])


def test_require_rejects_an_unknown_extra():
    with pytest.raises(ValueError, match=r"Argument `extra` must be one of .* Received: extra='plot'"):
        extras.require("matplotlib", extra="plot")


def test_record_store_without_sqlalchemy(monkeypatch):
    block(monkeypatch, "sqlalchemy")
    monkeypatch.delitem(vars(kadapt.meta), "RecordStore", raising=False)  # as if never loaded
    monkeypatch.delitem(sys.modules, "kadapt.meta.records.record_store", raising=False)
    with pytest.raises(ImportError, match=r'^The record store .*pip install "kadapt\[store\]"$'):
        from kadapt.meta import RecordStore  # noqa: F401


def test_postgres_store_without_psycopg(monkeypatch):
    from kadapt.meta import RecordStore

    block(monkeypatch, "psycopg")
    message = r'^A record store on a PostgreSQL server .*pip install "kadapt\[postgres\]"$'
    with pytest.raises(ImportError, match=message):
        RecordStore("postgresql://kadapt@localhost:1/records")


def test_plots_without_matplotlib(monkeypatch, tmp_path):
    from kadapt.run import plots

    block(monkeypatch, "matplotlib")
    steps = [{"step": 1, "learning_rate": 0.1, "momentum": 0.9, "loss": 1.0}]
    with pytest.raises(ImportError, match=r'^Drawing the run directory\'s plots .*pip install "kadapt\[plots\]"$'):
        plots.plot_training(steps, [], {}, tmp_path / "training.png")


@pytest.mark.parametrize("module", ["kadapt.tuning.accumulating_hyper_model", "kadapt.meta.model.hyper_model",
                                    "kadapt.meta.records.train"])
@pytest.mark.parametrize("missing", ["keras_tuner", "tensorboard"])
def test_tuner_without_keras_tuner_or_tensorboard(monkeypatch, module, missing):
    block(monkeypatch, missing)
    with pytest.raises(ImportError, match=rf'^A KerasTuner search .*`{missing}`.*pip install "kadapt\[tuner\]"$'):
        fresh_import(monkeypatch, module)


@pytest.mark.parametrize("family", ["digits", "moons"])
def test_bundled_data_without_sklearn(monkeypatch, family):
    block(monkeypatch, "sklearn")
    message = r'^Loading scikit-learn\'s bundled data sets .*pip install "kadapt\[data\]"$'
    with pytest.raises(ImportError, match=message):
        tasks.load_family(family, seed=0)


def test_core_trains_without_any_extra():
    blocked = "; ".join(f"sys.modules[{name!r}] = None" for name in OPTIONAL_MODULES)
    script = textwrap.dedent(f"""
        import sys
        {blocked}
        import keras, numpy as np
        import kadapt
        from kadapt.meta import MetaAdjuster, load_meta_model
        MetaAdjuster(), load_meta_model()  # the adjuster and its default meta-model need no extra
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model = kadapt.accumulate(model, micro_batch_size=2)
        model.compile(optimizer="sgd", loss="mse")
        history = model.fit(np.ones((4, 3)), np.zeros((4, 2)), batch_size=4, epochs=1, verbose=0)
        print(len(history.history["loss"]), model.optimizer.iterations.numpy())
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-2:] == ["1", "1"]


def test_require_tensorflow_returns_it_on_the_tensorflow_backend():
    import tensorflow as tf

    assert extras.require_tensorflow("Multi-worker training") is tf


def test_require_tensorflow_refuses_another_backend(monkeypatch):
    import keras

    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    message = r"^Multi-worker training runs on Keras' TensorFlow backend only; this process runs Keras on 'jax'"
    with pytest.raises(extras.UnsupportedBackendError, match=message):
        extras.require_tensorflow("Multi-worker training")
