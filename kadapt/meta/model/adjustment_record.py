"""`AdjustmentRecord`: one mid-run adjustment, the history that preceded it and what followed."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from kadapt.validation import check_non_negative_int

_FIELDS = (
    "run_id",
    "task",
    "family",
    "step",
    "features",
    "hyperparameters",
    "adjustment",
    "outcome",
)


@dataclasses.dataclass(frozen=True, eq=False)
class AdjustmentRecord:
    """One adjustment tried at a decision point of a run, and its outcome.

    The meta-model learns from these: at a decision point a collector
    snapshots the run, tries each candidate adjustment for a short horizon,
    and records the history window that preceded the decision, the
    adjustment and what followed. Records are compared by value (NaN equal
    to NaN in `features`); the features array is a read-only float32 copy and
    the dicts are plain-JSON copies (tuples become lists, NumPy scalars
    Python numbers), so a record read back from a store equals the one
    written.

    Args:
        run_id: Non-empty str. The run the decision point belongs to.
        task: Non-empty str. The task id, e.g. `"digits/mlp/sgd/lr=0.5"`.
        family: Non-empty str. The task family, the unit held out when the
            meta-model is validated, e.g. `"digits"`.
        step: Int >= 0. The training step of the decision point.
        features: 2-D array of real numbers, history window x feature. Stored
            as float32; NaN marks a missing value, infinities are rejected.
        hyperparameters: Dict of JSON values. The hyperparameters before the
            adjustment, e.g. `{"learning_rate": 0.5, "momentum": 0.9}`.
        adjustment: Dict of JSON values. What was applied, e.g.
            `{"learning_rate_multiplier": 0.3, "momentum": None}`.
        outcome: Dict of JSON values. What followed over the horizon, e.g.
            `{"loss_before": 1.2, "loss_after": 0.9, "diverged": False}`.

    Example:

    ```python
    record = AdjustmentRecord(
        run_id="run-0",
        task="digits/mlp/sgd/lr=0.5",
        family="digits",
        step=100,
        features=np.zeros((8, 4), "float32"),
        hyperparameters={"learning_rate": 0.5, "momentum": 0.9},
        adjustment={"learning_rate_multiplier": 0.3, "momentum": None},
        outcome={"loss_before": 1.2, "loss_after": 0.9, "diverged": False},
    )
    assert AdjustmentRecord.from_dict(record.to_dict()) == record
    ```
    """

    run_id: str
    task: str
    family: str
    step: int
    features: np.ndarray
    hyperparameters: dict
    adjustment: dict
    outcome: dict

    def __post_init__(self):
        for name in ("run_id", "task", "family"):
            _check_text(name, getattr(self, name))
        object.__setattr__(self, "step", check_non_negative_int(self.step, "step"))
        object.__setattr__(self, "features", _checked_features(self.features))
        for name in ("hyperparameters", "adjustment", "outcome"):
            object.__setattr__(self, name, _checked_dict(name, getattr(self, name)))

    def __eq__(self, other):
        if not isinstance(other, AdjustmentRecord):
            return NotImplemented
        same_features = np.array_equal(self.features, other.features, equal_nan=True)
        return same_features and self._fields_but_features() == other._fields_but_features()

    def _fields_but_features(self):
        return [getattr(self, name) for name in _FIELDS if name != "features"]

    def to_dict(self) -> dict[str, Any]:
        """Returns the record as plain JSON values; NaN features become `None`."""
        data = {name: _plain(name, getattr(self, name)) for name in _FIELDS if name != "features"}
        rows = self.features.tolist()
        data["features"] = [[None if math.isnan(value) else value for value in row] for row in rows]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AdjustmentRecord:
        """Builds a record from the output of `to_dict()`; `None` features become NaN."""
        if not isinstance(data, dict) or set(data) != set(_FIELDS):
            keys = sorted(data) if isinstance(data, dict) else data
            raise ValueError(
                f"Argument `data` must be a dict with exactly the keys {list(_FIELDS)}. "
                f"Received: data with keys {keys!r}"
            )
        return cls(**{**data, "features": _features_from_lists(data["features"])})


def _check_text(name, value):
    if not isinstance(value, str):
        raise TypeError(
            f"Argument `{name}` must be a str. "
            f"Received: {name}={value!r} (of type {type(value).__name__})"
        )
    if not value:
        raise ValueError(f"Argument `{name}` must be a non-empty str. Received: {name}=''")


def _checked_features(features):
    try:
        array = np.asarray(features)
    except ValueError as error:
        raise ValueError(
            "Argument `features` must be a 2-D array (history window x feature). "
            f"Received: features={features!r}"
        ) from error
    if array.dtype.kind not in "iuf":
        raise TypeError(
            "Argument `features` must be an array of real numbers. "
            f"Received: features.dtype={array.dtype}"
        )
    if array.ndim != 2 or 0 in array.shape:
        raise ValueError(
            "Argument `features` must be a non-empty 2-D array (history window x feature). "
            f"Received: features.shape={array.shape}"
        )
    array = array.astype("float32")
    infinite = int(np.isinf(array).sum())
    if infinite:
        raise ValueError(
            "Argument `features` must be finite or NaN in float32 (NaN marks a missing "
            f"value). Received: features with {infinite} infinite values"
        )
    array.setflags(write=False)
    return array


def _checked_dict(name, value):
    if not isinstance(value, dict):
        raise TypeError(
            f"Argument `{name}` must be a dict. "
            f"Received: {name}={value!r} (of type {type(value).__name__})"
        )
    return _plain(name, value)


def _plain(name, value):
    """Returns a copy of `value` made of plain JSON types, or raises naming argument `name`."""
    if isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            raise TypeError(
                f"Argument `{name}` must have str keys only. Received: {name}={value!r}"
            )
        return {key: _plain(name, item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(name, item) for item in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        # One NaN object everywhere, so dicts holding NaN compare equal after a
        # JSON round trip (dict equality tests identity before ==).
        return math.nan
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    raise TypeError(
        f"Argument `{name}` must hold only JSON values (dict, list, str, number, bool, "
        f"None). Received: {name} holding {value!r} (of type {type(value).__name__})"
    )


def _features_from_lists(rows):
    try:
        return np.array(
            [[math.nan if value is None else value for value in row] for row in rows],
            dtype="float32",
        )
    except (TypeError, ValueError) as error:
        raise ValueError(
            "Argument `features` must be a list of equally long rows of numbers, "
            f"`None` marking NaN. Received: features={rows!r}"
        ) from error
