"""`train_meta_model`: KerasTuner search with a split by task family, then a report and a file."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from typing import Any
from pathlib import Path

import keras
import numpy as np

from kadapt.extras import require
from kadapt.meta.model.adjustment_record import AdjustmentRecord
from kadapt.meta.model.ensemble import pack_ensemble
from kadapt.meta.model.hyper_model import MetaHyperModel
from kadapt.meta.model.meta_model import decision_data
from kadapt.meta.model.meta_model import evaluate_policies
from kadapt.tuning.distributed_search import distributed_search
from kadapt.validation import check_range

keras_tuner = require("keras_tuner", extra="tuner")
require("tensorboard", extra="tuner")  # KerasTuner imports it in every trial on the TensorFlow backend

BATCH_SIZE = 64
PATIENCE = 5
MIN_GAIN_SWEEP = (0.0, 0.02, 0.05, 0.1, 0.2)  # abstention thresholds the report compares per held-out family


def train_meta_model(store: Iterable[AdjustmentRecord], directory: str | os.PathLike,
                     output: str | os.PathLike | None = None, *, validation_families: Sequence[str] | None = None,
                     max_trials: int = 8, epochs: int = 40, seed: int = 0,
                     verbose: int = 0, ensemble: int = 1) -> tuple[keras.Model | None, dict[str, Any] | None]:
    """Searches the meta-model's architecture on a store's records and saves the best.

    The search (`keras_tuner.RandomSearch` over `MetaHyperModel`, objective
    `val_loss`) validates on whole task families the training part never
    contains. The report then holds each family out in turn: a model with the
    best hyperparameters is trained on the other families and judged on it
    (accuracy: it picks the best candidate; regret: score lost against the
    best), beside always-keep and the rule baseline, and the regret at each
    abstention threshold of `MIN_GAIN_SWEEP`. The saved model is
    trained on every family for the median early-stopped epoch count. With
    `ensemble` K > 1, every model (the report's and the saved one) is K fits
    of the best hyperparameters from seeds `seed` ... `seed + K - 1`, packed
    into one model that averages them (`kadapt.meta.model.ensemble.pack_ensemble`).

    Under KerasTuner's distributed mode (`KERASTUNER_TUNER_ID`,
    `KERASTUNER_ORACLE_IP`, `KERASTUNER_ORACLE_PORT`; see
    `kadapt.tuning.DistributedSearch`) every process runs this with the same
    arguments and a shared `directory`. The chief serves the search until all
    trials have ended, then alone reports, trains and saves; a worker runs
    trials, writes no output and returns `(None, None)`.

    Args:
        store: `kadapt.meta.RecordStore` (or any iterable of records).
        directory: Path. KerasTuner's working directory.
        output: Path or `None`. Where to save the `.keras` model; its report
            goes beside it as `.json`. Defaults to `None` (not saved).
        validation_families: Sequence of strings or `None`. Families for the
            search's validation; defaults to one family picked by `seed`.
        max_trials: Int. KerasTuner trials. Defaults to `8`.
        epochs: Int. Most epochs per fit (early stopping on `val_loss`).
        seed: Int. Makes the search and the training reproducible.
        verbose: Int. Keras verbosity. Defaults to `0`.
        ensemble: Int >= 1. Fits averaged into each model. Defaults to `1`.

    Returns:
        `(model, report)`; `(None, None)` on a distributed search's worker.
    """
    check_range("ensemble", ensemble, low=1, integer=True)
    search = distributed_search()
    worker = search is not None and not search.is_chief
    records = list(store)
    data = decision_data(records)
    families = sorted(set(data.families.tolist()))
    validation_families = _validation_families(families, validation_families, seed)
    held_out = np.isin(data.families, validation_families)
    keras.utils.set_random_seed(seed)
    tuner = _tuner(directory, max_trials, seed, worker)
    train, validation = data.subset(~held_out), data.subset(held_out)
    tuner.search(train.x, train.targets(), validation_data=(validation.x, validation.targets()),
                 epochs=epochs, batch_size=BATCH_SIZE, callbacks=[_early_stopping()], verbose=verbose)
    if worker:  # the chief reports and saves
        return None, None
    hyperparameters = tuner.get_best_hyperparameters(1)[0]
    per_family, stopped = _leave_one_family_out(data, families, hyperparameters, epochs, seed, ensemble)
    model = _ensemble_fit(data, hyperparameters, int(np.median(stopped)), seed, ensemble)
    report = {"records": len(records), "decisions": len(data), "families": families,
              "search_validation_families": list(validation_families),
              "hyperparameters": hyperparameters.values, "epochs": int(np.median(stopped)), "ensemble": ensemble,
              "held_out": per_family, "mean": _mean_report(per_family)}
    if output is not None:
        _save(model, report, Path(output))
    return model, report


def _validation_families(families, requested, seed):
    if len(families) < 2:
        raise ValueError(f"Training a meta-model needs records from at least 2 task families (the "
                         f"validation split is by family). The store has {families}. Collect more.")
    if requested is None:
        return [families[np.random.default_rng(seed).integers(len(families))]]
    unknown = sorted(set(requested) - set(families))
    if unknown or len(set(requested)) >= len(families):
        raise ValueError(f"Argument `validation_families` must name some, not all, of the store's "
                         f"families {families}. Received: validation_families={list(requested)}")
    return list(requested)


def _tuner(directory, max_trials, seed, worker):
    # KerasTuner's overwrite deletes the project directory; on a worker that
    # is the chief's trials and those the other workers are running.
    return keras_tuner.RandomSearch(MetaHyperModel(), objective="val_loss", max_trials=max_trials,
                                    seed=seed, directory=str(directory), project_name="meta_model",
                                    overwrite=not worker)


def _early_stopping():
    return keras.callbacks.EarlyStopping(patience=PATIENCE, restore_best_weights=True)


def _leave_one_family_out(data, families, hyperparameters, epochs, seed, ensemble=1):
    """Each family held out in turn: `ensemble` early-stopped fits on the others (from seeds
    `seed`, `seed + 1`, ...), averaged, judged on it. Returns the report and every fit's epochs."""
    report, stopped = {}, []
    for family in families:
        mask = data.families == family
        train, test = data.subset(~mask), data.subset(mask)
        members = []
        for member_seed in range(seed, seed + ensemble):
            keras.utils.set_random_seed(member_seed)
            member = MetaHyperModel().build(hyperparameters)
            order = np.random.default_rng(member_seed).permutation(len(train))
            stopper = _early_stopping()
            member.fit(train.x[order], train.targets()[order], validation_split=0.15, epochs=epochs,
                       batch_size=BATCH_SIZE, callbacks=[stopper], verbose=0)
            stopped.append(max(stopper.best_epoch + 1, 1) if stopper.stopped_epoch else epochs)
            members.append(member)
        model = members[0] if ensemble == 1 else pack_ensemble(members)
        report[family] = {"decisions": int(mask.sum()), **evaluate_policies(test, model),
                          "regret_by_min_gain": {f"{gain:g}": evaluate_policies(test, model, gain)["meta_model"]["regret"]
                                                 for gain in MIN_GAIN_SWEEP}}
    return report, stopped


def _ensemble_fit(data, hyperparameters, epochs, seed, ensemble):
    members = [_fit(data, hyperparameters, epochs, member_seed) for member_seed in range(seed, seed + ensemble)]
    return members[0] if ensemble == 1 else pack_ensemble(members)


def _fit(data, hyperparameters, epochs, seed):
    keras.utils.set_random_seed(seed)
    model = MetaHyperModel().build(hyperparameters)
    order = np.random.default_rng(seed).permutation(len(data))
    model.fit(data.x[order], data.targets()[order], epochs=epochs, batch_size=BATCH_SIZE, verbose=0)
    return model


def _mean_report(per_family):
    policies = next(iter(per_family.values())).keys() - {"decisions", "regret_by_min_gain"}
    report = {policy: {metric: float(np.mean([f[policy][metric] for f in per_family.values()]))
                       for metric in ("accuracy", "regret")} for policy in sorted(policies)}
    report["meta_model_regret_by_min_gain"] = {
        gain: float(np.mean([f["regret_by_min_gain"][gain] for f in per_family.values()]))
        for gain in next(iter(per_family.values()))["regret_by_min_gain"]}
    return report


def _save(model, report, output):
    output.parent.mkdir(parents=True, exist_ok=True)
    model.save(output)
    output.with_suffix(".json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
