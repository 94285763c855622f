"""`kadapt probe` / tools/probe_gpu.py on the CPU."""

import json

import keras
import pytest

from kadapt import cli


def test_probe_json_for_a_builtin(capsys):
    code = cli.main(["probe", "--model", "mlp", "--input-shape", "20", "--batch-size", "64",
                     "--memory-budget", "1GiB", "--json"])
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert code == 0
    assert report["plan"]["logical_batch_size"] == 64
    assert report["plan"]["micro_batch_size"] == report["probe"]["micro_batch_size"]
    assert any(d["device"] == "CPU:0" and d["total_bytes"] > 0 for d in report["devices"])
    assert "trial micro-batch" in captured.err  # progress lines go to stderr with --json


def test_probe_table_for_a_keras_file(tmp_path, capsys):
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4)])
    path = tmp_path / "model.keras"
    model.save(path)
    cli.main(["probe", "--model", str(path), "--batch-size", "32", "--memory-budget", "512MiB"])
    out = capsys.readouterr().out
    assert "micro-batch   peak MiB  samples/s  fits" in out
    assert "plan: logical batch 32 = 1 micro-batch(es) of 32" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "missing.keras"], "--model must be an existing .keras file"),
        (["--model", "mlp", "--input-shape", "a,b"], "--input-shape must be positive ints"),
        (["--model", "mlp", "--input-shape", "0,3"], "Received: --input-shape=0,3"),
        (["--input-shape", "8"], "kadapt: error: --input-shape describes a built-in --model"),
        (["--model", "mlp", "--input-shape", "4", "--memory-budget", "lots"], "--memory-budget could not be parsed"),
    ],
)
def test_bad_arguments_end_in_one_line_before_any_output(argv, message, capsys):
    with pytest.raises(SystemExit, match=message) as raised:
        cli.main(["probe", *argv])
    assert str(raised.value).startswith("kadapt: error: ")
    assert capsys.readouterr().out == ""


def test_probe_refuses_a_batch_size_that_is_not_positive(capsys):
    with pytest.raises(SystemExit, match=r"kadapt: error: --batch-size must be a positive int .* Received: --batch-size=0"):
        cli.main(["probe", "--model", "mlp", "--input-shape", "4", "--batch-size", "0"])
