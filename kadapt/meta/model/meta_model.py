"""The meta-model file: decision data from records, the spec it carries, save/load and scoring.

A meta-model maps a feature window `(WINDOW, len(FEATURE_NAMES))` to a
predicted score for each of `kadapt.meta.actions.ACTIONS`, relative to
keeping: d_a = s_a - s_keep, where a score is the log of the validation loss
at the end of the run over the loss at the decision (lower is better). It is
trained on the scores of the candidates tried at each recorded decision point
(`MaskedScoreError` leaves out those not tried). The predicted gain of an
action is -d_a: the log of how much lower it is predicted to end than keeping.
`choose` abstains — keeps — unless the best allowed action's predicted gain
reaches `min_gain`.

The feature spec, the action list and the format version ride inside the
`.keras` file in a `MetaSpec` layer, so a model whose inputs or outputs mean
something else is refused at load time.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import keras
import numpy as np

from kadapt.meta.model import actions as action_lib
from kadapt.meta.model.adjustment_record import AdjustmentRecord
from kadapt.meta.model.features import FEATURE_NAMES
from kadapt.meta.model.features import FEATURE_SPEC
from kadapt.meta.model.features import WINDOW

FORMAT_VERSION = 2  # 1: action probabilities; 2: score differences to keep
MIN_GAIN = 0.1  # abstain unless an action is predicted to end >= ~10% below keeping (chosen on training-family records)
# A learning-rate cut needs less: its downside is a slower run, not an unstable one, and on a constant
# rate it lowers the noise floor the run ends on (chosen on the evaluation families' development seeds
# 0-2, then measured once on seeds 3-5: benchmarks/README.md#meta_rescue).
MIN_CUT_GAIN = 0.03
# A further raise after a raise needs only a predicted gain: the run has shown its rate too low, and
# the meta-model, consulted every few epochs, rates the next step small once the first raise sped
# the loss up (chosen on the development seeds 0-2, then measured once on seeds 3-5, as above).
FOLLOW_GAIN = 0.005
DEFAULT_PATH = Path(__file__).parent / "pretrained" / "default.keras"


def model_spec() -> dict[str, Any]:
    """What a meta-model file must declare to be used with this kadapt."""
    return {"format": FORMAT_VERSION, "features": FEATURE_SPEC, "actions": [dict(a) for a in action_lib.ACTIONS]}


@keras.saving.register_keras_serializable(package="kadapt")
class MetaSpec(keras.layers.Layer):
    """Identity layer that stores the meta-model's input/output spec in its config."""

    def __init__(self, spec: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec = model_spec() if spec is None else spec

    def call(self, inputs: Any) -> Any:
        return inputs

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "spec": self.spec}


@keras.saving.register_keras_serializable(package="kadapt")
class MaskedScoreError(keras.losses.Loss):
    """Huber error between predicted and recorded score differences, over the tried candidates.

    `y_true` holds NaN for the candidates not tried at a decision point; they
    add nothing to the loss (nor, through a NaN, to its gradient).
    """

    def __init__(self, delta: float = 1.0, name: str = "masked_score_error", reduction: str = "sum_over_batch_size",
                 dtype: str | None = None) -> None:
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self.delta = float(delta)

    def call(self, y_true: Any, y_pred: Any) -> Any:
        ops = keras.ops
        tried = ops.logical_not(ops.isnan(y_true))
        error = ops.where(tried, y_pred - ops.where(tried, y_true, 0.0), 0.0)
        absolute = ops.abs(error)
        huber = ops.where(absolute <= self.delta, 0.5 * error**2, self.delta * (absolute - 0.5 * self.delta))
        count = ops.maximum(ops.sum(ops.cast(tried, y_pred.dtype), axis=-1), 1.0)
        return ops.sum(huber, axis=-1) / count

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "delta": self.delta}


@dataclasses.dataclass(frozen=True)
class Choice:
    """What `choose` decided: the action to apply, the predicted gain of the best allowed
    action over keeping, and that action (`considered`; the same as `action` unless it abstained)."""

    action: int
    gain: float
    considered: int

    @property
    def abstained(self) -> bool:
        return self.action != self.considered


@dataclasses.dataclass
class DecisionData:
    """Decision points: windows `x`, candidate `scores` (+inf where not tried), `families`."""

    x: np.ndarray
    scores: np.ndarray
    families: np.ndarray

    def __len__(self) -> int:
        return len(self.x)

    def subset(self, mask: np.ndarray) -> DecisionData:
        return DecisionData(self.x[mask], self.scores[mask], self.families[mask])

    def targets(self) -> np.ndarray:
        """Score differences to keep, d = s - s_keep; NaN where a candidate was not tried."""
        keep = self.scores[:, action_lib.KEEP:action_lib.KEEP + 1]
        difference = np.where(np.isfinite(self.scores), self.scores - keep, np.nan)
        return difference.astype("float32")


def decision_data(records: Iterable[AdjustmentRecord], score: str = "score") -> DecisionData:
    """Groups records by decision point (run, step, rollback) into `DecisionData`.

    `score` names the outcome that scores a candidate: `"score"` (at the end
    of the budget) or `"score_short"` (after the short horizon); a record
    without it counts as not tried."""
    groups = {}
    for record in records:
        key = (record.run_id, record.step, bool(record.adjustment.get("rollback", False)))
        if key not in groups:
            groups[key] = (record.features, np.full(len(action_lib.ACTIONS), np.inf), record.family)
        groups[key][1][int(record.adjustment["action"])] = record.outcome.get(score, np.inf)
    if not groups:
        raise ValueError("The record store is empty: collect records first, e.g. `kadapt meta collect`.")
    groups = {key: group for key, group in groups.items() if np.isfinite(group[1][action_lib.KEEP])}
    if not groups:
        raise ValueError("No decision point in the records tried \"keep\": scores are relative to it. "
                         "Collect records with kadapt.meta.collect.")
    windows, scores, families = zip(*groups.values())
    _check_windows(windows)
    return DecisionData(np.stack(windows).astype("float32"), np.stack(scores), np.asarray(families))


def _check_windows(windows):
    expected = (WINDOW, len(FEATURE_NAMES))
    wrong = {tuple(w.shape) for w in windows} - {expected}
    if wrong:
        raise ValueError(f"Records hold feature windows of shape {sorted(wrong)}, but this kadapt's "
                         f"features are {expected}. Re-collect the records with this version.")


def load_meta_model(path: str | os.PathLike = "default") -> keras.Model:
    """Loads a meta-model in Keras safe mode and checks its spec.

    Args:
        path: `"default"` (the model shipped with kadapt) or a `.keras` path.
    """
    if path == "default":
        path = DEFAULT_PATH
    path = Path(path)
    if path.suffix != ".keras" or not path.is_file():
        raise ValueError(f"Argument `meta_model` must be \"default\" or the path of an existing .keras "
                         f"file. Received: meta_model={str(path)!r}")
    model = keras.saving.load_model(path, safe_mode=True)
    check_spec(model, path)
    return model


def check_spec(model: keras.Model, path: str | os.PathLike = "<model>") -> None:
    """Raises `ValueError` unless `model` carries this kadapt's `MetaSpec`."""
    specs = [layer.spec for layer in model.layers if isinstance(layer, MetaSpec)]
    if not specs:
        raise ValueError(f"The meta-model {path} has no feature spec (no MetaSpec layer): it was not "
                         f"made by kadapt.meta.train_meta_model. Train one with `kadapt meta train`.")
    if specs[0] != model_spec():
        raise ValueError(f"The meta-model {path} was trained on different features or actions "
                         f"(its spec: {specs[0]}; this kadapt: {model_spec()}). Retrain it with "
                         f"`kadapt meta train` on records collected by this version.")


def predicted_differences(model: keras.Model, windows: np.ndarray) -> np.ndarray:
    """The model's score differences to keep, `(len(windows), len(ACTIONS))`; keep's is 0."""
    predicted = np.asarray(model(np.asarray(windows, "float32"), training=False), "float64")
    return predicted - predicted[:, action_lib.KEEP:action_lib.KEEP + 1]


def choose(model: keras.Model, window: np.ndarray, allowed: np.ndarray | None = None,
           min_gain: float = MIN_GAIN) -> Choice:
    """The `Choice` for one window: the allowed action with the lowest predicted score,
    applied only when its predicted gain over keeping reaches `min_gain` (when keep
    is allowed; when it is not — after a divergence — the best allowed is applied)."""
    return choose_from(predicted_differences(model, window[None])[0], allowed, min_gain)


def choose_from(differences: np.ndarray, allowed: np.ndarray | None = None,
                min_gain: float | np.ndarray = MIN_GAIN) -> Choice:
    """`choose` on predicted score differences to keep (lower is better); `min_gain` may be one
    threshold per action (the best allowed action's own applies)."""
    allowed = np.ones(len(action_lib.ACTIONS), bool) if allowed is None else np.asarray(allowed, bool)
    if not allowed.any():  # nothing can change: keeping is all there is
        return Choice(action_lib.KEEP, 0.0, action_lib.KEEP)
    masked = np.where(allowed, differences, np.inf)
    best = int(np.argmin(masked))
    gain = float(-masked[best])
    needed = float(np.asarray(min_gain, "float64")[best]) if np.ndim(min_gain) else float(min_gain)
    if allowed[action_lib.KEEP] and best != action_lib.KEEP and gain < needed:
        return Choice(action_lib.KEEP, gain, best)
    return Choice(best, gain, best)


def rule_policy(window: np.ndarray) -> int:
    """The hand-written baseline: cut the LR on divergence, rise, oscillation or plateau;
    raise it when updates are tiny and progress is slow; else keep."""
    last = dict(zip(FEATURE_NAMES, window[-1]))
    if last["nonfinite"] > 0 or last["above_best"] > 0.5:
        return 0
    if last["train_slope"] > 0.02 or last["update_cosine"] < -0.5:
        return 1
    if abs(last["val_slope"]) < 0.003 and abs(last["train_slope"]) < 0.003:
        return 1
    if last["update_size"] < -0.9 and -0.02 < last["train_slope"] < 0:
        return 3
    return action_lib.KEEP


def evaluate_policies(data: DecisionData, model: keras.Model | None = None,
                      min_gain: float = MIN_GAIN) -> dict[str, Any]:
    """Accuracy (picks the best candidate) and mean regret (score lost against
    the best) of the meta-model (abstaining below `min_gain`), always-keep and
    the rule baseline."""
    best = data.scores.min(axis=1)
    picks = {"keep": np.full(len(data), action_lib.KEEP),
             "rule": np.array([rule_policy(w) for w in data.x])}
    if model is not None:
        differences = predicted_differences(model, data.x)
        tried = np.isfinite(data.scores)
        picks["meta_model"] = np.array([choose_from(d, t, min_gain).action for d, t in zip(differences, tried)])
    report = {}
    for name, pick in picks.items():
        chosen = data.scores[np.arange(len(data)), pick]
        chosen = np.where(np.isfinite(chosen), chosen, data.scores[:, action_lib.KEEP])
        report[name] = {"accuracy": float(np.mean(chosen <= best + 1e-9)),
                        "regret": float(np.mean(chosen - best))}
    return report
