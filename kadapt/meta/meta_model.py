"""The meta-model file: decision data from records, the spec it carries, save/load and scoring.

A meta-model maps a feature window `(WINDOW, len(FEATURE_NAMES))` to a
probability over `kadapt.meta.actions.ACTIONS`. It is trained on soft targets:
for a decision point with candidate scores s (lower is better),
p_a ∝ exp(-(s_a - min s) / TEMPERATURE). The feature spec, the action list and
the format version ride inside the `.keras` file in a `MetaSpec` layer, so a
model whose inputs mean something else is refused at load time.
"""

import dataclasses
from pathlib import Path

import keras
import numpy as np

from kadapt.meta import actions as action_lib
from kadapt.meta.features import FEATURE_NAMES
from kadapt.meta.features import FEATURE_SPEC
from kadapt.meta.features import WINDOW

TEMPERATURE = 0.1
FORMAT_VERSION = 1
DEFAULT_PATH = Path(__file__).parent / "pretrained" / "default.keras"


def model_spec():
    """What a meta-model file must declare to be used with this kadapt."""
    return {"format": FORMAT_VERSION, "features": FEATURE_SPEC, "actions": [dict(a) for a in action_lib.ACTIONS]}


@keras.saving.register_keras_serializable(package="kadapt")
class MetaSpec(keras.layers.Layer):
    """Identity layer that stores the meta-model's input/output spec in its config."""

    def __init__(self, spec=None, **kwargs):
        super().__init__(**kwargs)
        self.spec = model_spec() if spec is None else spec

    def call(self, inputs):
        return inputs

    def get_config(self):
        return {**super().get_config(), "spec": self.spec}


@dataclasses.dataclass
class DecisionData:
    """Decision points: windows `x`, candidate `scores` (+inf where not tried), `families`."""

    x: np.ndarray
    scores: np.ndarray
    families: np.ndarray

    def __len__(self):
        return len(self.x)

    def subset(self, mask):
        return DecisionData(self.x[mask], self.scores[mask], self.families[mask])

    def targets(self):
        """Soft targets, p ∝ exp(-(s - min s) / TEMPERATURE)."""
        shifted = self.scores - self.scores.min(axis=1, keepdims=True)
        weights = np.where(np.isfinite(shifted), np.exp(-shifted / TEMPERATURE), 0.0)
        return (weights / weights.sum(axis=1, keepdims=True)).astype("float32")


def decision_data(records):
    """Groups records by decision point (run, step, rollback) into `DecisionData`."""
    groups = {}
    for record in records:
        key = (record.run_id, record.step, bool(record.adjustment.get("rollback", False)))
        if key not in groups:
            groups[key] = (record.features, np.full(len(action_lib.ACTIONS), np.inf), record.family)
        groups[key][1][int(record.adjustment["action"])] = record.outcome["score"]
    if not groups:
        raise ValueError("The record store is empty: collect records first, e.g. `kadapt meta collect`.")
    windows, scores, families = zip(*groups.values())
    _check_windows(windows)
    return DecisionData(np.stack(windows).astype("float32"), np.stack(scores), np.asarray(families))


def _check_windows(windows):
    expected = (WINDOW, len(FEATURE_NAMES))
    wrong = {tuple(w.shape) for w in windows} - {expected}
    if wrong:
        raise ValueError(f"Records hold feature windows of shape {sorted(wrong)}, but this kadapt's "
                         f"features are {expected}. Re-collect the records with this version.")


def load_meta_model(path="default"):
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


def check_spec(model, path="<model>"):
    """Raises `ValueError` unless `model` carries this kadapt's `MetaSpec`."""
    specs = [layer.spec for layer in model.layers if isinstance(layer, MetaSpec)]
    if not specs:
        raise ValueError(f"The meta-model {path} has no feature spec (no MetaSpec layer): it was not "
                         f"made by kadapt.meta.train_meta_model. Train one with `kadapt meta train`.")
    if specs[0] != model_spec():
        raise ValueError(f"The meta-model {path} was trained on different features or actions "
                         f"(its spec: {specs[0]}; this kadapt: {model_spec()}). Retrain it with "
                         f"`kadapt meta train` on records collected by this version.")


def choose(model, window, allowed=None):
    """`(action_index, confidence, probabilities)` for one window; masked to `allowed`."""
    probabilities = np.asarray(model(window[None].astype("float32"), training=False))[0]
    if allowed is not None:
        probabilities = np.where(allowed, probabilities, 0.0)
    total = probabilities.sum()
    probabilities = probabilities / total if total > 0 else np.eye(len(action_lib.ACTIONS))[action_lib.KEEP]
    index = int(np.argmax(probabilities))
    return index, float(probabilities[index]), probabilities


def rule_policy(window):
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


def evaluate_policies(data, model=None):
    """Accuracy (picks the best candidate) and mean regret (score lost against
    the best) of the meta-model, always-keep and the rule baseline."""
    best = data.scores.min(axis=1)
    picks = {"keep": np.full(len(data), action_lib.KEEP),
             "rule": np.array([rule_policy(w) for w in data.x])}
    if model is not None:
        probabilities = np.asarray(model.predict(data.x, verbose=0))
        picks["meta_model"] = np.argmax(np.where(np.isfinite(data.scores), probabilities, -1.0), axis=1)
    report = {}
    for name, pick in picks.items():
        chosen = data.scores[np.arange(len(data)), pick]
        chosen = np.where(np.isfinite(chosen), chosen, data.scores[:, action_lib.KEEP])
        report[name] = {"accuracy": float(np.mean(chosen <= best + 1e-9)),
                        "regret": float(np.mean(chosen - best))}
    return report
