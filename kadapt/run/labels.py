"""The task a run's labels call for: integers are classes, floats a target to regress, strings class names.

The kind follows the labels' dtype (a `.npy`'s, or a CSV column's cells:
whole numbers, other numbers, words): float labels are a regression even
when every value is whole (scikit-learn's diabetes target is), so a user
says which by the dtype saved. Class names are sorted; their index is the
class the network outputs.
"""

import dataclasses

import numpy as np

from kadapt.recipes.task import CLASSIFICATION
from kadapt.recipes.task import Task
from kadapt.run.errors import UsageError


@dataclasses.dataclass(frozen=True)
class Labels:
    """The `Task` of a run's labels and, for string labels, the sorted class names."""

    task: Task
    class_names: tuple | None = None

    def coded(self, y):
        """Labels as the network learns them: int32 classes, or float32 targets."""
        if self.task.is_regression:
            return np.asarray(y, "float32")
        if self.class_names is not None:
            return np.searchsorted(np.array(self.class_names), y).astype("int32")
        return np.asarray(y).astype("int32")


def label_task(spec, y_train, others=()):
    """The `Labels` of training labels `y_train` (N,); `others` (validation,
    test labels) must be of the same kind and join the class names.

    Regression standardizes with `y_train` alone. One class only, fewer
    training rows than classes, negative classes and non-finite targets are
    `UsageError`s."""
    kind = np.asarray(y_train).dtype.kind
    if kind == "f":
        return Labels(_regression(spec, y_train))
    if kind == "U":
        names = tuple(str(name) for name in np.unique(np.concatenate([y_train, *others])))
        labels = Labels(Task(CLASSIFICATION, len(names)), names)
    else:
        every = np.concatenate([np.asarray(y_train).reshape(-1), *(np.asarray(y).reshape(-1) for y in others)])
        if every.size and every.min() < 0:
            raise UsageError(f"--data {spec}: integer labels are classes 0, 1, 2, ...; the labels hold "
                             f"{every.min()}. Number the classes from 0 (or save the labels as floats for a "
                             "regression).")
        labels = Labels(Task(CLASSIFICATION, int(every.max()) + 1 if every.size else 0))
    _check_classes(spec, labels.coded(y_train), labels)
    return labels


def _regression(spec, y_train):
    y = np.asarray(y_train, "float64")
    if not np.all(np.isfinite(y)):
        row = int(np.flatnonzero(~np.isfinite(y))[0])
        raise UsageError(f"--data {spec}: training label {row} (counted from 0) is {y[row]}; a regression "
                         "target must be a finite number. Fix or drop the row.")
    if y.min() == y.max():
        raise UsageError(f"--data {spec}: the float labels (a regression target) hold {y[0]:g} in every training "
                         "row: there is nothing to learn. Check the labels file.")
    return Task.regression(y)


def _check_classes(spec, coded, labels):
    present = np.unique(coded)
    if len(present) < 2:
        name = labels.class_names[present[0]] if labels.class_names else present[0]
        raise UsageError(f"--data {spec}: every training label is {name}: one class only, nothing to tell "
                         "apart. Give rows of at least two classes.")
    if len(coded) < labels.task.outputs:
        regression = "" if labels.class_names else (" Whole numbers are classes: for a regression, save the labels "
                                                     "as floats (in a CSV, write 3.0 for 3).")
        raise UsageError(f"--data {spec}: {len(coded)} training rows for {labels.task.outputs} classes; each class "
                         f"needs rows to learn from. Give more rows, or fewer classes.{regression}")
