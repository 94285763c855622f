"""`choose_optimizer`: the recipe's SGD for fast_resnet on images, Adam for any other network; what
the user gives stands. And the recipe compiles the optimizer the config names."""

import pytest

from kadapt.recipes.config import OPTIMIZERS
from kadapt.recipes.config import FastFitConfig
from kadapt.recipes.optimizer_choice import MEASURED
from kadapt.recipes.optimizer_choice import choose_optimizer


@pytest.mark.parametrize("network", ["fast_resnet", "small_cnn"])
def test_kadapts_image_networks_on_images_keep_the_recipes_sgd(network):
    choice = choose_optimizer(network, images=True)
    assert (choice.optimizer, choice.learning_rate, choice.schedule) == ("sgd", 0.2, "triangular")


@pytest.mark.parametrize("network, images", [("mlp", False), ("mlp", True), ("own_model:build", True),
                                             ("fast_resnet", False)])
def test_any_other_network_gets_adam_at_its_measured_rate(network, images):
    choice = choose_optimizer(network, images)
    assert (choice.optimizer, choice.learning_rate, choice.schedule) == ("adam", *MEASURED["adam"])
    assert "benchmarks/README.md#table_recipe" in choice.reason
    assert choice.reason.startswith(f"{network} is not one of kadapt's image networks" if images else
                                    "rows that are not images: Adam")


def test_what_the_user_gives_stands():
    choice = choose_optimizer("mlp", False, optimizer="sgd", learning_rate="auto", schedule="cosine")
    assert (choice.optimizer, choice.learning_rate, choice.schedule, choice.reason) == (
        "sgd", "auto", "cosine", "--optimizer sgd")
    assert choose_optimizer("fast_resnet", True, learning_rate=0.05).learning_rate == 0.05


def test_every_optimizer_name_has_measured_defaults_and_a_builder():
    from kadapt.recipes.training import OPTIMIZER_BUILDERS

    assert set(MEASURED) == set(OPTIMIZERS) == set(OPTIMIZER_BUILDERS)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_the_recipe_compiles_the_named_optimizer(name):
    import keras

    from kadapt.optimizers import SGD
    from kadapt.optimizers import Adam
    from kadapt.optimizers import FilterMuon
    from kadapt.optimizers import Prodigy
    from kadapt.optimizers import ScheduleFreeAdamW
    from kadapt.optimizers import ScheduleFreeSGD
    from kadapt.recipes.training import recipe_optimizer

    optimizer = recipe_optimizer(FastFitConfig(optimizer=name, schedule="constant", learning_rate=0.01), 10)
    assert type(optimizer) is {"sgd": SGD, "adam": Adam, "prodigy": Prodigy, "schedule_free_adamw": ScheduleFreeAdamW,
                               "schedule_free_sgd": ScheduleFreeSGD, "muon": keras.optimizers.Muon,
                               "muon_filters": FilterMuon}[name]
    assert float(optimizer.learning_rate.numpy()) == pytest.approx(0.01)


def test_an_unchosen_optimizer_is_refused_by_the_recipe():
    from kadapt.recipes.training import recipe_optimizer

    with pytest.raises(ValueError, match="choose one first with `kadapt.recipes.optimizer_choice.choose_optimizer`"):
        recipe_optimizer(FastFitConfig(), 10)


def test_an_unknown_optimizer_is_refused():
    with pytest.raises(ValueError, match=r"`optimizer` must be one of auto, sgd, adam, prodigy, "
                                         r"schedule_free_adamw, schedule_free_sgd, muon, muon_filters. Received: optimizer='lion'"):
        FastFitConfig(optimizer="lion")


def test_kadapt_train_with_prodigy_trains_at_its_reference_defaults(tmp_path, monkeypatch):
    """`--optimizer prodigy`: Prodigy at rate 1.0, constant (its reference defaults), recorded in
    config.json; on well separated classes it ends far above chance."""
    import json

    from helpers import write_separable_rows
    from kadapt.run.pipeline import start_run
    from kadapt.run.pipeline import train

    data = write_separable_rows(tmp_path, scale=100)
    monkeypatch.chdir(tmp_path)
    run = start_run({"data": data, "model": "mlp", "optimizer": "prodigy", "epochs": 3, "meta": "off"},
                    str(tmp_path / "run"))
    record = train(run, echo=lambda line: None, verbose=0)
    resolved = json.loads((tmp_path / "run" / "config.json").read_text())["resolved"]
    assert resolved["optimizer"]["optimizer"] == "prodigy"
    assert (resolved["recipe"]["learning_rate"], resolved["recipe"]["schedule"]) == (1.0, "constant")
    assert type(run.model.optimizer).__name__ == "Prodigy"
    assert record["test_accuracy"] > 0.9


def test_kadapt_train_says_muon_filters_falls_back_on_a_network_without_filters(tmp_path, monkeypatch):
    from helpers import write_separable_rows
    from kadapt.run.pipeline import start_run
    from kadapt.run.pipeline import train

    data = write_separable_rows(tmp_path, scale=100)
    monkeypatch.chdir(tmp_path)
    run = start_run({"data": data, "model": "mlp", "optimizer": "muon_filters", "epochs": 1, "meta": "off"},
                    str(tmp_path / "run"))
    lines = []
    train(run, echo=lines.append, verbose=0)
    assert [line for line in lines if "falls back" in line] == [
        f"optimizer: --optimizer muon_filters falls back to its AdamW step on every weight: {run.model.name} has no "
        "convolution filter (3 to 5 dimensions) for Muon's orthogonalized step (--optimizer muon: its 2-D kernels; "
        "or adam)"]
