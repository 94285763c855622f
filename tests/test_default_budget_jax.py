"""`kadapt train` on JAX: no `--memory-budget` needed on its CPU, which reports no memory limit (issue 45
item 0)."""

import json

import numpy as np
import pytest

pytestmark = pytest.mark.backends("jax")


def test_kadapt_train_on_jax_probes_within_half_the_available_ram_without_a_budget(tmp_path, monkeypatch):
    from kadapt.run import pipeline

    monkeypatch.delenv("KADAPT_MEMORY_BUDGET", raising=False)
    monkeypatch.setattr(pipeline, "trivially_fits", lambda bound, budget: False)  # the probe runs
    rng = np.random.default_rng(0)
    np.save(tmp_path / "x.npy", rng.normal(size=(60, 4)).astype("float32"))
    np.save(tmp_path / "y.npy", np.arange(60) % 3)
    monkeypatch.chdir(tmp_path)
    lines = []
    run = pipeline.start_run({"data": "x.npy,y.npy", "model": "mlp", "epochs": 1, "meta": "off", "max_steps": 2},
                             str(tmp_path / "run"))
    pipeline.train(run, echo=lines.append, verbose=0)
    budget = json.loads((tmp_path / "run" / "probe.json").read_text())["budget"]
    assert budget["source"] == f"50% of available RAM; {budget['device']} reports no memory limit"
    assert [line for line in lines if line.startswith("probing mlp on ")] == [
        f"probing mlp on {budget['device']}, budget {budget['bytes'] / 2**20:.1f} MiB ({budget['source']})"]
    assert not any("too small" in line for line in lines)


def test_a_default_budget_too_small_names_it_and_the_flag(tmp_path, monkeypatch):
    from kadapt.batching.jax import probe as jax_probe
    from kadapt.run import pipeline
    from kadapt.run.errors import UsageError

    monkeypatch.delenv("KADAPT_MEMORY_BUDGET", raising=False)
    monkeypatch.setattr(pipeline, "trivially_fits", lambda bound, budget: False)
    monkeypatch.setattr(jax_probe, "available_ram", lambda: 2000)
    rng = np.random.default_rng(0)
    np.save(tmp_path / "x.npy", rng.normal(size=(60, 4)).astype("float32"))
    np.save(tmp_path / "y.npy", np.arange(60) % 3)
    monkeypatch.chdir(tmp_path)
    run = pipeline.start_run({"data": "x.npy,y.npy", "model": "mlp", "epochs": 1, "meta": "off"}, str(tmp_path / "run"))
    with pytest.raises(UsageError, match=r"^The default memory budget \(0 MiB, 50% of available RAM; .* reports no "
                                         r"memory limit\) is too small for this model: it is smaller"):
        pipeline.train(run, echo=lambda line: None, verbose=0)
