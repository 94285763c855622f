"""`kadapt.environment` on any CPU: a process whose TensorFlow keeps no CPU
allocator statistics (oneDNN off, as on some CPUs by default, forced here by
`TF_ENABLE_ONEDNN_OPTS=0`) gets one clear error from the library, and the
`kadapt` command configures TensorFlow itself and starts quietly. Each
configuration runs in a fresh subprocess, since TensorFlow reads its settings
once, at import."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from helpers import write_tiny_npz

from kadapt import environment

VARIABLES = (environment.ONEDNN, environment.BFC, environment.LOG_LEVEL)


def clean_env(**settings):
    """This process's environment without TensorFlow's settings, plus `settings`."""
    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    env.update(settings)
    return env


def run_python(code, env):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=240)


def run_kadapt(*args, env, cwd=None):
    return subprocess.run([sys.executable, "-m", "kadapt.cli", *map(str, args)], env=env,
                          cwd=cwd, capture_output=True, text=True, timeout=240)


def cpp_log_lines(stderr):
    return [line for line in stderr.splitlines() if environment.is_tensorflow_log_line(line)]


def test_configure_sets_only_what_the_user_left_unset(monkeypatch):
    monkeypatch.delitem(sys.modules, "tensorflow")  # as before the first import
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(environment.ONEDNN, "0")
    applied = environment.configure_tensorflow()
    assert applied == {environment.LOG_LEVEL: "2"}
    assert os.environ[environment.ONEDNN] == "0"


def test_configure_after_tensorflow_is_imported_changes_nothing(monkeypatch):
    monkeypatch.delenv(environment.ONEDNN, raising=False)
    assert environment.configure_tensorflow() == {}
    assert environment.ONEDNN not in os.environ


@pytest.mark.parametrize("line, expected", [
    ("I0000 00:00:1796118168.848942    2437 cudart_stub.cc:31] Could not find cuda drivers", True),
    ("E0000 00:00:1796118171.486620    2437 cuda_platform.cc:52] failed call to cuInit: INTERNAL", True),
    ("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR", True),
    ("kadapt: error: --batch-size must be a positive int", False),
    ("UserWarning: something Python said", False),
])
def test_tensorflow_log_lines_are_told_from_others(line, expected):
    assert environment.is_tensorflow_log_line(line) is expected


SEPARATOR = "-- the next command --"
NO_STATISTICS_SCRIPT = """
    import json
    import sys
    import kadapt

    result = {{"before": "tensorflow" in sys.modules}}
    from kadapt.cli import main

    # The kadapt command first, which loads TensorFlow; a line on each stream ends its output.
    try:
        result["command"] = [main(["probe", "--model", "mlp", "--input-shape", "8", "--batch-size", "32",
                                   "--memory-budget", "64MiB"]), None]
    except SystemExit as stopped:  # Python would print the message and exit with status 1
        result["command"] = [1, str(stopped.code)]
    for stream in (sys.stdout, sys.stderr):
        print({separator!r}, file=stream, flush=True)
    result["after"] = "tensorflow" in sys.modules
    import keras, numpy as np, tensorflow as tf

    model = kadapt.load_model({path!r})
    result["loaded"] = [type(model).__name__, type(model.optimizer).__name__,
                        model.optimizer.get_config()["learning_rate"]["class_name"]]
    result["statistics"] = kadapt.environment.allocator_statistics_available("CPU:0")
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).random((64, 4), dtype=np.float32)
    y = np.zeros(64, dtype=np.int64)

    def compiled(*layers):
        model = keras.Sequential([keras.Input((4,)), *layers, keras.layers.Dense(2)])
        model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    def error_of(call):
        try:
            call()
        except Exception as error:
            return [type(error).__name__, isinstance(error, RuntimeError), str(error)]
        return None

    result["probe"] = error_of(lambda: kadapt.probe_micro_batch(compiled(), (x, y), memory_budget="64MiB"))
    auto = kadapt.accumulate(compiled(), "auto", memory_budget="64MiB")
    result["auto"] = error_of(lambda: auto.fit(x, y, batch_size=32, epochs=1, verbose=0))

    class AllocatesPastRows(keras.layers.Layer):
        # Out of memory above 8 rows: the real CPU allocator refuses 2**36 floats.
        def call(self, inputs):
            rows = tf.shape(inputs)[0]
            junk = tf.cond(rows > 8, lambda: tf.reduce_sum(tf.random.uniform([2**36])),
                           lambda: tf.constant(0.0))
            return inputs + 0.0 * junk

    recovering = kadapt.accumulate(compiled(AllocatesPastRows()), 16)
    history = recovering.fit(x, y, batch_size=32, epochs=1, verbose=0, shuffle=False)
    result["oom_events"] = recovering.oom_events
    result["steps"] = int(recovering.optimizer.iterations.numpy())
    print(json.dumps(result))
"""


def saved_kadapt_model(path):
    """A model of kadapt's wrapper, optimizer and schedule, saved to `path` by this process."""
    import keras

    import kadapt

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    schedule = kadapt.CosineAnnealing(0.1, 0.001, total_steps=10)
    model.compile(optimizer=kadapt.optimizers.SGD(schedule, momentum=0.9), loss="mse")
    trainer = kadapt.accumulate(model, 4)
    trainer(np.zeros((1, 3), "float32"))
    trainer.save(path)
    return path


@pytest.fixture(scope="module")
def without_statistics(tmp_path_factory):
    """One fresh process whose user set oneDNN off: kadapt imported first, `kadapt probe`, a model
    saved here loaded there, then the library's calls that need allocator statistics."""
    path = saved_kadapt_model(tmp_path_factory.mktemp("fresh") / "model.keras")
    done = run_python(NO_STATISTICS_SCRIPT.format(path=str(path), separator=SEPARATOR),
                      clean_env(**{environment.ONEDNN: "0"}))
    assert done.returncode == 0, done.stderr[-3000:]
    (stdout, rest), stderr = done.stdout.split(SEPARATOR + "\n"), done.stderr.split(SEPARATOR + "\n")[0]
    return {**json.loads(rest.strip().splitlines()[-1]), "command_output": (stdout, stderr)}


def test_the_configuration_without_statistics_has_none(without_statistics):
    assert without_statistics["statistics"] is False


@pytest.mark.parametrize("entry", ["probe", "auto"])
def test_probing_without_statistics_raises_one_clear_runtime_error(without_statistics, entry):
    name, is_runtime_error, message = without_statistics[entry]
    assert (name, is_runtime_error) == ("AllocatorStatisticsError", True)
    assert "TF_ENABLE_ONEDNN_OPTS=1 before TensorFlow is imported" in message
    assert "set here: TF_ENABLE_ONEDNN_OPTS='0'" in message
    assert "Cannot reset memory stats" not in message


def test_out_of_memory_recovery_without_statistics_shrinks_without_a_memory_model(without_statistics):
    # No probe ran, so no memory model: the micro-batch shrinks by 0.75 until it fits.
    assert without_statistics["oom_events"] == [[0, 16, 12], [0, 12, 9], [0, 9, 6]]
    assert without_statistics["steps"] == 2


COMMANDS_SCRIPT = """
    import sys
    from kadapt.cli import main

    probe = main(["probe", "--model", "mlp", "--input-shape", "8", "--batch-size", "32",
                  "--memory-budget", "64MiB"])
    for stream in (sys.stdout, sys.stderr):
        print({separator!r}, file=stream, flush=True)
    train = main(["train", "--data", {data!r}, "--model", "small_cnn", "--batch-size", "16",
                  "--memory-budget", "256MiB", "--meta", "off", "--epochs", "1", "--out", {out!r}])
    sys.exit(probe or train)
"""


@pytest.fixture(scope="module")
def probe_then_train(tmp_path_factory):
    """`kadapt probe`, then `kadapt train`, in one process started without TensorFlow's
    settings: the first loads TensorFlow; a line between them splits their output."""
    directory = tmp_path_factory.mktemp("commands")
    data = write_tiny_npz(directory / "tiny.npz")
    done = run_python(COMMANDS_SCRIPT.format(separator=SEPARATOR, data=str(data), out=str(directory / "run")),
                      clean_env())
    assert done.returncode == 0, done.stderr[-3000:]
    stdout, stderr = done.stdout.split(SEPARATOR + "\n"), done.stderr.split(SEPARATOR + "\n")
    return {"probe": (stdout[0], stderr[0]), "train": (stdout[1], stderr[1]), "run": directory / "run"}


def test_kadapt_probe_configures_tensorflow_and_starts_quietly(probe_then_train):
    stdout, stderr = probe_then_train["probe"]
    assert "chosen micro-batch:" in stdout
    assert stdout.startswith("threads: one inter-op thread under a memory budget on the CPU, so that a step's "
                             "peak holds still (set TF_NUM_INTEROP_THREADS to choose)\n")
    assert stderr == ""


def test_steady_peaks_leaves_the_users_threads_and_a_started_tensorflow_alone(monkeypatch):
    import tensorflow as tf

    tf.constant(1.0)  # this process's TensorFlow has started (the suite's ops ran before)
    monkeypatch.delenv(environment.INTEROP_THREADS, raising=False)
    if tf.config.threading.get_inter_op_parallelism_threads() != 1:
        assert environment.steady_peaks(tf) == ("TensorFlow's own inter-op threads (it had already started in "
                                                "this process)")
    monkeypatch.setenv(environment.INTEROP_THREADS, "3")
    assert environment.steady_peaks(tf) == "TF_NUM_INTEROP_THREADS=3 (yours)"


def test_kadapt_probe_fact_sheet_in_json_and_verbose_start_up_lines():
    done = run_kadapt("--verbose", "probe", "--json", env=clean_env())
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout)
    cpu = next(d for d in facts["devices"] if d["device"] == "CPU:0")
    assert cpu["allocator_statistics"] is True and cpu["total_bytes"] > 0
    assert cpu["allocator"] == "TensorFlow's default CPU allocator"
    assert facts["tensorflow"]["onednn"] == "on"
    assert facts["tensorflow"]["onednn_variable"] == "TF_ENABLE_ONEDNN_OPTS=1"
    assert "probe" not in facts
    assert any("oneDNN custom operations are on" in line for line in cpp_log_lines(done.stderr))


def test_a_users_setting_is_respected_shown_and_the_probe_says_what_to_change(without_statistics):
    stdout, stderr = without_statistics["command_output"]
    cpu_line = next(line for line in stdout.splitlines() if line.startswith("CPU:0"))
    assert "  no  " in cpu_line  # the fact sheet: no statistics with oneDNN off
    assert "oneDNN CPU kernels: off (TF_ENABLE_ONEDNN_OPTS=0)" in stdout
    status, message = without_statistics["command"]
    assert status == 1 and stderr == ""  # the exit message is its one line
    assert message.startswith("kadapt: error: TensorFlow keeps no allocator") and "\n" not in message
    assert "TF_ENABLE_ONEDNN_OPTS=1" in message


def test_a_log_level_the_user_set_shows_the_lines_it_lets_through():
    done = run_kadapt("probe", "--json", env=clean_env(**{environment.LOG_LEVEL: "0"}))
    assert done.returncode == 0, done.stderr[-3000:]
    assert cpp_log_lines(done.stderr)


def test_kadapt_train_probes_and_trains_quietly(probe_then_train):
    stdout, stderr = probe_then_train["train"]
    assert "trial micro-batch" in stdout
    assert stdout.startswith("threads: one inter-op thread under a memory budget")  # as the probe before it
    assert (probe_then_train["run"] / "probe.json").is_file()
    assert stderr == ""


def test_import_kadapt_leaves_tensorflow_unloaded_until_a_name_is_used(without_statistics):
    assert (without_statistics["before"], without_statistics["after"]) == (False, True)


def test_load_model_knows_kadapts_objects_in_a_fresh_process(without_statistics):
    assert without_statistics["loaded"] == ["AccumulatingWrapper", "SGD", "CosineAnnealing"]
